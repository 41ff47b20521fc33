//! The addons of `scripts/control-plane.sh up DIR --with kueue,trainer`: Kubeflow Trainer v2
//! and Kueue, built from their Go modules, writing JobSets through our webhook

use super::*;

mod kueue;

/// GET `path` on loopback HTTP: the body of a 200 answer.
async fn http_get(port: u16, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
        .await
        .map_err(|_| format!("GET {path}: no answer within 10 s"))?
        .map_err(|e| e.to_string())?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    if head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200") {
        Ok(body.to_owned())
    } else {
        Err(head.lines().next().unwrap_or("").to_owned())
    }
}

/// The sum of metric `name` over its series whose labels include `labels`, from `/metrics` on
/// loopback `port`.
async fn metric_sum(port: u16, name: &str, labels: &[(&str, &str)]) -> Result<f64, String> {
    let text = http_get(port, "/metrics").await?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(metric_line)
        .filter(|(n, l, _)| {
            *n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum())
}

/// The mutating reviews our webhook answered so far.
async fn mutations(webhook: &Webhook) -> f64 {
    metric_sum(
        webhook.health,
        "jobset_inplace_admission_requests_total",
        &[("endpoint", "mutate")],
    )
    .await
    .expect("the webhook's metrics")
}

/// The agent's name in the pod template of each Job of JobSet `name` (its first init
/// container), or an error while there are fewer than `jobs` Jobs.
async fn jobs_agents(
    client: &Client,
    namespace: &str,
    name: &str,
    jobs: usize,
) -> Result<Vec<String>, String> {
    let api: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), namespace);
    let list = api
        .list(&ListParams::default().labels(&format!("jobset.sigs.k8s.io/jobset-name={name}")))
        .await
        .map_err(|e| e.to_string())?;
    if list.items.len() < jobs {
        return Err(format!("{} of {jobs} Jobs of {name}", list.items.len()));
    }
    Ok(list
        .items
        .iter()
        .map(|job| {
            let spec = serde_json::to_value(&job.spec).unwrap_or_default();
            spec["template"]["spec"]["initContainers"][0]["name"]
                .as_str()
                .unwrap_or("none")
                .to_owned()
        })
        .collect())
}

/// Waits until `name`'s resourceVersion stays the same for 3 s (the controllers are done with
/// it), and returns the object.
async fn settled(jobsets: &Api<DynamicObject>, name: &str) -> DynamicObject {
    eventually(
        &format!("{name} settles"),
        Duration::from_secs(60),
        || async {
            let before = jobsets.get(name).await.map_err(|e| e.to_string())?;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let after = jobsets.get(name).await.map_err(|e| e.to_string())?;
            (before.metadata.resource_version == after.metadata.resource_version)
                .then_some(after)
                .ok_or_else(|| "still changing".to_owned())
        },
    )
    .await
}

/// A ClusterTrainingRuntime whose JobSet template uses InPlaceRestart: one replicated job `node`
/// (Trainer's `trainer` step) of 2 pods, as a user writes it (nothing injected).
fn in_place_runtime(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name},
        "spec": {"template": {"spec": {
            "failurePolicy": {"maxRestarts": 3, "restartStrategy": "InPlaceRestart"},
            "replicatedJobs": [{"name": "node", "replicas": 1, "template": {
                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                "spec": {"parallelism": 2, "completions": 2, "template": {"spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "node", "image": "registry.example/train:1",
                                    "command": ["python", "-m", "train"]}]}}}}}]}}},
    }))
    .expect("ClusterTrainingRuntime")
}

