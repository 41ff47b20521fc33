//! The Helm chart `charts/jobset-inplace/`, with helm built from its Go module by
//! `scripts/helm.sh` (pinned in `scripts/tools/go.mod`, cached):
//!
//! - the chart is the one source of deploy/'s objects (`render.rs`): `scripts/render-deploy.sh`
//!   renders deploy/'s generated files again and they must be the tracked bytes (the first
//!   differing file and line named), and no resource of deploy/ written by hand holds an object
//!   the chart renders;
//! - `helm lint --strict` passes for every variant;
//! - `helm template` of each variant renders the objects `kubectl kustomize` renders of the
//!   matching overlay (and with the monitoring and network-policy toggles, of the overlay with
//!   those components): the same kinds and names, and every field of every object equal but for
//!   what Helm adds (its labels, the config checksum) and the kustomize ConfigMap's hash suffix.
//!   The objects are the chart's own in both (rendered); what this holds is the hand-written
//!   kustomize patches that select a variant (the self-signed webhook, cert-manager's CA
//!   injection, the attempt dialect's agent policy, jobset-native's reconciler env) against the
//!   chart's values that select the same variant;
//! - values reach the objects (images, pull secrets, replicas, scheduling, the group-restart
//!   timeout, the opt-in namespace selector, the injection config), which the binary's own config
//!   loader and CLI accept;
//! - `values.schema.json` rejects a wrong type and an unknown key, saying which;
//! - the chart's version and appVersion are the crate's version;
//! - every rendered object is valid under Kubernetes 1.35's schema (`scripts/validate-manifests.py`);
//! - what platform teams' ways of installing need (`adoption.rs`): the chart as a subchart
//!   (`global`, `enabled`), `namespaceOverride`, the webhooks' failure policy and timeout, the
//!   ServiceMonitors' interval, the reconciler's budget, `kubeVersion` as docs/reference.md says,
//!   Chart.yaml's metadata, no `lookup` or hooks (Argo CD);
//! - the chart README's values table is what `values.yaml`'s comments say (`readme.rs`);
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
mod adoption;
mod barrier;
mod cluster;
mod metrics;
mod offline;
mod readme;
mod render;

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
// Shared by the areas
// ---------------------------------------------------------------------------------------------

fn parse_args(container: &Value) -> Cli {
    let args = strings(&container["args"]);
    let argv = std::iter::once("jobset-inplace".to_owned()).chain(args.iter().cloned());
    Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("args {args:?} do not parse: {e}"))
}

/// The CRD the chart keeps on `helm uninstall` (values: crds.keep).
const JOBSETEPOCH_CRD: &str = "jobsetepochs.jobset-inplace.dev";
