//! Admission: the webhook binary behind the overlay's own webhook configurations

use super::*;

/// Every value of `want` is in `got` (objects compared key by key, the rest exactly): what the
/// API server added (defaults) does not count, what it dropped (pruning) does.
fn missing(want: &Value, got: &Value, path: &str, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, v) in w {
                match g.get(k) {
                    Some(gv) => missing(v, gv, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k} missing")),
                }
            }
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                missing(wv, gv, &format!("{path}[{i}]"), out);
            }
        }
        _ if want == got => {}
        // A quantity written as a number comes back as a string.
        (Value::Number(n), Value::String(s)) if n.to_string() == *s => {}
        _ => out.push(format!("{path}: want {want}, got {got}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_injects_denies_and_fails_as_configured() {
    with_cluster("the_webhook_injects_denies_and_fails_as_configured", |cluster| async move {
        let ns = TestNamespace::create(&cluster, "rc-webhook").await;
        let jobsets = jobset_api(&cluster.client, &ns.name);
        let pp = PostParams::default();
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };

        let webhook = serve_webhook(&cluster).await;
        // The API server picks the configurations up within moments: wait for a dry run to come
        // back injected.
        eventually("the configurations in force", Duration::from_secs(30), || async {
            let js = jobsets
                .create(&dry_run, &build::JobSet::from_value(fixture_object("story1-plain")).name("probe").namespace(&ns.name).typed::<DynamicObject>())
                .await
                .map_err(|e| e.to_string())?;
            let annotations = js.data["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["annotations"].clone();
            if serde_json::to_string(&js.data).unwrap_or_default().contains(INJECTED_ANNOTATION) {
                Ok(())
            } else {
                Err(format!("not injected yet: {annotations}"))
            }
        })
        .await;

        // A plain InPlaceRestart JobSet is stored injected: everything the webhook's answer for
        // this fixture holds (fixtures/admission/story1-plain/mutated.yaml) survives the CRD's
        // pruning and defaulting.
        jobsets
            .create(&pp, &build::JobSet::from_value(fixture_object("story1-plain")).name("plain").namespace(&ns.name).typed::<DynamicObject>())
            .await
            .expect("a plain InPlaceRestart JobSet is admitted");
        let stored = jobsets.get("plain").await.expect("stored");
        let want = fixture_yaml("story1-plain", "mutated.yaml");
        let mut lost = Vec::new();
        missing(&want["spec"], &stored.data["spec"], "spec", &mut lost);
        assert!(lost.is_empty(), "the stored JobSet lost what the webhook injected: {lost:#?}");

        // A broken one is denied with every violation's field path (but those JobSet's own
        // webhook denies too: see `JobSet::as_jobset_requires` of the test kit's builder).
        let expected = fixture_yaml("violations-all", "expected.yaml");
        let mut want_fields: Vec<String> = expected["validate"]["violations"]
            .as_array()
            .expect("violations")
            .iter()
            .map(|v| v.as_str().expect("path").to_owned())
            .filter(|p| {
                !p.ends_with(".backoffLimit")
                    && !p.ends_with(".podReplacementPolicy")
                    && !p.ends_with(".completions")
            })
            .collect();
        assert!(want_fields.len() >= 5, "{want_fields:?}");
        let (code, _, message, mut fields) = api_error(
            jobsets
                .create(&pp, &build::JobSet::from_value(fixture_object("violations-all")).name("broken").namespace(&ns.name).as_jobset_requires().typed::<DynamicObject>())
                .await,
        )
        .expect("a broken JobSet is denied");
        assert_eq!(code, 422, "{message}");
        assert!(
            message.contains("admission webhook \"validate.jobset-inplace.dev\" denied the request"),
            "{message}"
        );
        want_fields.sort();
        fields.sort();
        assert_eq!(fields, want_fields, "{message}");

        // An UPDATE that breaks the stored JobSet is denied too (by both webhooks: JobSet's holds
        // replicatedJobs immutable, so either answer may come first).
        let (code, _, message, _) = api_error(
            jobsets
                .patch(
                    "plain",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}, "spec": {"replicatedJobs": [{"name": "workers", "replicas": 4, "template": {"spec": {"completions": 16, "parallelism": 16, "backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "worker", "image": "x"}]}}}}}]}})),
                )
                .await,
        )
        .expect("a breaking update is denied");
        assert!(
            message.contains("validate.jobset-inplace.dev") || message.contains("vjobset.kb.io"),
            "{code} {message}"
        );

        // Issue 21 item 4, through the real API server: the agent's token handed to every
        // container (no account named and the token automounted; the agent's account named
        // with it automounted), or a volume of the template's own taken for the agent's token:
        // each denied, naming the field, and nothing stored.
        // Issue 34: a worker that mounts the agent's token volume, a token of its own projected
        // in a pod that runs as the agent's account, a container named like the agent: each
        // denied, naming the field (before, each was stored); the agent's account named with
        // automountServiceAccountToken true is refused by the injection itself now.
        let pod = "spec.replicatedJobs[0].template.spec.template.spec";
        for (case, name, webhook, field) in [
            ("automount-token-with-chosen-account", "token-automount", "mutate", "automountServiceAccountToken"),
            ("token-volume-name-taken", "token-volume", "mutate", "volumes[0] containers[0].volumeMounts[0]"),
            ("agent-account-automounts-token", "token-agent-account", "mutate", "automountServiceAccountToken"),
            ("token-volume-mounted-by-worker", "token-mounted", "mutate", "containers[0].volumeMounts[0]"),
            ("token-projected-for-agent-account", "token-projected", "mutate", "volumes[0]"),
            ("container-named-like-the-agent", "named-like-agent", "mutate", "containers[0].name"),
        ] {
            let (code, _, message, fields) = api_error(
                jobsets
                    .create(&pp, &build::JobSet::from_value(fixture_object(case)).name(name).namespace(&ns.name).as_jobset_requires().typed::<DynamicObject>())
                    .await,
            )
            .unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(code, 422, "{case}: {message}");
            assert!(
                message.contains(&format!("admission webhook \"{webhook}.jobset-inplace.dev\" denied the request")),
                "{case}: {message}"
            );
            let want: Vec<String> = field.split(' ').map(|f| format!("{pod}.{f}")).collect();
            assert_eq!(fields, want, "{case}: {message}");
            assert!(jobsets.get_opt(name).await.expect("get").is_none(), "{case}: nothing stored");
        }

        // Issue 34: the agent's account named, the token's automounting unset: stored with it
        // off and the token in the agent only (before: stored as written, every container got
        // the agent's token).
        let stored = jobsets
            .create(&pp, &build::JobSet::from_value(fixture_object("agent-account-named-token-unset")).name("token-named").namespace(&ns.name).as_jobset_requires().typed::<DynamicObject>())
            .await
            .expect("the agent's account named is injected");
        let stored = serde_json::to_value(&stored).expect("json");
        let spec = &stored["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"];
        assert_eq!(spec["automountServiceAccountToken"], false, "{spec}");
        assert_eq!(spec["volumes"][0]["name"], "jobset-inplace-agent-token", "{spec}");
        assert!(spec["containers"][0].get("volumeMounts").is_none(), "{spec}");

        // The webhook gone: an InPlaceRestart JobSet fails closed (the validating webhook's
        // failurePolicy: Fail), any other JobSet never reaches it.
        webhook.stop().await;
        // The mutating webhook's failure is ignored; the validating one's is the answer.
        let (code, _, message, _) =
            api_error(
                jobsets
                    .create(&pp, &build::JobSet::from_value(fixture_object("story1-plain")).name("closed").namespace(&ns.name).as_jobset_requires().typed::<DynamicObject>())
                    .await,
            )
                .expect("fails closed without the webhook");
        assert!(
            message.contains("failed calling webhook \"validate.jobset-inplace.dev\""),
            "{code} {message}"
        );
        assert!(
            jobsets.get_opt("closed").await.expect("get").is_none(),
            "nothing stored"
        );
        jobsets
            .create(&pp, &build::JobSet::from_value(fixture_object("not-in-place-restart")).name("other-strategy").namespace(&ns.name).typed::<DynamicObject>())
            .await
            .expect("a JobSet without InPlaceRestart never reaches the webhook");

        // Without the validating configuration, the mutating one's failurePolicy: Ignore lets
        // the JobSet through uninjected.
        kubectl(
            Some(&cluster.kubeconfig),
            &["delete", "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION],
        )
        .await
        .expect("delete the validating configuration");
        let stored = eventually("mutation ignored", Duration::from_secs(30), || async {
            jobsets
                .create(&pp, &build::JobSet::from_value(fixture_object("story1-plain")).name("ignored").namespace(&ns.name).as_jobset_requires().typed::<DynamicObject>())
                .await
                .map_err(|e| e.to_string())
        })
        .await;
        assert!(
            !serde_json::to_string(&stored.data)
                .expect("json")
                .contains(INJECTED_ANNOTATION),
            "stored uninjected"
        );

        delete_webhook_configurations(&cluster).await;
        drop(ns);
    })
    .await;
}

/// The JobSet of a fixture as the webhook injects it (its default config, the one `Webhook`
/// runs with): what `jobset-inplace inject` prints.
fn injected(object: &DynamicObject) -> DynamicObject {
    use jobset_inplace::admission::{self, InjectionConfig};
    let mut value = serde_json::to_value(object).expect("json");
    let config = InjectionConfig::defaults(jobset_inplace::protocol::Dialect::Epoch);
    let mutation = admission::mutate(&value, &config);
    assert!(!mutation.patch.0.is_empty(), "the fixture is injected");
    json_patch::patch(&mut value, &mutation.patch).expect("the patch applies");
    serde_json::from_value(value).expect("JobSet")
}

/// Kubeflow Trainer's case against the real API server, with JobSet's own webhooks (which hold
/// replicatedJobs immutable) in the chain when its controller runs: a client that applies (or
/// updates) its JobSet again as it built it, without what our webhook added, leaves the stored
/// JobSet as it was; with the webhook down, updates that do not touch the spec (a label, a
/// finalizer removed from a JobSet being deleted) still go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobset_written_again_without_its_injection_is_stored_unchanged() {
    with_cluster(
        "a_jobset_written_again_without_its_injection_is_stored_unchanged",
        |cluster| async move {
            let ns = TestNamespace::create(&cluster, "rc-rewrite").await;
            let jobsets = jobset_api(&cluster.client, &ns.name);
            let webhook = serve_webhook(&cluster).await;
            let dry_run = PostParams {
                dry_run: true,
                ..Default::default()
            };
            eventually(
                "the configurations in force",
                Duration::from_secs(30),
                || async {
                    let js = jobsets
                        .create(
                            &dry_run,
                            &build::JobSet::from_value(fixture_object("story1-plain"))
                                .name("probe")
                                .namespace(&ns.name)
                                .as_jobset_requires()
                                .typed::<DynamicObject>(),
                        )
                        .await
                        .map_err(|e| e.to_string())?;
                    if serde_json::to_string(&js.data)
                        .unwrap_or_default()
                        .contains(INJECTED_ANNOTATION)
                    {
                        Ok(())
                    } else {
                        Err("not injected yet".to_owned())
                    }
                },
            )
            .await;

            let name = "trained";
            // As a Go client (Kubeflow Trainer) writes it: quantities as strings, the form
            // JobSet's defaulting webhook gives them on CREATE (an apply of `4` over `"4"` would
            // change the spec whatever the injection does).
            let plain = {
                let mut js = serde_json::to_value(
                    build::JobSet::from_value(fixture_object("story1-plain"))
                        .name(name)
                        .namespace(&ns.name)
                        .as_jobset_requires()
                        .typed::<DynamicObject>(),
                )
                .expect("json");
                for c in js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
                    ["containers"]
                    .as_array_mut()
                    .expect("containers")
                {
                    for kind in ["requests", "limits"] {
                        for q in c["resources"][kind].as_object_mut().into_iter().flatten() {
                            if let Value::Number(n) = q.1 {
                                *q.1 = Value::String(n.to_string());
                            }
                        }
                    }
                }
                serde_json::from_value::<DynamicObject>(js).expect("JobSet")
            };
            let trainer = PatchParams::apply("trainer").force();
            // The trainer applies the injected JobSet first, so that it owns every field the
            // injection holds and a later apply without them removes them.
            let first = jobsets
                .patch(name, &trainer, &Patch::Apply(&injected(&plain)))
                .await
                .expect("the injected JobSet is applied");
            let agents = |js: &DynamicObject| {
                js.data["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
                    ["initContainers"]
                    .as_array()
                    .map(|l| l.iter().filter(|c| c["name"] == "jobset-inplace-agent").count())
                    .unwrap_or(0)
            };
            assert_eq!(agents(&first), 1);
            let generation = first.metadata.generation;

            // The plain JobSet applied over it: the apply removes what the trainer no longer
            // applies, the mutating webhook (on UPDATE) puts it back, and the validating webhooks
            // (ours, JobSet's immutability) see the spec as it was.
            let second = jobsets
                .patch(name, &trainer, &Patch::Apply(&plain))
                .await
                .expect("the plain JobSet is applied over the injected one");
            assert_eq!(
                second.data["spec"], first.data["spec"],
                "the spec is unchanged"
            );
            assert_eq!(
                second.metadata.generation, generation,
                "no spec change seen"
            );
            // Applied again: nothing changes at all, not even the resourceVersion. (JobSet's
            // controller may write the status meanwhile: the resourceVersion is read just
            // before; a JobSet that changed on every apply would change on each attempt.)
            let mut no_op = Err(String::new());
            for _ in 0..5 {
                let before = jobsets.get(name).await.expect("get");
                let third = jobsets
                    .patch(name, &trainer, &Patch::Apply(&plain))
                    .await
                    .expect("applied again");
                assert_eq!(third.data["spec"], first.data["spec"]);
                no_op = if third.metadata.resource_version == before.metadata.resource_version {
                    Ok(())
                } else {
                    Err(format!(
                        "resourceVersion {:?} -> {:?}",
                        before.metadata.resource_version, third.metadata.resource_version
                    ))
                };
                if no_op.is_ok() {
                    break;
                }
            }
            no_op.expect("an apply of the same JobSet again is a no-op");

            // An update of the stored JobSet without the agent, its account and token, and the
            // injected annotation (a client that writes back what it built): stored unchanged.
            // Read just before and retried on a conflict, as a client does.
            let fourth = eventually("the update admitted", Duration::from_secs(30), || async {
                let mut written = jobsets.get(name).await.map_err(|e| e.to_string())?;
                let template =
                    &mut written.data["spec"]["replicatedJobs"][0]["template"]["spec"]["template"];
                if let Some(a) = template["metadata"]["annotations"].as_object_mut() {
                    a.remove(INJECTED_ANNOTATION);
                }
                let pod = template["spec"].as_object_mut().expect("pod spec");
                for key in [
                    "initContainers",
                    "serviceAccountName",
                    "automountServiceAccountToken",
                    "volumes",
                ] {
                    assert!(pod.remove(key).is_some(), "{key} was injected");
                }
                match jobsets
                    .replace(name, &PostParams::default(), &written)
                    .await
                {
                    Ok(js) => Ok(js),
                    Err(kube::Error::Api(e)) if e.code == 409 => Err(e.message),
                    Err(e) => panic!("an update without the injection is admitted: {e}"),
                }
            })
            .await;
            assert_eq!(
                fourth.data["spec"], first.data["spec"],
                "the spec is unchanged"
            );
            assert_eq!(fourth.metadata.generation, generation);

            // The webhook down: what does not touch the spec still goes through.
            webhook.stop().await;
            let relabelled = jobsets
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"team": "b"},
                                                      "finalizers": ["example.com/keep"]}})),
                )
                .await
                .expect("a metadata-only update with the webhook down");
            assert_eq!(relabelled.data["spec"], first.data["spec"]);
            jobsets
                .delete(name, &DeleteParams::default())
                .await
                .expect("delete");
            let deleting = jobsets.get(name).await.expect("held by its finalizer");
            assert!(deleting.metadata.deletion_timestamp.is_some());
            jobsets
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await
                .expect("the finalizer of a JobSet being deleted is removed with the webhook down");
            eventually("the JobSet is gone", Duration::from_secs(30), || async {
                match jobsets.get_opt(name).await {
                    Ok(None) => Ok(()),
                    Ok(Some(_)) => Err("still there".to_owned()),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await;

            delete_webhook_configurations(&cluster).await;
            drop(ns);
        },
    )
    .await;
}

/// `story1-plain` as JobSet accepts it, renamed, as a Go client (Kubeflow Trainer) writes it:
/// quantities as strings, the form JobSet's defaulting webhook gives them on CREATE (an apply of
/// `4` over `"4"` would change the spec whatever the injection does).
fn plain_as_go_writes(name: &str, namespace: &str, suspend: bool) -> DynamicObject {
    let mut js = serde_json::to_value(
        build::JobSet::from_value(fixture_object("story1-plain"))
            .name(name)
            .namespace(namespace)
            .as_jobset_requires()
            .typed::<DynamicObject>(),
    )
    .expect("json");
    for c in js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
    {
        for kind in ["requests", "limits"] {
            for q in c["resources"][kind].as_object_mut().into_iter().flatten() {
                if let Value::Number(n) = q.1 {
                    *q.1 = Value::String(n.to_string());
                }
            }
        }
    }
    if suspend {
        js["spec"]["suspend"] = json!(true);
    }
    serde_json::from_value(js).expect("JobSet")
}

/// An upgrade of jobset-inplace under running (and suspended) JobSets, against the real API
/// server with JobSet's own webhooks, which hold a replicatedJob's containers immutable, suspended
/// or not: the webhook first injects an older agent image; replaced by one that injects another,
/// a client's re-apply (server-side apply as Kubeflow Trainer does) and update of each JobSet as
/// it built it are admitted and leave the stored injection as it was; a JobSet created after the
/// upgrade gets the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_keeps_the_stored_injection_of_running_jobsets() {
    with_cluster(
        "an_upgrade_keeps_the_stored_injection_of_running_jobsets",
        |cluster| async move {
            const OLD: &str = "ghcr.io/jobset-inplace/jobset-inplace:0.0.9";
            let ns = TestNamespace::create(&cluster, "rc-upgrade").await;
            let jobsets = jobset_api(&cluster.client, &ns.name);
            let configurations: Vec<Value> = install(&cluster, "epoch")
                .await
                .into_iter()
                .filter(|o| {
                    o["kind"] == "MutatingWebhookConfiguration"
                        || o["kind"] == "ValidatingWebhookConfiguration"
                })
                .collect();
            // The webhook injects `image` once its configurations point at it.
            let serve = |webhook: &Webhook, image: String| {
                let pointed = pointed_at(&configurations, webhook);
                let cluster = &cluster;
                let jobsets = &jobsets;
                let ns = ns.name.clone();
                async move {
                    apply(cluster, &pointed)
                        .await
                        .expect("webhook configurations");
                    let dry_run = PostParams {
                        dry_run: true,
                        ..Default::default()
                    };
                    eventually("the webhook in force", Duration::from_secs(30), || async {
                        let js = jobsets
                            .create(&dry_run, &plain_as_go_writes("probe", &ns, false))
                            .await
                            .map_err(|e| e.to_string())?;
                        match agent_image(&js) {
                            Some(i) if i == image => Ok(()),
                            other => Err(format!("injects {other:?}")),
                        }
                    })
                    .await;
                }
            };
            let old = Webhook::start_with(&["--agent-image", OLD]).await;
            serve(&old, OLD.to_owned()).await;
            let trainer = PatchParams::apply("trainer").force();
            let mut stored = Vec::new();
            for (name, suspend) in [("running", false), ("queued", true)] {
                let plain = plain_as_go_writes(name, &ns.name, suspend);
                let created = jobsets
                    .patch(name, &trainer, &Patch::Apply(&plain))
                    .await
                    .expect("created by an apply, injected by the old webhook");
                assert_eq!(agent_image(&created).as_deref(), Some(OLD), "{name}");
                stored.push((name, suspend, plain, created));
            }

            // The upgrade: the webhook replaced by one that injects another image.
            old.stop().await;
            let new = Webhook::start().await;
            let new_image = jobset_inplace::admission::InjectionConfig::defaults(
                jobset_inplace::protocol::Dialect::Epoch,
            )
            .image;
            assert_ne!(new_image, OLD);
            serve(&new, new_image.clone()).await;

            for (name, suspend, plain, created) in &stored {
                let reapplied = jobsets
                    .patch(name, &trainer, &Patch::Apply(plain))
                    .await
                    .unwrap_or_else(|e| panic!("{name}: the re-apply after the upgrade: {e}"));
                assert_eq!(reapplied.data["spec"], created.data["spec"], "{name}");
                assert_eq!(
                    reapplied.metadata.generation, created.metadata.generation,
                    "{name}"
                );
                // An update without any of the injection (a client writing back what it built).
                let updated = eventually("the update admitted", Duration::from_secs(30), || async {
                    let mut written = jobsets.get(name).await.map_err(|e| e.to_string())?;
                    let template = &mut written.data["spec"]["replicatedJobs"][0]["template"]
                        ["spec"]["template"];
                    if let Some(a) = template["metadata"]["annotations"].as_object_mut() {
                        a.remove(INJECTED_ANNOTATION);
                    }
                    let pod = template["spec"].as_object_mut().expect("pod spec");
                    for key in [
                        "initContainers",
                        "serviceAccountName",
                        "automountServiceAccountToken",
                        "volumes",
                    ] {
                        assert!(pod.remove(key).is_some(), "{name}: {key} was injected");
                    }
                    match jobsets.replace(name, &PostParams::default(), &written).await {
                        Ok(js) => Ok(js),
                        Err(kube::Error::Api(e)) if e.code == 409 => Err(e.message),
                        Err(e) => panic!("{name} (suspended: {suspend}): the update: {e}"),
                    }
                })
                .await;
                assert_eq!(updated.data["spec"], created.data["spec"], "{name}");
                assert_eq!(agent_image(&updated).as_deref(), Some(OLD), "{name}");
            }

            // A JobSet created after the upgrade gets the new injection.
            let fresh = jobsets
                .patch(
                    "fresh",
                    &trainer,
                    &Patch::Apply(&plain_as_go_writes("fresh", &ns.name, false)),
                )
                .await
                .expect("a new JobSet");
            assert_eq!(agent_image(&fresh).as_deref(), Some(new_image.as_str()));

            new.stop().await;
            delete_webhook_configurations(&cluster).await;
            drop(ns);
        },
    )
    .await;
}