/// Kubeflow Trainer v2 turns a TrainJob into a JobSet from a ClusterTrainingRuntime whose template
/// uses InPlaceRestart: the JobSet it creates is injected by our webhook, and its re-applies
/// (server-side apply, field manager `trainer`, on every reconcile while the TrainJob or the
/// JobSet is suspended; v2.3 leaves a running JobSet alone) reach our webhook and store nothing
/// new: the JobSet's generation and resourceVersion do not move. Resumed, its Jobs' pod
/// templates carry the agent. Pods never run here (no kubelet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainjob_from_an_in_place_restart_runtime_is_injected_and_re_applied_unchanged() {
    const TEST: &str =
        "a_trainjob_from_an_in_place_restart_runtime_is_injected_and_re_applied_unchanged";
    with_cluster(TEST, |cluster| async move {
        if !addon_started(&cluster, TEST, "trainer") {
            return;
        }
        let webhook = serve_webhook(&cluster).await;
        let ns = TestNamespace::create(&cluster, "rc-trainer").await;
        let runtime = format!("{}-inplace", ns.name);
        let _leftovers = ClusterObjects {
            kubeconfig: cluster.kubeconfig.clone(),
            objects: vec![(
                "clustertrainingruntime.trainer.kubeflow.org",
                runtime.clone(),
            )],
        };
        let pp = PostParams::default();
        let runtimes = api_of(&cluster.client, TRAINING_RUNTIME, None);
        let template = in_place_runtime(&runtime);
        eventually(
            "the ClusterTrainingRuntime",
            Duration::from_secs(60),
            || async {
                runtimes
                    .create(&pp, &template)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        )
        .await;

        // Suspended, as Kueue (or a user) would submit it: Trainer applies the JobSet again on
        // every reconcile until it runs.
        let trainjobs = api_of(&cluster.client, TRAIN_JOB, Some(&ns.name));
        let trainjob = train_job("train", &runtime, true);
        // Our webhook's configurations may take a moment: the JobSet must come out injected.
        eventually("the TrainJob", Duration::from_secs(60), || async {
            trainjobs
                .create(&pp, &trainjob)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await;
        let jobsets = jobset_api(&cluster.client, &ns.name);
        eventually(
            "Trainer's JobSet, injected",
            Duration::from_secs(60),
            || async {
                let js = jobsets.get("train").await.map_err(|e| e.to_string())?;
                let agent = agent_of_template(&js);
                (agent == "jobset-inplace-agent")
                    .then_some(())
                    .ok_or_else(|| format!("not injected: {agent}"))
            },
        )
        .await;
        let before = settled(&jobsets, "train").await;
        assert_eq!(
            agent_of_template(&before),
            "jobset-inplace-agent",
            "{:?}",
            before.data
        );
        assert_eq!(
            before.data["spec"]["failurePolicy"]["restartStrategy"],
            "InPlaceRestart"
        );

        // Trainer watches its JobSets: each change of one (a label: metadata, which does not reach
        // our webhook) makes Trainer reconcile and apply it again, which stores nothing.
        for i in 0..3 {
            let touched = jobsets
                .patch(
                    "train",
                    &PatchParams::default(),
                    &merge(json!({"metadata": {"labels": {"rc-touch": i.to_string()}}})),
                )
                .await
                .expect("touch the JobSet");
            // Trainer's apply of an unchanged spec does not reach our webhook (its
            // matchConditions skip an UPDATE that leaves the spec as it was): give it time.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let after = settled(&jobsets, "train").await;
            assert_eq!(after.metadata.generation, before.metadata.generation);
            assert_eq!(
                after.metadata.resource_version,
                touched.metadata.resource_version,
                "Trainer's re-apply {i} stored something: {}",
                serde_json::to_string(&after.data["spec"]).unwrap_or_default()
            );
            assert_eq!(after.data["spec"], before.data["spec"]);
        }

        // Resumed: Trainer applies it unsuspended once; JobSet's controller makes the Jobs, whose
        // pod templates carry the agent.
        trainjobs
            .patch(
                "train",
                &PatchParams::default(),
                &merge(json!({"spec": {"suspend": false}})),
            )
            .await
            .expect("resume the TrainJob");
        let agents = eventually(
            "the Jobs of the resumed JobSet",
            Duration::from_secs(60),
            || jobs_agents(&cluster.client, &ns.name, "train", 1),
        )
        .await;
        assert!(
            agents.iter().all(|a| a == "jobset-inplace-agent"),
            "{agents:?}"
        );
        let running = settled(&jobsets, "train").await;
        assert_eq!(running.data["spec"]["suspend"], false);
        assert_eq!(agent_of_template(&running), "jobset-inplace-agent");
        let generation = running.metadata.generation;
        trainjobs
            .patch(
                "train",
                &PatchParams::default(),
                &merge(json!({"metadata": {"annotations": {"rc-touch": "running"}}})),
            )
            .await
            .expect("touch the TrainJob");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let still = jobsets.get("train").await.expect("JobSet");
        assert_eq!(
            still.metadata.generation, generation,
            "a running JobSet's spec moved"
        );

        webhook.stop().await;
        delete_webhook_configurations(&cluster).await;
        drop(ns);
    })
    .await;
}

fn addon_agent_image(js: &DynamicObject) -> String {
    agent_image(js).unwrap_or_else(|| "none".to_owned())
}

/// The agent's image in the pod template of each Job of JobSet `name`, or an error while it has
/// no Job.
async fn jobs_agent_images(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Vec<String>, String> {
    let api: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), namespace);
    let list = api
        .list(&ListParams::default().labels(&format!("jobset.sigs.k8s.io/jobset-name={name}")))
        .await
        .map_err(|e| e.to_string())?;
    if list.items.is_empty() {
        return Err(format!("no Job of {name} yet"));
    }
    Ok(list
        .items
        .iter()
        .map(|job| {
            let spec = serde_json::to_value(&job.spec).unwrap_or_default();
            spec["template"]["spec"]["initContainers"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["name"] == "jobset-inplace-agent"))
                .and_then(|c| c["image"].as_str())
                .unwrap_or("none")
                .to_owned()
        })
        .collect())
}

