//! The `deploy/` kustomize tree: every overlay renders with `kubectl kustomize`, each object is a
//! well-formed Kubernetes object of its kind, and what the manifests say agrees with what the
//! code does: the injection config loads, the flags parse with the binary's own CLI, the webhook
//! configurations send InPlaceRestart JobSets (and only those) to paths the server serves, every
//! container runs under the `restricted` Pod Security profile, the RBAC grants every request the
//! reconciler and the self-signed webhook make (they run against the in-repo test API server)
//! and no verb they do not, the agent policy's CEL allows exactly the agent's own epoch write,
//! and the CRD component gives the released JobSet CRD the epoch status fields.
//!
//! CEL is evaluated with the `cel` crate (cel-rust), not Kubernetes' cel-go: it parses and runs
//! the standard macros (`has`, `all`), `in`, `matches`, `int()`, string and list equality, the
//! ternary operator and map indexing, which is all the expressions here use. It does not type
//! check: Kubernetes compiles policy expressions against the OpenAPI schema of the object, which
//! only an API server does. The test objects are JSON, so a field Kubernetes would see as an
//! empty typed value is simply absent here; the expressions guard every such field with `has()`,
//! which is correct for both.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use jobset_inplace_testkit::process::run_bounded;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser};
use jobset_inplace::admission::InjectionConfig;
use jobset_inplace::cli::{Cli, Command as Sub};
use jobset_inplace::protocol::{Dialect, JOBSET_NAME_LABEL};
use jobset_inplace_testkit::fixtures;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const NAMESPACE: &str = "jobset-inplace-system";
const IMAGE: &str = "ghcr.io/jobset-inplace/jobset-inplace";
const RENDER_LIMIT: Duration = Duration::from_secs(60);
const OVERLAYS: [&str; 3] = ["epoch", "jobset-native", "cert-manager"];
/// The overlays whose webhook keeps its own certificates (`webhook --self-signed`).
const SELF_SIGNED: [&str; 2] = ["epoch", "jobset-native"];

fn deploy_dir() -> PathBuf {
    fixtures::manifest_dir().join("deploy")
}

/// The dialect each overlay is for.
fn overlay_dialect(overlay: &str) -> Dialect {
    match overlay {
        "jobset-native" => Dialect::Attempt,
        _ => Dialect::Epoch,
    }
}

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------

/// Whether `kubectl` (with its built-in kustomize) is here; says so loudly once when not.
fn have_kubectl() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    *HAVE.get_or_init(|| {
        match run_bounded(
            Command::new("kubectl").args(["version", "--client"]),
            RENDER_LIMIT,
        ) {
            Ok(_) => true,
            Err(e) => {
                eprintln!(
                    "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
                     !! SKIPPED: kubectl is not installed, so deploy/ was NOT rendered or tested.\n\
                     !! ({e})\n\
                     !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
                );
                false
            }
        }
    })
}

/// `kubectl kustomize DIR` as JSON values, one per object.
fn kustomize(dir: &Path) -> Vec<Value> {
    let text = run_bounded(
        Command::new("kubectl").arg("kustomize").arg(dir),
        RENDER_LIMIT,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// The rendered objects of one overlay (rendered once per test binary), or `None` without
/// kubectl.
fn overlay(name: &str) -> Option<Rendered> {
    if !have_kubectl() {
        return None;
    }
    static CACHE: OnceLock<Mutex<HashMap<String, Vec<Value>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    let objects = cache
        .entry(name.to_owned())
        .or_insert_with(|| kustomize(&deploy_dir().join("overlays").join(name)))
        .clone();
    Some(Rendered {
        name: name.to_owned(),
        objects,
    })
}

/// A temporary directory for a kustomization of the test's own.
fn kustomization_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

/// A kustomization that lists `deploy/<path>` entries: `{deploy}` in `template` is replaced by
/// the path of `deploy/` relative to where it is written.
fn write_kustomization(dir: &Path, template: &str, files: &[(&str, &str)]) {
    let deploy = std::fs::canonicalize(deploy_dir()).expect("deploy/");
    let here = std::fs::canonicalize(dir).expect("dir");
    let text = template.replace(
        "{deploy}",
        &fixtures::relative_path(&here, &deploy)
            .display()
            .to_string(),
    );
    std::fs::write(dir.join("kustomization.yaml"), text).expect("write");
    for (name, text) in files {
        std::fs::write(dir.join(name), text).expect("write");
    }
}

/// Renders a kustomization written into a temporary directory.
fn render_kustomization(template: &str, files: &[(&str, &str)]) -> Vec<Value> {
    let dir = kustomization_dir();
    write_kustomization(dir.path(), template, files);
    kustomize(dir.path())
}

struct Rendered {
    name: String,
    objects: Vec<Value>,
}

impl Rendered {
    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    fn get(&self, kind: &str, name: &str) -> &Value {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{}: no {kind} {name}", self.name))
    }

    /// The ConfigMap generated from `jobset-inplace-config` (its name has a hash suffix).
    fn config_map(&self) -> &Value {
        let found: Vec<&Value> = self
            .of_kind("ConfigMap")
            .into_iter()
            .filter(|c| {
                c["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("jobset-inplace-config-"))
            })
            .collect();
        assert_eq!(found.len(), 1, "{}: one injection ConfigMap", self.name);
        found[0]
    }

    fn deployment(&self, name: &str) -> &Value {
        self.get("Deployment", name)
    }

    fn container<'a>(&'a self, deployment: &str, container: &str) -> &'a Value {
        self.deployment(deployment)["spec"]["template"]["spec"]["containers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == container))
            .unwrap_or_else(|| panic!("{}: no container {container}", self.name))
    }
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

fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
}

/// Parses a container's args with the binary's own command line.
fn parse_args(container: &Value) -> Cli {
    let args = strings(&container["args"]);
    let argv = std::iter::once("jobset-inplace".to_owned()).chain(args.iter().cloned());
    Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("args {args:?} do not parse: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Every overlay renders, and every object is a well-formed object of its kind
// ---------------------------------------------------------------------------------------------

/// Paths where `got` (the typed round trip) differs from `want` (the manifest).
fn differences(want: &Value, got: &Value, path: &str, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => differences(v, w, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k}: unknown field, dropped by the type")),
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("{path}.{k}: added by the type"));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                differences(v, w, &format!("{path}[{i}]"), out);
            }
        }
        _ if want == got => {}
        // A float field (a schema's `minimum`) reads an integer back as a float.
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => {}
        _ => out.push(format!("{path}: {want} became {got}")),
    }
}

/// Deserializes into the typed object and back: every field must survive (a misspelt or
/// misplaced key is dropped by the type and so shows up here).
fn round_trip<K: DeserializeOwned + Serialize>(object: &Value) -> Vec<String> {
    let typed: K = match serde_json::from_value(object.clone()) {
        Ok(t) => t,
        Err(e) => return vec![format!("does not deserialize: {e}")],
    };
    let back = serde_json::to_value(&typed).expect("serializes");
    let mut out = Vec::new();
    differences(object, &back, "", &mut out);
    out
}

/// Checks one object strictly; returns its problems.
fn check_object(object: &Value) -> Vec<String> {
    use k8s_openapi::api::admissionregistration::v1 as adm;
    use k8s_openapi::api::rbac::v1 as rbac;
    use k8s_openapi::api::{apps::v1 as apps, core::v1 as core, policy::v1 as policy};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
    let kind = object["kind"].as_str().unwrap_or_default();
    match kind {
        "Namespace" => round_trip::<core::Namespace>(object),
        "ServiceAccount" => round_trip::<core::ServiceAccount>(object),
        "ConfigMap" => round_trip::<core::ConfigMap>(object),
        "Service" => round_trip::<core::Service>(object),
        "Deployment" => round_trip::<apps::Deployment>(object),
        "PodDisruptionBudget" => round_trip::<policy::PodDisruptionBudget>(object),
        "NetworkPolicy" => round_trip::<k8s_openapi::api::networking::v1::NetworkPolicy>(object),
        "ClusterRole" => round_trip::<rbac::ClusterRole>(object),
        "ClusterRoleBinding" => round_trip::<rbac::ClusterRoleBinding>(object),
        "Role" => round_trip::<rbac::Role>(object),
        "RoleBinding" => round_trip::<rbac::RoleBinding>(object),
        "MutatingWebhookConfiguration" => round_trip::<adm::MutatingWebhookConfiguration>(object),
        "ValidatingWebhookConfiguration" => {
            round_trip::<adm::ValidatingWebhookConfiguration>(object)
        }
        "ValidatingAdmissionPolicy" => round_trip::<adm::ValidatingAdmissionPolicy>(object),
        "ValidatingAdmissionPolicyBinding" => {
            round_trip::<adm::ValidatingAdmissionPolicyBinding>(object)
        }
        "CustomResourceDefinition" => round_trip::<apiext::CustomResourceDefinition>(object),
        "FlowSchema" => round_trip::<k8s_openapi::api::flowcontrol::v1::FlowSchema>(object),
        "PriorityLevelConfiguration" => {
            round_trip::<k8s_openapi::api::flowcontrol::v1::PriorityLevelConfiguration>(object)
        }
        "Issuer" | "Certificate" => check_cert_manager(object),
        other => vec![format!("unexpected kind {other:?}")],
    }
}

/// cert-manager's kinds have no Rust types here: the fields this tree uses, by hand.
fn check_cert_manager(object: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if object["apiVersion"] != "cert-manager.io/v1" {
        out.push(format!("apiVersion {}", object["apiVersion"]));
    }
    let allowed: &[&str] = if object["kind"] == "Issuer" {
        &["selfSigned", "ca"]
    } else {
        &[
            "secretName",
            "dnsNames",
            "duration",
            "renewBefore",
            "privateKey",
            "issuerRef",
            "isCA",
            "commonName",
        ]
    };
    for key in object["spec"]
        .as_object()
        .into_iter()
        .flat_map(|s| s.keys())
    {
        if !allowed.contains(&key.as_str()) {
            out.push(format!("spec.{key}: not a field this test knows"));
        }
    }
    for key in object["spec"]["privateKey"]
        .as_object()
        .into_iter()
        .flat_map(|s| s.keys())
    {
        if !["algorithm", "size", "rotationPolicy"].contains(&key.as_str()) {
            out.push(format!("spec.privateKey.{key}: unknown"));
        }
    }
    out
}

/// Kinds that live in no namespace.
fn cluster_scoped(kind: &str) -> bool {
    matches!(
        kind,
        "Namespace"
            | "ClusterRole"
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

#[test]
fn every_overlay_renders_into_well_formed_objects() {
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let mut problems = Vec::new();
        let mut seen = BTreeSet::new();
        for o in &r.objects {
            let kind = o["kind"].as_str().unwrap_or_default();
            let id = format!("{kind} {}", o["metadata"]["name"].as_str().unwrap_or("?"));
            assert!(seen.insert(id.clone()), "{name}: {id} twice");
            problems.extend(check_object(o).into_iter().map(|p| format!("{id}: {p}")));
            // kustomize does not know every cluster-scoped kind: it would put a
            // ValidatingAdmissionPolicy in a namespace if the tree used `namespace:`.
            let ns = o["metadata"].get("namespace");
            if cluster_scoped(kind) {
                if ns.is_some() {
                    problems.push(format!("{id}: cluster-scoped, yet in namespace {ns:?}"));
                }
            } else if ns != Some(&json!(NAMESPACE)) {
                problems.push(format!("{id}: namespace {ns:?}, not {NAMESPACE}"));
            }
            if o["metadata"]["labels"]["app.kubernetes.io/part-of"] != "jobset-inplace" {
                problems.push(format!("{id}: no part-of label"));
            }
        }
        assert!(problems.is_empty(), "{name}:\n{}", problems.join("\n"));
        for required in [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ConfigMap",
            "Service",
            "Deployment",
            "PodDisruptionBudget",
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "FlowSchema",
        ] {
            assert!(!r.of_kind(required).is_empty(), "{name}: no {required}");
        }
    }
}

#[test]
fn the_strict_check_catches_typos() {
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                 "template": {"spec": {"containers": [{"name": "c", "image": "i", "readinessprobe": {}}]}}}});
    let problems = check_object(&deployment);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("readinessprobe"), "{problems:?}");
    let mut wrong_version = deployment.clone();
    wrong_version["apiVersion"] = json!("apps/v1beta1");
    assert!(!check_object(&wrong_version).is_empty());
    let vap = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "p"}, "spec": {"validation": [{"expression": "true"}]}});
    assert!(!check_object(&vap).is_empty());
}

/// Issue 21 item 10: what the image and CI are built from cannot change under them: every base
/// image but `scratch` is pinned by digest, every Debian package the builder installs by its
/// exact version (issue 34 item 6: `apt-get install NAME=VERSION`), and every tool CI or a
/// script installs by version (`cargo install --version X --locked`, `pip install NAME==X`).
#[test]
fn the_builder_image_and_the_ci_tools_are_pinned() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).expect(path);
    let mut problems = Vec::new();
    let mut images = 0;
    let dockerfile = read("Dockerfile");
    let mut packages = 0;
    for line in dockerfile
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
    {
        let Some((_, args)) = line.split_once("apt-get install ") else {
            continue;
        };
        for word in args
            .split_whitespace()
            .take_while(|w| !matches!(*w, "&&" | "\\" | ";"))
            .filter(|w| !w.starts_with('-'))
        {
            packages += 1;
            let pinned = word.split_once('=').is_some_and(|(name, version)| {
                !name.is_empty() && version.starts_with(|c: char| c.is_ascii_digit())
            });
            if !pinned {
                problems.push(format!(
                    "Dockerfile: apt-get install {word} has no exact version"
                ));
            }
        }
    }
    assert!(
        packages >= 3,
        "the builder's packages were not found: {packages}"
    );
    for line in dockerfile.lines() {
        let Some(rest) = line.trim().strip_prefix("FROM ") else {
            continue;
        };
        let image = rest
            .split_whitespace()
            .find(|w| !w.starts_with("--"))
            .unwrap_or("");
        if image == "scratch" {
            continue;
        }
        images += 1;
        let digest = image.split_once("@sha256:").map(|(_, d)| d);
        if !digest.is_some_and(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit())) {
            problems.push(format!("Dockerfile: {image} is not pinned by digest"));
        }
    }
    assert!(images >= 1, "no base image found");
    let mut installs = 0;
    for file in [
        ".ci/run",
        "scripts/cargo-tool.sh",
        "scripts/check-image.sh",
        "scripts/check-monitoring.sh",
        "scripts/dist.sh",
        "scripts/fuzz-smoke.sh",
    ] {
        for line in read(file)
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
        {
            if line.contains("cargo install") {
                installs += 1;
                if !(line.contains("--version") && line.contains("--locked")) {
                    problems.push(format!("{file}: {}", line.trim()));
                }
            }
            if line.contains("pip")
                && let Some((_, args)) = line.split_once(" install ")
            {
                installs += 1;
                let packages = args
                    .split_whitespace()
                    .filter(|w| !w.starts_with('-') && !w.starts_with('>'))
                    .filter(|w| !w.starts_with("2>") && !w.starts_with('&'))
                    .filter(|w| !matches!(*w, "then" | ";" | "&&"))
                    .collect::<Vec<_>>();
                if packages.is_empty() || !packages.iter().all(|p| p.contains("==")) {
                    problems.push(format!("{file}: {}", line.trim()));
                }
            }
        }
    }
    assert!(installs >= 3, "the installs were not found: {installs}");
    assert!(problems.is_empty(), "not pinned: {problems:#?}");
}

