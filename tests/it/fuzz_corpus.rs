//! The fuzz targets (`fuzz/src/lib.rs`, included here) as plain tests on stable Rust: every input
//! of `fuzz/corpus/<target>/` is replayed through its target, so `cargo test` checks the seeds
//! and what the fuzzer kept without building or running the fuzzer (see `fuzz/README.md`).
//!
//! The seeds derived from the admission fixtures are written by `UPDATE_FUZZ_CORPUS=1 cargo test
//! --test it fuzz_corpus`; the hand-written seeds and the fuzzer's minimized findings are committed
//! as they are.
#[path = "../../fuzz/src/lib.rs"]
#[allow(dead_code)] // `replay` is for the binaries
mod targets;

use jobset_inplace_testkit::fixtures;
use std::path::PathBuf;

fn corpus_dir(target: &str) -> PathBuf {
    fixtures::manifest_dir().join("fuzz/corpus").join(target)
}

#[test]
fn every_corpus_input_passes_its_target() {
    if std::env::var_os("UPDATE_FUZZ_CORPUS").is_some() {
        write_fixture_seeds();
    }
    for (name, target) in targets::TARGETS {
        let dir = corpus_dir(name);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        assert!(files.len() >= 5, "{name}: only {} inputs", files.len());
        let mut failed = Vec::new();
        for file in &files {
            let data = std::fs::read(file).expect("read a corpus file");
            if std::panic::catch_unwind(|| target(&data)).is_err() {
                failed.push(file.display().to_string());
            }
        }
        assert!(failed.is_empty(), "{name}: inputs fail: {failed:#?}");
    }
}

/// `review/fixture-<case>.json`: each fixture's request body; `offline/fixture-<case>.yaml`: its
/// object as a manifest (and the mutated one where there is one). The `hostile-*` cases (hundreds
/// of KB each, built to be expensive) are left out: seeds that large would slow every fuzzing
/// run, and `tests/it/admission/fixtures.rs` and `tests/it/admission/bounds.rs` replay them.
fn fixture_seeds() -> Vec<(PathBuf, Vec<u8>)> {
    let mut seeds = Vec::new();
    for case in fixtures::admission_cases() {
        if case.name.starts_with("hostile-") {
            continue;
        }
        let review = corpus_dir("review").join(format!("fixture-{}.json", case.name));
        seeds.push((review, case.body.clone()));
        let object = &case.request["request"]["object"];
        if !object.is_object() {
            continue;
        }
        let manifest = serde_saphyr::to_string(object).expect("YAML");
        let path = corpus_dir("offline").join(format!("fixture-{}.yaml", case.name));
        seeds.push((path, manifest.into_bytes()));
        if case.mutated_path().exists() {
            let mutated = std::fs::read(case.mutated_path()).expect("mutated.yaml");
            let path = corpus_dir("offline").join(format!("fixture-{}-mutated.yaml", case.name));
            seeds.push((path, mutated));
        }
    }
    seeds
}

fn write_fixture_seeds() {
    for (path, data) in fixture_seeds() {
        std::fs::write(path, data).expect("write a seed");
    }
}

/// The seeds derived from the fixtures are what the fixtures are now (a fixture changed without
/// its seeds being written again fails here).
#[test]
fn the_fixture_seeds_are_current() {
    if std::env::var_os("UPDATE_FUZZ_CORPUS").is_some() {
        // Being written by `every_corpus_input_passes_its_target`, beside this test.
        return;
    }
    let stale: Vec<String> = fixture_seeds()
        .into_iter()
        .filter(|(path, data)| std::fs::read(path).ok().as_deref() != Some(data.as_slice()))
        .map(|(path, _)| path.display().to_string())
        .collect();
    assert!(
        stale.is_empty(),
        "stale or missing seeds (write them with `UPDATE_FUZZ_CORPUS=1 cargo test --test \
         it fuzz_corpus`): {stale:#?}"
    );
}
