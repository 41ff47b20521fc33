//! The Helm chart `charts/jobset-inplace/`, with helm built from its Go module by
//! `scripts/helm.sh` (pinned in `scripts/tools/go.mod`, cached):
//!
//! - `helm lint --strict` passes for every variant;
//! - `helm template` of each variant renders the objects `kubectl kustomize` renders of the
//!   matching overlay (and with the monitoring and network-policy toggles, of the overlay with
//!   those components): the same kinds and names, and every field of every object equal but for
//!   what Helm adds (its labels, the config checksum) and the kustomize ConfigMap's hash suffix;
//!   so the chart and the kustomize tree cannot drift;
//! - values reach the objects (images, pull secrets, replicas, scheduling, the group-restart
//!   timeout, the opt-in namespace selector, the injection config), which the binary's own config
//!   loader and CLI accept;
//! - `values.schema.json` rejects a wrong type and an unknown key, saying which;
//! - the chart's version and appVersion are the crate's version;
//! - every rendered object is valid under Kubernetes 1.35's schema (`scripts/validate-manifests.py`);
//! - on a real control plane (`JOBSET_INPLACE_KUBECONFIG`, as tests/real_cluster/):
//!   `helm install`, `helm upgrade` to a changed value with a JobSet created before untouched,
//!   `helm rollback`, `helm uninstall` leaving nothing of the chart behind.
//!
//! Without Go, these tests say SKIPPED loudly and pass, unless `JOBSET_INPLACE_HELM=required`
//! (.ci/run sets it), which makes them fail instead. A helm build that fails always fails them.
//! `JOBSET_INPLACE_HELM=later` skips them loudly too: .ci/run's workspace tests set it, as they
//! run before its background helm build is done, and its real-cluster step runs them required.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use jobset_inplace_testkit::process::run_bounded;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use clap::Parser;
use jobset_inplace::admission::InjectionConfig;
use jobset_inplace::cli::{Cli, Command as Sub};
use jobset_inplace::protocol::Dialect;
use jobset_inplace_testkit::fixtures;
use serde_json::{Value, json};

const NAMESPACE: &str = "jobset-inplace-system";
const RELEASE: &str = "jobset-inplace";
const HELM_ENV: &str = "JOBSET_INPLACE_HELM";
const KUBECONFIG_ENV: &str = "JOBSET_INPLACE_KUBECONFIG";
const REAL_CLUSTER_ENV: &str = "JOBSET_INPLACE_REAL_CLUSTER";
/// A cold build of helm (every module compiled) on two busy cores.
const BUILD_LIMIT: Duration = Duration::from_secs(45 * 60);
/// One helm, kubectl or validator run.
const RUN_LIMIT: Duration = Duration::from_secs(180);
/// Creating the validator's virtualenv (pip install kubernetes-validate).
const VENV_LIMIT: Duration = Duration::from_secs(600);
/// The labels Helm's chart adds to every object (`_helpers.tpl`) that kustomize does not.
const HELM_LABELS: [&str; 4] = [
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
];

fn repo() -> PathBuf {
    fixtures::manifest_dir()
}

fn chart_dir() -> PathBuf {
    repo().join("charts").join("jobset-inplace")
}

// ---------------------------------------------------------------------------------------------
// Running helm and kubectl
// ---------------------------------------------------------------------------------------------

