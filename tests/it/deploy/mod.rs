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
mod agent_policy;
mod binary;
mod crd_and_image;
mod overlays;
mod pod_security;
mod provisioning;
mod rbac;
mod self_signed;
mod webhook_objects;

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
// Shared by the areas
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

fn load_config(start: Dialect, text: &str) -> InjectionConfig {
    let mut config = InjectionConfig::defaults(start);
    config
        .apply_file(Path::new("config.yaml"), text)
        .unwrap_or_else(|e| panic!("{e}"));
    config.check().unwrap_or_else(|e| panic!("{e}"));
    config
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

/// What a ValidatingAdmissionPolicy evaluated here says of one request.
#[derive(Debug, PartialEq, Eq)]
enum PolicyResult {
    NotMatched,
    Allowed,
    Denied(String),
}

/// A policy's match conditions, variables and validations on a request its match constraints
/// select.
fn evaluate_matched(policy: &Value, request: &Value, object: &Value, old: &Value) -> PolicyResult {
    let spec = &policy["spec"];
    let bindings = [("object", object), ("oldObject", old), ("request", request)];
    let mut variables = HashMap::new();
    for condition in spec["matchConditions"].as_array().into_iter().flatten() {
        let expression = condition["expression"].as_str().expect("expression");
        if !cel_bool(expression, &bindings, &variables) {
            return PolicyResult::NotMatched;
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
            return PolicyResult::Denied(
                validation["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
        }
    }
    PolicyResult::Allowed
}

/// The rules bound to one service account of this namespace: cluster-wide, and in the namespace.
struct Grants {
    cluster: Vec<Value>,
    namespaced: Vec<Value>,
}

/// The rules of the ClusterRole `jobset-inplace-metrics-auth` (base/metrics-rbac.yaml), bound to
/// the webhook and the reconciler: the reviews of scrapers' tokens for `/metrics` over HTTPS. The
/// components here run with plain metrics (`--metrics-secure=false` or the library's `run`), so
/// they never request them; `tests/real_cluster/metrics.rs` has the webhook use them.
fn metrics_review_rules() -> Vec<Value> {
    vec![
        json!({"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}),
        json!({"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}),
    ]
}

/// `account`'s grants but the metrics reviews ([`metrics_review_rules`]), which every variant
/// gives the webhook and the reconciler.
fn grants_besides_metrics(r: &Rendered, account: &str) -> Grants {
    let reviews = metrics_review_rules();
    let mut grants = grants_for(r, account);
    assert!(
        reviews.iter().all(|rule| grants.cluster.contains(rule)),
        "{}: {account} may review scrapers' tokens",
        r.name
    );
    grants.cluster.retain(|rule| !reviews.contains(rule));
    grants
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

/// A request of `user` on a namespaced object.
fn object_request(user: &str, operation: &str, namespace: &str, name: &str) -> Value {
    json!({"operation": operation, "namespace": namespace, "name": name,
           "userInfo": {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]}})
}

const WEBHOOK_USER: &str = "system:serviceaccount:jobset-inplace-system:jobset-inplace-webhook";