/// Issue 34 item 3: deploy/README.md's NetworkPolicy for the workload namespaces admits the
/// agent's barrier port (its default) from the node addresses only, and every other port (TCP
/// below and above it, UDP, SCTP) from anywhere, as without the policy; it is a valid object.
#[test]
fn the_barrier_network_policy_admits_only_the_nodes_to_the_barrier() {
    use jobset_inplace::wire::agent_env::DEFAULT_BARRIER_PORT;
    let readme = std::fs::read_to_string(deploy_dir().join("README.md")).expect("README");
    let block = readme
        .split("```yaml")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .find(|b| b.contains("jobset-inplace-barrier-from-nodes"))
        .expect("the barrier's NetworkPolicy block");
    let indent = block
        .lines()
        .find(|l| !l.trim().is_empty())
        .map_or(0, |l| l.len() - l.trim_start().len());
    let text: String = block
        .lines()
        .map(|l| l.get(indent..).unwrap_or("").to_owned() + "\n")
        .collect();
    let policy: Value = serde_saphyr::from_str(&text).expect("yaml");
    let problems = check_object(&policy);
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    let barrier = i64::from(DEFAULT_BARRIER_PORT);
    let mut open: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    let mut barrier_rules = 0;
    for rule in policy["spec"]["ingress"].as_array().expect("ingress") {
        let ports = rule["ports"].as_array().expect("ports");
        match rule.get("from") {
            Some(from) => {
                barrier_rules += 1;
                let from = from.as_array().expect("from");
                assert!(
                    from.iter().all(|f| f
                        .as_object()
                        .is_some_and(|f| f.len() == 1 && f.contains_key("ipBlock"))),
                    "only ipBlocks (the nodes): {from:?}"
                );
                assert_eq!(ports, &vec![json!({"port": barrier, "protocol": "TCP"})]);
            }
            None => {
                for p in ports {
                    let start = p["port"].as_i64().expect("port");
                    let end = p["endPort"].as_i64().unwrap_or(start);
                    let protocol = p["protocol"].as_str().unwrap_or("TCP").to_owned();
                    open.entry(protocol).or_default().push((start, end));
                }
            }
        }
    }
    assert_eq!(barrier_rules, 1);
    let covers = |protocol: &str, port: i64| {
        open.get(protocol)
            .is_some_and(|r| r.iter().any(|(a, b)| (*a..=*b).contains(&port)))
    };
    for port in 1..=65535 {
        assert_eq!(covers("TCP", port), port != barrier, "TCP {port}");
        assert!(covers("UDP", port), "UDP {port}");
        assert!(covers("SCTP", port), "SCTP {port}");
    }
}

/// Issue 34 item 6: the image check fails when the pinned hadolint cannot run (it passed,
/// printing "NOT RUN"): a hadolint of another version on PATH is not taken for it, and with
/// PyPI out of reach (its index on a closed loopback port) none can be installed.
#[test]
fn the_image_check_fails_when_the_pinned_hadolint_cannot_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    let fake = bin.join("hadolint");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'Haskell Dockerfile Linter 1.0.0'\nexit 0\n",
    )
    .expect("fake hadolint");
    let mut perms = std::fs::metadata(&fake).expect("meta").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&fake, perms).expect("chmod");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let result = run_bounded(
        Command::new(root.join("scripts/check-image.sh"))
            .arg("--lint-only")
            .current_dir(root)
            .env("PATH", path)
            .env("CHECK_IMAGE_WORK", dir.path().join("work"))
            .env("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
            .env("PIP_RETRIES", "0")
            .env("PIP_TIMEOUT", "2")
            .env("PIP_NO_CACHE_DIR", "1")
            .env("PIP_CONFIG_FILE", "/dev/null")
            .env_remove("PIP_FIND_LINKS"),
        Duration::from_secs(120),
    );
    let Err(e) = result else {
        panic!("the image check passed without its pinned hadolint: {result:?}");
    };
    assert!(
        e.contains("hadolint 2.15.1: neither on PATH nor installable"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// The injection config
// ---------------------------------------------------------------------------------------------

fn load_config(start: Dialect, text: &str) -> InjectionConfig {
    let mut config = InjectionConfig::defaults(start);
    config
        .apply_file(Path::new("config.yaml"), text)
        .unwrap_or_else(|e| panic!("{e}"));
    config.check().unwrap_or_else(|e| panic!("{e}"));
    config
}

#[test]
fn the_injection_config_loads_with_each_overlays_dialect() {
    use jobset_inplace::admission::config::{DEFAULT_IMAGE, DEFAULT_SERVICE_ACCOUNT};
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let dialect = overlay_dialect(name);
        let cm = r.config_map();
        let text = cm["data"]["config.yaml"].as_str().expect("config.yaml");
        // The file names its dialect: whatever the defaults started from, it wins.
        for start in Dialect::ALL {
            assert_eq!(load_config(start, text).protocol, dialect, "{name}");
        }
        let config = load_config(Dialect::Epoch, text);
        assert_eq!(
            cm["data"]["protocol"],
            dialect.as_str(),
            "{name}: reconciler's dialect"
        );
        assert_eq!(config.service_account, DEFAULT_SERVICE_ACCOUNT, "{name}");
        assert_eq!(
            config,
            {
                let mut d = InjectionConfig::defaults(dialect);
                d.image = config.image.clone();
                d
            },
            "{name}: the file spells out the built-in defaults, so --help tells the truth"
        );

        // The agent image: the webhook's own image, through the env that overrides the file.
        let webhook = r.container("jobset-inplace-webhook", "webhook");
        let image = webhook["image"].as_str().expect("image");
        assert_eq!(image, DEFAULT_IMAGE, "{name}: the image is this version's");
        assert_eq!(
            env_value(webhook, "JOBSET_INPLACE_AGENT_IMAGE").map(|e| &e["value"]),
            Some(&json!(image)),
            "{name}"
        );
        assert!(
            text.lines().all(|l| !l.starts_with("image:")),
            "{name}: image is the env's"
        );

        // Both Deployments use the generated ConfigMap (its hashed name).
        let cm_name = &cm["metadata"]["name"];
        let volumes =
            &r.deployment("jobset-inplace-webhook")["spec"]["template"]["spec"]["volumes"];
        assert!(
            volumes
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| v["configMap"]["name"] == *cm_name),
            "{name}: webhook mounts {cm_name}"
        );
        let reconciler = r.container("jobset-inplace-reconciler", "reconciler");
        assert_eq!(
            env_value(reconciler, "JOBSET_INPLACE_PROTOCOL")
                .map(|e| &e["valueFrom"]["configMapKeyRef"]),
            Some(&json!({"name": cm_name, "key": "protocol"})),
            "{name}"
        );
    }
}

#[test]
fn the_attempt_config_is_the_epoch_config_but_for_the_protocol() {
    let read = |p: &str| -> serde_json::Map<String, Value> {
        let text = std::fs::read_to_string(deploy_dir().join(p)).expect("read");
        let mut map: serde_json::Map<String, Value> = serde_saphyr::from_str(&text).expect("yaml");
        map.remove("protocol").expect("names its protocol");
        map
    };
    assert_eq!(
        read("base/config.yaml"),
        read("components/attempt-dialect/config.yaml")
    );
}

// ---------------------------------------------------------------------------------------------
// Flags, env, mounts and probes agree with the binary
// ---------------------------------------------------------------------------------------------

/// Env names the binary reads for a subcommand: its flags' and the global flags' env, plus the
/// downward-API names the reconciler reads directly.
fn known_env(sub: &str) -> BTreeSet<String> {
    let root = Cli::command();
    let sub = root.find_subcommand(sub).expect("subcommand").clone();
    root.get_arguments()
        .chain(sub.get_arguments())
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .chain(["POD_NAME".to_owned(), "POD_NAMESPACE".to_owned()])
        .collect()
}

/// The volume mount holding `path` (the longest mountPath above or at it) and its volume.
fn mount_for<'a>(pod: &'a Value, container: &'a Value, path: &Path) -> (&'a Value, &'a Value) {
    let mount = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["mountPath"].as_str().is_some_and(|p| path.starts_with(p)))
        .max_by_key(|m| m["mountPath"].as_str().map_or(0, str::len))
        .unwrap_or_else(|| panic!("nothing mounted at {}", path.display()));
    let volume = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume {}", mount["name"]));
    (mount, volume)
}

fn port_named(container: &Value, name: &str) -> u16 {
    container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or_else(|| panic!("no port {name}"))
}

fn check_probes(what: &str, container: &Value, health_port: u16) {
    assert_eq!(port_named(container, "health"), health_port, "{what}");
    for (probe, path) in [
        ("startupProbe", "/readyz"),
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
    ] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{what} {probe}");
        assert_eq!(get["port"], "health", "{what} {probe}");
    }
}

#[test]
fn container_flags_env_and_mounts_are_what_the_binary_takes() {
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        // Webhook.
        let pod = &r.deployment("jobset-inplace-webhook")["spec"]["template"]["spec"];
        let c = r.container("jobset-inplace-webhook", "webhook");
        let Sub::Webhook(args) = parse_args(c).command else {
            panic!("{name}: the webhook container runs `webhook`")
        };
        assert_eq!(args.addr.port(), port_named(c, "https"), "{name}");
        check_probes(name, c, args.health_addr.port());
        // Drained before it stops, and done before the kubelet's SIGKILL.
        let grace = pod["terminationGracePeriodSeconds"]
            .as_f64()
            .unwrap_or(30.0);
        assert!(args.shutdown_delay > std::time::Duration::ZERO, "{name}");
        assert!(
            (args.shutdown_delay + args.shutdown_timeout).as_secs_f64() < grace,
            "{name}: --shutdown-delay + --shutdown-timeout within the grace period {grace} s"
        );
        let config = args.injection.config.as_deref().expect("--config");
        let (mount, volume) = mount_for(pod, c, config);
        assert_eq!(mount["mountPath"], json!(config), "{name}");
        assert_eq!(
            volume["configMap"]["name"],
            r.config_map()["metadata"]["name"],
            "{name}"
        );
        let service = r.get("Service", "jobset-inplace-webhook");
        assert_eq!(args.self_signed, SELF_SIGNED.contains(&name), "{name}");
        if args.self_signed {
            let (mount, volume) = mount_for(pod, c, &args.cert_dir);
            assert!(volume["emptyDir"].is_object(), "{name}: writable cert dir");
            assert_ne!(mount["readOnly"], true, "{name}");
            assert_eq!(
                args.service,
                service["metadata"]["name"].as_str().unwrap_or_default()
            );
            assert_eq!(args.namespace, NAMESPACE);
            assert_eq!(args.secret, "jobset-inplace-webhook-tls");
            assert_eq!(
                pod["automountServiceAccountToken"], true,
                "{name}: it talks to the API"
            );
        } else {
            for (file, key) in [(&args.tls_cert, "tls.crt"), (&args.tls_key, "tls.key")] {
                let file = file.as_deref().expect("--tls-cert and --tls-key");
                let (mount, volume) = mount_for(pod, c, file);
                let mount_path = mount["mountPath"].as_str().unwrap_or_default();
                let rel = file.strip_prefix(mount_path).expect("under the mount");
                assert_eq!(
                    volume["secret"]["secretName"], "jobset-inplace-webhook-tls",
                    "{name}"
                );
                let items = volume["secret"]["items"].as_array().expect("items");
                assert!(
                    items
                        .iter()
                        .any(|i| i["key"] == key && i["path"] == json!(rel)),
                    "{name}: {key} at {}",
                    file.display()
                );
                assert!(
                    items.iter().all(|i| i["key"] != "ca.key"),
                    "{name}: the CA key stays out of the pod"
                );
            }
            assert_eq!(
                pod["automountServiceAccountToken"], false,
                "{name}: no API access"
            );
        }
        let known = known_env("webhook");
        for e in c["env"].as_array().into_iter().flatten() {
            let env = e["name"].as_str().unwrap_or_default();
            assert!(known.contains(env), "{name}: the webhook reads no {env}");
        }

        // Reconciler.
        let c = r.container("jobset-inplace-reconciler", "reconciler");
        let Sub::Reconciler(args) = parse_args(c).command else {
            panic!("{name}: the reconciler container runs `reconciler`")
        };
        assert!(args.leader_elect, "{name}");
        assert!(args.provision_service_accounts, "{name}");
        assert_eq!(args.agent_cluster_role, "jobset-inplace-agent");
        check_probes(name, c, args.health_addr.port());
        let known = known_env("reconciler");
        for e in c["env"].as_array().into_iter().flatten() {
            let env = e["name"].as_str().unwrap_or_default();
            assert!(known.contains(env), "{name}: the reconciler reads no {env}");
        }
        for (env, field) in [
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
        ] {
            assert_eq!(
                env_value(c, env).map(|e| &e["valueFrom"]["fieldRef"]["fieldPath"]),
                Some(&json!(field)),
                "{name}: {env} from the downward API"
            );
        }
        assert_eq!(
            r.deployment("jobset-inplace-reconciler")["spec"]["replicas"],
            2,
            "{name}"
        );
    }
}

#[tokio::test]
async fn the_probe_paths_are_served() {
    use tower::ServiceExt;
    let health = jobset_inplace::telemetry::health_router(jobset_inplace::telemetry::Health::new(
        || true,
        String::new,
    ));
    for path in ["/readyz", "/healthz"] {
        let request = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .expect("request");
        let response =
            tokio::time::timeout(Duration::from_secs(10), health.clone().oneshot(request))
                .await
                .expect("in time")
                .expect("answered");
        assert_eq!(response.status(), 200, "{path}");
    }
}

// ---------------------------------------------------------------------------------------------
// Pod Security Standards, `restricted`
// ---------------------------------------------------------------------------------------------

