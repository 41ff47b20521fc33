//! docs/operations.md, "Turning the webhook off now": the documented commands on the real API
//! server. `kubectl delete mutatingwebhookconfiguration,validatingwebhookconfiguration
//! jobset-inplace` with the webhook itself gone: a new InPlaceRestart JobSet is admitted without
//! injection, a JobSet stored injected keeps its injection and can still be updated; applying the
//! configurations again (what `helm upgrade` or `kubectl apply -k` of the overlay does) turns
//! injection back on.

use super::*;

fn injected_text(js: &DynamicObject) -> bool {
    serde_json::to_string(&js.data)
        .unwrap_or_default()
        .contains(INJECTED_ANNOTATION)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_off_switch_admits_jobsets_uninjected_and_turns_back_on() {
    with_cluster(
        "the_off_switch_admits_jobsets_uninjected_and_turns_back_on",
        |cluster| async move {
            let ns = TestNamespace::create(&cluster, "rc-off-switch").await;
            let jobsets = jobset_api(&cluster.client, &ns.name);
            let pp = PostParams::default();
            let dry_run = PostParams {
                dry_run: true,
                ..Default::default()
            };
            let plain = |name: &str| {
                build::JobSet::from_value(fixture_object("story1-plain"))
                    .name(name)
                    .namespace(&ns.name)
                    .as_jobset_requires()
                    .typed::<DynamicObject>()
            };
            let injection_is = |on: bool| {
                let jobsets = jobsets.clone();
                let probe = plain("probe");
                let dry_run = dry_run.clone();
                async move {
                    eventually(
                        &format!("injection {}", if on { "on" } else { "off" }),
                        Duration::from_secs(30),
                        || async {
                            let js = jobsets
                                .create(&dry_run, &probe)
                                .await
                                .map_err(|e| e.to_string())?;
                            if injected_text(&js) == on {
                                Ok(())
                            } else {
                                Err(format!("injected: {}", injected_text(&js)))
                            }
                        },
                    )
                    .await
                }
            };

            let webhook = serve_webhook(&cluster).await;
            injection_is(true).await;
            jobsets.create(&pp, &plain("before")).await.expect("before");
            assert!(injected_text(&jobsets.get("before").await.expect("stored")));

            // Off: the webhook gone (say, crashing), its two configurations deleted.
            webhook.stop().await;
            delete_webhook_configurations(&cluster).await;
            injection_is(false).await;
            jobsets
                .create(&pp, &plain("after"))
                .await
                .expect("admitted");
            assert!(!injected_text(&jobsets.get("after").await.expect("stored")));
            // The JobSet stored injected keeps its agents and can still be updated.
            let labelled = jobsets
                .patch(
                    "before",
                    &PatchParams::default(),
                    &merge(json!({"metadata": {"labels": {"team": "a"}}})),
                )
                .await
                .expect("an update with the webhook off");
            assert!(injected_text(&labelled));

            // On again: the configurations applied again.
            let webhook = serve_webhook(&cluster).await;
            injection_is(true).await;
            jobsets.create(&pp, &plain("again")).await.expect("again");
            assert!(injected_text(&jobsets.get("again").await.expect("stored")));

            webhook.stop().await;
            delete_webhook_configurations(&cluster).await;
            drop(ns);
        },
    )
    .await;
}
