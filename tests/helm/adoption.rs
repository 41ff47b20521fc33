//! What a platform team's way of installing charts needs (issue 47): the chart as a subchart
//! (`global`, `enabled`), `namespaceOverride`, the webhooks' failure policy and timeout, the
//! ServiceMonitors' interval, a budget for the reconciler, `kubeVersion` as docs/reference.md
//! says, Chart.yaml's metadata, and nothing Argo CD cannot render (`lookup`, hooks).

use super::*;

/// Every kind the chart renders that has no namespace.
fn cluster_scoped(kind: &str) -> bool {
    matches!(
        kind,
        "ClusterRole"
            | "ClusterRoleBinding"
            | "MutatingWebhookConfiguration"
            | "ValidatingWebhookConfiguration"
            | "ValidatingAdmissionPolicy"
            | "ValidatingAdmissionPolicyBinding"
            | "CustomResourceDefinition"
            | "FlowSchema"
            | "PriorityLevelConfiguration"
    )
}

/// `helm template CHART` in `namespace` with `sets`: its text, or helm's error.
fn template_chart(
    helm: &Path,
    chart: &Path,
    namespace: &str,
    sets: &[&str],
) -> Result<String, String> {
    let mut args = vec![
        "template".to_owned(),
        RELEASE.to_owned(),
        chart.display().to_string(),
        "--namespace".to_owned(),
        namespace.to_owned(),
    ];
    args.extend(set_args(sets));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_helm(helm, &args)
}

/// Copies `from` into `to`, following links (as `helm package` does).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if std::fs::metadata(e.path()).expect("stat").is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

/// An umbrella chart with this one as its dependency (`condition: jobset-inplace.enabled`) and
/// `global` values: helm validates the subchart's values, globals and `enabled` included,
/// against this chart's schema.
#[test]
fn the_chart_renders_as_a_subchart_with_global_and_enabled() {
    let Some(helm) = helm() else { return };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let umbrella = dir.path().join("platform");
    copy_tree(&chart_dir(), &umbrella.join("charts/jobset-inplace"));
    std::fs::write(
        umbrella.join("Chart.yaml"),
        format!(
            "apiVersion: v2\nname: platform\nversion: 1.0.0\ndependencies:\n\
             - name: jobset-inplace\n  version: {}\n  condition: jobset-inplace.enabled\n",
            env!("CARGO_PKG_VERSION")
        ),
    )
    .expect("write Chart.yaml");
    std::fs::write(
        umbrella.join("values.yaml"),
        "global:\n  imageRegistry: registry.example.com\n  team: {name: ml-platform}\n\
         jobset-inplace:\n  enabled: true\n  dialect: jobset-native\n",
    )
    .expect("write values.yaml");
    let text = template_chart(&helm, &umbrella, NAMESPACE, &[])
        .unwrap_or_else(|e| panic!("the umbrella chart does not render: {e}"));
    let objects = parse_yaml_stream(&text, "the umbrella chart");
    let cm = object(&objects, "ConfigMap", "jobset-inplace-config");
    assert_eq!(
        cm["data"]["protocol"], "attempt",
        "the parent's values reach it"
    );
    // The same objects as the chart installed alone with the same values.
    let alone = template(&helm, &["dialect=jobset-native"]);
    let d = compare(&objects, &alone);
    assert!(d.is_empty(), "as a subchart it differs:\n{}", d.join("\n"));
    // The condition switches it off.
    let off = template_chart(
        &helm,
        &umbrella,
        NAMESPACE,
        &["jobset-inplace.enabled=false"],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        parse_yaml_stream(&off, "enabled=false").is_empty(),
        "enabled=false rendered objects"
    );
    // The schema takes them alone too, and still refuses a wrong type for each.
    for sets in [&["global.x=1"][..], &["enabled=false"]] {
        try_template(&helm, sets).unwrap_or_else(|e| panic!("{sets:?}: {e}"));
    }
    for (set, want) in [
        ("global=x", "at '/global': got string, want object"),
        ("enabled=maybe", "at '/enabled': got string, want boolean"),
    ] {
        let e = try_template(&helm, &[set]).expect_err(set);
        assert!(e.contains(want), "{set}: {e}");
    }
}

