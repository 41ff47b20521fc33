//! Without a cluster: `helm lint --strict`, each variant rendered equal to its kustomize overlay
//! (the overlays' hand-written variant patches against the chart's values),
//! values reaching the objects, the values schema, versions, Kubernetes 1.35 validity.

use super::*;

#[test]
fn the_charts_version_and_app_version_are_the_crates() {
    let text = std::fs::read_to_string(chart_dir().join("Chart.yaml")).expect("Chart.yaml");
    let chart: Value = serde_saphyr::from_str(&text).expect("Chart.yaml is YAML");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart["version"], version, "Chart.yaml version");
    assert_eq!(chart["appVersion"], version, "Chart.yaml appVersion");
}

/// `path` of the chart is a link to `target` of the repository (one copy: `helm package` puts
/// what the link points to into the chart's archive).
fn assert_linked(path: &str, target: &str) {
    let link = chart_dir().join(path);
    let to = std::fs::read_link(&link).unwrap_or_else(|e| {
        panic!(
            "charts/jobset-inplace/{path} must be a link to {target} (one copy), not a file: {e}"
        )
    });
    let resolved = link
        .parent()
        .expect("in the chart")
        .join(to)
        .canonicalize()
        .expect("the link resolves");
    assert_eq!(
        resolved,
        repo().join(target).canonicalize().expect(target),
        "charts/jobset-inplace/{path}"
    );
}

/// One dashboard: the chart's is a link to deploy/'s, and `metrics.dashboard.enabled` renders it.
#[test]
fn the_charts_dashboard_is_deploys() {
    assert_linked(
        "files/jobset-inplace.json",
        "deploy/grafana/jobset-inplace.json",
    );
    let ours = std::fs::read(repo().join("deploy/grafana/jobset-inplace.json")).expect("dashboard");
    let Some(helm) = helm() else { return };
    let objects = template(&helm, &["metrics.dashboard.enabled=true"]);
    let cm = object(&objects, "ConfigMap", "jobset-inplace-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let rendered: Value = serde_json::from_str(
        cm["data"]["jobset-inplace.json"]
            .as_str()
            .unwrap_or_default(),
    )
    .expect("the dashboard ConfigMap holds JSON");
    let want: Value = serde_json::from_slice(&ours).expect("dashboard JSON");
    assert_eq!(rendered, want);
    // Off by default (the kustomize overlays carry no dashboard ConfigMap).
    assert!(
        !template(&helm, &[])
            .iter()
            .any(|o| o["metadata"]["name"] == "jobset-inplace-dashboard")
    );
}

#[test]
fn the_chart_lints_strictly_in_every_variant() {
    let Some(helm) = helm() else { return };
    let chart = chart_dir().display().to_string();
    for v in VARIANTS {
        let mut args = vec!["lint".to_owned(), "--strict".to_owned(), chart.clone()];
        args.extend(set_args(v.sets));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_helm(&helm, &args).unwrap_or_else(|e| panic!("{}: {e}", v.name));
        assert!(out.contains("0 chart(s) failed"), "{}: {out}", v.name);
    }
}

/// The overlays' objects are rendered from the chart (`render.rs`); their variant patches are
/// written by hand, and this holds each overlay, patches applied, to the chart with the values of
/// the same variant.
#[test]
fn each_variant_renders_the_objects_of_its_overlay() {
    let Some(helm) = helm() else { return };
    let mut failures = Vec::new();
    for v in VARIANTS {
        let chart = template(&helm, v.sets);
        let want = kustomize(v.overlay, v.components);
        let d = compare(&chart, &want);
        if !d.is_empty() {
            failures.push(format!("{}:\n  {}", v.name, d.join("\n  ")));
        }
    }
    assert!(
        failures.is_empty(),
        "the chart and deploy/ differ:\n{}",
        failures.join("\n")
    );
}

/// The injection config the chart renders loads with the binary's loader.
fn load_config(objects: &[Value], dialect: Dialect) -> InjectionConfig {
    let cm = object(objects, "ConfigMap", "jobset-inplace-config");
    let text = cm["data"]["config.yaml"].as_str().expect("config.yaml");
    let mut config = InjectionConfig::defaults(dialect);
    config
        .apply_file(Path::new("config.yaml"), text)
        .unwrap_or_else(|e| panic!("{e}"));
    config.check().unwrap_or_else(|e| panic!("{e}"));
    config
}

