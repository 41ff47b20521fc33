//! `cargo bench --bench review`: the in-process cost of `admission::review` per call, for both
//! endpoints, on the largest fixture request and on every fixture, beside the floor of parsing
//! the same bytes (`serde_json` into `IgnoredAny`, into a `Value`).
//!
//! Each figure is the fastest of `JOBSET_INPLACE_BENCH_BATCHES` (default 30) batches of calls,
//! divided by the batch size: on a shared machine the fastest batch is the least disturbed one.
//! The median batch is printed beside it.

use std::hint::black_box;
use std::time::{Duration, Instant};

use jobset_inplace::admission::{self, Endpoint, InjectionConfig};
use jobset_inplace_testkit::{fixtures, webhook_harness};

/// Fastest and median microseconds per call of `f`, over `batches` batches of about 20 ms.
fn measure(batches: usize, mut f: impl FnMut()) -> (f64, f64) {
    // Size a batch to ~20 ms.
    let started = Instant::now();
    let mut calibration = 0u32;
    while started.elapsed() < Duration::from_millis(20) {
        f();
        calibration += 1;
    }
    let per_batch = calibration.max(1);
    let mut samples: Vec<f64> = (0..batches)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..per_batch {
                f();
            }
            started.elapsed().as_secs_f64() * 1e6 / f64::from(per_batch)
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    (samples[0], samples[samples.len() / 2])
}

fn row(what: &str, (min, median): (f64, f64)) {
    println!("{what:<44} {min:>9.1} {median:>9.1}");
}

fn config_for(fixture: &fixtures::Fixture) -> InjectionConfig {
    match &fixture.config {
        Some(path) => {
            let path = path.to_string_lossy().into_owned();
            webhook_harness::config_from_flags(&["--config", &path])
        }
        None => webhook_harness::default_config(),
    }
}

/// The request with its object as the mutating webhook left it.
fn mutated_body(body: &[u8], config: &InjectionConfig) -> Option<Vec<u8>> {
    let mut review: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = review.pointer_mut("/request/object")?;
    let mutation = admission::mutate(object, config);
    json_patch::patch(object, &mutation.patch).ok()?;
    serde_json::to_vec(&review).ok()
}

fn main() {
    let batches: usize = webhook_harness::env_or("JOBSET_INPLACE_BENCH_BATCHES", 30);
    let fixtures = fixtures::fixture_requests();
    // The largest request a user sends, not the hostile inputs kept to test bounded work
    // (`hostile-*`, answered with a short denial); JOBSET_INPLACE_BENCH_FIXTURE names another.
    let wanted = std::env::var("JOBSET_INPLACE_BENCH_FIXTURE").ok();
    let Some(largest) = fixtures
        .iter()
        .filter(|f| match &wanted {
            Some(name) => &f.name == name,
            None => !f.name.starts_with("hostile-"),
        })
        .max_by_key(|f| f.body.len())
    else {
        println!("no fixtures");
        return;
    };
    let config = config_for(largest);
    let body = largest.body.as_slice();
    println!(
        "admission::review in-process: fixture {} ({} bytes); us per call, fastest and median \
         of {batches} batches",
        largest.name,
        body.len()
    );
    println!("{:<44} {:>9} {:>9}", "", "fastest", "median");
    row(
        "serde_json::from_slice::<IgnoredAny>",
        measure(batches, || {
            black_box(serde_json::from_slice::<serde::de::IgnoredAny>(black_box(body)).ok());
        }),
    );
    row(
        "serde_json::from_slice::<Value>",
        measure(batches, || {
            black_box(serde_json::from_slice::<serde_json::Value>(black_box(body)).ok());
        }),
    );
    for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
        row(
            &format!("review({endpoint:?})"),
            measure(batches, || {
                black_box(admission::review(endpoint, black_box(body), &config));
            }),
        );
    }
    // What the API server sends the validating webhook: the object as mutated.
    if let Some(mutated) = mutated_body(body, &config) {
        row(
            "review(Validate), the mutated request",
            measure(batches, || {
                black_box(admission::review(
                    Endpoint::Validate,
                    black_box(&mutated),
                    &config,
                ));
            }),
        );
    }

    // Every fixture, both endpoints: the sum of one call each.
    let all: Vec<(Vec<u8>, InjectionConfig)> = fixtures
        .iter()
        .map(|f| (f.body.clone(), config_for(f)))
        .collect();
    let bytes: usize = all.iter().map(|(b, _)| b.len()).sum();
    for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
        row(
            &format!("review({endpoint:?}), all {} fixtures", all.len()),
            measure(batches, || {
                for (body, config) in &all {
                    black_box(admission::review(endpoint, black_box(body), config));
                }
            }),
        );
    }
    println!("(all fixtures: {bytes} bytes in total)");
}