/// `namespaceOverride`: every namespaced object in it, and every reference to the namespace
/// (the webhook configurations' service, cert-manager's CA injection and certificate names, the
/// policies' and FlowSchemas' service accounts, the webhooks' excluded namespaces) follows. The
/// release's namespace appears nowhere in the rendering.
#[test]
fn namespace_override_moves_every_object_and_reference() {
    let Some(helm) = helm() else { return };
    let release_ns = "release-ns-not-used";
    let toggles = [
        "namespaceOverride=platform-system",
        "metrics.serviceMonitor.enabled=true",
        "metrics.prometheusRule.enabled=true",
        "metrics.dashboard.enabled=true",
        "networkPolicy.enabled=true",
    ];
    for certificates in ["self-signed", "cert-manager"] {
        let mut sets = toggles.to_vec();
        let c = format!("certificates={certificates}");
        sets.push(&c);
        let text = template_chart(&helm, &chart_dir(), release_ns, &sets)
            .unwrap_or_else(|e| panic!("{e}"));
        for (n, line) in text.lines().enumerate() {
            assert!(
                !line.contains(release_ns),
                "{certificates}: line {} names the release's namespace: {line}",
                n + 1
            );
        }
        let objects = parse_yaml_stream(&text, "namespaceOverride");
        for o in &objects {
            let kind = o["kind"].as_str().unwrap_or_default();
            let id = format!("{kind} {}", o["metadata"]["name"]);
            if cluster_scoped(kind) {
                assert!(o["metadata"]["namespace"].is_null(), "{id}");
            } else {
                assert_eq!(o["metadata"]["namespace"], "platform-system", "{id}");
            }
        }
        for kind in [
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ] {
            let w = object(&objects, kind, "jobset-inplace");
            assert_eq!(
                w["webhooks"][0]["clientConfig"]["service"]["namespace"], "platform-system",
                "{kind}"
            );
            let excluded = &w["webhooks"][0]["namespaceSelector"]["matchExpressions"][0];
            assert_eq!(
                excluded["values"],
                json!(["kube-system", "platform-system"]),
                "{kind}"
            );
            if certificates == "cert-manager" {
                assert_eq!(
                    w["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
                    "platform-system/jobset-inplace-webhook"
                );
            }
        }
        assert!(
            text.contains("system:serviceaccount:platform-system:jobset-inplace-reconciler"),
            "the reconciler's policies name its account in the namespace"
        );
        // The reconciler's schemas name its account (the agents' is ruled by the reconciler).
        for f in objects.iter().filter(|o| {
            o["kind"] == "FlowSchema" && o["metadata"]["name"] != "jobset-inplace-agents"
        }) {
            assert_eq!(
                f["spec"]["rules"][0]["subjects"][0]["serviceAccount"]["namespace"],
                "platform-system"
            );
        }
    }
    // Without it, the release's namespace.
    let objects = template(&helm, &[]);
    assert_eq!(
        object(&objects, "Deployment", "jobset-inplace-webhook")["metadata"]["namespace"],
        NAMESPACE
    );
    let e = try_template(&helm, &["namespaceOverride=Not_A_Namespace"]).expect_err("refused");
    assert!(e.contains("at '/namespaceOverride'"), "{e}");
}

/// `webhook.failurePolicy` sets the validating webhook's (the one that can refuse); the
/// mutating one stays `Ignore`. `webhook.timeoutSeconds` sets both.
#[test]
fn webhook_failure_policy_and_timeout_reach_the_configurations() {
    let Some(helm) = helm() else { return };
    let policies = |sets: &[&str]| {
        let objects = template(&helm, sets);
        let w = |kind: &str| object(&objects, kind, "jobset-inplace")["webhooks"][0].clone();
        let (m, v) = (
            w("MutatingWebhookConfiguration"),
            w("ValidatingWebhookConfiguration"),
        );
        (
            m["failurePolicy"].clone(),
            v["failurePolicy"].clone(),
            m["timeoutSeconds"].clone(),
            v["timeoutSeconds"].clone(),
        )
    };
    assert_eq!(
        policies(&[]),
        (json!("Ignore"), json!("Fail"), json!(5), json!(5)),
        "the defaults"
    );
    assert_eq!(
        policies(&["webhook.failurePolicy=Ignore", "webhook.timeoutSeconds=12"]),
        (json!("Ignore"), json!("Ignore"), json!(12), json!(12))
    );
    assert_eq!(
        policies(&["webhook.failurePolicy=Fail", "webhook.timeoutSeconds=30"]),
        (json!("Ignore"), json!("Fail"), json!(30), json!(30))
    );
    for (set, want) in [
        (
            "webhook.failurePolicy=Open",
            "at '/webhook/failurePolicy': value must be one of 'Fail', 'Ignore'",
        ),
        ("webhook.timeoutSeconds=0", "at '/webhook/timeoutSeconds'"),
        ("webhook.timeoutSeconds=31", "at '/webhook/timeoutSeconds'"),
    ] {
        let e = try_template(&helm, &[set]).expect_err(set);
        assert!(e.contains(want), "{set}: {e}");
    }
}

#[test]
fn service_monitor_interval_and_scrape_timeout_reach_both_endpoints() {
    let Some(helm) = helm() else { return };
    let endpoints = |sets: &[&str]| -> Vec<(Value, Value)> {
        let mut all = vec!["metrics.serviceMonitor.enabled=true"];
        all.extend(sets);
        template(&helm, &all)
            .into_iter()
            .filter(|o| o["kind"] == "ServiceMonitor")
            .map(|m| {
                let e = &m["spec"]["endpoints"][0];
                (e["interval"].clone(), e["scrapeTimeout"].clone())
            })
            .collect()
    };
    assert_eq!(endpoints(&[]), vec![(json!("30s"), json!("10s")); 2]);
    assert_eq!(
        endpoints(&[
            "metrics.serviceMonitor.interval=1m",
            "metrics.serviceMonitor.scrapeTimeout=45s"
        ]),
        vec![(json!("1m"), json!("45s")); 2]
    );
    for set in [
        "metrics.serviceMonitor.interval=soon",
        "metrics.serviceMonitor.interval=30",
        "metrics.serviceMonitor.scrapeTimeout=",
    ] {
        let e = try_template(&helm, &[set]).expect_err(set);
        assert!(e.contains("at '/metrics/serviceMonitor/"), "{set}: {e}");
    }
}

/// The reconciler's budget follows its replicas as the webhook's does: none at one replica
/// (it would block every drain of its node), `maxUnavailable: 1` selecting its pods above.
#[test]
fn the_reconciler_has_a_budget_with_more_than_one_replica() {
    let Some(helm) = helm() else { return };
    let budget = |replicas: &str| {
        let objects = template(&helm, &[&format!("reconciler.replicas={replicas}")]);
        let pod_labels = object(&objects, "Deployment", "jobset-inplace-reconciler")["spec"]
            ["template"]["metadata"]["labels"]
            .clone();
        let b: Vec<Value> = objects
            .into_iter()
            .filter(|o| {
                o["kind"] == "PodDisruptionBudget"
                    && o["metadata"]["name"] == "jobset-inplace-reconciler"
            })
            .collect();
        (b, pod_labels)
    };
    assert!(budget("1").0.is_empty(), "a budget with one replica");
    for replicas in ["2", "3"] {
        let (b, labels) = budget(replicas);
        assert_eq!(b.len(), 1, "{replicas} replicas");
        assert_eq!(b[0]["spec"]["maxUnavailable"], 1);
        assert_eq!(b[0]["metadata"]["namespace"], NAMESPACE);
        let selector = b[0]["spec"]["selector"]["matchLabels"]
            .as_object()
            .expect("matchLabels");
        assert!(!selector.is_empty());
        for (k, v) in selector {
            assert_eq!(
                &labels[k], v,
                "the budget selects the reconciler's pods ({k})"
            );
        }
    }
}

/// The Kubernetes versions docs/reference.md supports: the `Kubernetes` cell of the
/// compatibility table's first row (the default, injected agent), `>= 1.35`.
fn supported_kubernetes() -> String {
    let text = std::fs::read_to_string(repo().join("docs/reference.md")).expect("reference.md");
    let table = text
        .split_once("## Compatibility")
        .expect("reference.md has a Compatibility section")
        .1;
    let row = table
        .lines()
        .find(|l| l.starts_with("| injected sidecar agent (default)"))
        .expect("the default's row");
    let cell = row.split('|').nth(2).expect("the Kubernetes cell").trim();
    let version = cell
        .strip_prefix(">= ")
        .unwrap_or_else(|| panic!("the Kubernetes cell {cell:?} is not `>= X.Y`"));
    assert!(
        version.split('.').count() == 2 && version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "{version:?} is not X.Y"
    );
    version.to_owned()
}

#[test]
fn kube_version_is_what_the_reference_supports() {
    let text = std::fs::read_to_string(chart_dir().join("Chart.yaml")).expect("Chart.yaml");
    let chart: Value = serde_saphyr::from_str(&text).expect("Chart.yaml is YAML");
    let supported = supported_kubernetes();
    // `-0`: its pre-releases (1.35.0-rc.1) count as 1.35.
    assert_eq!(
        chart["kubeVersion"],
        format!(">={supported}.0-0"),
        "Chart.yaml's kubeVersion against docs/reference.md's >= {supported}"
    );
    let Some(helm) = helm() else { return };
    let (major, minor) = supported.split_once('.').expect("X.Y");
    let minor: u32 = minor.parse().expect("minor");
    let chart = chart_dir().display().to_string();
    let at = |v: String| {
        run_helm(
            &helm,
            &[
                "template",
                RELEASE,
                &chart,
                "--namespace",
                NAMESPACE,
                "--kube-version",
                &v,
            ],
        )
    };
    at(format!("{major}.{minor}.0")).unwrap_or_else(|e| panic!("{e}"));
    at(format!("{major}.{minor}.0-rc.1")).unwrap_or_else(|e| panic!("a pre-release: {e}"));
    let e = at(format!("{major}.{}.9", minor - 1)).expect_err("an older Kubernetes");
    assert!(e.contains("kubeVersion"), "{e}");
}

/// Chart.yaml says where the chart comes from and carries Artifact Hub's annotations, each of
/// the shape Artifact Hub reads (links, images and changes are YAML lists in a string).
#[test]
fn chart_yaml_carries_its_metadata_and_artifact_hubs_annotations() {
    let text = std::fs::read_to_string(chart_dir().join("Chart.yaml")).expect("Chart.yaml");
    let chart: Value = serde_saphyr::from_str(&text).expect("Chart.yaml is YAML");
    let https = |v: &Value, what: &str| {
        assert!(
            v.as_str().is_some_and(|s| s.starts_with("https://")),
            "{what}: {v}"
        );
    };
    https(&chart["home"], "home");
    let sources = chart["sources"].as_array().expect("sources");
    assert!(!sources.is_empty());
    sources.iter().for_each(|s| https(s, "sources"));
    let maintainers = chart["maintainers"].as_array().expect("maintainers");
    assert!(!maintainers.is_empty());
    for m in maintainers {
        assert!(m["name"].as_str().is_some_and(|n| !n.is_empty()), "{m}");
    }
    let a = &chart["annotations"];
    // The licence is the crate's (Cargo.toml's `license`, the chart's LICENSE file).
    assert_eq!(a["artifacthub.io/license"], "Apache-2.0");
    let list = |key: &str| -> Vec<Value> {
        let text = a[key].as_str().unwrap_or_else(|| panic!("{key}"));
        serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{key}: {e}"))
    };
    let links = list("artifacthub.io/links");
    assert!(!links.is_empty());
    for l in &links {
        assert!(l["name"].is_string(), "{l}");
        https(&l["url"], "a link");
    }
    let images = list("artifacthub.io/images");
    assert_eq!(
        images
            .iter()
            .map(|i| i["image"].as_str().unwrap_or_default())
            .collect::<Vec<_>>(),
        [format!(
            "ghcr.io/jobset-inplace/jobset-inplace:{}",
            env!("CARGO_PKG_VERSION")
        )],
        "the image of appVersion"
    );
    let changes = list("artifacthub.io/changes");
    assert!(!changes.is_empty());
    for c in &changes {
        assert!(
            [
                "added",
                "changed",
                "deprecated",
                "removed",
                "fixed",
                "security"
            ]
            .contains(&c["kind"].as_str().unwrap_or_default()),
            "{c}"
        );
        assert!(c["description"].is_string(), "{c}");
    }
}

/// What Argo CD (and any tool that renders with `helm template` and applies the result) needs:
/// no `lookup` (it renders without a cluster, so a lookup finds nothing), no Helm hooks (Argo CD
/// maps them to its own), and no caBundle in the webhook configurations (what fills it,
/// `--self-signed` or cert-manager's injector, is not the chart; docs/operations.md, "Argo CD").
#[test]
fn the_chart_renders_without_a_cluster_for_gitops_tools() {
    let dir = chart_dir().join("templates");
    let mut offending = Vec::new();
    for e in std::fs::read_dir(&dir).expect("templates") {
        let path = e.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("template");
        for (n, line) in text.lines().enumerate() {
            if line.contains("lookup") || line.contains("helm.sh/hook") {
                offending.push(format!("{}:{}: {line}", path.display(), n + 1));
            }
        }
    }
    assert!(offending.is_empty(), "{}", offending.join("\n"));
    let Some(helm) = helm() else { return };
    for sets in [&[][..], &["certificates=cert-manager"]] {
        let objects = template(&helm, sets);
        for kind in [
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ] {
            let w = &object(&objects, kind, "jobset-inplace")["webhooks"][0];
            assert!(w["clientConfig"].is_object(), "{kind}");
            assert!(
                w["clientConfig"]["caBundle"].is_null(),
                "{sets:?}: {kind} renders a caBundle"
            );
        }
    }
}