/// The helm binary `scripts/helm.sh build` made (built once per test binary), or `None` (and a
/// loud SKIPPED) when Go is missing and helm is not required.
fn helm() -> Option<PathBuf> {
    static HELM: OnceLock<Option<PathBuf>> = OnceLock::new();
    HELM.get_or_init(|| {
        let required = std::env::var(HELM_ENV).as_deref() == Ok("required");
        if std::env::var(HELM_ENV).as_deref() == Ok("later") {
            eprintln!(
                "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
                 !! SKIPPED: {HELM_ENV}=later: the chart is linted, rendered and compared with\n\
                 !! deploy/ in a later run of these tests (.ci/run's real-cluster step).\n\
                 !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
            );
            return None;
        }
        if let Err(e) = run_bounded(Command::new("go").arg("version"), RUN_LIMIT) {
            if required {
                panic!("{HELM_ENV}=required but Go is not usable to build helm: {e}");
            }
            eprintln!(
                "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
                 !! SKIPPED: Go is not installed, so helm was not built and the chart was NOT\n\
                 !! linted, rendered or compared with deploy/. ({e})\n\
                 !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
            );
            return None;
        }
        let out = run_bounded(
            Command::new(repo().join("scripts/helm.sh")).arg("build"),
            BUILD_LIMIT,
        )
        .unwrap_or_else(|e| panic!("scripts/helm.sh build: {e}"));
        let path = PathBuf::from(out.lines().last().unwrap_or_default().trim());
        assert!(path.is_file(), "scripts/helm.sh build printed {out:?}");
        Some(path)
    })
    .clone()
}

/// `helm ARGS` (bounded); stdout, or the reason with helm's stderr.
fn run_helm(helm: &Path, args: &[&str]) -> Result<String, String> {
    run_bounded(Command::new(helm).args(args), RUN_LIMIT)
}

fn parse_yaml_stream(text: &str, what: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// `--set` arguments of a list of `key=value` (`string:key=value`: `--set-string`, for values
/// helm would otherwise read as numbers or booleans).
fn set_args(sets: &[&str]) -> Vec<String> {
    sets.iter()
        .flat_map(|s| match s.strip_prefix("string:") {
            Some(s) => ["--set-string".to_owned(), s.to_owned()],
            None => ["--set".to_owned(), (*s).to_owned()],
        })
        .collect()
}

/// `helm template` of the chart in the release namespace with `sets`: its text, or helm's error.
fn try_template(helm: &Path, sets: &[&str]) -> Result<String, String> {
    let chart = chart_dir();
    let mut args = vec![
        "template".to_owned(),
        RELEASE.to_owned(),
        chart.display().to_string(),
        "--namespace".to_owned(),
        NAMESPACE.to_owned(),
    ];
    args.extend(set_args(sets));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_helm(helm, &args)
}

fn template(helm: &Path, sets: &[&str]) -> Vec<Value> {
    let text = try_template(helm, sets).unwrap_or_else(|e| panic!("{e}"));
    parse_yaml_stream(&text, &format!("helm template {sets:?}"))
}

/// `kubectl kustomize` of a kustomization taking `overlays/OVERLAY` and `components`.
fn kustomize(overlay: &str, components: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let deploy = repo().join("deploy");
    let rel = |p: &str| {
        fixtures::relative_path(dir.path(), &deploy.join(p))
            .display()
            .to_string()
    };
    let mut k = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- {}\n",
        rel(&format!("overlays/{overlay}"))
    );
    if !components.is_empty() {
        k.push_str("components:\n");
        for c in components {
            k.push_str(&format!("- {}\n", rel(&format!("components/{c}"))));
        }
    }
    std::fs::write(dir.path().join("kustomization.yaml"), k).expect("write kustomization");
    let text = run_bounded(
        Command::new("kubectl").arg("kustomize").arg(dir.path()),
        RUN_LIMIT,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    parse_yaml_stream(&text, &format!("kubectl kustomize overlays/{overlay}"))
}

// ---------------------------------------------------------------------------------------------
// The variants, and what "the same objects" means
// ---------------------------------------------------------------------------------------------

struct Variant {
    name: &'static str,
    /// The chart's values for it.
    sets: &'static [&'static str],
    overlay: &'static str,
    components: &'static [&'static str],
}

const TOGGLES: &[&str] = &[
    "metrics.serviceMonitor.enabled=true",
    "metrics.prometheusRule.enabled=true",
    "networkPolicy.enabled=true",
];

const VARIANTS: &[Variant] = &[
    Variant {
        name: "epoch (the defaults)",
        sets: &[],
        overlay: "epoch",
        components: &[],
    },
    Variant {
        name: "jobset-native",
        sets: &["dialect=jobset-native"],
        overlay: "jobset-native",
        components: &[],
    },
    Variant {
        name: "cert-manager",
        sets: &["certificates=cert-manager"],
        overlay: "cert-manager",
        components: &[],
    },
    Variant {
        name: "epoch with monitoring and network policies",
        sets: TOGGLES,
        overlay: "epoch",
        components: &["monitoring", "network-policy"],
    },
];

