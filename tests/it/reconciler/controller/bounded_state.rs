//! Bounded state: what the controller keeps per JobSet goes with the JobSet

use super::*;

/// A controller started directly (no lease), to read its state sizes.
fn controller(w: &World) -> Controller {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let (_leader_tx, leader) = tokio::sync::watch::channel(true);
    Controller::start(
        w.server.client(),
        options(w.dialect, "r1", None).settings,
        metrics,
        leader,
    )
}

async fn sizes_until(c: &Controller, what: &str, f: impl Fn(&StateSizes) -> bool) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let s = c.state_sizes();
        if f(&s) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A group restart in progress, a malformed annotation reported, failing status writes: the
/// controller holds state for the JobSet. Deletes of its pods and of the JobSet, seen by the
/// watches, empty every per-JobSet map and the queue.
async fn hold_state_for_a_jobset(w: &World, c: &Controller) {
    w.sync_pods(2, 1, "sync").await;
    w.set_epoch(0, 2);
    w.until("deprecated", |w| w.deprecated() == Some(1)).await;
    w.set_raw_epoch(1, "two");
    w.server
        .fail_next(1_000, Verb::Patch, "jobsets/status", 500);
    w.set_epoch(0, 3);
    sizes_until(c, "a restart, a report and a retry", |s| {
        s.restarts == 1 && s.reported == 1 && s.retries == 1 && s.jobsets == 1 && s.pods == 2
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_jobset_state_goes_when_the_jobset_is_deleted() {
    bounded(async {
        let w = World::new(Dialect::Epoch, &[(1, 2)], 10).await;
        let c = controller(&w);
        hold_state_for_a_jobset(&w, &c).await;
        for i in 0..2 {
            w.server
                .delete("pods", NS, &format!("js-{i}"))
                .expect("pod");
        }
        w.server.delete("jobsets", NS, "js").expect("jobset");
        sizes_until(&c, "nothing held", |s| *s == StateSizes::default()).await;
        w.server.clear_faults();
        c.shutdown().await;
    })
    .await;
}

/// The JobSet is deleted while the JobSet watch is down, and the history is compacted: the
/// watch relists, and what the relist no longer has is forgotten, with its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_jobset_state_goes_when_a_relist_misses_the_jobset() {
    bounded(async {
        let w = World::new(Dialect::Epoch, &[(1, 2)], 10).await;
        let c = controller(&w);
        hold_state_for_a_jobset(&w, &c).await;
        let watches = w.server.counters().get(Verb::Watch, "jobsets");
        w.server.fail_next(1_000, Verb::Watch, "jobsets", 500);
        w.server.cut_watches();
        w.until("a failed re-watch", |w| {
            w.server.counters().get(Verb::Watch, "jobsets") > watches
        })
        .await;
        for i in 0..2 {
            w.server
                .delete("pods", NS, &format!("js-{i}"))
                .expect("pod");
        }
        w.server.delete("jobsets", NS, "js").expect("jobset");
        w.server.compact_all();
        w.server.clear_faults();
        sizes_until(&c, "nothing held", |s| *s == StateSizes::default()).await;
        c.shutdown().await;
    })
    .await;
}

/// A malformed annotation that is fixed is forgotten (and reported again if it breaks again).
#[tokio::test]
async fn fixed_malformed_annotations_are_forgotten() {
    bounded(async {
        let w = World::new(Dialect::Epoch, &[(1, 2)], 10).await;
        let c = controller(&w);
        w.set_epoch(0, 1);
        w.set_raw_epoch(1, "one");
        sizes_until(&c, "the report", |s| s.reported == 1).await;
        w.set_epoch(1, 1);
        w.until("sync", |w| w.synced() == Some(1)).await;
        sizes_until(&c, "forgotten", |s| s.reported == 0).await;
        // kube's recorder turns a repeat into a series on the same event.
        let warnings = |w: &World| -> i64 {
            w.events()
                .iter()
                .filter(|e| e["reason"] == "MalformedEpoch")
                .map(|e| e["series"]["count"].as_i64().unwrap_or(1))
                .sum()
        };
        let before = warnings(&w);
        w.set_raw_epoch(1, "one");
        w.until("a second warning", |w| warnings(w) > before).await;
        c.shutdown().await;
    })
    .await;
}