#[test]
fn every_container_runs_under_the_restricted_profile() {
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let ns = r.get("Namespace", NAMESPACE);
        assert_eq!(
            ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted",
            "{name}"
        );
        let deployments = r.of_kind("Deployment");
        assert_eq!(deployments.len(), 2, "{name}");
        for d in deployments {
            let dname = d["metadata"]["name"].as_str().unwrap_or_default();
            let pod = &d["spec"]["template"]["spec"];
            for host in ["hostNetwork", "hostPID", "hostIPC"] {
                assert_ne!(pod[host], true, "{name} {dname}: {host}");
            }
            for v in pod["volumes"].as_array().into_iter().flatten() {
                let kinds: Vec<&String> = v
                    .as_object()
                    .into_iter()
                    .flat_map(|o| o.keys())
                    .filter(|k| *k != "name")
                    .collect();
                assert!(
                    kinds.iter().all(|k| [
                        "configMap",
                        "secret",
                        "emptyDir",
                        "projected",
                        "downwardAPI"
                    ]
                    .contains(&k.as_str())),
                    "{name} {dname}: volume {kinds:?}"
                );
            }
            let containers = ["initContainers", "containers", "ephemeralContainers"]
                .iter()
                .flat_map(|k| pod[*k].as_array().into_iter().flatten());
            for c in containers {
                let what = format!("{name} {dname}/{}", c["name"]);
                let sc = &c["securityContext"];
                let effective = |field: &str| -> Value {
                    if sc[field].is_null() {
                        pod["securityContext"][field].clone()
                    } else {
                        sc[field].clone()
                    }
                };
                assert_eq!(effective("runAsNonRoot"), true, "{what}");
                assert_eq!(
                    effective("runAsUser"),
                    65532,
                    "{what}: numeric non-root user"
                );
                assert_eq!(
                    effective("seccompProfile")["type"],
                    "RuntimeDefault",
                    "{what}"
                );
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}");
                assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{what}");
                assert!(sc["capabilities"]["add"].is_null(), "{what}");
                assert_ne!(sc["privileged"], true, "{what}");
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}");
                for p in c["ports"].as_array().into_iter().flatten() {
                    assert!(p["hostPort"].is_null(), "{what}: hostPort");
                }
                for (kind, resource) in [
                    ("requests", "cpu"),
                    ("requests", "memory"),
                    ("limits", "cpu"),
                    ("limits", "memory"),
                ] {
                    assert!(
                        c["resources"][kind][resource].is_string(),
                        "{what}: {kind}.{resource}"
                    );
                }
                assert!(
                    c["image"].as_str().is_some_and(|i| i.starts_with(IMAGE)),
                    "{what}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Webhook configurations, Service, PodDisruptionBudget
// ---------------------------------------------------------------------------------------------

/// Evaluates a CEL expression to a boolean; an error or a non-boolean is a test failure.
fn cel_bool(
    expression: &str,
    bindings: &[(&str, &Value)],
    variables: &HashMap<String, cel::Value>,
) -> bool {
    match cel_eval(expression, bindings, variables) {
        Ok(cel::Value::Bool(b)) => b,
        other => panic!("{expression}: {other:?}"),
    }
}

fn cel_eval(
    expression: &str,
    bindings: &[(&str, &Value)],
    variables: &HashMap<String, cel::Value>,
) -> Result<cel::Value, String> {
    thread_local! {
        // Parsing is most of the cost in a debug build: each expression once per thread.
        static PROGRAMS: std::cell::RefCell<HashMap<String, std::rc::Rc<cel::Program>>> =
            std::cell::RefCell::new(HashMap::new());
    }
    let cached = PROGRAMS.with(|p| p.borrow().get(expression).cloned());
    let program = match cached {
        Some(p) => p,
        None => {
            let p = std::rc::Rc::new(
                cel::Program::compile(expression).map_err(|e| format!("does not parse: {e}"))?,
            );
            PROGRAMS.with(|c| c.borrow_mut().insert(expression.to_owned(), p.clone()));
            p
        }
    };
    let mut context = cel::Context::default();
    for (name, value) in bindings {
        let value = cel::to_value(value).map_err(|e| e.to_string())?;
        context.add_variable_from_value(*name, value);
    }
    context.add_variable_from_value("variables", cel::Value::Map(variables.clone().into()));
    program.execute(&context).map_err(|e| format!("fails: {e}"))
}

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

// ---------------------------------------------------------------------------------------------
// The agent's ValidatingAdmissionPolicy
// ---------------------------------------------------------------------------------------------

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    NotMatched,
    Allowed,
    Denied(String),
}

/// Evaluates a ValidatingAdmissionPolicy on one request as the API server would: the match
/// constraints, then every match condition, the variables in order, and every validation.
/// An expression that errors fails the test (these must be total on any pod).
fn evaluate_policy(policy: &Value, request: &Value, object: &Value, old: &Value) -> Verdict {
    let spec = &policy["spec"];
    let resource = match request["subResource"].as_str() {
        Some(sub) if !sub.is_empty() => format!("pods/{sub}"),
        _ => "pods".to_owned(),
    };
    let matched = spec["matchConstraints"]["resourceRules"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|rule| {
            strings(&rule["apiGroups"]).contains(&String::new())
                && strings(&rule["apiVersions"]).contains(&"v1".to_owned())
                && strings(&rule["operations"])
                    .iter()
                    .any(|o| request["operation"] == o.as_str())
                && strings(&rule["resources"])
                    .iter()
                    .any(|r| *r == resource || (r == "pods/*" && resource.starts_with("pods/")))
        });
    if !matched {
        return Verdict::NotMatched;
    }
    evaluate_matched(policy, request, object, old)
}

/// A policy's match conditions, variables and validations on a request its match constraints
/// select.
fn evaluate_matched(policy: &Value, request: &Value, object: &Value, old: &Value) -> Verdict {
    let spec = &policy["spec"];
    let bindings = [("object", object), ("oldObject", old), ("request", request)];
    let mut variables = HashMap::new();
    for condition in spec["matchConditions"].as_array().into_iter().flatten() {
        let expression = condition["expression"].as_str().expect("expression");
        if !cel_bool(expression, &bindings, &variables) {
            return Verdict::NotMatched;
        }
    }
    for variable in spec["variables"].as_array().into_iter().flatten() {
        let name = variable["name"].as_str().expect("name").to_owned();
        let expression = variable["expression"].as_str().expect("expression");
        let value = cel_eval(expression, &bindings, &variables)
            .unwrap_or_else(|e| panic!("variable {name}: {expression}: {e}"));
        variables.insert(name, value);
    }
    for validation in spec["validations"].as_array().into_iter().flatten() {
        let expression = validation["expression"].as_str().expect("expression");
        if !cel_bool(expression, &bindings, &variables) {
            return Verdict::Denied(
                validation["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
        }
    }
    Verdict::Allowed
}

const AGENT: &str = "system:serviceaccount:team-a:jobset-inplace-agent";

fn worker_pod(name: &str, epoch_annotation: &str, epoch: Option<&str>) -> Value {
    let mut annotations = json!({JOBSET_NAME_LABEL: "js", "jobset-inplace.dev/injected": "0.1.0"});
    if let Some(e) = epoch {
        annotations[epoch_annotation] = json!(e);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "uid": "u-1", "resourceVersion": "7",
                     "labels": {JOBSET_NAME_LABEL: "js", "batch.kubernetes.io/job-name": "js-w-0"},
                     "annotations": annotations,
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "js-w-0", "uid": "j-1", "controller": true}]},
        "spec": {"serviceAccountName": "jobset-inplace-agent",
                 "containers": [{"name": "w", "image": "trainer:1"}]},
        "status": {"phase": "Running"}
    })
}

fn update_request(user: &str, token_pod: Option<&str>, sub_resource: &str) -> Value {
    let mut user_info =
        json!({"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]});
    if let Some(pod) = token_pod {
        user_info["extra"] = json!({"authentication.kubernetes.io/pod-name": [pod],
                                    "authentication.kubernetes.io/pod-uid": ["u-1"]});
    }
    json!({"operation": "UPDATE", "namespace": "team-a", "name": "js-0",
           "resource": {"group": "", "version": "v1", "resource": "pods"},
           "subResource": sub_resource, "userInfo": user_info})
}

/// The agent policy's verdicts on the requests agents and others send.
fn check_agent_policy(what: &str, policy: &Value, dialect: Dialect) {
    let key = dialect.pod_annotation();
    let other_key = Dialect::ALL
        .into_iter()
        .find(|d| *d != dialect)
        .map(Dialect::pod_annotation)
        .expect("two dialects");
    let own = update_request(AGENT, Some("js-0"), "");
    let verdict =
        |request: &Value, old: &Value, new: &Value| evaluate_policy(policy, request, new, old);
    let edit = |old: &Value, f: &dyn Fn(&mut Value)| {
        let mut new = old.clone();
        f(&mut new);
        new
    };
    let at = |e: Option<&str>| worker_pod("js-0", key, e);

    // Allowed: the agent writes its own pod's epoch annotation.
    let mut bare = at(None);
    bare["metadata"]
        .as_object_mut()
        .map(|m| m.remove("annotations"));
    let cases_allowed = [
        (
            "first registration, pod without annotations",
            bare.clone(),
            edit(&bare, &|p| p["metadata"]["annotations"] = json!({key: "1"})),
        ),
        ("first registration", at(None), at(Some("1"))),
        ("next epoch", at(Some("1")), at(Some("2"))),
        (
            "the same epoch again (a retried patch)",
            at(Some("2")),
            at(Some("2")),
        ),
        ("a malformed epoch replaced", at(Some("x")), at(Some("3"))),
        (
            "the largest int32 epoch",
            at(Some("2147483646")),
            at(Some("2147483647")),
        ),
        (
            "an out-of-range epoch replaced",
            at(Some("9999999999")),
            at(Some("1")),
        ),
        (
            "resourceVersion and managedFields move with any update",
            at(Some("1")),
            edit(&at(Some("2")), &|p| {
                p["metadata"]["resourceVersion"] = json!("8");
                p["metadata"]["managedFields"] = json!([{"manager": "agent"}]);
            }),
        ),
    ];
    for (case, old, new) in &cases_allowed {
        assert_eq!(verdict(&own, old, new), Verdict::Allowed, "{what}: {case}");
    }

    // Denied: anything else the agent's account might try.
    // Each denial comes from the validation meant for it (its message says which).
    let denied = |case: &str, because: &str, request: &Value, old: &Value, new: &Value| {
        let v = verdict(request, old, new);
        assert!(
            matches!(&v, Verdict::Denied(m) if m.contains(because)),
            "{what}: {case}: {v:?}, expected a denial for {because:?}"
        );
    };
    denied(
        "another pod's epoch",
        "only update the pod its token",
        &update_request(AGENT, Some("js-1"), ""),
        &at(Some("1")),
        &at(Some("2")),
    );
    denied(
        "a token bound to no pod",
        "only update the pod its token",
        &update_request(AGENT, None, ""),
        &at(Some("1")),
        &at(Some("2")),
    );
    denied(
        "the agent of another namespace",
        "only update the pod its token",
        &update_request(
            "system:serviceaccount:team-b:jobset-inplace-agent",
            Some("js-0"),
            "",
        ),
        &at(Some("1")),
        &at(Some("2")),
    );
    denied(
        "pods/status",
        "subresources",
        &update_request(AGENT, Some("js-0"), "status"),
        &at(Some("1")),
        &at(Some("2")),
    );
    denied(
        "pods/status, status only",
        "subresources",
        &update_request(AGENT, Some("js-0"), "status"),
        &at(Some("1")),
        &edit(&at(Some("1")), &|p| p["status"]["phase"] = json!("Failed")),
    );
    denied(
        "pods/ephemeralcontainers",
        "subresources",
        &update_request(AGENT, Some("js-0"), "ephemeralcontainers"),
        &at(Some("1")),
        &edit(&at(Some("1")), &|p| {
            p["spec"]["ephemeralContainers"] = json!([{"name": "debug", "image": "busybox"}])
        }),
    );
    denied(
        "another annotation added",
        "no pod annotation but",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["metadata"]["annotations"]["x"] = json!("y")
        }),
    );
    denied(
        "another annotation changed",
        "no pod annotation but",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["metadata"]["annotations"][JOBSET_NAME_LABEL] = json!("other")
        }),
    );
    denied(
        "another annotation removed",
        "no pod annotation but",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["metadata"]["annotations"]
                .as_object_mut()
                .map(|a| a.remove(JOBSET_NAME_LABEL));
        }),
    );
    denied(
        "the other dialect's annotation",
        "no pod annotation but",
        &own,
        &at(Some("1")),
        &edit(&at(Some("1")), &|p| {
            p["metadata"]["annotations"][other_key] = json!("5")
        }),
    );
    denied(
        "a label changed",
        "labels",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["metadata"]["labels"]["team"] = json!("x")
        }),
    );
    denied(
        "labels removed",
        "labels",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["metadata"].as_object_mut().map(|m| m.remove("labels"));
        }),
    );
    denied(
        "the spec changed",
        "spec",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["spec"]["containers"][0]["image"] = json!("evil:1")
        }),
    );
    denied(
        "a finalizer added",
        "finalizers or owner",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["metadata"]["finalizers"] = json!(["x/y"])
        }),
    );
    denied(
        "owner references dropped",
        "finalizers or owner",
        &own,
        &at(Some("1")),
        &edit(&at(Some("2")), &|p| {
            p["metadata"]
                .as_object_mut()
                .map(|m| m.remove("ownerReferences"));
        }),
    );
    denied(
        "the epoch removed",
        "never decreases",
        &own,
        &at(Some("1")),
        &at(None),
    );
    denied(
        "the epoch decreased",
        "never decreases",
        &own,
        &at(Some("3")),
        &at(Some("2")),
    );
    // The agent and reconciler read int32; a larger value would be retried forever.
    for bad in [
        "",
        "-1",
        "+1",
        "1.0",
        "one",
        " 1",
        "12345678901",
        "2147483648",
        "9999999999",
    ] {
        denied(
            &format!("epoch {bad:?}"),
            "never decreases",
            &own,
            &at(Some("1")),
            &at(Some(bad)),
        );
    }

    // Not the policy's business: other users, other operations.
    for user in [
        "system:serviceaccount:team-a:default",
        "system:serviceaccount:team-a:jobset-inplace-agent-2",
        "system:serviceaccount:team-a:my-jobset-inplace-agent",
        "system:serviceaccount:jobset-inplace-system:jobset-inplace-reconciler",
        "alice",
        "jobset-inplace-agent",
    ] {
        let request = update_request(user, Some("js-0"), "");
        let anything = edit(&at(Some("1")), &|p| {
            p["spec"]["containers"][0]["image"] = json!("x")
        });
        assert_eq!(
            verdict(&request, &at(Some("1")), &anything),
            Verdict::NotMatched,
            "{what}: {user}"
        );
    }
    for operation in ["CREATE", "DELETE", "CONNECT"] {
        let mut request = own.clone();
        request["operation"] = json!(operation);
        assert_eq!(
            verdict(&request, &at(Some("1")), &at(Some("1"))),
            Verdict::NotMatched,
            "{what}: {operation}"
        );
    }
}

#[test]
fn the_agent_policy_allows_only_the_agents_own_epoch_annotation() {
    use jobset_inplace::admission::config::DEFAULT_SERVICE_ACCOUNT;
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let policy = r.get("ValidatingAdmissionPolicy", "jobset-inplace-agent");
        let binding = r.get("ValidatingAdmissionPolicyBinding", "jobset-inplace-agent");
        assert_eq!(binding["spec"]["policyName"], "jobset-inplace-agent");
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        let dialect = overlay_dialect(name);
        assert_eq!(
            policy["spec"]["variables"][0],
            json!({"name": "epochAnnotation", "expression": format!("'{}'", dialect.pod_annotation())}),
            "{name}"
        );
        // The account it restricts is the one the webhook injects.
        let condition = policy["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap_or_default();
        assert!(
            condition.contains(&format!(":{DEFAULT_SERVICE_ACCOUNT}$")),
            "{condition}"
        );
        check_agent_policy(name, policy, dialect);
    }
}