/// kustomize's ConfigMap name carries a hash of its content: `jobset-inplace-config-<10>`.
fn is_hashed_config_name(s: &str) -> bool {
    s.strip_prefix("jobset-inplace-config-")
        .is_some_and(|h| h.len() == 10 && h.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// Replaces every string that is the hashed ConfigMap name with the chart's name; collapses the
/// whitespace of CEL expressions (kustomize re-serializes a folded `>-` scalar with a more-indented
/// line as a literal one with a blank line added: the same CEL, other whitespace); orders the
/// volumes and volume mounts by name (kustomize's strategic merge orders them differently from
/// one combination of components to the next; Kubernetes does not care).
fn unhash(v: &mut Value) {
    match v {
        Value::String(s) if is_hashed_config_name(s) => *s = "jobset-inplace-config".to_owned(),
        Value::Array(a) => a.iter_mut().for_each(unhash),
        Value::Object(o) => {
            for (k, v) in o.iter_mut() {
                match (k.as_str(), v) {
                    ("expression", Value::String(s)) => {
                        *s = s.split_whitespace().collect::<Vec<_>>().join(" ");
                    }
                    ("volumes" | "volumeMounts", Value::Array(a)) => {
                        a.iter_mut().for_each(unhash);
                        a.sort_by_key(|m| m["name"].as_str().unwrap_or_default().to_owned());
                    }
                    (_, v) => unhash(v),
                }
            }
        }
        _ => {}
    }
}

fn remove_empty(object: &mut Value, path: &[&str]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let mut at = &mut *object;
    for p in parent {
        match at.get_mut(*p) {
            Some(next) => at = next,
            None => return,
        }
    }
    if let Some(map) = at.as_object_mut()
        && map
            .get(*last)
            .is_some_and(|v| v.as_object().is_some_and(|m| m.is_empty()))
    {
        map.remove(*last);
    }
}

/// The objects by (kind, name), with what only Helm or only kustomize adds taken out:
/// Helm's labels, the pods' config checksum annotation, kustomize's ConfigMap hash suffix; the
/// injection config's text is compared as the YAML it is (comments differ).
fn normalized(objects: &[Value]) -> BTreeMap<(String, String), Value> {
    let mut out = BTreeMap::new();
    for o in objects {
        let mut o = o.clone();
        unhash(&mut o);
        if let Some(labels) = o["metadata"]["labels"].as_object_mut() {
            for l in HELM_LABELS {
                labels.remove(l);
            }
        }
        if let Some(a) = o
            .pointer_mut("/spec/template/metadata/annotations")
            .and_then(Value::as_object_mut)
        {
            a.remove("checksum/config");
        }
        remove_empty(&mut o, &["spec", "template", "metadata", "annotations"]);
        // Helm's alone: the JobSetEpoch CRD kept on uninstall (crds.keep).
        if let Some(a) = o
            .pointer_mut("/metadata/annotations")
            .and_then(Value::as_object_mut)
        {
            a.remove("helm.sh/resource-policy");
        }
        remove_empty(&mut o, &["metadata", "annotations"]);
        if o["kind"] == "ConfigMap"
            && let Some(text) = o["data"]["config.yaml"].as_str()
        {
            let parsed: Value = serde_saphyr::from_str(text).expect("config.yaml is YAML");
            o["data"]["config.yaml"] = parsed;
        }
        let key = (
            o["kind"].as_str().unwrap_or_default().to_owned(),
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
        assert!(
            out.insert(key.clone(), o).is_none(),
            "{key:?} rendered twice"
        );
    }
    out
}

/// Paths where `got` differs from `want`.
fn differences(want: &Value, got: &Value, path: &str, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => differences(v, w, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k}: missing in the chart ({v})")),
                }
            }
            for (k, v) in b.iter().filter(|(k, _)| !a.contains_key(*k)) {
                out.push(format!("{path}.{k}: only in the chart ({v})"));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                differences(v, w, &format!("{path}[{i}]"), out);
            }
        }
        _ if want == got => {}
        _ => out.push(format!("{path}: kustomize {want}, chart {got}")),
    }
}

