//! Webhook configurations, Service, PodDisruptionBudget

use super::*;

/// Whether a webhook's matchConditions all hold for a CREATE of `object`.
fn webhook_matches(webhook: &Value, object: &Value) -> bool {
    let request =
        json!({"operation": "CREATE", "namespace": "team-a", "userInfo": {"username": "alice"}});
    let conditions = webhook["matchConditions"]
        .as_array()
        .expect("matchConditions");
    assert!(!conditions.is_empty());
    conditions.iter().all(|c| {
        cel_bool(
            c["expression"].as_str().expect("expression"),
            &[
                ("object", object),
                ("oldObject", &Value::Null),
                ("request", &request),
            ],
            &HashMap::new(),
        )
    })
}

/// JobSets (or what claims to be one) the match conditions must sort as the code does.
fn jobset_objects() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let story1 = fixtures::read_yaml(
        &fixtures::manifest_dir().join("fixtures/admission/story1-plain/request.json"),
    );
    out.push(("story1".to_owned(), story1["request"]["object"].clone()));
    let other = fixtures::read_yaml(
        &fixtures::manifest_dir().join("fixtures/admission/not-in-place-restart/request.yaml"),
    );
    out.push((
        "not-in-place-restart".to_owned(),
        other["request"]["object"].clone(),
    ));
    for file in [
        "jobset-main-container-agent.yaml",
        "jobset-sidecar-agent.yaml",
    ] {
        let path = fixtures::reference_dir().join(file);
        let text = std::fs::read_to_string(&path).expect("example fixture");
        for v in serde_saphyr::from_multiple::<Value>(&text).expect("yaml") {
            if v["kind"] == "JobSet" {
                out.push((file.to_owned(), v));
            }
        }
    }
    let base = |spec: Value| json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "x"}, "spec": spec});
    out.push(("no spec".into(), json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "x"}})));
    out.push((
        "no failurePolicy".into(),
        base(json!({"replicatedJobs": []})),
    ));
    out.push((
        "no restartStrategy".into(),
        base(json!({"failurePolicy": {"maxRestarts": 3}})),
    ));
    for strategy in [
        "Recreate",
        "BlockingRecreate",
        "InPlaceRestart",
        "inplacerestart",
    ] {
        out.push((
            strategy.into(),
            base(json!({"failurePolicy": {"restartStrategy": strategy, "maxRestarts": 1}})),
        ));
    }
    out
}

#[test]
fn the_match_conditions_select_exactly_in_place_restart_jobsets() {
    let objects = jobset_objects();
    let in_place: Vec<&str> = objects
        .iter()
        .filter(|(_, o)| o["spec"]["failurePolicy"]["restartStrategy"] == "InPlaceRestart")
        .map(|(n, _)| n.as_str())
        .collect();
    assert!(
        in_place.contains(&"story1") && in_place.contains(&"InPlaceRestart"),
        "{in_place:?}"
    );
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        for kind in [
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ] {
            let webhook = &r.get(kind, "jobset-inplace")["webhooks"][0];
            for (what, object) in &objects {
                let code: jobset_inplace::jobset::JobSet = serde_json::from_value(object.clone())
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(
                    webhook_matches(webhook, object),
                    code.is_in_place_restart(),
                    "{name} {kind}: {what}"
                );
            }
        }
    }
}

/// The validating webhook fails closed, but only where that protects something: a CREATE and
/// an UPDATE that changes the spec are sent to it; an UPDATE of metadata alone (labels, a
/// finalizer removed by the garbage collector) and anything about an object being deleted are
/// not, so that an outage of the webhook does not block them. The mutating webhook is called
/// for the same requests: an UPDATE that leaves the spec as it was has nothing to re-inject.
#[test]
fn validation_is_called_only_where_it_protects_something() {
    let story1 = fixtures::read_yaml(
        &fixtures::manifest_dir().join("fixtures/admission/story1-full/request.yaml"),
    )["request"]["object"]
        .clone();
    let mut relabelled = story1.clone();
    relabelled["metadata"]["labels"] = json!({"team": "b"});
    let mut spec_changed = story1.clone();
    spec_changed["spec"]["suspend"] = json!(true);
    let mut deleting = story1.clone();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-11-26T08:00:00Z");
    deleting["metadata"]["finalizers"] = json!(["example.com/keep"]);
    let mut finalizer_removed = deleting.clone();
    finalizer_removed["metadata"]["finalizers"] = json!([]);
    let mut deleting_spec_changed = deleting.clone();
    deleting_spec_changed["spec"]["suspend"] = json!(true);
    let cases: [(&str, &str, &Value, &Value, bool); 5] = [
        ("create", "CREATE", &story1, &Value::Null, true),
        ("spec change", "UPDATE", &spec_changed, &story1, true),
        ("labels only", "UPDATE", &relabelled, &story1, false),
        (
            "finalizer removal while deleting",
            "UPDATE",
            &finalizer_removed,
            &deleting,
            false,
        ),
        (
            "spec change while deleting",
            "UPDATE",
            &deleting_spec_changed,
            &deleting,
            false,
        ),
    ];
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        for kind in [
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
        ] {
            let webhook = &r.get(kind, "jobset-inplace")["webhooks"][0];
            let conditions = webhook["matchConditions"].as_array().expect("conditions");
            for (what, operation, object, old, sent) in &cases {
                let request = json!({"operation": operation, "namespace": "team-a",
                                 "userInfo": {"username": "alice"}});
                let matched = conditions.iter().all(|c| {
                    cel_bool(
                        c["expression"].as_str().expect("expression"),
                        &[
                            ("object", object),
                            ("oldObject", old),
                            ("request", &request),
                        ],
                        &HashMap::new(),
                    )
                });
                assert_eq!(matched, *sent, "{name} {kind}: {what}");
            }
        }
    }
}