/// The policy file as written, for both dialects, without kubectl.
#[test]
fn the_agent_policy_file_evaluates_for_both_dialects() {
    let text = std::fs::read_to_string(deploy_dir().join("base/agent-policy.yaml")).expect("read");
    let policy = serde_saphyr::from_multiple::<Value>(&text)
        .expect("yaml")
        .into_iter()
        .find(|v| v["kind"] == "ValidatingAdmissionPolicy")
        .expect("policy");
    for dialect in Dialect::ALL {
        let mut policy = policy.clone();
        policy["spec"]["variables"][0]["expression"] =
            json!(format!("'{}'", dialect.pod_annotation()));
        check_agent_policy(dialect.as_str(), &policy, dialect);
    }
}

#[test]
fn the_agent_role_is_what_the_agent_needs() {
    use jobset_inplace::reconciler::provision::ProvisionSettings;
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let settings = ProvisionSettings::default();
        let role = r.get("ClusterRole", &settings.cluster_role);
        assert_eq!(
            role["rules"],
            json!([
                {"apiGroups": ["jobset-inplace.dev"], "resources": ["jobsetepochs"], "verbs": ["watch"]},
                {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}
            ]),
            "{name}"
        );
        // The reconciler may bind it without holding it.
        let reconciler = r.get("ClusterRole", "jobset-inplace-reconciler");
        assert!(
            reconciler["rules"].as_array().into_iter().flatten().any(|rule| rule
                == &json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                           "resourceNames": [settings.cluster_role], "verbs": ["bind"]})),
            "{name}: bind on the agent role"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// RBAC: every request the components make is granted, and nothing they never ask for
// ---------------------------------------------------------------------------------------------

/// The rules bound to one service account of this namespace: cluster-wide, and in the namespace.
struct Grants {
    cluster: Vec<Value>,
    namespaced: Vec<Value>,
}

fn grants_for(r: &Rendered, account: &str) -> Grants {
    let subject = json!({"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE});
    let bound = |binding_kind: &str| -> Vec<Value> {
        r.of_kind(binding_kind)
            .into_iter()
            .filter(|b| {
                b["subjects"]
                    .as_array()
                    .is_some_and(|s| s.contains(&subject))
            })
            .flat_map(|b| {
                let role = r.get(
                    b["roleRef"]["kind"].as_str().unwrap_or_default(),
                    b["roleRef"]["name"].as_str().unwrap_or_default(),
                );
                role["rules"].as_array().cloned().unwrap_or_default()
            })
            .collect()
    };
    Grants {
        cluster: bound("ClusterRoleBinding"),
        namespaced: bound("RoleBinding"),
    }
}

fn rule_allows(rule: &Value, group: &str, resource: &str, verb: &str, name: Option<&str>) -> bool {
    let has = |field: &str, want: &str| strings(&rule[field]).iter().any(|v| v == want || v == "*");
    let names = strings(&rule["resourceNames"]);
    has("apiGroups", group)
        && has("resources", resource)
        && has("verbs", verb)
        && (names.is_empty() || name.is_some_and(|n| names.iter().any(|r| r == n)))
}

/// Every (group, resource, verb) the rules grant.
fn granted(rules: &[Value]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in rules {
        for g in strings(&rule["apiGroups"]) {
            for res in strings(&rule["resources"]) {
                for v in strings(&rule["verbs"]) {
                    out.insert((g.clone(), res.clone(), v));
                }
            }
        }
    }
    out
}

/// The requests the test API server counted, as (group, resource[/subresource], verb).
fn observed(
    server: &jobset_inplace_testkit::apiserver::TestApiServer,
) -> BTreeSet<(String, String, String)> {
    let registry = server.registry();
    server
        .counters()
        .by
        .keys()
        .map(|(verb, name)| {
            let (base, sub) = match name.split_once('/') {
                Some((b, s)) => (b, Some(s)),
                None => (name.as_str(), None),
            };
            let id = registry
                .resolve(base)
                .unwrap_or_else(|| panic!("unknown resource {name}"));
            let t = &registry.types()[id];
            let resource = match sub {
                Some(s) => format!("{}/{s}", t.plural),
                None => t.plural.to_string(),
            };
            (t.group.to_string(), resource, verb.as_str().to_owned())
        })
        .collect()
}

/// Checks `seen` against `grants`; `named` gives the object name of requests on resources only
/// granted by name; `namespaced` lists the resources requested in this namespace only (the rest
/// are requested in any namespace, so need cluster-wide rules). Returns what is granted but never
/// requested.
fn check_grants(
    what: &str,
    grants: &Grants,
    seen: &BTreeSet<(String, String, String)>,
    named: &BTreeMap<&str, &str>,
    namespaced: &[&str],
) -> BTreeSet<(String, String, String)> {
    for (group, resource, verb) in seen {
        let name = if verb == "create" || verb == "list" || verb == "watch" {
            None
        } else {
            named.get(resource.as_str()).copied()
        };
        let mut rules = grants.cluster.iter().collect::<Vec<_>>();
        if namespaced.contains(&resource.as_str()) {
            rules.extend(grants.namespaced.iter());
        }
        assert!(
            rules
                .iter()
                .any(|r| rule_allows(r, group, resource, verb, name)),
            "{what}: `{verb} {resource}` (group {group:?}, name {name:?}) is not granted"
        );
    }
    let mut all = granted(&grants.cluster);
    all.extend(granted(&grants.namespaced));
    all.difference(seen).cloned().collect()
}

/// Polls `f` every 10 ms for up to 30 s.
async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn jobset_json(ns: &str, name: &str, max_restarts: i64) -> Value {
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"failurePolicy": {"restartStrategy": "InPlaceRestart", "maxRestarts": max_restarts},
                 "replicatedJobs": [
                    {"name": "w", "replicas": 1, "template": {"spec": {"parallelism": 1, "completions": 1,
                        "template": {"spec": {"containers": [{"name": "w", "image": "w"}]}}}}},
                    {"name": "t", "replicas": 1, "template": {"spec": {"parallelism": 1, "completions": 1,
                        "template": {"spec": {"serviceAccountName": "trainer", "containers": [{"name": "w", "image": "w"}]}}}}}
                 ]},
        "status": {}
    })
}

#[tokio::test]
async fn the_reconcilers_rbac_grants_every_request_it_makes_and_no_more() {
    use jobset_inplace::reconciler::provision::{self, ProvisionSettings};
    use jobset_inplace::reconciler::{self, LeaderElection, Options, Settings, crd};
    use jobset_inplace_testkit::apiserver::{TestApiServer, Verb};
    // The attempt dialect runs on the released CRD, so the start-up CRD check runs too.
    let Some(r) = overlay("jobset-native") else {
        return;
    };
    let Sub::Reconciler(args) =
        parse_args(r.container("jobset-inplace-reconciler", "reconciler")).command
    else {
        panic!("reconciler")
    };
    let dialect = Dialect::Attempt;
    let server = TestApiServer::start().await;
    let seen = tokio::time::timeout(Duration::from_secs(60), async {
        let crd_object = fixtures::read_yaml(&fixtures::reference_dir().join("jobset.x-k8s.io_jobsets.yaml"));
        server.create("customresourcedefinitions", crd_object).expect("crd");
        let epochs_crd = fixtures::read_yaml(&deploy_dir().join("base/jobsetepoch-crd.yaml"));
        server.create("customresourcedefinitions", epochs_crd).expect("crd");
        server
            .create("namespaces", json!({"metadata": {"name": "team-b", "labels": {"jobset-inplace.dev/enabled": "true"}}}))
            .expect("namespace");
        // The deadline's steps run within seconds: the JobSet's annotation sets a 1 s timeout.
        let mut js = jobset_json("team-a", "js", 2);
        js["metadata"]["annotations"] = json!({jobset_inplace::deadline::TIMEOUT_ANNOTATION: "1s"});
        let js = server.create("jobsets", js).expect("jobset");
        // A Job of the JobSet, for a recreation to delete.
        server
            .create("jobs", json!({"metadata": {"name": "js-w-0", "namespace": "team-a",
                "labels": {JOBSET_NAME_LABEL: "js", jobset_inplace::deadline::RESTART_ATTEMPT_LABEL: "0"},
                "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "js",
                                     "uid": js["metadata"]["uid"], "controller": true}]},
                "spec": {"template": {"spec": {"containers": [{"name": "w", "image": "w"}]}}}}))
            .expect("job");
        for i in 0..2 {
            server
                .create("pods", jobset_inplace_testkit::reconciler::member_of(&server, json!({"metadata": {"name": format!("js-{i}"), "namespace": "team-a",
                    "labels": {JOBSET_NAME_LABEL: "js", "batch.kubernetes.io/job-name": "js-w-0"}, "annotations": {JOBSET_NAME_LABEL: "js"}},
                    "spec": {"containers": [{"name": "w", "image": "w"}]},
                    "status": {"phase": "Running", "containerStatuses": [{"name": "w", "restartCount": 0}]}})))
                .expect("pod");
        }
        let options = Options {
            settings: Settings {
                dialect,
                namespace: args.namespace.clone(),
                workers: 2,
                debounce: Duration::from_millis(5),
                identity: "jobset-inplace-reconciler-0".to_owned(),
                provision: args.provision_service_accounts.then(|| ProvisionSettings {
                    service_account: args.agent_service_account.clone(),
                    cluster_role: args.agent_cluster_role.clone(),
                    own_namespace: NAMESPACE.to_owned(),
                }),
                request_timeout: args.request_timeout,
                watch_timeout: args.watch_timeout,
                write_epoch_status: args.write_epoch_status,
                publish_epochs: true,
                group_restart_timeout: (!args.group_restart_timeout.is_zero())
                    .then_some(args.group_restart_timeout),
                node_lost_grace: (!args.node_lost_grace.is_zero()).then_some(args.node_lost_grace),
            },
            leader_election: args.leader_elect.then(|| LeaderElection {
                lease_name: args.lease_name.clone(),
                lease_namespace: NAMESPACE.to_owned(),
                duration: Duration::from_secs(args.lease_duration_seconds),
                grace: Duration::from_secs(args.lease_grace_seconds),
            }),
            check_crd: !args.skip_crd_check,
        };
        assert!(options.check_crd && options.leader_election.is_some());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(reconciler::run(server.client(), options, None, async {
            let _ = stopped.await;
        }));
        let status = |field: &str| server.get("jobsets", "team-a", "js").map(|j| j["status"][field].clone());
        let set_epoch = |pod: &str, epoch: &str| {
            server
                .patch("pods", "team-a", pod, &json!({"metadata": {"annotations": {dialect.pod_annotation(): epoch}}}))
                .expect("pod");
        };
        // Every pod registers: synced.
        set_epoch("js-0", "0");
        set_epoch("js-1", "0");
        until("synced 0", || status(dialect.synced_field()) == Some(json!(0))).await;
        // A group restart; its first status write meets a conflict and is re-read.
        server.fail_next(1, Verb::Patch, "jobsets/status", 409);
        set_epoch("js-0", "1");
        until("deprecated 0", || status(dialect.deprecated_field()) == Some(json!(0))).await;
        set_epoch("js-1", "1");
        until("synced 1", || status(dialect.synced_field()) == Some(json!(1))).await;
        // A second restart that js-1 never joins: the group-restart deadline deletes it after
        // 1 s, then recreates the JobSet (status.restarts, its Job deleted) 1 s later.
        set_epoch("js-0", "2");
        until("js-1 deleted", || server.get("pods", "team-a", "js-1").is_none()).await;
        until("recreated", || status("restarts") == Some(json!(1))).await;
        until("the Job deleted", || {
            server.get("jobs", "team-a", "js-w-0").is_some_and(|j| j["metadata"]["deletionTimestamp"].is_string())
        })
        .await;
        // One restart too many: the JobSet fails.
        set_epoch("js-0", "3");
        until("failed", || {
            status("conditions").is_some_and(|c| c.as_array().into_iter().flatten().any(|c| c["type"] == "Failed"))
        })
        .await;
        // The agent's accounts, in the JobSet's namespace and the labelled one.
        until("provisioned", || {
            ["team-a", "team-b"].iter().all(|ns| {
                server.get("serviceaccounts", ns, "jobset-inplace-agent").is_some()
                    && server.get("rolebindings", ns, "jobset-inplace-agent").is_some()
            })
        })
        .await;
        until("events", || !server.list("events.events.k8s.io", Some("team-a")).is_empty()).await;
        // What provisioning stored passes the provisioning policies, as created and as applied
        // again.
        for ns in ["team-a", "team-b"] {
            for (resource, policy) in [
                ("serviceaccounts", "jobset-inplace-reconciler-agent-accounts"),
                ("rolebindings", "jobset-inplace-reconciler-binds-agent"),
            ] {
                let stored = server.get(resource, ns, "jobset-inplace-agent").expect("provisioned");
                let policy = r.get("ValidatingAdmissionPolicy", policy);
                for (op, old) in [("CREATE", Value::Null), ("UPDATE", stored.clone())] {
                    let request = object_request(RECONCILER_USER, op, ns, "jobset-inplace-agent");
                    assert_eq!(
                        evaluate_matched(policy, &request, &stored, &old),
                        Verdict::Allowed,
                        "{op} {resource} in {ns}: {stored}"
                    );
                }
            }
        }
        // team-b no longer asks for the agent's account: its binding goes.
        server
            .patch("namespaces", "", "team-b", &json!({"metadata": {"labels": {"jobset-inplace.dev/enabled": null}}}))
            .expect("unlabel");
        until("binding removed", || server.get("rolebindings", "team-b", "jobset-inplace-agent").is_none()).await;
        let _ = stop.send(());
        match tokio::time::timeout(Duration::from_secs(20), task).await {
            Ok(Ok(result)) => result.expect("the reconciler ran"),
            other => panic!("the reconciler did not stop: {other:?}"),
        }
        observed(&server)
    })
    .await
    .expect("the scenario finished in time");
    // The CRD check passed on the released CRD in this dialect, as in the cluster.
    let released =
        fixtures::read_yaml(&fixtures::reference_dir().join("jobset.x-k8s.io_jobsets.yaml"));
    assert_eq!(crd::missing_status_fields(&released, dialect), Ok(()));

    let named = BTreeMap::from([
        ("customresourcedefinitions", crd::CRD_NAME),
        ("leases", args.lease_name.as_str()),
        ("serviceaccounts", provision::ROLE_BINDING),
        ("rolebindings", provision::ROLE_BINDING),
    ]);
    let grants = grants_for(&r, "jobset-inplace-reconciler");
    // Issue 21: its patches and deletes of RoleBindings and ServiceAccounts name the agent's
    // objects (RBAC cannot name the object of a create or a list).
    for (group, resource, verb) in [
        ("rbac.authorization.k8s.io", "rolebindings", "patch"),
        ("rbac.authorization.k8s.io", "rolebindings", "delete"),
        ("", "serviceaccounts", "patch"),
    ] {
        let rules: Vec<&Value> = grants
            .cluster
            .iter()
            .chain(grants.namespaced.iter())
            .collect();
        assert!(
            rules.iter().any(|rule| rule_allows(
                rule,
                group,
                resource,
                verb,
                Some(provision::ROLE_BINDING)
            )),
            "`{verb} {resource}` of the agent's object"
        );
        for other in [None, Some("default"), Some("kube-proxy")] {
            assert!(
                !rules
                    .iter()
                    .any(|rule| rule_allows(rule, group, resource, verb, other)),
                "`{verb} {resource}` of {other:?} is granted"
            );
        }
    }
    // Leases only in its own namespace; never cluster-wide.
    assert!(
        grants
            .cluster
            .iter()
            .all(|rule| !strings(&rule["resources"]).contains(&"leases".to_owned()))
    );
    let unused = check_grants("reconciler", &grants, &seen, &named, &["leases"]);
    let reasons: BTreeMap<(&str, &str, &str), &str> = BTreeMap::from([
        (
            ("events.k8s.io", "events", "patch"),
            "a repeated event is patched into a series",
        ),
        (
            ("", "serviceaccounts", "create"),
            "server-side apply of a new object is authorized as create",
        ),
        (
            ("rbac.authorization.k8s.io", "rolebindings", "create"),
            "server-side apply of a new object is authorized as create",
        ),
        (
            ("jobset-inplace.dev", "jobsetepochs", "create"),
            "server-side apply of a new object is authorized as create",
        ),
        (
            ("rbac.authorization.k8s.io", "clusterroles", "bind"),
            "binding the agent role without holding it; no request",
        ),
    ]);
    let unexplained: Vec<_> = unused
        .iter()
        .filter(|(g, res, v)| !reasons.contains_key(&(g.as_str(), res.as_str(), v.as_str())))
        .collect();
    assert!(
        unexplained.is_empty(),
        "granted to the reconciler but never requested: {unexplained:?}\nrequested: {seen:?}"
    );
}