/// The differences between the chart's objects and kustomize's (empty when the same).
fn compare(chart: &[Value], kustomize: &[Value]) -> Vec<String> {
    let chart = normalized(chart);
    let mut kustomize = normalized(kustomize);
    // The chart installs into the release namespace (`helm install --namespace ...`), which
    // Helm must have before it renders anything (it keeps the release there), so the Namespace
    // object with its Pod Security labels is kustomize's alone (deploy/README.md, "Helm").
    kustomize.remove(&("Namespace".to_owned(), NAMESPACE.to_owned()));
    let mut out = Vec::new();
    let names = |m: &BTreeMap<(String, String), Value>| m.keys().cloned().collect::<BTreeSet<_>>();
    for k in names(&kustomize).difference(&names(&chart)) {
        out.push(format!("{k:?}: missing in the chart"));
    }
    for k in names(&chart).difference(&names(&kustomize)) {
        out.push(format!("{k:?}: only in the chart"));
    }
    for (k, want) in &kustomize {
        if let Some(got) = chart.get(k) {
            let mut d = Vec::new();
            differences(want, got, "", &mut d);
            out.extend(d.into_iter().map(|d| format!("{} {}: {d}", k.0, k.1)));
        }
    }
    out
}

/// The objects of one kind and name in a rendering.
fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn container<'a>(objects: &'a [Value], deployment: &str) -> &'a Value {
    &object(objects, "Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn env_value(container: &Value, name: &str) -> Option<String> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(str::to_owned))
}

// ---------------------------------------------------------------------------------------------
// Tests without a cluster
// ---------------------------------------------------------------------------------------------

#[test]
fn the_charts_version_and_app_version_are_the_crates() {
    let text = std::fs::read_to_string(chart_dir().join("Chart.yaml")).expect("Chart.yaml");
    let chart: Value = serde_saphyr::from_str(&text).expect("Chart.yaml is YAML");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart["version"], version, "Chart.yaml version");
    assert_eq!(chart["appVersion"], version, "Chart.yaml appVersion");
}

#[test]
fn the_charts_dashboard_is_deploys() {
    let ours = std::fs::read(repo().join("deploy/grafana/jobset-inplace.json")).expect("dashboard");
    let chart = std::fs::read(chart_dir().join("files/jobset-inplace.json")).expect("chart copy");
    assert!(
        ours == chart,
        "charts/jobset-inplace/files/jobset-inplace.json differs from deploy/grafana/jobset-inplace.json: copy it"
    );
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

fn parse_args(container: &Value) -> Cli {
    let args = strings(&container["args"]);
    let argv = std::iter::once("jobset-inplace".to_owned()).chain(args.iter().cloned());
    Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("args {args:?} do not parse: {e}"))
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

// ---------------------------------------------------------------------------------------------
// On a real control plane
// ---------------------------------------------------------------------------------------------

/// The kubeconfig of the real control plane, or `None` (and a loud SKIPPED) without one.
fn real_cluster(test: &str) -> Option<PathBuf> {
    let Some(path) = std::env::var_os(KUBECONFIG_ENV).filter(|p| !p.is_empty()) else {
        if std::env::var(REAL_CLUSTER_ENV).as_deref() == Ok("required") {
            panic!("{test}: {REAL_CLUSTER_ENV}=required but {KUBECONFIG_ENV} is not set");
        }
        eprintln!(
            "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
             !! SKIPPED {test}: no real control plane (run scripts/control-plane.sh up DIR\n\
             !! and set {KUBECONFIG_ENV}=DIR/kubeconfig)\n\
             !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
        );
        return None;
    };
    Some(PathBuf::from(path))
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
    run_bounded(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args),
        RUN_LIMIT,
    )
}

fn kubectl_json(kubeconfig: &Path, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    let out = kubectl(kubeconfig, &a).unwrap_or_else(|e| panic!("{e}"));
    serde_json::from_str(&out).expect("kubectl -o json")
}

/// `helm ARGS` against the cluster, in the release namespace.
fn helm_on(helm: &Path, kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
    run_bounded(
        Command::new(helm)
            .args(args)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--namespace", NAMESPACE]),
        RUN_LIMIT,
    )
}