#[test]
fn values_reach_the_objects_and_the_binary_accepts_them() {
    let Some(helm) = helm() else { return };
    let digest = format!("sha256:{}", "ab".repeat(32));
    let digest_set = format!("image.digest={digest}");
    let objects = template(
        &helm,
        &[
            "dialect=jobset-native",
            "image.registry=registry.example.com",
            "image.repository=mirror/jobset-inplace",
            "image.tag=0.1.0-rc1",
            &digest_set,
            "image.pullPolicy=Always",
            "imagePullSecrets[0].name=mirror-credentials",
            "agent.image.repository=mirror/agent",
            "agent.image.tag=v7",
            "agent.imagePullSecrets[0].name=agent-pull",
            "agent.imagePullSecrets[1].name=agent-pull-2",
            "webhook.replicas=3",
            "webhook.resources.limits.memory=512Mi",
            "webhook.nodeSelector.pool=system",
            "webhook.tolerations[0].key=dedicated",
            "webhook.tolerations[0].operator=Exists",
            "webhook.priorityClassName=system-cluster-critical",
            "webhook.namespaceSelection=optIn",
            "webhook.excludedNamespaces={kube-system,platform}",
            "reconciler.replicas=1",
            "reconciler.groupRestartTimeout=5m",
            "reconciler.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
            "reconciler.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
            "injection.restartExitCode=7",
            "injection.barrierPort=9000",
        ],
    );
    let image = format!("registry.example.com/mirror/jobset-inplace:0.1.0-rc1@{digest}");
    let webhook = container(&objects, "jobset-inplace-webhook");
    let reconciler = container(&objects, "jobset-inplace-reconciler");
    assert_eq!(webhook["image"], image.as_str());
    assert_eq!(reconciler["image"], image.as_str());
    assert_eq!(webhook["imagePullPolicy"], "Always");
    assert_eq!(
        env_value(webhook, "JOBSET_INPLACE_AGENT_IMAGE").as_deref(),
        Some(format!("registry.example.com/mirror/agent:v7@{digest}").as_str()),
        "the agent image: its own fields, the others of `image`"
    );
    let pod = |d: &str| &object(&objects, "Deployment", d)["spec"]["template"]["spec"];
    for d in ["jobset-inplace-webhook", "jobset-inplace-reconciler"] {
        assert_eq!(
            pod(d)["imagePullSecrets"],
            json!([{"name": "mirror-credentials"}])
        );
    }
    let deployment = |d: &str| &object(&objects, "Deployment", d)["spec"];
    assert_eq!(deployment("jobset-inplace-webhook")["replicas"], 3);
    assert_eq!(deployment("jobset-inplace-reconciler")["replicas"], 1);
    assert_eq!(webhook["resources"]["limits"]["memory"], "512Mi");
    assert_eq!(
        webhook["resources"]["requests"]["cpu"], "50m",
        "a default kept"
    );
    assert_eq!(
        pod("jobset-inplace-webhook")["nodeSelector"],
        json!({"pool": "system"})
    );
    assert_eq!(
        pod("jobset-inplace-webhook")["tolerations"],
        json!([{"key": "dedicated", "operator": "Exists"}])
    );
    assert_eq!(
        pod("jobset-inplace-webhook")["priorityClassName"],
        "system-cluster-critical"
    );
    assert!(
        pod("jobset-inplace-webhook")["affinity"]["podAntiAffinity"].is_object(),
        "the default anti-affinity stays without affinity:"
    );
    assert!(
        pod("jobset-inplace-reconciler")["affinity"]["podAntiAffinity"].is_null()
            && pod("jobset-inplace-reconciler")["affinity"]["nodeAffinity"].is_object(),
        "affinity: replaces the default"
    );
    // The reconciler takes its flags, with the timeout.
    match parse_args(reconciler).command {
        Sub::Reconciler(_) => {}
        other => panic!("the reconciler container runs {other:?}"),
    }
    assert!(strings(&reconciler["args"]).contains(&"--group-restart-timeout=5m".to_owned()));
    assert_eq!(
        env_value(reconciler, "JOBSET_INPLACE_WRITE_EPOCH_STATUS").as_deref(),
        Some("false")
    );
    // The opt-in selector, on both webhooks.
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        assert_eq!(
            object(&objects, kind, "jobset-inplace")["webhooks"][0]["namespaceSelector"],
            json!({"matchExpressions": [
                {"key": "jobset-inplace.dev/enabled", "operator": "In", "values": ["true"]},
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                 "values": ["kube-system", "platform", NAMESPACE]},
            ]}),
            "{kind}"
        );
    }
    // The injection config loads with the attempt dialect and carries the values.
    load_config(&objects, Dialect::Attempt);
    let cm = object(&objects, "ConfigMap", "jobset-inplace-config");
    assert_eq!(cm["data"]["protocol"], "attempt");
    let text: Value =
        serde_saphyr::from_str(cm["data"]["config.yaml"].as_str().unwrap_or_default())
            .expect("config YAML");
    assert_eq!(text["protocol"], "attempt");
    assert_eq!(text["restartExitCode"], 7);
    assert_eq!(text["barrierPort"], 9000);
    assert_eq!(
        text["imagePullSecrets"],
        json!(["agent-pull", "agent-pull-2"])
    );
    // The agent policy watches the attempt dialect's annotation.
    let policy = object(
        &objects,
        "ValidatingAdmissionPolicy",
        "jobset-inplace-agent",
    );
    assert_eq!(
        policy["spec"]["variables"][0]["expression"],
        "'jobset.sigs.k8s.io/in-place-restart-attempt'"
    );
    // The webhook container's flags parse too.
    match parse_args(webhook).command {
        Sub::Webhook(_) => {}
        other => panic!("the webhook container runs {other:?}"),
    }
}