/// A kustomization of one's own without a certificate component (deploy/README.md, "Your own
/// CA"): the webhook serves the Secret `jobset-inplace certs --secret` fills, mounted, with no
/// API access, and the CA key stays out of the pod.
#[test]
fn without_a_certificate_component_the_webhook_serves_the_mounted_secret() {
    if !have_kubectl() {
        return;
    }
    let kustomization = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
        resources:\n- {deploy}/base\n\
        components:\n- {deploy}/components/epoch-status-fields\n";
    let r = Rendered {
        name: "own certificates".to_owned(),
        objects: render_kustomization(kustomization, &[]),
    };
    let c = r.container("jobset-inplace-webhook", "webhook");
    let Sub::Webhook(args) = parse_args(c).command else {
        panic!("the webhook container runs `webhook`")
    };
    assert!(!args.self_signed);
    let pod = &r.deployment("jobset-inplace-webhook")["spec"]["template"]["spec"];
    for (file, key) in [(&args.tls_cert, "tls.crt"), (&args.tls_key, "tls.key")] {
        let file = file.as_deref().expect("--tls-cert and --tls-key");
        let (_, volume) = mount_for(pod, c, file);
        assert_eq!(volume["secret"]["secretName"], "jobset-inplace-webhook-tls");
        let items = volume["secret"]["items"].as_array().expect("items");
        assert!(items.iter().any(|i| i["key"] == key), "{key}");
        assert!(items.iter().all(|i| i["key"] != "ca.key"));
    }
    assert_eq!(pod["automountServiceAccountToken"], false);
    let grants = grants_for(&r, "jobset-inplace-webhook");
    assert!(grants.cluster.is_empty() && grants.namespaced.is_empty());
    assert!(r.of_kind("ValidatingAdmissionPolicy").iter().all(|p| {
        p["metadata"]["name"] != "jobset-inplace-webhook-ca-bundle"
            && p["metadata"]["name"] != "jobset-inplace-webhook-secret"
    }));
}