/// Every object the release names, as (kind, namespace, name), from `helm get manifest`.
fn release_objects(helm: &Path, kubeconfig: &Path) -> Vec<(String, String, String)> {
    let text =
        helm_on(helm, kubeconfig, &["get", "manifest", RELEASE]).unwrap_or_else(|e| panic!("{e}"));
    parse_yaml_stream(&text, "helm get manifest")
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default().to_owned(),
                o["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

/// The resource name kubectl takes for a kind of the chart.
fn resource_of(kind: &str) -> String {
    match kind {
        "PodDisruptionBudget" => "poddisruptionbudgets.policy".to_owned(),
        "FlowSchema" => "flowschemas.flowcontrol.apiserver.k8s.io".to_owned(),
        "ValidatingAdmissionPolicy" => {
            "validatingadmissionpolicies.admissionregistration.k8s.io".to_owned()
        }
        "ValidatingAdmissionPolicyBinding" => {
            "validatingadmissionpolicybindings.admissionregistration.k8s.io".to_owned()
        }
        "CustomResourceDefinition" => "customresourcedefinitions.apiextensions.k8s.io".to_owned(),
        other => other.to_lowercase(),
    }
}

fn exists(kubeconfig: &Path, kind: &str, namespace: &str, name: &str) -> bool {
    let resource = resource_of(kind);
    let mut args = vec![
        "get",
        resource.as_str(),
        name,
        "--ignore-not-found",
        "-o",
        "name",
    ];
    if !namespace.is_empty() {
        args.extend(["-n", namespace]);
    }
    !kubectl(kubeconfig, &args)
        .unwrap_or_else(|e| panic!("{e}"))
        .trim()
        .is_empty()
}

fn reconciler_args(kubeconfig: &Path) -> Vec<String> {
    let d = kubectl_json(
        kubeconfig,
        &[
            "-n",
            NAMESPACE,
            "get",
            "deployment",
            "jobset-inplace-reconciler",
        ],
    );
    strings(&d["spec"]["template"]["spec"]["containers"][0]["args"])
}

/// Polls `check` every 500 ms until it returns `Ok`; panics with its last error after `limit`.
fn eventually<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        match check() {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => panic!("{what}: not within {limit:?}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// A JobSet in the test namespace; with `in_place`, an InPlaceRestart one.
fn jobset_manifest(namespace: &str, name: &str, in_place: bool) -> String {
    let mut js = json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicatedJobs": [{
                "name": "workers",
                "replicas": 1,
                "template": {"spec": {
                    "parallelism": 1,
                    "completions": 1,
                    "template": {"spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "train", "image": "busybox:1.36", "command": ["true"]}]
                    }}
                }}
            }]
        }
    });
    if in_place {
        js["spec"]["failurePolicy"] =
            json!({"maxRestarts": 3, "restartStrategy": "InPlaceRestart"});
        // What JobSet's own validation asks of an in-place JobSet (our webhook would add it), so
        // that only ours can refuse it.
        let job = &mut js["spec"]["replicatedJobs"][0]["template"]["spec"];
        job["backoffLimit"] = json!(2147483647);
        job["podReplacementPolicy"] = json!("Failed");
    }
    js.to_string()
}

/// The CRD the chart keeps on `helm uninstall` (values: crds.keep).
const JOBSETEPOCH_CRD: &str = "jobsetepochs.jobset-inplace.dev";