/// The version stamp of a JobSet's injection (its first replicatedJob's pod template).
fn injected_stamp(js: &DynamicObject) -> Value {
    js.data["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["annotations"]
        [INJECTED_ANNOTATION]
        .clone()
}

/// An upgrade of jobset-inplace under Kubeflow Trainer v2.3: the webhook that injected an older
/// agent (image tag 0.0.9) replaced by this version's. Then, with Trainer reconciling every
/// TrainJob again (each JobSet and TrainJob touched):
/// - a running TrainJob's JobSet keeps its stored injection (image, stamp, spec, generation) and
///   Trainer reports no failed reconcile (v2.3 applies a running JobSet no more);
/// - a suspended TrainJob's JobSet keeps its stored injection too, because JobSet v0.12 holds a
///   replicatedJob's pod template immutable even while suspended: Trainer's re-applies while
///   suspended and the one that resumes it are admitted (no failed reconcile) and the Jobs it
///   then gets run the old agent, until the TrainJob is recreated;
/// - a TrainJob created after the upgrade gets the new injection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trainjobs_across_an_upgrade_keep_a_running_injection_and_take_the_new_one_where_they_may()
{
    const TEST: &str =
        "trainjobs_across_an_upgrade_keep_a_running_injection_and_take_the_new_one_where_they_may";
    const OLD_IMAGE: &str = "ghcr.io/jobset-inplace/jobset-inplace:0.0.9";
    with_cluster(TEST, |cluster| async move {
        if !addon_started(&cluster, TEST, "trainer") {
            return;
        }
        let new_image = jobset_inplace::admission::InjectionConfig::defaults(
            jobset_inplace::protocol::Dialect::Epoch,
        )
        .image;
        assert_ne!(new_image, OLD_IMAGE);
        let old = serve_webhook_with(&cluster, &["--agent-image", OLD_IMAGE]).await;
        let ns = TestNamespace::create(&cluster, "rc-trainer-upgrade").await;
        let runtime = format!("{}-inplace", ns.name);
        let _leftovers = ClusterObjects {
            kubeconfig: cluster.kubeconfig.clone(),
            objects: vec![(
                "clustertrainingruntime.trainer.kubeflow.org",
                runtime.clone(),
            )],
        };
        let pp = PostParams::default();
        let runtimes = api_of(&cluster.client, TRAINING_RUNTIME, None);
        let template = in_place_runtime(&runtime);
        eventually(
            "the ClusterTrainingRuntime",
            Duration::from_secs(60),
            || async {
                runtimes
                    .create(&pp, &template)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        )
        .await;
        let trainjobs = api_of(&cluster.client, TRAIN_JOB, Some(&ns.name));
        let jobsets = jobset_api(&cluster.client, &ns.name);
        let injected_image = |name: &'static str| {
            let jobsets = jobsets.clone();
            move || {
                let jobsets = jobsets.clone();
                async move {
                    let js = jobsets.get(name).await.map_err(|e| e.to_string())?;
                    let image = addon_agent_image(&js);
                    (image != "none")
                        .then_some(image)
                        .ok_or("not injected".to_owned())
                }
            }
        };
        // The old webhook in force before the TrainJobs: their JobSets must come out injected.
        eventually(
            "the old webhook in force",
            Duration::from_secs(60),
            || async {
                let dry_run = PostParams {
                    dry_run: true,
                    ..Default::default()
                };
                let js = jobsets
                    .create(&dry_run, &train_jobset(&ns.name, 2))
                    .await
                    .map_err(|e| e.to_string())?;
                let image = addon_agent_image(&js);
                (image == OLD_IMAGE).then_some(()).ok_or(image)
            },
        )
        .await;
        for (name, suspend) in [("running", false), ("waiting", true)] {
            trainjobs
                .create(&pp, &train_job(name, &runtime, suspend))
                .await
                .unwrap_or_else(|e| panic!("TrainJob {name}: {e}"));
            let image = eventually(
                &format!("{name} injected"),
                Duration::from_secs(60),
                injected_image(name),
            )
            .await;
            assert_eq!(image, OLD_IMAGE, "{name}");
        }
        let agents = eventually(
            "the Jobs of the running JobSet",
            Duration::from_secs(60),
            || jobs_agent_images(&cluster.client, &ns.name, "running"),
        )
        .await;
        assert!(agents.iter().all(|a| a == OLD_IMAGE), "{agents:?}");
        let running = settled(&jobsets, "running").await;
        let waiting = settled(&jobsets, "waiting").await;
        assert_eq!(running.data["spec"]["suspend"], false);
        assert_eq!(waiting.data["spec"]["suspend"], true);
        assert!(injected_stamp(&running).is_string(), "{:?}", running.data);

        // The upgrade: the webhook replaced by this version's, in force once a dry run comes back
        // with the new agent.
        old.stop().await;
        let new = serve_webhook(&cluster).await;
        eventually(
            "the new webhook in force",
            Duration::from_secs(60),
            || async {
                let dry_run = PostParams {
                    dry_run: true,
                    ..Default::default()
                };
                let js = jobsets
                    .create(&dry_run, &train_jobset(&ns.name, 2))
                    .await
                    .map_err(|e| e.to_string())?;
                let image = addon_agent_image(&js);
                (image == new_image).then_some(()).ok_or(image)
            },
        )
        .await;

        // Trainer reconciles both TrainJobs again (it watches their JobSets and them).
        for name in ["running", "waiting"] {
            let touch = merge(json!({"metadata": {"labels": {"rc-touch": "upgraded"}}}));
            jobsets
                .patch(name, &PatchParams::default(), &touch)
                .await
                .expect("touch the JobSet");
            trainjobs
                .patch(name, &PatchParams::default(), &touch)
                .await
                .expect("touch the TrainJob");
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        for (name, before) in [("running", &running), ("waiting", &waiting)] {
            let after = settled(&jobsets, name).await;
            assert_eq!(after.data["spec"], before.data["spec"], "{name}");
            assert_eq!(
                after.metadata.generation, before.metadata.generation,
                "{name}"
            );
            assert_eq!(addon_agent_image(&after), OLD_IMAGE, "{name}");
            assert_eq!(injected_stamp(&after), injected_stamp(before), "{name}");
        }
        let failures = trainer_failures(&cluster.client, &ns.name)
            .await
            .expect("events");
        assert!(
            failures.is_empty(),
            "Trainer's reconciles failed: {failures:?}"
        );

        // The suspended TrainJob resumed: Trainer applies its JobSet unsuspended (a spec change,
        // through both webhooks), which keeps the stored injection; its Jobs run the old agent.
        let seen = mutations(&new).await;
        trainjobs
            .patch(
                "waiting",
                &PatchParams::default(),
                &merge(json!({"spec": {"suspend": false}})),
            )
            .await
            .expect("resume the TrainJob");
        let agents = eventually(
            "the Jobs of the resumed JobSet",
            Duration::from_secs(60),
            || jobs_agent_images(&cluster.client, &ns.name, "waiting"),
        )
        .await;
        assert!(agents.iter().all(|a| a == OLD_IMAGE), "{agents:?}");
        // That apply went through the new webhook (its counter moves once it has answered).
        eventually(
            "Trainer's resuming apply reviewed by the new webhook",
            Duration::from_secs(10),
            || async {
                let now = mutations(&new).await;
                (now > seen)
                    .then_some(())
                    .ok_or(format!("mutations {seen} -> {now}"))
            },
        )
        .await;
        let resumed = settled(&jobsets, "waiting").await;
        assert_eq!(resumed.data["spec"]["suspend"], false);
        assert_eq!(addon_agent_image(&resumed), OLD_IMAGE);
        assert_eq!(injected_stamp(&resumed), injected_stamp(&waiting));
        let failures = trainer_failures(&cluster.client, &ns.name)
            .await
            .expect("events");
        assert!(
            failures.is_empty(),
            "Trainer's reconciles failed: {failures:?}"
        );

        // A TrainJob created after the upgrade gets the new injection, and its Jobs the new agent.
        trainjobs
            .create(&pp, &train_job("fresh", &runtime, false))
            .await
            .expect("a TrainJob after the upgrade");
        let image = eventually(
            "fresh injected",
            Duration::from_secs(60),
            injected_image("fresh"),
        )
        .await;
        assert_eq!(image, new_image);
        let agents = eventually(
            "the Jobs of the fresh JobSet",
            Duration::from_secs(60),
            || jobs_agent_images(&cluster.client, &ns.name, "fresh"),
        )
        .await;
        assert!(agents.iter().all(|a| *a == new_image), "{agents:?}");

        new.stop().await;
        delete_webhook_configurations(&cluster).await;
        drop(ns);
    })
    .await;
}