#[test]
fn the_default_config_loads_and_images_are_the_release() {
    let Some(helm) = helm() else { return };
    let objects = template(&helm, &[]);
    load_config(&objects, Dialect::Epoch);
    let image = format!(
        "ghcr.io/jobset-inplace/jobset-inplace:{}",
        env!("CARGO_PKG_VERSION")
    );
    let webhook = container(&objects, "jobset-inplace-webhook");
    assert_eq!(webhook["image"], image.as_str());
    assert_eq!(
        env_value(webhook, "JOBSET_INPLACE_AGENT_IMAGE").as_deref(),
        Some(image.as_str())
    );
    assert!(
        !strings(&container(&objects, "jobset-inplace-reconciler")["args"])
            .iter()
            .any(|a| a.starts_with("--group-restart-timeout")),
        "no timeout flag by default: the binary's default"
    );
}

/// helm's error for `sets`, which must fail.
fn rejection(helm: &Path, sets: &[&str]) -> String {
    match try_template(helm, sets) {
        Ok(_) => panic!("helm template {sets:?} rendered: the schema let it through"),
        Err(e) => e,
    }
}

#[test]
fn the_schema_rejects_a_wrong_type_and_an_unknown_key() {
    let Some(helm) = helm() else { return };
    let cases: &[(&[&str], &[&str])] = &[
        // A wrong type: helm names the field and both types.
        (
            &["webhook.replicas=two"],
            &[
                "values don't meet the specifications of the schema",
                "at '/webhook/replicas': got string, want integer",
            ],
        ),
        (
            &["metrics.service=yes"],
            &["at '/metrics/service': got string, want boolean"],
        ),
        (
            &["imagePullSecrets[0]=mirror-credentials"],
            &["at '/imagePullSecrets/0': got string, want object"],
        ),
        // An unknown key, at the top and nested.
        (
            &["replicas=2"],
            &["at '': additional properties 'replicas' not allowed"],
        ),
        (
            &["webhook.replica=2"],
            &["at '/webhook': additional properties 'replica' not allowed"],
        ),
        // A value out of its set or shape (no `auto` dialect: nothing detects it).
        (
            &["dialect=auto"],
            &["at '/dialect': value must be one of 'epoch', 'jobset-native'"],
        ),
        (
            &["image.digest=latest"],
            &["at '/image/digest': 'latest' does not match"],
        ),
        (
            &["reconciler.groupRestartTimeout=soon"],
            &["at '/reconciler/groupRestartTimeout': 'soon' does not match"],
        ),
        // Labels that would clash with the chart's own.
        (
            &["commonLabels.app\\.kubernetes\\.io/name=x"],
            &["invalid propertyName 'app.kubernetes.io/name'"],
        ),
        // Names are fixed: refused with the reason, not as an unknown key.
        (
            &["fullnameOverride=platform-jobset-inplace"],
            &["fullnameOverride: jobset-inplace's object names are fixed"],
        ),
        (
            &["nameOverride=x"],
            &["nameOverride: jobset-inplace's object names are fixed"],
        ),
    ];
    let mut failures = Vec::new();
    for (sets, wants) in cases {
        let e = rejection(&helm, sets);
        eprintln!(
            "{sets:?} -> {}",
            e.lines()
                .filter(|l| !l.trim().is_empty())
                .collect::<Vec<_>>()
                .join(" | ")
        );
        for w in *wants {
            if !e.contains(w) {
                failures.push(format!("{sets:?}: the message does not say {w:?}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The validator's virtualenv (target/tools-venv, as scripts/dist.sh makes it).
fn validator_python() -> PathBuf {
    let venv = repo().join("target/tools-venv");
    let python = venv.join("bin/python");
    let ready = run_bounded(
        Command::new(&python).args(["-c", "import kubernetes_validate"]),
        RUN_LIMIT,
    )
    .is_ok();
    if !ready {
        run_bounded(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            VENV_LIMIT,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        run_bounded(
            Command::new(venv.join("bin/pip")).args([
                "install",
                "-q",
                "--disable-pip-version-check",
                "kubernetes-validate",
            ]),
            VENV_LIMIT,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
    python
}

#[test]
fn every_rendered_object_is_valid_under_kubernetes_1_35() {
    let Some(helm) = helm() else { return };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut files = Vec::new();
    let all = [
        "metrics.serviceMonitor.enabled=true",
        "metrics.prometheusRule.enabled=true",
        "metrics.dashboard.enabled=true",
        "networkPolicy.enabled=true",
        "webhook.namespaceSelection=optIn",
        "reconciler.groupRestartTimeout=90s",
    ];
    for (i, variant) in [
        vec!["dialect=epoch"],
        vec!["dialect=jobset-native"],
        vec!["certificates=cert-manager"],
        vec!["dialect=jobset-native", "certificates=cert-manager"],
    ]
    .into_iter()
    .enumerate()
    {
        let mut sets = variant.clone();
        sets.extend(all);
        let text = try_template(&helm, &sets).unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join(format!("variant-{i}.yaml"));
        std::fs::write(&path, text).expect("write");
        files.push(path);
    }
    let python = validator_python();
    let out = run_bounded(
        Command::new(python)
            .arg(repo().join("scripts/validate-manifests.py"))
            .args(["--kubernetes", "1.35", "--crd"])
            .arg(repo().join("fixtures/jobset-v0.12/jobset.x-k8s.io_jobsets.yaml"))
            .args(&files),
        RUN_LIMIT,
    )
    .unwrap_or_else(|e| panic!("the chart's objects are not all valid under 1.35: {e}"));
    eprintln!("{out}");
}

/// What users of JobSet's and Kueue's charts set (issue 36): common labels, pod labels and
/// annotations, extra arguments and environment, the log level, topology spread, security
/// contexts merged over the restricted profile, cert-manager's issuer; and a budget that follows
/// the replicas.
#[test]
fn the_values_users_of_other_charts_set_reach_the_objects() {
    let Some(helm) = helm() else { return };
    let objects = template(
        &helm,
        &[
            "commonLabels.team=ml-platform",
            "logLevel=jobset_inplace=debug",
            "string:webhook.podLabels.sidecar\\.istio\\.io/inject=false",
            "string:webhook.podAnnotations.prometheus\\.io/scrape=true",
            "webhook.extraArgs[0]=--max-body-bytes-in-flight=32Mi",
            "reconciler.extraEnv[0].name=HTTPS_PROXY",
            "reconciler.extraEnv[0].value=http://proxy.internal:3128",
            "reconciler.topologySpreadConstraints[0].maxSkew=1",
            "reconciler.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
            "reconciler.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
            "reconciler.podSecurityContext.fsGroup=2000",
            "webhook.securityContext.runAsUser=1001",
        ],
    );
    for o in &objects {
        assert_eq!(
            o["metadata"]["labels"]["team"], "ml-platform",
            "{} {}",
            o["kind"], o["metadata"]["name"]
        );
    }
    let webhook = object(&objects, "Deployment", "jobset-inplace-webhook");
    let pod = &webhook["spec"]["template"];
    assert_eq!(
        pod["metadata"]["labels"]["sidecar.istio.io/inject"],
        "false"
    );
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/name"],
        "jobset-inplace-webhook"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );
    let c = container(&objects, "jobset-inplace-webhook");
    let args = strings(&c["args"]);
    assert!(
        args.contains(&"--max-body-bytes-in-flight=32Mi".to_owned()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--log-level=jobset_inplace=debug".to_owned()),
        "{args:?}"
    );
    // Merged over the restricted profile: the rest of it stays.
    assert_eq!(c["securityContext"]["runAsUser"], 1001);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
    // The binary takes what the chart passes.
    parse_args(c);

    let reconciler = object(&objects, "Deployment", "jobset-inplace-reconciler");
    let spec = &reconciler["spec"]["template"]["spec"];
    assert_eq!(spec["securityContext"]["fsGroup"], 2000);
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        spec["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(
        spec["topologySpreadConstraints"][0]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    let rc = container(&objects, "jobset-inplace-reconciler");
    assert_eq!(
        env_value(rc, "HTTPS_PROXY").as_deref(),
        Some("http://proxy.internal:3128")
    );
    assert!(strings(&rc["args"]).contains(&"--log-level=jobset_inplace=debug".to_owned()));
    parse_args(rc);

    // The budget follows the replicas: none at 1 (it would block every drain of the node).
    let budgets = |replicas: &str| -> Vec<Value> {
        template(&helm, &[&format!("webhook.replicas={replicas}")])
            .into_iter()
            .filter(|o| {
                o["kind"] == "PodDisruptionBudget"
                    && o["metadata"]["name"] == "jobset-inplace-webhook"
            })
            .collect()
    };
    assert!(
        budgets("1").is_empty(),
        "a budget with one replica blocks drains"
    );
    for replicas in ["2", "3"] {
        let b = budgets(replicas);
        assert_eq!(b.len(), 1, "{replicas} replicas");
        assert_eq!(b[0]["spec"]["maxUnavailable"], 1, "{replicas} replicas");
    }

    // cert-manager with the user's issuer: no CA of the chart's own.
    let objects = template(
        &helm,
        &[
            "certificates=cert-manager",
            "certManager.issuerRef.name=corp-ca",
            "certManager.issuerRef.kind=ClusterIssuer",
        ],
    );
    assert!(
        !objects.iter().any(|o| o["kind"] == "Issuer"),
        "no Issuer of the chart's own"
    );
    let cert = object(&objects, "Certificate", "jobset-inplace-webhook");
    assert_eq!(cert["spec"]["issuerRef"]["name"], "corp-ca");
    assert_eq!(cert["spec"]["issuerRef"]["kind"], "ClusterIssuer");
    assert!(
        !objects
            .iter()
            .any(|o| o["kind"] == "Certificate" && o["metadata"]["name"] == "jobset-inplace-ca")
    );

    // The JobSetEpoch CRD is kept on uninstall unless asked.
    let crd = |sets: &[&str]| {
        template(&helm, sets)
            .into_iter()
            .find(|o| o["metadata"]["name"] == JOBSETEPOCH_CRD)
            .expect("the chart renders the JobSetEpoch CRD")
    };
    assert_eq!(
        crd(&[])["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    assert!(crd(&["crds.keep=false"])["metadata"]["annotations"].is_null());
}

/// `reconciler.groupRestartTimeout`: the schema takes what the binary's duration parser takes
/// (humantime's units, whole seconds), and the binary checks the range (1s to 24h).
#[test]
fn the_schema_and_the_binary_accept_the_same_durations() {
    let Some(helm) = helm() else { return };
    let corpus = [
        "", "0", "90", "90 ", "90s", "5m", "1h30m", "1h 30m", "1d", "90d", "1.5h", "500ms", "2min",
        "3 hours", "1w", "soon", "2x", "-5s", "1h-", " ", "1e3s", "0x10",
    ];
    let mut failures = Vec::new();
    for text in corpus {
        let set = format!("reconciler.groupRestartTimeout={text}");
        let set = format!("string:{set}");
        let schema = try_template(&helm, &[&set]).is_ok();
        // Empty: no flag (the binary's default).
        let binary = text.is_empty() || jobset_inplace::settings::parse_duration(text).is_ok();
        if schema != binary {
            failures.push(format!("{text:?}: schema {schema}, binary {binary}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // In the range the binary takes: 1 day is the longest.
    assert!(jobset_inplace::deadline::parse_timeout("1d").is_ok());
    assert!(jobset_inplace::deadline::parse_timeout("90d").is_err());
}

#[test]
fn the_chart_carries_the_projects_licence() {
    assert_linked("LICENSE", "LICENSE");
    let root = std::fs::read(repo().join("LICENSE")).expect("LICENSE");
    assert!(String::from_utf8_lossy(&root).contains("Apache License"));
}