/// RBAC grants the reconciler `delete` on every pod and Job and `patch` on every pod's status;
/// its policy holds those deletes to the pods and Jobs of JobSets (the jobset-name label), and its
/// status writes to marking such a pod Failed, in every overlay. Other accounts are not matched.
#[test]
fn the_reconcilers_deletes_are_held_to_the_pods_and_jobs_of_jobsets() {
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let policy = r.get(
            "ValidatingAdmissionPolicy",
            "jobset-inplace-reconciler-deletes",
        );
        assert_eq!(check_object(policy), Vec::<String>::new(), "{name}");
        let binding = r.get(
            "ValidatingAdmissionPolicyBinding",
            "jobset-inplace-reconciler-deletes",
        );
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        let fails = r.get(
            "ValidatingAdmissionPolicy",
            "jobset-inplace-reconciler-fails-pods",
        );
        assert_eq!(check_object(fails), Vec::<String>::new(), "{name}");
        let binding = r.get(
            "ValidatingAdmissionPolicyBinding",
            "jobset-inplace-reconciler-fails-pods",
        );
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        assert_eq!(fails["spec"]["failurePolicy"], "Fail");
        let rules = |p: &Value| -> Vec<(Vec<String>, Vec<String>, Vec<String>)> {
            p["spec"]["matchConstraints"]["resourceRules"]
                .as_array()
                .expect("rules")
                .iter()
                .map(|r| {
                    (
                        strings(&r["apiGroups"]),
                        strings(&r["resources"]),
                        strings(&r["operations"]),
                    )
                })
                .collect()
        };
        let delete = vec!["DELETE".to_owned()];
        assert_eq!(
            rules(policy),
            [
                (vec![String::new()], vec!["pods".to_owned()], delete.clone()),
                (vec!["batch".to_owned()], vec!["jobs".to_owned()], delete)
            ],
            "{name}"
        );
        assert_eq!(
            rules(fails),
            [(
                vec![String::new()],
                vec!["pods/status".to_owned()],
                vec!["UPDATE".to_owned()]
            )],
            "{name}"
        );
        // Marking a pod of a JobSet Failed, and nothing else of a pod's status.
        let update = json!({"operation": "UPDATE", "subResource": "status",
                            "userInfo": {"username": "system:serviceaccount:jobset-inplace-system:jobset-inplace-reconciler"}});
        let pod = |labels: Value, phase: &str| {
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "p", "namespace": "team-a", "labels": labels},
                   "status": {"phase": phase}})
        };
        let of_js = json!({JOBSET_NAME_LABEL: "js"});
        assert_eq!(
            evaluate_matched(
                fails,
                &update,
                &pod(of_js.clone(), "Failed"),
                &pod(of_js.clone(), "Running")
            ),
            Verdict::Allowed,
            "{name}: a JobSet's pod marked Failed"
        );
        for (labels, phase) in [
            (of_js.clone(), "Running"),
            (of_js.clone(), "Succeeded"),
            (json!({"app": "x"}), "Failed"),
        ] {
            assert!(
                matches!(
                    evaluate_matched(
                        fails,
                        &update,
                        &pod(labels.clone(), phase),
                        &pod(labels.clone(), "Running")
                    ),
                    Verdict::Denied(_)
                ),
                "{name}: {labels} to {phase}"
            );
        }
        // The account it binds is the reconciler's, as deployed.
        let reconciler = "system:serviceaccount:jobset-inplace-system:jobset-inplace-reconciler";
        assert!(
            !grants_for(&r, "jobset-inplace-reconciler")
                .cluster
                .is_empty(),
            "{name}: the reconciler's account"
        );
        let request = |user: &str| json!({"operation": "DELETE", "userInfo": {"username": user}});
        let object = |kind: &str, labels: Value| {
            json!({"apiVersion": if kind == "Job" { "batch/v1" } else { "v1" }, "kind": kind,
                   "metadata": {"name": "x", "namespace": "team-a", "labels": labels}})
        };
        let of_jobset = json!({JOBSET_NAME_LABEL: "js", "app": "x"});
        for kind in ["Pod", "Job"] {
            let verdict = |user: &str, old: &Value| {
                evaluate_matched(policy, &request(user), &Value::Null, old)
            };
            assert_eq!(
                verdict(reconciler, &object(kind, of_jobset.clone())),
                Verdict::Allowed,
                "{name}: a {kind} of a JobSet"
            );
            for other in [json!({"app": "x"}), json!({})] {
                assert!(
                    matches!(
                        verdict(reconciler, &object(kind, other.clone())),
                        Verdict::Denied(_)
                    ),
                    "{name}: a {kind} of no JobSet ({other})"
                );
            }
            // No labels at all (an empty map is not stored).
            let mut unlabelled = object(kind, json!({}));
            unlabelled["metadata"]
                .as_object_mut()
                .map(|m| m.remove("labels"));
            assert!(matches!(
                verdict(reconciler, &unlabelled),
                Verdict::Denied(_)
            ));
            for user in [
                "system:serviceaccount:kube-system:generic-garbage-collector",
                "system:serviceaccount:team-a:jobset-inplace-reconciler",
                "alice",
            ] {
                assert_eq!(
                    verdict(user, &object(kind, json!({"app": "x"}))),
                    Verdict::NotMatched,
                    "{name}: {user}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The reconciler's provisioning and pod-status writes, held by policies (issue 21)
// ---------------------------------------------------------------------------------------------

const RECONCILER_USER: &str =
    "system:serviceaccount:jobset-inplace-system:jobset-inplace-reconciler";

/// Whether a policy's match constraints select `operation` on `group`/`resource` (v1).
fn policy_matches(policy: &Value, group: &str, resource: &str, operation: &str) -> bool {
    policy["spec"]["matchConstraints"]["resourceRules"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|rule| {
            strings(&rule["apiGroups"]).iter().any(|g| g == group)
                && strings(&rule["apiVersions"]).iter().any(|v| v == "v1")
                && strings(&rule["resources"]).iter().any(|r| r == resource)
                && strings(&rule["operations"]).iter().any(|o| o == operation)
        })
}

/// A policy variable's value, evaluated alone (one that needs no request).
fn policy_variable(policy: &Value, name: &str) -> cel::Value {
    let expression = policy["spec"]["variables"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == name)
        .and_then(|v| v["expression"].as_str())
        .unwrap_or_else(|| panic!("no variable {name}"));
    cel_eval(expression, &[], &HashMap::new()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn cel_strings(value: &cel::Value) -> BTreeSet<String> {
    match value {
        cel::Value::List(items) => items
            .iter()
            .map(|v| match v {
                cel::Value::String(s) => s.to_string(),
                other => panic!("not a string: {other:?}"),
            })
            .collect(),
        other => panic!("not a list: {other:?}"),
    }
}

/// A request of `user` on a namespaced object.
fn object_request(user: &str, operation: &str, namespace: &str, name: &str) -> Value {
    json!({"operation": operation, "namespace": namespace, "name": name,
           "userInfo": {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]}})
}

/// RFC 7386 JSON merge patch (what a `Patch::Merge` does to the stored object).
fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let map = target.as_object_mut().expect("an object");
    for (key, value) in fields {
        if value.is_null() {
            map.remove(key);
        } else {
            merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Issue 21, item 1: RBAC lets the reconciler create any RoleBinding and bind the agent role, so
/// its token could bind that role to any subject in any namespace (`patch pods` with no policy
/// holding the subject), delete any RoleBinding and patch any ServiceAccount. The two
/// provisioning policies, evaluated with CEL on what provisioning writes (allowed) and on the
/// attack's objects (refused), in every overlay; the protected namespaces are the code's.
#[test]
fn the_reconcilers_provisioning_is_held_to_the_agents_binding_and_account() {
    use jobset_inplace::reconciler::provision::{self, ProvisionSettings};
    let settings = ProvisionSettings::default();
    let agent = settings.service_account.clone();
    assert_eq!(agent, settings.cluster_role);
    assert_eq!(agent, provision::ROLE_BINDING);
    let mut protected: BTreeSet<String> = provision::SYSTEM_NAMESPACES
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    protected.insert(settings.own_namespace.clone());
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let binds = r.get(
            "ValidatingAdmissionPolicy",
            "jobset-inplace-reconciler-binds-agent",
        );
        let accounts = r.get(
            "ValidatingAdmissionPolicy",
            "jobset-inplace-reconciler-agent-accounts",
        );
        for policy in [binds, accounts] {
            let policy_name = policy["metadata"]["name"].as_str().expect("name");
            assert_eq!(check_object(policy), Vec::<String>::new(), "{name}");
            assert_eq!(policy["spec"]["failurePolicy"], "Fail");
            let binding = r.get("ValidatingAdmissionPolicyBinding", policy_name);
            assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
            assert_eq!(binding["spec"]["policyName"], policy_name);
            // One list of protected namespaces: the code's.
            assert_eq!(
                cel_strings(&policy_variable(policy, "protectedNamespaces")),
                protected,
                "{name}: {policy_name}"
            );
            assert_eq!(
                policy_variable(policy, "agent"),
                cel::Value::String(agent.clone().into())
            );
        }
        for op in ["CREATE", "UPDATE", "DELETE"] {
            assert!(policy_matches(
                binds,
                "rbac.authorization.k8s.io",
                "rolebindings",
                op
            ));
        }
        for op in ["CREATE", "UPDATE"] {
            assert!(policy_matches(accounts, "", "serviceaccounts", op));
        }

        // RoleBindings.
        let verdict = |op: &str, ns: &str, object: &Value, old: &Value| {
            let target = if op == "DELETE" { old } else { object };
            let name = target["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            evaluate_matched(
                binds,
                &object_request(RECONCILER_USER, op, ns, &name),
                object,
                old,
            )
        };
        let provisioned =
            |ns: &str| provision::role_binding(ns, &BTreeSet::from([agent.clone()]), &settings);
        let mut defaulted = provisioned("team-a");
        defaulted["subjects"][0]["apiGroup"] = json!("");
        for (what, object) in [
            ("as provisioning applies it", provisioned("team-a")),
            ("as the API server stores it", defaulted.clone()),
        ] {
            assert_eq!(
                verdict("CREATE", "team-a", &object, &Value::Null),
                Verdict::Allowed,
                "{name}: {what}"
            );
            assert_eq!(
                verdict("UPDATE", "team-a", &object, &defaulted),
                Verdict::Allowed,
                "{name}: {what}, again"
            );
        }
        assert_eq!(
            verdict("DELETE", "team-a", &Value::Null, &defaulted),
            Verdict::Allowed,
            "{name}: a binding no JobSet needs removed"
        );
        let with = |ns: &str, f: &dyn Fn(&mut Value)| {
            let mut b = provisioned(ns);
            f(&mut b);
            b
        };
        let subject = |kind: &str, name: &str, ns: &str| json!([{"kind": kind, "name": name, "namespace": ns}]);
        let refused: Vec<(&str, &str, Value)> = vec![
            (
                "the reconciler's own account bound in kube-system",
                "kube-system",
                with("kube-system", &|b| {
                    b["subjects"] =
                        subject("ServiceAccount", "jobset-inplace-reconciler", NAMESPACE)
                }),
            ),
            (
                "the reconciler's own account bound in a workload namespace",
                "team-a",
                with("team-a", &|b| {
                    b["subjects"] =
                        subject("ServiceAccount", "jobset-inplace-reconciler", NAMESPACE)
                }),
            ),
            (
                "the namespace's default account",
                "team-a",
                with("team-a", &|b| {
                    b["subjects"] = subject("ServiceAccount", "default", "team-a")
                }),
            ),
            (
                "another namespace's agent account",
                "team-a",
                with("team-a", &|b| {
                    b["subjects"] = subject("ServiceAccount", &agent, "team-b")
                }),
            ),
            (
                "a subject without a namespace",
                "team-a",
                with("team-a", &|b| {
                    b["subjects"] = json!([{"kind": "ServiceAccount", "name": agent}])
                }),
            ),
            (
                "a user named as the agent",
                "team-a",
                with(
                    "team-a",
                    &|b| b["subjects"] = json!([{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": format!("system:serviceaccount:team-a:{agent}")}]),
                ),
            ),
            (
                "a group",
                "team-a",
                with(
                    "team-a",
                    &|b| b["subjects"] = json!([{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:serviceaccounts"}]),
                ),
            ),
            (
                "a second subject",
                "team-a",
                with("team-a", &|b| {
                    b["subjects"] = json!([{"kind": "ServiceAccount", "name": agent, "namespace": "team-a"},
                                           {"kind": "ServiceAccount", "name": "default", "namespace": "team-a"}])
                }),
            ),
            (
                "no subject",
                "team-a",
                with("team-a", &|b| {
                    b.as_object_mut().map(|o| o.remove("subjects"));
                }),
            ),
            (
                "another name",
                "team-a",
                with("team-a", &|b| b["metadata"]["name"] = json!("other")),
            ),
            (
                "another ClusterRole",
                "team-a",
                with("team-a", &|b| b["roleRef"]["name"] = json!("admin")),
            ),
            (
                "a Role of the agent's name",
                "team-a",
                with("team-a", &|b| b["roleRef"]["kind"] = json!("Role")),
            ),
        ];
        let mut refused = refused;
        for ns in &protected {
            refused.push((
                "the provisioning shape in a protected namespace",
                ns.as_str(),
                provisioned(ns),
            ));
        }
        for (what, ns, object) in &refused {
            for (op, old) in [("CREATE", Value::Null), ("UPDATE", object.clone())] {
                assert!(
                    matches!(verdict(op, ns, object, &old), Verdict::Denied(_)),
                    "{name}: {op} {what} ({ns})"
                );
            }
        }
        let mut other = defaulted.clone();
        other["metadata"]["name"] = json!("team-a-admins");
        assert!(
            matches!(
                verdict("DELETE", "team-a", &Value::Null, &other),
                Verdict::Denied(_)
            ),
            "{name}: deleting an unrelated RoleBinding"
        );

        // ServiceAccounts.
        let sa_verdict = |op: &str, ns: &str, object: &Value, old: &Value| {
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            evaluate_matched(
                accounts,
                &object_request(RECONCILER_USER, op, ns, &name),
                object,
                old,
            )
        };
        let sa = provision::service_account("team-a", &settings);
        assert_eq!(
            sa_verdict("CREATE", "team-a", &sa, &Value::Null),
            Verdict::Allowed,
            "{name}"
        );
        assert_eq!(
            sa_verdict("UPDATE", "team-a", &sa, &sa),
            Verdict::Allowed,
            "{name}"
        );
        // Issue 34: the provisioned account does not automount its token, and an account
        // provisioned before (without the field) is turned off by the next apply.
        assert_eq!(sa["automountServiceAccountToken"], false, "{name}");
        let mut before = sa.clone();
        before
            .as_object_mut()
            .expect("object")
            .remove("automountServiceAccountToken");
        assert_eq!(
            sa_verdict("UPDATE", "team-a", &sa, &before),
            Verdict::Allowed,
            "{name}: turning automounting off"
        );
        // What others set on the account stays, and does not stop the reconciler's apply.
        let mut kept = sa.clone();
        kept["imagePullSecrets"] = json!([{"name": "registry"}]);
        kept["automountServiceAccountToken"] = json!(false);
        assert_eq!(
            sa_verdict("UPDATE", "team-a", &kept, &kept),
            Verdict::Allowed,
            "{name}"
        );
        let mut others_true = sa.clone();
        others_true["automountServiceAccountToken"] = json!(true);
        assert_eq!(
            sa_verdict("UPDATE", "team-a", &sa, &others_true),
            Verdict::Allowed,
            "{name}: turning another's true off"
        );
        let sa_with = |ns: &str, f: &dyn Fn(&mut Value)| {
            let mut s = provision::service_account(ns, &settings);
            f(&mut s);
            s
        };
        let mut refused_accounts: Vec<(&str, &str, Value, Value)> = vec![
            (
                "another account",
                "team-a",
                sa_with("team-a", &|s| s["metadata"]["name"] = json!("default")),
                Value::Null,
            ),
            (
                "pull secrets added",
                "team-a",
                sa_with("team-a", &|s| {
                    s["imagePullSecrets"] = json!([{"name": "x"}])
                }),
                sa.clone(),
            ),
            (
                "secrets added",
                "team-a",
                sa_with("team-a", &|s| s["secrets"] = json!([{"name": "x"}])),
                sa.clone(),
            ),
            (
                "token automount set",
                "team-a",
                sa_with("team-a", &|s| {
                    s["automountServiceAccountToken"] = json!(true)
                }),
                kept.clone(),
            ),
            (
                "created with token automounting",
                "team-a",
                sa_with("team-a", &|s| {
                    s["automountServiceAccountToken"] = json!(true)
                }),
                Value::Null,
            ),
            (
                "token automount turned on",
                "team-a",
                sa_with("team-a", &|s| {
                    s["automountServiceAccountToken"] = json!(true)
                }),
                before.clone(),
            ),
            (
                "created with pull secrets",
                "team-a",
                sa_with("team-a", &|s| {
                    s["imagePullSecrets"] = json!([{"name": "x"}])
                }),
                Value::Null,
            ),
        ];
        for ns in &protected {
            refused_accounts.push((
                "in a protected namespace",
                ns.as_str(),
                provision::service_account(ns, &settings),
                Value::Null,
            ));
        }
        for (what, ns, object, old) in &refused_accounts {
            let op = if old.is_null() { "CREATE" } else { "UPDATE" };
            assert!(
                matches!(sa_verdict(op, ns, object, old), Verdict::Denied(_)),
                "{name}: {op} {what} ({ns})"
            );
        }

        // Only the reconciler's account is held.
        for user in [
            "system:serviceaccount:team-a:jobset-inplace-reconciler",
            "system:serviceaccount:kube-system:clusterrole-aggregation-controller",
            "alice",
        ] {
            let object = &refused[0].2;
            assert_eq!(
                evaluate_matched(
                    binds,
                    &object_request(user, "CREATE", "kube-system", &agent),
                    object,
                    &Value::Null
                ),
                Verdict::NotMatched,
                "{name}: {user}"
            );
        }
    }
}

/// Issue 21, item 9: the reconciler's pod status write marks a pod of a JobSet `Failed` with a
/// reason and a message (the deadline's merge patch), and changes nothing else of the pod in the
/// same write (conditions, IPs, container statuses, labels, ...), and not on a pod that has
/// already ended. Every PodStatus field of the Kubernetes version the manifests are checked
/// against is either one of those three or held unchanged by the policy.
#[test]
fn the_reconcilers_pod_status_write_only_marks_a_pod_failed() {
    use k8s_openapi::api::core::v1::PodStatus;
    // Every field of PodStatus, filled; the destructuring below has no `..`, so a new field in the
    // typed version fails to compile here.
    let every: Value = json!({
        "allocatedResources": {"cpu": "1"},
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "w", "image": "w", "imageID": "", "ready": true, "restartCount": 0}],
        "ephemeralContainerStatuses": [{"name": "e", "image": "e", "imageID": "", "ready": false, "restartCount": 0}],
        "extendedResourceClaimStatus": {"resourceClaimName": "c", "requestMappings": []},
        "hostIP": "10.0.0.1",
        "hostIPs": [{"ip": "10.0.0.1"}],
        "initContainerStatuses": [{"name": "i", "image": "i", "imageID": "", "ready": false, "restartCount": 0}],
        "message": "m",
        "nominatedNodeName": "n",
        "observedGeneration": 1,
        "phase": "Running",
        "podIP": "10.1.0.1",
        "podIPs": [{"ip": "10.1.0.1"}],
        "qosClass": "BestEffort",
        "reason": "r",
        "resize": "Proposed",
        "resourceClaimStatuses": [{"name": "c"}],
        "resources": {"limits": {"cpu": "1"}},
        "startTime": "2026-01-01T00:00:00Z"
    });
    let typed: PodStatus = serde_json::from_value(every.clone()).expect("a PodStatus");
    let PodStatus {
        allocated_resources,
        conditions,
        container_statuses,
        ephemeral_container_statuses,
        extended_resource_claim_status,
        host_ip,
        host_ips,
        init_container_statuses,
        message,
        nominated_node_name,
        observed_generation,
        phase,
        pod_ip,
        pod_ips,
        qos_class,
        reason,
        resize,
        resource_claim_statuses,
        resources,
        start_time,
    } = typed;
    assert!(
        allocated_resources.is_some()
            && conditions.is_some()
            && container_statuses.is_some()
            && ephemeral_container_statuses.is_some()
            && extended_resource_claim_status.is_some()
            && host_ip.is_some()
            && host_ips.is_some()
            && init_container_statuses.is_some()
            && message.is_some()
            && nominated_node_name.is_some()
            && observed_generation.is_some()
            && phase.is_some()
            && pod_ip.is_some()
            && pod_ips.is_some()
            && qos_class.is_some()
            && reason.is_some()
            && resize.is_some()
            && resource_claim_statuses.is_some()
            && resources.is_some()
            && start_time.is_some(),
        "every field named as the API names it"
    );
    let written = ["phase", "reason", "message"];
    let held: BTreeSet<String> = every
        .as_object()
        .expect("fields")
        .keys()
        .filter(|k| !written.contains(&k.as_str()))
        .cloned()
        .collect();

    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let policy = r.get(
            "ValidatingAdmissionPolicy",
            "jobset-inplace-reconciler-fails-pods",
        );
        // The fields the policy compares are exactly those it does not let the reconciler write.
        let compared: BTreeSet<String> = policy["spec"]["validations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["expression"].as_str())
            .flat_map(|e| {
                e.split("has(object.status.")
                    .skip(1)
                    .filter_map(|rest| rest.split(')').next())
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .filter(|f| f != "phase")
            .collect();
        assert_eq!(compared, held, "{name}");

        // A pod of a JobSet, running on a node, as the kubelet reports it.
        let running = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "js-w-0-1", "namespace": "team-a", "uid": "u-1",
                         "labels": {JOBSET_NAME_LABEL: "js", "batch.kubernetes.io/job-name": "js-w-0"},
                         "annotations": {JOBSET_NAME_LABEL: "js", "jobset.sigs.k8s.io/epoch": "1"},
                         "finalizers": ["batch.kubernetes.io/job-tracking"]},
            "spec": {"nodeName": "n1", "containers": [{"name": "w", "image": "w"}]},
            "status": {"phase": "Running", "observedGeneration": 1, "qosClass": "BestEffort",
                       "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
                       "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
                       "podIP": "10.1.0.1", "podIPs": [{"ip": "10.1.0.1"}],
                       "startTime": "2026-01-01T00:00:00Z",
                       "containerStatuses": [{"name": "w", "image": "w", "imageID": "", "ready": true, "restartCount": 2,
                                              "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}}]}
        });
        // What the deadline's first step sends (src/reconciler/controller/deadline.rs,
        // fail_and_delete): a merge patch of pods/status with the pod's UID as a precondition.
        let deadline = json!({"metadata": {"uid": "u-1"},
            "status": {"phase": "Failed", "reason": "GroupRestartTimedOut",
                       "message": "the group restart to epoch 2 did not complete within 20s"}});
        let request = json!({"operation": "UPDATE", "namespace": "team-a", "name": "js-w-0-1",
                             "subResource": "status", "userInfo": {"username": RECONCILER_USER}});
        let patched = |old: &Value, patch: &Value| {
            let mut new = old.clone();
            merge_patch(&mut new, patch);
            new
        };
        assert_eq!(
            evaluate_matched(policy, &request, &patched(&running, &deadline), &running),
            Verdict::Allowed,
            "{name}: the deadline's write"
        );
        let pending = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "js-w-0-1", "namespace": "team-a", "labels": {JOBSET_NAME_LABEL: "js"}},
            "status": {"phase": "Pending", "qosClass": "BestEffort"}});
        assert_eq!(
            evaluate_matched(policy, &request, &patched(&pending, &deadline), &pending),
            Verdict::Allowed,
            "{name}: the deadline's write on a pod never scheduled"
        );
        // The same write with one more change each.
        let mut extra: Vec<(String, Value)> = vec![
            (
                "a condition changed".into(),
                json!({"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]}}),
            ),
            (
                "a condition added".into(),
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}, {"type": "DisruptionTarget", "status": "True"}]}}),
            ),
            (
                "the conditions removed".into(),
                json!({"status": {"conditions": null}}),
            ),
            (
                "the pod IP".into(),
                json!({"status": {"podIP": "10.9.9.9", "podIPs": [{"ip": "10.9.9.9"}]}}),
            ),
            (
                "the pod IPs".into(),
                json!({"status": {"podIPs": [{"ip": "10.1.0.1"}, {"ip": "fd00::1"}]}}),
            ),
            (
                "the host IP".into(),
                json!({"status": {"hostIP": "10.0.0.9"}}),
            ),
            ("the host IPs".into(), json!({"status": {"hostIPs": null}})),
            (
                "a restart count".into(),
                json!({"status": {"containerStatuses": [{"name": "w", "image": "w", "imageID": "", "ready": true, "restartCount": 0}]}}),
            ),
            (
                "the start time".into(),
                json!({"status": {"startTime": null}}),
            ),
            (
                "the QoS class".into(),
                json!({"status": {"qosClass": "Guaranteed"}}),
            ),
            (
                "the observed generation".into(),
                json!({"status": {"observedGeneration": 7}}),
            ),
            (
                "a label".into(),
                json!({"metadata": {"labels": {"app": "x"}}}),
            ),
            (
                "the jobset-name label removed".into(),
                json!({"metadata": {"labels": {JOBSET_NAME_LABEL: null}}}),
            ),
            (
                "an annotation".into(),
                json!({"metadata": {"annotations": {"jobset.sigs.k8s.io/epoch": "9"}}}),
            ),
            (
                "the finalizer removed".into(),
                json!({"metadata": {"finalizers": null}}),
            ),
        ];
        // Each held field, set where the pod has none.
        for field in &held {
            if running["status"].get(field).is_none() {
                extra.push((
                    format!("{field} set"),
                    json!({"status": {field: every[field]}}),
                ));
            }
        }
        for (what, more) in &extra {
            // Both patches in one (a null, removing a field, is kept as such).
            let mut patch = deadline.clone();
            for (part, fields) in more.as_object().expect("parts") {
                for (field, value) in fields.as_object().expect("fields") {
                    patch[part][field] = value.clone();
                }
            }
            let new = patched(&running, &patch);
            assert!(
                matches!(
                    evaluate_matched(policy, &request, &new, &running),
                    Verdict::Denied(_)
                ),
                "{name}: Failed and {what}"
            );
        }
        // A pod that has already ended keeps the kubelet's account of it.
        for phase in ["Failed", "Succeeded"] {
            let mut ended = running.clone();
            ended["status"]["phase"] = json!(phase);
            ended["status"]["reason"] = json!("Error");
            match evaluate_matched(policy, &request, &patched(&ended, &deadline), &ended) {
                Verdict::Denied(m) => assert!(m.contains("already ended"), "{name}: {m}"),
                other => panic!("{name}: a {phase} pod marked again: {other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn the_self_signed_webhooks_rbac_grants_what_it_uses() {
    use jobset_inplace::certs::rotation::Policy;
    use jobset_inplace_testkit::apiserver::TestApiServer;
    let Some(r) = overlay("cert-manager") else {
        return;
    };
    let grants = grants_for(&r, "jobset-inplace-webhook");
    assert!(
        grants.cluster.is_empty() && grants.namespaced.is_empty(),
        "cert-manager: no API access"
    );
    for name in SELF_SIGNED {
        let Some(r) = overlay(name) else { return };
        let Sub::Webhook(args) =
            parse_args(r.container("jobset-inplace-webhook", "webhook")).command
        else {
            panic!("webhook")
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let server = TestApiServer::start().await;
        let dirs = [
            tempfile::tempdir().expect("tempdir"),
            tempfile::tempdir().expect("tempdir"),
        ];
        let seen = tokio::time::timeout(Duration::from_secs(60), async {
            for (kind, resource) in [
                (
                    "MutatingWebhookConfiguration",
                    "mutatingwebhookconfigurations",
                ),
                (
                    "ValidatingWebhookConfiguration",
                    "validatingwebhookconfigurations",
                ),
            ] {
                server
                    .create(resource, r.get(kind, &args.webhook_config).clone())
                    .expect("configuration");
            }
            // The overlay's flags, with lifetimes of seconds so that a renewal and a whole CA
            // rotation happen here (each an update of the Secret).
            let replicas = dirs.each_ref().map(|dir| {
                let mut replica = args.clone();
                replica.cert_dir = dir.path().to_owned();
                replica.cert_renew_interval = Duration::from_millis(100);
                replica.serving_cert_validity = Duration::from_secs(2);
                replica.ca_validity = Duration::from_secs(6);
                replica.ca_overlap = Duration::from_millis(500);
                replica.renewer(server.client()).expect("lifetimes fit")
            });
            assert_eq!(
                replicas[0].target().names,
                jobset_inplace::certs::service_names(&args.service, NAMESPACE)
            );
            let mut kinds = BTreeSet::new();
            let deadline = Instant::now() + Duration::from_secs(30);
            while !kinds.contains("drop") {
                assert!(
                    Instant::now() < deadline,
                    "a whole rotation in time: {kinds:?}"
                );
                for replica in &replicas {
                    for step in replica.step().await.expect("step").steps {
                        kinds.insert(step.kind());
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(
                kinds,
                BTreeSet::from(["new", "renew", "start", "switch", "drop"]),
                "{name}"
            );
            assert_eq!(Policy::DEFAULT, args.policy().expect("deployed lifetimes"));
            for resource in [
                "mutatingwebhookconfigurations",
                "validatingwebhookconfigurations",
            ] {
                let config = server
                    .get(resource, "", &args.webhook_config)
                    .expect("configuration");
                assert!(
                    config["webhooks"][0]["clientConfig"]["caBundle"].is_string(),
                    "{resource}: caBundle"
                );
            }
            // The Secret it created passes the Secret policy, as created and as renewed.
            let stored = server
                .get("secrets", NAMESPACE, &args.secret)
                .expect("its Secret");
            let policy = r.get("ValidatingAdmissionPolicy", "jobset-inplace-webhook-secret");
            for (op, old) in [("CREATE", Value::Null), ("UPDATE", stored.clone())] {
                let request = object_request(WEBHOOK_USER, op, NAMESPACE, &args.secret);
                assert_eq!(
                    evaluate_matched(policy, &request, &stored, &old),
                    Verdict::Allowed,
                    "{name}: {op} of its Secret"
                );
            }
            observed(&server)
        })
        .await
        .expect("in time");
        let named = BTreeMap::from([
            ("secrets", args.secret.as_str()),
            (
                "mutatingwebhookconfigurations",
                args.webhook_config.as_str(),
            ),
            (
                "validatingwebhookconfigurations",
                args.webhook_config.as_str(),
            ),
        ]);
        let grants = grants_for(&r, "jobset-inplace-webhook");
        assert!(
            grants
                .cluster
                .iter()
                .all(|rule| !strings(&rule["resources"]).contains(&"secrets".to_owned()))
        );
        let unused = check_grants(name, &grants, &seen, &named, &["secrets"]);
        assert_eq!(
            unused,
            BTreeSet::new(),
            "{name}: every grant of the self-signed webhook is used"
        );
        server.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// The epoch-status-fields component on the released CRD, the one-place image, cert-manager
// ---------------------------------------------------------------------------------------------

fn released_crd_text() -> String {
    std::fs::read_to_string(fixtures::reference_dir().join("jobset.x-k8s.io_jobsets.yaml"))
        .expect("released CRD")
}

fn v1alpha2_status_schema(crd: &Value) -> jsonschema::Validator {
    let schema = crd["spec"]["versions"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == "v1alpha2"))
        .map(|v| v["schema"]["openAPIV3Schema"]["properties"]["status"].clone())
        .expect("v1alpha2 status schema");
    jsonschema::validator_for(&schema).expect("compiles")
}

#[test]
fn the_crd_component_gives_the_released_crd_the_epoch_fields() {
    use jobset_inplace::reconciler::crd::missing_status_fields;
    if !have_kubectl() {
        return;
    }
    // The recipe of deploy/README.md: the JobSet manifest, the overlay, the component.
    let kustomization = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
        resources:\n- jobset-manifests.yaml\n- {deploy}/overlays/epoch\n\
        components:\n- {deploy}/components/epoch-status-fields\n";
    let objects = render_kustomization(
        kustomization,
        &[("jobset-manifests.yaml", &released_crd_text())],
    );
    let crds: Vec<&Value> = objects
        .iter()
        .filter(|o| {
            o["kind"] == "CustomResourceDefinition"
                && o["metadata"]["name"] == jobset_inplace::reconciler::crd::CRD_NAME
        })
        .collect();
    assert_eq!(crds.len(), 1);
    let crd = crds[0];
    assert_eq!(check_object(crd), Vec::<String>::new(), "still a valid CRD");
    let released =
        fixtures::read_yaml(&fixtures::reference_dir().join("jobset.x-k8s.io_jobsets.yaml"));
    assert!(missing_status_fields(&released, Dialect::Epoch).is_err());
    assert_eq!(
        missing_status_fields(crd, Dialect::Epoch),
        Ok(()),
        "the reconciler starts"
    );
    assert_eq!(
        missing_status_fields(crd, Dialect::Attempt),
        Ok(()),
        "the released fields stay"
    );
    // Nothing else changes: the rest is the overlay as it renders alone.
    if let Some(alone) = overlay("epoch") {
        let not_jobsets = |o: &&Value| {
            o["kind"] != "CustomResourceDefinition"
                || o["metadata"]["name"] != jobset_inplace::reconciler::crd::CRD_NAME
        };
        let rest: Vec<&Value> = objects.iter().filter(not_jobsets).collect();
        assert_eq!(rest, alone.objects.iter().collect::<Vec<_>>());
    }

    // The status schema (the whole object's is checked by tests/it/admission/fixtures.rs).
    let schema = v1alpha2_status_schema(crd);
    let accepts = |status: Value| fixtures::schema_errors(&schema, &status);
    assert_eq!(accepts(json!({})), Vec::<String>::new());
    assert_eq!(
        accepts(json!({"deprecatedEpoch": 0, "syncedEpoch": 1, "restarts": 1})),
        Vec::<String>::new()
    );
    assert_eq!(
        accepts(json!({"deprecatedEpoch": 2147483646, "syncedEpoch": 2147483647})),
        Vec::<String>::new()
    );
    for bad in [
        json!({"deprecatedEpoch": -1}),
        json!({"syncedEpoch": -5}),
        json!({"syncedEpoch": "2"}),
        json!({"deprecatedEpoch": 1.5}),
    ] {
        assert!(!accepts(bad.clone()).is_empty(), "{bad} accepted");
    }
    // The released schema would not have had them (pruned by the API server, not rejected).
    let released_schema = &released["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        ["status"]["properties"];
    assert!(released_schema.get("syncedEpoch").is_none());

    // The patch stops the build rather than patch the wrong version.
    let mut moved = released.clone();
    moved["spec"]["versions"][0]["name"] = json!("v1alpha3");
    let moved = serde_json::to_string(&moved).expect("json");
    let dir = kustomization_dir();
    write_kustomization(
        dir.path(),
        kustomization,
        &[("jobset-manifests.yaml", &moved)],
    );
    let result = run_bounded(
        Command::new("kubectl").arg("kustomize").arg(dir.path()),
        RENDER_LIMIT,
    );
    assert!(
        result.is_err(),
        "a CRD whose first version is not v1alpha2 must not be patched"
    );
}

#[test]
fn the_epoch_overlay_alone_patches_no_crd() {
    let Some(r) = overlay("epoch") else { return };
    let names: Vec<&Value> = r
        .of_kind("CustomResourceDefinition")
        .into_iter()
        .map(|c| &c["metadata"]["name"])
        .collect();
    assert_eq!(
        names,
        [&json!(jobset_inplace::wire::epochs::CRD_NAME)],
        "only its own JobSetEpoch CRD; the JobSet CRD is not ours to ship"
    );
}

#[test]
fn one_images_entry_moves_every_image() {
    if !have_kubectl() {
        return;
    }
    for name in ["epoch", "cert-manager"] {
        let kustomization = format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n- {{deploy}}/overlays/{name}\n\
             images:\n- name: {IMAGE}\n  newName: registry.example.com/mirror/jobset-inplace\n  newTag: 9.9.9\n"
        );
        let r = Rendered {
            name: name.to_owned(),
            objects: render_kustomization(&kustomization, &[]),
        };
        let want = json!("registry.example.com/mirror/jobset-inplace:9.9.9");
        for (deployment, container) in [
            ("jobset-inplace-webhook", "webhook"),
            ("jobset-inplace-reconciler", "reconciler"),
        ] {
            assert_eq!(
                r.container(deployment, container)["image"],
                want,
                "{name} {deployment}"
            );
        }
        let webhook = r.container("jobset-inplace-webhook", "webhook");
        assert_eq!(
            env_value(webhook, "JOBSET_INPLACE_AGENT_IMAGE").map(|e| &e["value"]),
            Some(&want),
            "{name}: the injected agent follows"
        );
    }
}

#[test]
fn cert_manager_issues_the_secret_the_webhook_mounts() {
    use jobset_inplace::certs;
    let Some(r) = overlay("cert-manager") else {
        return;
    };
    let pod = &r.deployment("jobset-inplace-webhook")["spec"]["template"]["spec"];
    let tls_secret = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|v| v["secret"]["secretName"].as_str())
        .expect("a Secret volume");
    let serving = r.get("Certificate", "jobset-inplace-webhook");
    assert_eq!(serving["spec"]["secretName"], tls_secret);
    let service = r.get("Service", "jobset-inplace-webhook")["metadata"]["name"]
        .as_str()
        .expect("service");
    let names = certs::service_names(service, NAMESPACE);
    let dns = strings(&serving["spec"]["dnsNames"]);
    assert!(
        dns.contains(&format!("{service}.{NAMESPACE}.svc")),
        "{dns:?}: the name the API server dials"
    );
    assert!(dns.iter().all(|d| names.contains(d)), "{dns:?}");
    assert_ne!(serving["spec"]["isCA"], true);
    // serving <- CA issuer <- CA certificate <- self-signed issuer
    let ca_issuer = r.get(
        "Issuer",
        serving["spec"]["issuerRef"]["name"]
            .as_str()
            .expect("issuer"),
    );
    assert_eq!(serving["spec"]["issuerRef"]["kind"], "Issuer");
    let ca_secret = &ca_issuer["spec"]["ca"]["secretName"];
    let ca = r
        .of_kind("Certificate")
        .into_iter()
        .find(|c| c["spec"]["secretName"] == *ca_secret)
        .expect("the CA certificate");
    assert_eq!(ca["spec"]["isCA"], true);
    let root = r.get(
        "Issuer",
        ca["spec"]["issuerRef"]["name"].as_str().expect("issuer"),
    );
    assert!(root["spec"]["selfSigned"].is_object());
    // Both webhook configurations get the CA of the serving certificate.
    let from = format!(
        "{NAMESPACE}/{}",
        serving["metadata"]["name"].as_str().unwrap_or_default()
    );
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        assert_eq!(
            r.get(kind, "jobset-inplace")["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            json!(from)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The self-signed webhook's rights narrowed to the caBundle; the NetworkPolicy
// component.
// ---------------------------------------------------------------------------------------------

#[test]
fn the_self_signed_webhook_may_change_only_the_ca_bundle() {
    for name in SELF_SIGNED {
        let Some(r) = overlay(name) else {
            return;
        };
        check_ca_bundle_policy(&r);
    }
}

const WEBHOOK_USER: &str = "system:serviceaccount:jobset-inplace-system:jobset-inplace-webhook";

/// Issue 21, item 9: RBAC cannot name the object of a create, so the self-signed webhook's Role
/// lets it create any Secret of its namespace; the Secret policy holds its Secret writes to the
/// one it is configured with (as its Role names it for get and update), of type
/// kubernetes.io/tls. A service-account-token Secret (a token of any account of the namespace,
/// filled in by the token controller), another name or an Opaque Secret are refused.
#[test]
fn the_self_signed_webhook_may_create_only_its_tls_secret() {
    for name in SELF_SIGNED {
        let Some(r) = overlay(name) else { return };
        let Sub::Webhook(args) =
            parse_args(r.container("jobset-inplace-webhook", "webhook")).command
        else {
            panic!("webhook")
        };
        let policy = r.get("ValidatingAdmissionPolicy", "jobset-inplace-webhook-secret");
        assert_eq!(check_object(policy), Vec::<String>::new(), "{name}");
        assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        let binding = r.get(
            "ValidatingAdmissionPolicyBinding",
            "jobset-inplace-webhook-secret",
        );
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        for op in ["CREATE", "UPDATE"] {
            assert!(policy_matches(policy, "", "secrets", op), "{name}: {op}");
        }
        // The name is the one the Role grants get and update on, and the flag's.
        let role = r.get("Role", "jobset-inplace-webhook");
        let named: Vec<String> = role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|rule| strings(&rule["resourceNames"]))
            .collect();
        assert_eq!(named, std::slice::from_ref(&args.secret), "{name}");
        let secret = |name: &str, type_: Option<&str>| {
            let mut s = json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "data": {"tls.crt": "", "tls.key": "", "ca.crt": "", "ca.key": ""}});
            if let Some(t) = type_ {
                s["type"] = json!(t);
            }
            s
        };
        let verdict = |user: &str, object: &Value| {
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            evaluate_matched(
                policy,
                &object_request(user, "CREATE", NAMESPACE, &name),
                object,
                &Value::Null,
            )
        };
        assert_eq!(
            verdict(
                WEBHOOK_USER,
                &secret(&args.secret, Some("kubernetes.io/tls"))
            ),
            Verdict::Allowed,
            "{name}"
        );
        let mut token = secret(
            "jobset-inplace-reconciler-token",
            Some("kubernetes.io/service-account-token"),
        );
        token["metadata"]["annotations"] =
            json!({"kubernetes.io/service-account.name": "jobset-inplace-reconciler"});
        token.as_object_mut().map(|o| o.remove("data"));
        let mut token_named_as_ours = token.clone();
        token_named_as_ours["metadata"]["name"] = json!(args.secret);
        for (what, object) in [
            ("a service-account token", token.clone()),
            (
                "a service-account token under its Secret's name",
                token_named_as_ours,
            ),
            (
                "an Opaque Secret of its name",
                secret(&args.secret, Some("Opaque")),
            ),
            (
                "a Secret of its name with no type",
                secret(&args.secret, None),
            ),
            (
                "a TLS Secret of another name",
                secret("other-tls", Some("kubernetes.io/tls")),
            ),
        ] {
            assert!(
                matches!(verdict(WEBHOOK_USER, &object), Verdict::Denied(_)),
                "{name}: {what}"
            );
        }
        // Only the webhook's account is held (an admin's `certs --secret` is not).
        for user in [
            "alice",
            "system:serviceaccount:team-a:jobset-inplace-webhook",
        ] {
            assert_eq!(verdict(user, &token), Verdict::NotMatched, "{name}: {user}");
        }
    }
}

fn check_ca_bundle_policy(r: &Rendered) {
    let policy = r.get(
        "ValidatingAdmissionPolicy",
        "jobset-inplace-webhook-ca-bundle",
    );
    assert_eq!(check_object(policy), Vec::<String>::new());
    let binding = r.get(
        "ValidatingAdmissionPolicyBinding",
        "jobset-inplace-webhook-ca-bundle",
    );
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    let rules = &policy["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(
        strings(&rules["resources"]),
        [
            "mutatingwebhookconfigurations",
            "validatingwebhookconfigurations"
        ]
    );
    let webhook = "system:serviceaccount:jobset-inplace-system:jobset-inplace-webhook";
    let request = |user: &str, operation: &str| json!({"operation": operation, "userInfo": {"username": user}});
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let config = r.get(kind, "jobset-inplace");
        let with_ca = |ca: &str| {
            let mut c = config.clone();
            for w in c["webhooks"].as_array_mut().expect("webhooks") {
                w["clientConfig"]["caBundle"] = json!(ca);
            }
            c
        };
        let old = with_ca("b2xk");
        let verdict = |user: &str, operation: &str, new: &Value| {
            evaluate_matched(policy, &request(user, operation), new, &old)
        };
        // Allowed: setting the caBundle, first time or renewed; nothing at all.
        let mut first = old.clone();
        for w in first["webhooks"].as_array_mut().expect("webhooks") {
            w["clientConfig"]
                .as_object_mut()
                .map(|c| c.remove("caBundle"));
        }
        assert_eq!(
            evaluate_matched(policy, &request(webhook, "UPDATE"), &old, &first),
            Verdict::Allowed,
            "{kind}: first caBundle"
        );
        assert_eq!(
            verdict(webhook, "UPDATE", &with_ca("bmV3")),
            Verdict::Allowed,
            "{kind}"
        );
        assert_eq!(verdict(webhook, "UPDATE", &old), Verdict::Allowed, "{kind}");
        // Denied: anything else a stolen token could try.
        type Edit = Box<dyn Fn(&mut Value)>;
        let edits: Vec<(&str, Edit)> = vec![
            (
                "a URL instead of the service",
                Box::new(|c| {
                    c["webhooks"][0]["clientConfig"]["url"] = json!("https://evil.example/");
                }),
            ),
            (
                "another service",
                Box::new(|c| {
                    c["webhooks"][0]["clientConfig"]["service"]["name"] = json!("evil");
                }),
            ),
            (
                "another path",
                Box::new(|c| {
                    c["webhooks"][0]["clientConfig"]["service"]["path"] = json!("/allow-all");
                }),
            ),
            (
                "failurePolicy changed",
                Box::new(|c| {
                    let flipped = if c["webhooks"][0]["failurePolicy"] == "Ignore" {
                        "Fail"
                    } else {
                        "Ignore"
                    };
                    c["webhooks"][0]["failurePolicy"] = json!(flipped);
                }),
            ),
            (
                "no rules",
                Box::new(|c| c["webhooks"][0]["rules"] = json!([])),
            ),
            (
                "a namespaceSelector",
                Box::new(|c| {
                    c["webhooks"][0]["namespaceSelector"] = json!({"matchLabels": {"none": "x"}});
                }),
            ),
            (
                "an objectSelector",
                Box::new(|c| {
                    c["webhooks"][0]["objectSelector"] = json!({"matchLabels": {"none": "x"}});
                }),
            ),
            (
                "a match condition",
                Box::new(|c| {
                    c["webhooks"][0]["matchConditions"] =
                        json!([{"name": "never", "expression": "false"}]);
                }),
            ),
            (
                "a shorter timeout",
                Box::new(|c| c["webhooks"][0]["timeoutSeconds"] = json!(1)),
            ),
            (
                "a webhook removed",
                Box::new(|c| {
                    if let Some(w) = c["webhooks"].as_array_mut() {
                        w.truncate(0);
                    }
                }),
            ),
            (
                "a webhook renamed",
                Box::new(|c| c["webhooks"][0]["name"] = json!("x.example")),
            ),
            (
                "a label",
                Box::new(|c| c["metadata"]["labels"]["x"] = json!("y")),
            ),
            (
                "an annotation",
                Box::new(|c| c["metadata"]["annotations"] = json!({"x": "y"})),
            ),
        ];
        for (what, edit) in &edits {
            let mut new = with_ca("bmV3");
            edit(&mut new);
            assert!(
                matches!(verdict(webhook, "UPDATE", &new), Verdict::Denied(_)),
                "{kind}: {what} must be denied"
            );
        }
        assert!(
            matches!(verdict(webhook, "DELETE", &old), Verdict::Denied(_)),
            "{kind}: delete"
        );
        // Other users are not this policy's business.
        let mut other = with_ca("bmV3");
        other["webhooks"][0]["timeoutSeconds"] = json!(1);
        assert_eq!(
            verdict(
                "system:serviceaccount:jobset-inplace-system:other",
                "UPDATE",
                &other
            ),
            Verdict::NotMatched,
            "{kind}"
        );
    }
}

#[test]
fn the_network_policy_component_admits_only_the_api_server_and_monitoring() {
    if !have_kubectl() {
        return;
    }
    let kustomization = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
        resources:\n- {deploy}/overlays/epoch\n\
        components:\n- {deploy}/components/network-policy\n";
    let objects = render_kustomization(kustomization, &[]);
    let r = Rendered {
        name: "epoch + network-policy".to_owned(),
        objects,
    };
    let policies = r.of_kind("NetworkPolicy");
    assert_eq!(policies.len(), 2);
    for policy in &policies {
        assert_eq!(check_object(policy), Vec::<String>::new());
        assert_eq!(policy["metadata"]["namespace"], NAMESPACE);
        assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
        // It selects a Deployment's pods, and names ports those pods have.
        let selector = &policy["spec"]["podSelector"]["matchLabels"];
        let deployment = r
            .of_kind("Deployment")
            .into_iter()
            .find(|d| {
                selector
                    .as_object()
                    .into_iter()
                    .flatten()
                    .all(|(k, v)| d["spec"]["template"]["metadata"]["labels"][k] == *v)
            })
            .expect("a Deployment it selects");
        let ports: Vec<String> = deployment["spec"]["template"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["name"].as_str().map(str::to_owned))
            .collect();
        for rule in policy["spec"]["ingress"].as_array().expect("ingress") {
            let from = &rule["from"];
            let allowed: Vec<String> = rule["ports"]
                .as_array()
                .expect("ports")
                .iter()
                .map(|p| p["port"].as_str().expect("a named port").to_owned())
                .collect();
            for port in &allowed {
                assert!(ports.contains(port), "{port} is a container port");
            }
            if allowed == ["https"] {
                // The API server only: an address block, never every pod or namespace.
                assert!(from[0].get("ipBlock").is_some(), "{rule}");
                assert_eq!(from.as_array().map(Vec::len), Some(1));
            } else {
                assert_eq!(allowed, ["health"], "{rule}");
                assert_eq!(
                    from,
                    &json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}])
                );
            }
        }
    }
    let webhook = r.get("NetworkPolicy", "jobset-inplace-webhook");
    assert_eq!(webhook["spec"]["ingress"].as_array().map(Vec::len), Some(2));
    let reconciler = r.get("NetworkPolicy", "jobset-inplace-reconciler");
    assert_eq!(
        reconciler["spec"]["ingress"].as_array().map(Vec::len),
        Some(1)
    );
}

/// API Priority and Fairness (`deploy/base/flowcontrol.yaml`): the reconciler's account, as its
/// Deployment runs it, goes to `leader-election` for its Lease and to `workload-high` for the
/// rest, before the built-in `service-accounts` schema (9000) that would otherwise catch it with
/// every agent; the agents keep that built-in schema (no schema of ours names them).
#[test]
fn flow_schemas_name_the_reconciler_as_it_runs() {
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let reconciler = r.get("Deployment", "jobset-inplace-reconciler");
        let reconciler_account = reconciler["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .expect("the reconciler's account");
        let subject = |fs: &Value| fs["spec"]["rules"][0]["subjects"].clone();
        let lease = r.get("FlowSchema", "jobset-inplace-reconciler-leader-election");
        let rest = r.get("FlowSchema", "jobset-inplace-reconciler");
        for fs in [lease, rest] {
            assert_eq!(
                subject(fs),
                json!([{"kind": "ServiceAccount",
                        "serviceAccount": {"name": reconciler_account, "namespace": NAMESPACE}}]),
                "{name}"
            );
        }
        assert_eq!(
            lease["spec"]["priorityLevelConfiguration"]["name"],
            "leader-election"
        );
        assert_eq!(
            lease["spec"]["rules"][0]["resourceRules"],
            json!([{"verbs": ["get", "create", "update", "patch"],
                    "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                    "namespaces": ["*"]}]),
            "{name}: only the Lease"
        );
        assert_eq!(
            rest["spec"]["priorityLevelConfiguration"]["name"],
            "workload-high"
        );
        let precedence = |fs: &Value| fs["spec"]["matchingPrecedence"].as_i64().expect("set");
        assert!(
            precedence(lease) < precedence(rest),
            "{name}: the Lease rule first"
        );
        assert_eq!(r.of_kind("FlowSchema").len(), 2, "{name}");
        for fs in r.of_kind("FlowSchema") {
            assert!(precedence(fs) < 9000, "{name}: {fs}");
            let text = fs.to_string();
            assert!(!text.contains("jobset-inplace-agent\""), "{name}: {text}");
        }
    }
}

/// Issue 21, item 7: the JobSetEpoch CRD's CEL rule (evaluated with the `cel` crate; the real API
/// server in `tests/real_cluster/`) refuses any move back of a published epoch, a removed one,
/// and a removed `jobSetUID`, whoever writes (a deposed reconciler leader's late write included);
/// it lets the epochs grow, a JobSet created again under the same name (another UID) start over,
/// and an object an earlier version wrote (no `jobSetUID`) be written.
#[test]
fn the_jobsetepoch_crd_refuses_to_move_an_epoch_back() {
    let text =
        std::fs::read_to_string(deploy_dir().join("base/jobsetepoch-crd.yaml")).expect("the CRD");
    let crd: Value = serde_saphyr::from_str(&text).expect("yaml");
    let rules =
        &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"];
    let rules = rules.as_array().expect("the CRD has CEL rules at its root");
    let allowed = |old: &Value, new: &Value| {
        rules.iter().all(|r| {
            let rule = r["rule"].as_str().expect("rule");
            cel_bool(rule, &[("self", new), ("oldSelf", old)], &HashMap::new())
        })
    };
    let obj = |uid: Option<&str>, d: Option<i64>, s: Option<i64>| {
        let mut o = json!({"apiVersion": "jobset-inplace.dev/v1alpha1", "kind": "JobSetEpoch",
                           "metadata": {"name": "js"}, "epochs": {"bypass": false}});
        if let Some(uid) = uid {
            o["jobSetUID"] = json!(uid);
        }
        if let Some(d) = d {
            o["epochs"]["deprecated"] = json!(d);
        }
        if let Some(s) = s {
            o["epochs"]["synced"] = json!(s);
        }
        o
    };
    let old = obj(Some("u"), Some(3), Some(4));
    for (new, want, what) in [
        (obj(Some("u"), Some(3), Some(4)), true, "unchanged"),
        (obj(Some("u"), Some(4), Some(4)), true, "deprecated grows"),
        (obj(Some("u"), Some(3), Some(5)), true, "synced grows"),
        (obj(Some("u"), Some(2), Some(4)), false, "deprecated back"),
        (obj(Some("u"), Some(3), Some(3)), false, "synced back"),
        (obj(Some("u"), None, Some(4)), false, "deprecated removed"),
        (obj(Some("u"), Some(3), None), false, "synced removed"),
        (obj(None, Some(0), Some(0)), false, "jobSetUID removed"),
        (
            obj(Some("v"), None, None),
            true,
            "another JobSet of that name starts over",
        ),
    ] {
        assert_eq!(allowed(&old, &new), want, "{what}");
    }
    let mut no_epochs = obj(Some("u"), None, None);
    no_epochs.as_object_mut().map(|o| o.remove("epochs"));
    assert!(!allowed(&old, &no_epochs), "epochs removed");
    assert!(
        allowed(&no_epochs, &obj(Some("u"), None, Some(1))),
        "first epochs"
    );
    assert!(
        allowed(
            &obj(None, Some(7), Some(8)),
            &obj(Some("u"), Some(1), Some(1))
        ),
        "an object an earlier version wrote"
    );
    assert!(allowed(
        &obj(Some("u"), None, None),
        &obj(Some("u"), Some(0), None)
    ));
}