#[tokio::test]
async fn webhook_configurations_call_the_served_paths_with_the_right_policies() {
    use jobset_inplace::jobset::{GROUP, PLURAL, VERSION};
    use tower::ServiceExt;
    let default_args = match Cli::try_parse_from(["jobset-inplace", "webhook"])
        .expect("parses")
        .command
    {
        Sub::Webhook(a) => a,
        _ => unreachable!(),
    };
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let service = r.get("Service", "jobset-inplace-webhook");
        let container = r.container("jobset-inplace-webhook", "webhook");
        let pdb = r.get("PodDisruptionBudget", "jobset-inplace-webhook");
        let deployment = r.deployment("jobset-inplace-webhook");
        let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
        let selects = |selector: &Value| {
            selector
                .as_object()
                .into_iter()
                .flatten()
                .all(|(k, v)| pod_labels[k] == *v)
        };
        assert!(
            selects(&service["spec"]["selector"]),
            "{name}: Service selects the webhook pods"
        );
        assert!(
            selects(&pdb["spec"]["selector"]["matchLabels"]),
            "{name}: PDB selects them"
        );
        assert!(
            selects(&deployment["spec"]["selector"]["matchLabels"]),
            "{name}"
        );
        // One replica at a time, never all: a drain proceeds while one serves.
        assert_eq!(pdb["spec"]["maxUnavailable"], 1, "{name}");
        assert!(pdb["spec"].get("minAvailable").is_none(), "{name}");
        assert_eq!(deployment["spec"]["replicas"], 2, "{name}");
        let anti = &deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"];
        let term = &anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"];
        assert!(
            selects(&term["labelSelector"]["matchLabels"]),
            "{name}: anti-affinity"
        );

        let ports = service["spec"]["ports"].as_array().expect("ports");
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0]["port"], 443);
        let target = ports[0]["targetPort"].as_str().map_or_else(
            || {
                ports[0]["targetPort"]
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or(0)
            },
            |named| port_named(container, named),
        );
        assert_eq!(target, 8443, "{name}: 443 -> 8443");

        for (kind, path, operations, failure) in [
            (
                "MutatingWebhookConfiguration",
                "/mutate",
                json!(["CREATE", "UPDATE"]),
                "Ignore",
            ),
            (
                "ValidatingWebhookConfiguration",
                "/validate",
                json!(["CREATE", "UPDATE"]),
                "Fail",
            ),
        ] {
            let what = format!("{name} {kind}");
            let config = r.get(kind, &default_args.webhook_config);
            let webhooks = config["webhooks"].as_array().expect("webhooks");
            assert_eq!(webhooks.len(), 1, "{what}");
            let w = &webhooks[0];
            assert_eq!(
                w["clientConfig"]["service"],
                json!({"name": service["metadata"]["name"], "namespace": NAMESPACE, "path": path, "port": 443}),
                "{what}"
            );
            assert!(w["clientConfig"]["url"].is_null(), "{what}");
            assert_eq!(
                w["rules"],
                json!([{"apiGroups": [GROUP], "apiVersions": [VERSION], "operations": operations,
                        "resources": [PLURAL], "scope": "Namespaced"}]),
                "{what}: the main resource only (status writes stay out)"
            );
            assert_eq!(w["failurePolicy"], failure, "{what}");
            assert_eq!(w["sideEffects"], "None", "{what}");
            assert_eq!(w["timeoutSeconds"], 5, "{what}");
            assert_eq!(w["admissionReviewVersions"], json!(["v1"]), "{what}");
            assert_eq!(w["matchPolicy"], "Equivalent", "{what}");
            if kind.starts_with("Mutating") {
                assert_eq!(w["reinvocationPolicy"], "IfNeeded", "{what}");
            }
            assert_eq!(
                w["namespaceSelector"],
                json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                             "values": ["kube-system", NAMESPACE]}]}),
                "{what}"
            );
            match name {
                "cert-manager" => assert_eq!(
                    config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
                    format!("{NAMESPACE}/jobset-inplace-webhook"),
                    "{what}"
                ),
                _ => assert!(config["metadata"]["annotations"].is_null(), "{what}"),
            }

            // The path is served: the story-1 review answers 200 with its uid.
            let body = std::fs::read(
                fixtures::manifest_dir().join("fixtures/admission/story1-plain/request.json"),
            )
            .expect("fixture");
            let uid =
                serde_json::from_slice::<Value>(&body).expect("json")["request"]["uid"].clone();
            let text = r.config_map()["data"]["config.yaml"]
                .as_str()
                .expect("config");
            let webhook = jobset_inplace::webhook::Webhook::new(load_config(Dialect::Epoch, text));
            let request = axum::http::Request::post(path)
                .header("content-type", "application/json")
                .body(axum::body::Body::from(body))
                .expect("request");
            let response = tokio::time::timeout(
                Duration::from_secs(10),
                jobset_inplace::webhook::router(webhook).oneshot(request),
            )
            .await
            .expect("in time")
            .expect("answered");
            assert_eq!(response.status(), 200, "{what}: {path} served");
            let bytes = http_body_util::BodyExt::collect(response.into_body())
                .await
                .expect("body")
                .to_bytes();
            let review: Value = serde_json::from_slice(&bytes).expect("AdmissionReview");
            assert_eq!(review["response"]["uid"], uid, "{what}");
        }
    }
}