#[test]
fn helm_installs_upgrades_rolls_back_and_uninstalls_on_a_real_control_plane() {
    let test = "helm_installs_upgrades_rolls_back_and_uninstalls_on_a_real_control_plane";
    let Some(kubeconfig) = real_cluster(test) else {
        return;
    };
    let Some(helm) = helm() else { return };
    let k = kubeconfig.as_path();
    let chart = chart_dir().display().to_string();
    let ns = "helm-jobsets";
    // Leftovers of an interrupted run go first.
    let _ = helm_on(
        &helm,
        k,
        &["uninstall", RELEASE, "--wait", "--timeout", "2m"],
    );
    let _ = kubectl(
        k,
        &[
            "delete",
            "namespace",
            ns,
            "--ignore-not-found",
            "--wait=true",
        ],
    );

    // install
    kubectl(k, &["create", "namespace", ns]).unwrap_or_else(|e| panic!("{e}"));
    let out = helm_on(
        &helm,
        k,
        &[
            "install",
            RELEASE,
            &chart,
            "--create-namespace",
            "--set",
            "dialect=jobset-native",
        ],
    )
    .unwrap_or_else(|e| panic!("helm install: {e}"));
    eprintln!("{out}");
    let installed = release_objects(&helm, k);
    assert!(
        installed.len() > 30,
        "the release names {} objects",
        installed.len()
    );
    for (kind, namespace, name) in &installed {
        assert!(
            exists(k, kind, namespace, name),
            "{kind} {namespace}/{name} was not created"
        );
    }
    for kind in [
        "mutatingwebhookconfiguration",
        "validatingwebhookconfiguration",
    ] {
        let c = kubectl_json(k, &["get", kind, "jobset-inplace"]);
        assert_eq!(
            c["webhooks"][0]["clientConfig"]["service"]["namespace"], NAMESPACE,
            "{kind}"
        );
        assert_eq!(
            c["metadata"]["annotations"]["meta.helm.sh/release-name"],
            RELEASE
        );
    }
    assert!(
        !reconciler_args(k)
            .iter()
            .any(|a| a.starts_with("--group-restart-timeout"))
    );
    // The API server type-checks each admission policy against the schemas of what it matches
    // (kube-controller-manager's status controller): no warnings.
    let policies: Vec<&str> = installed
        .iter()
        .filter(|(kind, _, _)| kind == "ValidatingAdmissionPolicy")
        .map(|(_, _, name)| name.as_str())
        .collect();
    assert!(policies.len() >= 5, "policies: {policies:?}");
    for name in policies {
        let status = eventually(
            &format!("policy {name} type-checked"),
            Duration::from_secs(90),
            || {
                let p = kubectl_json(k, &["get", "validatingadmissionpolicy", name]);
                let done = p["status"]["observedGeneration"] == p["metadata"]["generation"]
                    && p["status"]["typeChecking"].is_object();
                if done {
                    Ok(p["status"].clone())
                } else {
                    Err(format!("status {}", p["status"]))
                }
            },
        );
        assert!(
            status["typeChecking"]["expressionWarnings"].is_null(),
            "policy {name}: type-check warnings: {status}"
        );
    }

    // A JobSet created under the release (not InPlaceRestart: no webhook pod runs here to
    // answer for one), which the upgrade must leave as stored.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let manifest = dir.path().join("jobset.json");
    std::fs::write(&manifest, jobset_manifest(ns, "helm-before", false)).expect("write");
    kubectl(k, &["create", "-f", &manifest.display().to_string()])
        .unwrap_or_else(|e| panic!("{e}"));
    let before = kubectl_json(k, &["-n", ns, "get", "jobset", "helm-before"]);
    // The release's webhook configurations are live: an InPlaceRestart JobSet goes to them, and
    // with no webhook pod to answer (none runs on this control plane) the validating one fails
    // closed, by name.
    let in_place = dir.path().join("in-place.json");
    std::fs::write(&in_place, jobset_manifest(ns, "helm-in-place", true)).expect("write");
    let refused = kubectl(
        k,
        &[
            "create",
            "--dry-run=server",
            "-f",
            &in_place.display().to_string(),
        ],
    )
    .expect_err("an InPlaceRestart JobSet got through without its webhook");
    assert!(
        refused.contains("validate.jobset-inplace.dev"),
        "refused, but not by our webhook: {refused}"
    );

    // upgrade to a changed value
    helm_on(
        &helm,
        k,
        &[
            "upgrade",
            RELEASE,
            &chart,
            "--reuse-values",
            "--set",
            "reconciler.groupRestartTimeout=5m",
        ],
    )
    .unwrap_or_else(|e| panic!("helm upgrade: {e}"));
    assert!(
        reconciler_args(k).contains(&"--group-restart-timeout=5m".to_owned()),
        "the upgrade reached the reconciler: {:?}",
        reconciler_args(k)
    );
    let after = kubectl_json(k, &["-n", ns, "get", "jobset", "helm-before"]);
    assert_eq!(
        before["metadata"]["resourceVersion"], after["metadata"]["resourceVersion"],
        "the upgrade wrote the JobSet"
    );
    assert_eq!(before["spec"], after["spec"]);
    let cm = kubectl_json(
        k,
        &["-n", NAMESPACE, "get", "configmap", "jobset-inplace-config"],
    );
    assert_eq!(
        cm["data"]["protocol"], "attempt",
        "--reuse-values kept the dialect"
    );

    // rollback to the first revision
    helm_on(&helm, k, &["rollback", RELEASE, "1"]).unwrap_or_else(|e| panic!("helm rollback: {e}"));
    assert!(
        !reconciler_args(k)
            .iter()
            .any(|a| a.starts_with("--group-restart-timeout")),
        "the rollback took the timeout back out: {:?}",
        reconciler_args(k)
    );
    let history =
        helm_on(&helm, k, &["history", RELEASE, "-o", "json"]).unwrap_or_else(|e| panic!("{e}"));
    let history: Value = serde_json::from_str(&history).expect("history JSON");
    assert_eq!(
        history.as_array().map(Vec::len),
        Some(3),
        "install, upgrade, rollback: {history}"
    );

    // uninstall: nothing the release named is left
    let objects = release_objects(&helm, k);
    helm_on(
        &helm,
        k,
        &["uninstall", RELEASE, "--wait", "--timeout", "2m"],
    )
    .unwrap_or_else(|e| panic!("helm uninstall: {e}"));
    // The JobSetEpoch CRD stays (crds.keep, helm.sh/resource-policy: keep): deleting it would
    // delete what running JobSets' agents watch. Everything else of the release goes.
    let kept = ("CustomResourceDefinition", "", JOBSETEPOCH_CRD);
    assert!(
        objects
            .iter()
            .any(|(kind, _, name)| kind == kept.0 && name == kept.2),
        "the release installed the JobSetEpoch CRD: {objects:?}"
    );
    let left: Vec<_> = objects
        .iter()
        .filter(|(kind, _, name)| !(kind == kept.0 && name == kept.2))
        .filter(|(kind, namespace, name)| exists(k, kind, namespace, name))
        .collect();
    assert!(
        left.is_empty(),
        "left behind after helm uninstall: {left:?}"
    );
    assert!(
        exists(k, kept.0, kept.1, kept.2),
        "helm uninstall deleted the JobSetEpoch CRD"
    );
    kubectl(
        k,
        &[
            "delete",
            "crd",
            JOBSETEPOCH_CRD,
            "--wait=true",
            "--timeout=60s",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        helm_on(&helm, k, &["status", RELEASE]).is_err(),
        "the release is gone"
    );
    // What stays (deploy/README.md): the namespace (Helm's --create-namespace does not delete
    // it) and the JobSet of the workload namespace; the runtime's Secret, Lease and agent
    // accounts would too, but no pod ran here to make them.
    assert!(exists(k, "Namespace", "", NAMESPACE));
    let remaining = kubectl(
        k,
        &[
            "-n",
            NAMESPACE,
            "get",
            "all,configmap,secret,serviceaccount,role,rolebinding,lease",
            "-o",
            "name",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let ours: Vec<&str> = remaining
        .lines()
        .filter(|l| l.contains("jobset-inplace"))
        .collect();
    assert!(ours.is_empty(), "left in {NAMESPACE}: {ours:?}");
    let cluster = kubectl(k, &["get", "clusterrole,clusterrolebinding,mutatingwebhookconfiguration,validatingwebhookconfiguration,validatingadmissionpolicy,validatingadmissionpolicybinding,flowschema,crd", "-o", "name"])
        .unwrap_or_else(|e| panic!("{e}"));
    let ours: Vec<&str> = cluster
        .lines()
        .filter(|l| l.contains("jobset-inplace"))
        .collect();
    assert!(ours.is_empty(), "cluster-scoped objects left: {ours:?}");
    assert!(
        exists(k, "JobSet", ns, "helm-before"),
        "the workload's JobSet stays"
    );
    // Gone before the next test (tests/real_cluster/ applies the overlays into the same
    // namespace on the same control plane in CI).
    for n in [ns, NAMESPACE] {
        kubectl(
            k,
            &["delete", "namespace", n, "--wait=true", "--timeout=120s"],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
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
            .filter(|o| o["kind"] == "PodDisruptionBudget")
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

/// The line of charts/jobset-inplace/README.md below which the values' table is generated.
const README_MARKER: &str = "<!-- The table below is generated from values.yaml by tests/helm.rs \
                             (UPDATE_CHART_README=1 cargo test --test helm chart_readme). -->";

/// The values' table of the chart's README: one row per leaf of values.yaml (a key whose value
/// is on its line: a scalar, `{}` or `[]`), with the comment lines just above it (or above the
/// nearest enclosing key that has them) as its description.
fn values_table(values_yaml: &str) -> String {
    let mut rows = Vec::new();
    // (indent, key, its comment) of the enclosing keys.
    let mut stack: Vec<(usize, String, String)> = Vec::new();
    let mut comment: Vec<String> = Vec::new();
    for line in values_yaml.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() {
            comment.clear();
            continue;
        }
        // A comment block describes the key right below it; a blank line ends it (so the file's
        // header, followed by one, describes nothing).
        if let Some(text) = trimmed.strip_prefix('#') {
            comment.push(text.trim().to_owned());
            continue;
        }
        let Some((key, value)) = trimmed.split_once(':') else {
            continue;
        };
        while stack.last().is_some_and(|(i, _, _)| *i >= indent) {
            stack.pop();
        }
        let own = comment.join(" ");
        comment.clear();
        let value = value.trim();
        let path: Vec<&str> = stack
            .iter()
            .map(|(_, k, _)| k.as_str())
            .chain([key])
            .collect();
        if value.is_empty() {
            stack.push((indent, key.to_owned(), own));
            continue;
        }
        let description = if own.is_empty() {
            stack
                .iter()
                .rev()
                .map(|(_, _, c)| c.as_str())
                .find(|c| !c.is_empty())
                .unwrap_or("")
                .to_owned()
        } else {
            own
        };
        rows.push(format!(
            "| `{}` | `{}` | {} |",
            path.join("."),
            value.replace('|', "\\|"),
            description.replace('|', "\\|")
        ));
    }
    let mut out = String::from("| value | default | what it is |\n|---|---|---|\n");
    for r in rows {
        out.push_str(&r);
        out.push('\n');
    }
    out
}

#[test]
fn chart_readme_lists_every_value_as_values_yaml_says() {
    let dir = chart_dir();
    let values = std::fs::read_to_string(dir.join("values.yaml")).expect("values.yaml");
    let path = dir.join("README.md");
    let readme = std::fs::read_to_string(&path).expect("charts/jobset-inplace/README.md");
    let head = readme
        .split_once(README_MARKER)
        .map(|(head, _)| head)
        .unwrap_or_else(|| panic!("{} lacks the line {README_MARKER}", path.display()));
    let want = format!("{head}{README_MARKER}\n\n{}", values_table(&values));
    if std::env::var_os("UPDATE_CHART_README").is_some() {
        std::fs::write(&path, &want).expect("write the README");
        return;
    }
    assert!(
        readme == want,
        "{} is not what values.yaml says: run UPDATE_CHART_README=1 cargo test --test helm chart_readme",
        path.display()
    );
    // Every leaf of the schema's top level is in it, so a value added to values.yaml without a
    // row cannot pass.
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("values.schema.json")).expect("schema"),
    )
    .expect("schema JSON");
    for key in schema["properties"].as_object().expect("properties").keys() {
        assert!(
            readme.contains(&format!("| `{key}")),
            "README has no row for {key}"
        );
    }
}

#[test]
fn the_chart_carries_the_projects_licence() {
    let root = std::fs::read(repo().join("LICENSE")).expect("LICENSE");
    let chart = std::fs::read(chart_dir().join("LICENSE")).expect("charts/jobset-inplace/LICENSE");
    assert!(
        root == chart,
        "the chart's LICENSE differs from the repository's"
    );
    assert!(String::from_utf8_lossy(&root).contains("Apache License"));
}

#[test]
fn values_table_nests_keys_and_inherits_descriptions() {
    let yaml = "# header\n\n# The image.\nimage:\n  # Where.\n  registry: ghcr.io\n  tag: \"\"\nlist: []\n";
    assert_eq!(
        values_table(yaml),
        "| value | default | what it is |\n|---|---|---|\n\
         | `image.registry` | `ghcr.io` | Where. |\n\
         | `image.tag` | `\"\"` | The image. |\n\
         | `list` | `[]` |  |\n"
    );
}
