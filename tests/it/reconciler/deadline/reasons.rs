//! Why a JobSet was evaluated

use super::*;

/// A pass of the workers counts why its JobSet was queued: a pod's event (`pod`), the
/// group-restart deadline's timer (`deadline`), and the deadline's WARN line names the reasons of
/// the pass that took the step. Every reason's series is there from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_event_and_the_deadline_are_counted_under_their_reasons() {
    bounded(async {
        const RNS: &str = "reasons";
        crate::logs::captured();
        let server = TestApiServer::start().await;
        store_with_running_pods(
            &server,
            RNS,
            JobSet::new("js")
                .namespace(RNS)
                .replicas(2)
                .max_restarts(5)
                .annotation(TIMEOUT_ANNOTATION, "2s")
                .build(),
            &["js-0", "js-1"],
        );
        let r = Running::start(
            server.client_named("reconciler"),
            options(Dialect::Epoch, Some(Duration::from_secs(120)), "r1"),
        )
        .await;
        let text = r.metrics().await;
        for label in [
            "jobset",
            "pod",
            "job",
            "jobsetepoch",
            "node",
            "resync",
            "leadership",
            "retry",
            "deadline",
        ] {
            assert!(text.contains(&reason(label)), "{label}: {text}");
        }
        for p in ["js-0", "js-1"] {
            set_epoch_in(&server, RNS, p, 1);
        }
        until("synced", WAIT, || {
            status_field(&server, RNS, "js", "syncedEpoch") == Some(1)
        })
        .await;
        // js-0 restarts; js-1 never registers: the deadline's timer fires after 2 s. (The
        // registrations at epoch 1 may have been read by the reconciler's first list, a
        // `resync`; epoch 2 comes as a pod event, the pod watch being past its list once the
        // reconciler synced epoch 1.)
        set_epoch_in(&server, RNS, "js-0", 2);
        until("the deprecation", WAIT, || {
            status_field(&server, RNS, "js", "deprecatedEpoch") == Some(1)
        })
        .await;
        assert_eq!(
            r.sample(&reason("deadline")).await,
            0.0,
            "nothing queued by the deadline before its window"
        );
        // The pass counts its reasons as it ends: a scrape may run ahead of it.
        assert!(
            r.sample_reaching(&reason("pod"), 1.0).await >= 1.0,
            "{}",
            r.metrics().await
        );
        until("js-1 deleted", Duration::from_secs(2) + SLACK, || {
            server.get("pods", RNS, "js-1").is_none()
        })
        .await;
        assert!(r.sample_reaching(&reason("deadline"), 1.0).await >= 1.0);
        assert_eq!(r.sample(&reason("node")).await, 0.0, "no node was lost");
        let lines: Vec<String> = {
            let logs = crate::logs::captured()
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            String::from_utf8_lossy(&logs)
                .lines()
                .filter(|l| {
                    l.contains("group restart timed out")
                        && l.contains(&format!("namespace={RNS} "))
                })
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(lines.len(), 1, "{lines:#?}");
        let reasons = lines[0]
            .split_once("reconcile{reasons=")
            .and_then(|(_, rest)| rest.split_once('}'))
            .map(|(reasons, _)| reasons.split(',').collect::<Vec<_>>());
        assert!(
            reasons.is_some_and(|r| r.contains(&"deadline")),
            "{}",
            lines[0]
        );
        r.stop().await;
    })
    .await;
}
