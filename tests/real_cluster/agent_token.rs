//! Issue 46 item 2 through the real API server: the agent's token reaches no look-alike of the
//! agent, and no pod that runs as the agent's account shares its process namespace.

use super::*;

/// `object` as the webhook at 4567270 injected it: the template injected as it is injected
/// today when `before` makes it one the old code took the same way, then `after` put back; and
/// opted out of the injection, so that the validating webhook alone judges it.
fn injected_then(object: &Value, before: &str, before_value: Option<Value>, after: Value) -> Value {
    use jobset_inplace::admission::{self, InjectionConfig};
    let config = InjectionConfig::defaults(jobset_inplace::protocol::Dialect::Epoch);
    let mut value = match &before_value {
        Some(v) => build::JobSet::from_value(object.clone())
            .set(before, v.clone())
            .build(),
        None => build::JobSet::from_value(object.clone())
            .remove(before)
            .build(),
    };
    let mutation = admission::mutate(&value, &config);
    assert!(mutation.violations.is_empty(), "{:?}", mutation.violations);
    json_patch::patch(&mut value, &mutation.patch).expect("the patch applies");
    let mut value = build::JobSet::from_value(value).set(before, after).build();
    value["metadata"]["annotations"]["jobset-inplace.dev/inject"] = json!("false");
    value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_keeps_the_agent_s_token_from_look_alikes_and_shared_process_namespaces() {
    with_cluster(
        "the_webhook_keeps_the_agent_s_token_from_look_alikes_and_shared_process_namespaces",
        |cluster| async move {
            let ns = TestNamespace::create(&cluster, "rc-agent-token").await;
            let jobsets = jobset_api(&cluster.client, &ns.name);
            let pp = PostParams::default();
            let webhook = serve_webhook(&cluster).await;
            // The configurations in force: a plain JobSet comes back injected from a dry run.
            let probe = build::JobSet::from_value(fixture_object("story1-plain"))
                .name("probe")
                .namespace(&ns.name)
                .as_jobset_requires()
                .typed::<DynamicObject>();
            create_injected(&jobsets, &probe)
                .await
                .expect("the configurations in force");

            const POD: &str = "spec.replicatedJobs[0].template.spec.template.spec";
            const POD_PTR: &str = "/spec/replicatedJobs/0/template/spec/template/spec";
            let image_ptr = format!("{POD_PTR}/initContainers/0/image");
            let shared_ptr = format!("{POD_PTR}/shareProcessNamespace");
            let look_alike = fixture_object("agent-look-alike");
            let shared = fixture_object("share-process-namespace");
            let watchdog = look_alike.pointer(&image_ptr).cloned().expect("an image");
            assert_eq!(watchdog, json!("example.com/team-a/watchdog:1"));
            assert_eq!(shared.pointer(&shared_ptr), Some(&json!(true)));
            assert_eq!(
                shared.pointer(&format!("{POD_PTR}/securityContext/runAsUser")),
                Some(&json!(1000))
            );
            let old_look_alike = injected_then(
                &look_alike,
                &image_ptr,
                Some(json!("ghcr.io/jobset-inplace/jobset-inplace:0.0.9")),
                watchdog,
            );
            assert_eq!(
                old_look_alike.pointer(&format!("{POD_PTR}/initContainers/0/volumeMounts/0/name")),
                Some(&json!("jobset-inplace-agent-token")),
                "as 4567270 stored it: the look-alike mounts the agent's token"
            );
            let old_shared = injected_then(&shared, &shared_ptr, None, json!(true));

            // (webhook, name, object, the fields the denial names, a word of its message)
            let cases = [
                (
                    "mutate",
                    "look-alike",
                    look_alike,
                    vec![format!("{POD}.initContainers[0].image")],
                    "ghcr.io/jobset-inplace/jobset-inplace",
                ),
                (
                    "mutate",
                    "shared-pids",
                    shared,
                    vec![format!("{POD}.shareProcessNamespace")],
                    "/proc/<pid>/root",
                ),
                (
                    "validate",
                    "old-look-alike",
                    old_look_alike,
                    vec![
                        format!("{POD}.initContainers[0].volumeMounts[0]"),
                        format!("{POD}.initContainers[0].image"),
                    ],
                    "ghcr.io/jobset-inplace/jobset-inplace",
                ),
                (
                    "validate",
                    "old-shared-pids",
                    old_shared,
                    vec![format!("{POD}.shareProcessNamespace")],
                    "/proc/<pid>/root",
                ),
            ];
            for (webhook_name, name, object, want, word) in cases {
                let js = build::JobSet::from_value(object)
                    .name(name)
                    .namespace(&ns.name)
                    .as_jobset_requires()
                    .typed::<DynamicObject>();
                let (code, _, message, fields) = api_error(jobsets.create(&pp, &js).await)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(code, 422, "{name}: {message}");
                assert!(
                    message.contains(&format!(
                        "admission webhook \"{webhook_name}.jobset-inplace.dev\" denied the request"
                    )),
                    "{name}: {message}"
                );
                assert!(message.contains(word), "{name}: {message}");
                assert_eq!(fields, want, "{name}: {message}");
                assert!(
                    jobsets.get_opt(name).await.expect("get").is_none(),
                    "{name}: nothing stored"
                );
            }
            webhook.stop().await;
            delete_webhook_configurations(&cluster).await;
            drop(ns);
        },
    )
    .await;
}
