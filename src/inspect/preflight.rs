//! `doctor`'s checks before the first JobSet: can this cluster do in-place restarts at all? The
//! Kubernetes version, the API server's `RestartAllContainers` gate (a server-side dry-run pod),
//! JobSet's controller version and its own `InPlaceRestart` gate and both of our webhooks (a
//! server-side dry-run JobSet), the FlowSchemas' priority levels, and with `--pull-check` whether
//! a training node can pull the agent image (a short-lived pod, deleted).
//!
//! Every decision is a pure function of what the API server answered; [`run`] asks it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use k8s_openapi::apimachinery::pkg::version::Info;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use super::finding::{Finding, Outcome};
use crate::jobset::JobSet;
use crate::wire::agent_env;

/// The oldest Kubernetes whose pods take a `RestartAllContainers` rule (sidecar mode).
pub const MIN_MINOR: u64 = 35;
/// The annotation the mutating webhook stamps on each pod template it injected.
const INJECTED_ANNOTATION: &str = "jobset-inplace.dev/injected";
/// Our webhooks' names, as the API server quotes them in its errors.
const MUTATE_WEBHOOK: &str = "mutate.jobset-inplace.dev";
const VALIDATE_WEBHOOK: &str = "validate.jobset-inplace.dev";
/// JobSet v0.12's refusal of an InPlaceRestart JobSet with its gate off.
const JOBSET_GATE_OFF: &str = "InPlaceRestart feature gate is disabled";
/// The name every probe object takes (dry-run ones are never stored).
pub const PROBE_NAME: &str = "jobset-inplace-doctor";
/// An image every cluster can resolve for the dry-run probes (never pulled: nothing runs).
const PROBE_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// What the API server answered a request: the object, or its error's message.
pub type Answer = Result<Value, String>;

/// `kubernetes-version`: at least 1.35. An API server started with `--emulated-version` behaves
/// as that version (its APIs and feature gates are the emulated release's) and says so in
/// `/version`'s `emulationMajor`/`emulationMinor`: that is the version judged.
pub fn check_version(info: &Info) -> Finding {
    const CHECK: &str = "kubernetes-version";
    let digits = |s: &str| -> Option<u64> {
        s.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .ok()
    };
    let emulated = match (&info.emulation_major, &info.emulation_minor) {
        (Some(major), Some(minor)) if !major.is_empty() && !minor.is_empty() => {
            Some((major.as_str(), minor.as_str()))
        }
        _ => None,
    };
    let (major, minor) = emulated.unwrap_or((info.major.as_str(), info.minor.as_str()));
    let runs = match emulated {
        Some((major, minor))
            if digits(major) != digits(&info.major) || digits(minor) != digits(&info.minor) =>
        {
            format!("{} emulating {major}.{minor}", info.git_version)
        }
        _ => info.git_version.clone(),
    };
    match (digits(major), digits(minor)) {
        (Some(major), Some(minor)) if major > 1 || minor >= MIN_MINOR => Finding::new(
            CHECK,
            Outcome::Ok,
            format!("the API server runs {runs} (>= 1.{MIN_MINOR}: pods take restartPolicyRules)"),
        ),
        (Some(_), Some(_)) => Finding::new(
            CHECK,
            Outcome::Fail,
            format!(
                "the API server runs {runs}: sidecar mode needs Kubernetes >= 1.{MIN_MINOR} (the \
                 RestartAllContainers rule)"
            ),
        )
        .fix(format!(
            "upgrade the control plane and the training nodes to 1.{MIN_MINOR} or later"
        )),
        _ => Finding::new(
            CHECK,
            Outcome::Warn,
            format!(
                "cannot read the version {major:?}.{minor:?} ({})",
                info.git_version
            ),
        ),
    }
}

/// The pod sent as a dry run: a sidecar with a `RestartAllContainers` rule, as injected.
pub fn restart_rule_pod(namespace: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": PROBE_NAME, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [{
                "name": agent_env::CONTAINER_NAME, "image": PROBE_IMAGE, "restartPolicy": "Always",
                "restartPolicyRules": [{"action": "RestartAllContainers",
                    "exitCodes": {"operator": "In", "values": [42]}}]
            }],
            "containers": [{"name": "worker", "image": PROBE_IMAGE}]
        }
    })
}

/// `restart-all-containers`: the API server kept the sidecar's rule (an API server with the
/// gate off drops the field, or refuses the action).
pub fn check_restart_rule(answer: &Answer) -> Finding {
    const CHECK: &str = "restart-all-containers";
    let fix = "turn on the API server's (and the kubelets') feature gates \
               RestartAllContainersOnContainerExits and NodeDeclaredFeatures (Kubernetes 1.35 \
               alpha; ContainerRestartRules is on by default)";
    match answer {
        Ok(pod) => {
            let kept = pod
                .pointer("/spec/initContainers/0/restartPolicyRules/0/action")
                .and_then(Value::as_str)
                == Some("RestartAllContainers");
            if kept {
                Finding::new(
                    CHECK,
                    Outcome::Ok,
                    "the API server accepts a sidecar with a RestartAllContainers rule (dry run)",
                )
            } else {
                Finding::new(
                    CHECK,
                    Outcome::Fail,
                    "the API server dropped the sidecar's RestartAllContainers rule (dry run): \
                     its feature gate is off",
                )
                .fix(fix)
            }
        }
        Err(message) => Finding::new(
            CHECK,
            Outcome::Fail,
            format!("the API server refused a pod with a RestartAllContainers rule: {message}"),
        )
        .fix(fix),
    }
}

/// The JobSet sent as a dry run: InPlaceRestart, as JobSet's own webhook wants it (backoffLimit
/// MaxInt32, podReplacementPolicy Failed, completions = parallelism). `validation_probe` also
/// gives its worker `WORKER_COMMAND` (the main-container agent, which is not offered): the
/// mutating webhook injects the sidecar all the same, and only our validating webhook refuses
/// it, so its denial proves that validation is reached. (The agent's account with its token
/// automounted, the probe before, is refused by the injection itself now.)
pub fn probe_jobset(namespace: &str, validation_probe: bool) -> Value {
    let mut worker = json!({"name": "worker", "image": PROBE_IMAGE});
    if validation_probe {
        worker["env"] = json!([{"name": "WORKER_COMMAND", "value": "true"}]);
    }
    let pod_spec = json!({"restartPolicy": "Never", "containers": [worker]});
    json!({
        "apiVersion": crate::jobset::API_VERSION, "kind": crate::jobset::KIND,
        "metadata": {"name": PROBE_NAME, "namespace": namespace},
        "spec": {
            "failurePolicy": {"restartStrategy": "InPlaceRestart", "maxRestarts": 3},
            "replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": {
                "parallelism": 1, "completions": 1, "backoffLimit": 2_147_483_647,
                "podReplacementPolicy": "Failed",
                "template": {"spec": pod_spec}
            }}}]
        }
    })
}

/// Who answered a JobSet dry run, from the API server's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobSetAnswer {
    /// Stored (as a dry run): the object as it would be.
    Accepted(Value),
    /// Refused by JobSet's webhook for its `InPlaceRestart` gate.
    GateOff(String),
    /// Denied by the named webhook.
    Denied { webhook: String, message: String },
    /// The API server could not call the named webhook (down, TLS, timeout).
    CallFailed { webhook: String, message: String },
    /// Anything else (no JobSet CRD, no rights, ...).
    Other(String),
}

/// The webhook a message quotes after `prefix` (`admission webhook "x" denied`).
fn quoted_after(message: &str, prefix: &str) -> Option<String> {
    let rest = &message[message.find(prefix)? + prefix.len()..];
    let rest = rest.strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_owned())
}

/// Classifies the answer to a JobSet dry run. Pure.
pub fn classify(answer: &Answer) -> JobSetAnswer {
    match answer {
        Ok(object) => JobSetAnswer::Accepted(object.clone()),
        Err(message) if message.contains(JOBSET_GATE_OFF) => JobSetAnswer::GateOff(message.clone()),
        Err(message) => {
            if let Some(webhook) = quoted_after(message, "failed calling webhook ") {
                JobSetAnswer::CallFailed {
                    webhook,
                    message: message.clone(),
                }
            } else if let Some(webhook) = quoted_after(message, "admission webhook ") {
                JobSetAnswer::Denied {
                    webhook,
                    message: message.clone(),
                }
            } else {
                JobSetAnswer::Other(message.clone())
            }
        }
    }
}

fn is_ours(webhook: &str) -> bool {
    webhook == MUTATE_WEBHOOK || webhook == VALIDATE_WEBHOOK
}

/// `jobset-in-place-restart-gate`: JobSet's webhook lets an InPlaceRestart JobSet through.
pub fn check_jobset_gate(answer: &JobSetAnswer) -> Finding {
    const CHECK: &str = "jobset-in-place-restart-gate";
    match answer {
        JobSetAnswer::Accepted(_) => Finding::new(
            CHECK,
            Outcome::Ok,
            "JobSet accepts an InPlaceRestart JobSet (dry run): its InPlaceRestart gate is on",
        ),
        JobSetAnswer::Denied { webhook, .. } if is_ours(webhook) => Finding::new(
            CHECK,
            Outcome::Ok,
            "JobSet's webhook let an InPlaceRestart JobSet through to ours (dry run): its \
             InPlaceRestart gate is on",
        ),
        JobSetAnswer::GateOff(message) => Finding::new(
            CHECK,
            Outcome::Fail,
            format!("JobSet refuses InPlaceRestart JobSets: {message}"),
        )
        .fix(
            "turn on JobSet's InPlaceRestart feature gate (`featureGates: {InPlaceRestart: \
             true}` in its Configuration, or --feature-gates=InPlaceRestart=true) and restart \
             its controller manager",
        ),
        JobSetAnswer::CallFailed { webhook, message } if is_ours(webhook) => Finding::new(
            CHECK,
            Outcome::Warn,
            format!("cannot tell: our webhook's failure answered first ({message})"),
        ),
        JobSetAnswer::CallFailed { message, .. }
        | JobSetAnswer::Denied { message, .. }
        | JobSetAnswer::Other(message) => Finding::new(
            CHECK,
            Outcome::Fail,
            format!("an InPlaceRestart JobSet is refused (dry run): {message}"),
        ),
    }
}

/// `webhook-injection`: the dry-run JobSet came back with the agent injected.
pub fn check_injection(answer: &JobSetAnswer) -> Finding {
    const CHECK: &str = "webhook-injection";
    match answer {
        JobSetAnswer::Accepted(object) => {
            let template = object.pointer("/spec/replicatedJobs/0/template/spec/template");
            let pod = template.and_then(|t| t.get("spec"));
            let has_agent = pod
                .into_iter()
                .flat_map(|p| ["initContainers", "containers"].map(|k| p.get(k)))
                .flatten()
                .filter_map(Value::as_array)
                .flatten()
                .any(|c| c["name"] == agent_env::CONTAINER_NAME);
            let stamp = template
                .and_then(|t| t.pointer("/metadata/annotations"))
                .and_then(|a| a.get(INJECTED_ANNOTATION))
                .and_then(Value::as_str);
            match (has_agent, stamp) {
                (true, Some(version)) => Finding::new(
                    CHECK,
                    Outcome::Ok,
                    format!(
                        "a dry-run InPlaceRestart JobSet passed both webhooks with the agent \
                         injected ({INJECTED_ANNOTATION}: {version}): the caBundle is trusted"
                    ),
                ),
                _ => Finding::new(
                    CHECK,
                    Outcome::Fail,
                    "a dry-run InPlaceRestart JobSet was stored without the agent: the mutating \
                     webhook was not called (its failurePolicy Ignore hides a call error) or \
                     does not match",
                )
                .fix(
                    "check the webhook pods and Service, the MutatingWebhookConfiguration's \
                     rules and namespaceSelector, and the ca-bundle check above",
                ),
            }
        }
        JobSetAnswer::CallFailed { webhook, message } => {
            let tls = ["x509", "certificate", "tls:"]
                .iter()
                .any(|m| message.contains(m));
            Finding::new(
                CHECK,
                Outcome::Fail,
                format!("the API server cannot call webhook {webhook}: {message}"),
            )
            .fix(if tls {
                "the caBundle does not verify the webhook's certificate: see the ca-bundle \
                 check, and `jobset-inplace certs` or cert-manager's CA injector"
            } else {
                "is the webhook running and ready? check its pods, its Service's endpoints \
                 and any NetworkPolicy between the API server and it"
            })
        }
        JobSetAnswer::Denied { webhook, message } => Finding::new(
            CHECK,
            Outcome::Fail,
            format!("a valid dry-run InPlaceRestart JobSet was denied by {webhook}: {message}"),
        ),
        JobSetAnswer::GateOff(_) => Finding::new(
            CHECK,
            Outcome::Warn,
            "not checked: JobSet refuses InPlaceRestart JobSets (see \
             jobset-in-place-restart-gate)",
        ),
        JobSetAnswer::Other(message) => Finding::new(
            CHECK,
            Outcome::Fail,
            format!("a dry-run InPlaceRestart JobSet failed: {message}"),
        ),
    }
}

/// `webhook-validation`: the JobSet only our validating webhook refuses was denied by it.
pub fn check_validation(answer: &JobSetAnswer) -> Finding {
    const CHECK: &str = "webhook-validation";
    match answer {
        JobSetAnswer::Denied { webhook, .. } if webhook == VALIDATE_WEBHOOK => Finding::new(
            CHECK,
            Outcome::Ok,
            format!(
                "{VALIDATE_WEBHOOK} is reached: it denied a JobSet whose worker asks for the main-container agent (dry run)"
            ),
        ),
        JobSetAnswer::Accepted(_) => Finding::new(
            CHECK,
            Outcome::Fail,
            format!(
                "a JobSet that {VALIDATE_WEBHOOK} must deny was accepted (dry run): the \
                 validating webhook is not called"
            ),
        )
        .fix(
            "check the ValidatingWebhookConfiguration's rules, matchConditions and \
             namespaceSelector",
        ),
        JobSetAnswer::CallFailed { webhook, message } => Finding::new(
            CHECK,
            Outcome::Fail,
            format!("the API server cannot call webhook {webhook}: {message}"),
        )
        .fix("is the webhook running and ready, and its caBundle right (ca-bundle check)?"),
        JobSetAnswer::Denied { message, .. }
        | JobSetAnswer::GateOff(message)
        | JobSetAnswer::Other(message) => Finding::new(
            CHECK,
            Outcome::Warn,
            format!("not reached: another answer came first: {message}"),
        ),
    }
}

/// The version of an image reference: its tag, else its digest, else `latest`.
fn image_version(image: &str) -> String {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let last = name.rsplit('/').next().unwrap_or(name);
    match (last.split_once(':'), digest) {
        (Some((_, tag)), _) => tag.to_owned(),
        (None, Some(d)) => d.to_owned(),
        (None, None) => "latest".to_owned(),
    }
}

/// `jobset-controller`: JobSet's controller Deployment and the version its image names.
pub fn check_jobset_controller(deployments: &[Deployment]) -> Finding {
    const CHECK: &str = "jobset-controller";
    let found: Vec<String> = deployments
        .iter()
        .filter_map(|d| {
            let image = d
                .spec
                .as_ref()?
                .template
                .spec
                .as_ref()?
                .containers
                .iter()
                .filter_map(|c| c.image.as_deref())
                .find(|i| i.contains("jobset"))?;
            let ready = d
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0);
            Some(format!(
                "{}/{} runs {} (version {}, {ready} ready)",
                d.metadata.namespace.as_deref().unwrap_or_default(),
                d.metadata.name.as_deref().unwrap_or_default(),
                image,
                image_version(image)
            ))
        })
        .collect();
    if found.is_empty() {
        Finding::new(
            CHECK,
            Outcome::Warn,
            "no JobSet controller Deployment found (jobset-controller-manager): its version is \
             unknown",
        )
        .fix("install JobSet >= v0.11 (its InPlaceRestart); doctor reads the version of its Deployment's image")
    } else {
        Finding::new(CHECK, Outcome::Ok, found.join("; "))
    }
}

/// `flow-schemas`: every FlowSchema of ours names a priority level that exists.
pub fn check_flow_schemas(
    schemas: &[FlowSchema],
    levels: &[PriorityLevelConfiguration],
) -> Finding {
    const CHECK: &str = "flow-schemas";
    let ours: Vec<&FlowSchema> = schemas
        .iter()
        .filter(|s| {
            s.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("jobset-inplace"))
        })
        .collect();
    if ours.is_empty() {
        return Finding::new(
            CHECK,
            Outcome::Warn,
            "no jobset-inplace FlowSchema: the reconciler and the agents share the API server's \
             default priority levels",
        )
        .fix("apply the install manifest (deploy/base/flowcontrol.yaml)");
    }
    let exists = |name: &str| {
        levels
            .iter()
            .any(|l| l.metadata.name.as_deref() == Some(name))
    };
    let mut missing = Vec::new();
    let mut named = Vec::new();
    for s in &ours {
        let schema = s.metadata.name.as_deref().unwrap_or_default();
        let level = s
            .spec
            .as_ref()
            .map(|spec| spec.priority_level_configuration.name.as_str())
            .unwrap_or_default();
        if exists(level) {
            named.push(format!("{schema} -> {level}"));
        } else {
            missing.push(format!(
                "FlowSchema {schema} names priority level {level:?}, which does not exist"
            ));
        }
    }
    if missing.is_empty() {
        Finding::new(CHECK, Outcome::Ok, named.join(", "))
    } else {
        Finding::new(CHECK, Outcome::Fail, missing.join("; ")).fix(
            "create the priority level, or point the FlowSchema at one that exists (`kubectl \
             get prioritylevelconfigurations`)",
        )
    }
}

/// The pod `--pull-check` runs: the agent image printing its version, on a training node. It
/// tolerates every taint (training nodes are commonly tainted, `nvidia.com/gpu:NoSchedule`): the
/// nodes are chosen by `--nodes`, and the pod lives seconds.
pub fn pull_pod(
    namespace: &str,
    image: &str,
    node_selector: &BTreeMap<String, String>,
    pull_secrets: &[String],
) -> Value {
    let mut spec = json!({
        "restartPolicy": "Never",
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 0,
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "pull-check", "image": image, "imagePullPolicy": "Always",
            "args": ["--version"],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                          "limits": {"cpu": "100m", "memory": "32Mi"}},
            "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false,
                                "capabilities": {"drop": ["ALL"]}}}]
    });
    if !node_selector.is_empty() {
        spec["nodeSelector"] = json!(node_selector);
    }
    if !pull_secrets.is_empty() {
        spec["imagePullSecrets"] = pull_secrets
            .iter()
            .map(|name| json!({"name": name}))
            .collect();
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": format!("{PROBE_NAME}-pull-"), "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": PROBE_NAME}},
        "spec": spec
    })
}

/// `agent-image-pull` from the pull-check pod's status: `None` while it is still undecided
/// (and `waited_out` is false). Pure.
pub fn check_pull(pod: &Pod, image: &str, waited_out: bool) -> Option<Finding> {
    const CHECK: &str = "agent-image-pull";
    let status = pod.status.as_ref();
    let container = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first());
    let state = container.and_then(|c| c.state.as_ref());
    let pulled = container.is_some_and(|c| !c.image_id.is_empty())
        || state.is_some_and(|s| s.running.is_some() || s.terminated.is_some());
    if pulled {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or("?");
        return Some(Finding::new(
            CHECK,
            Outcome::Ok,
            format!("node {node} pulled {image}"),
        ));
    }
    if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
        let reason = waiting.reason.as_deref().unwrap_or_default();
        if matches!(
            reason,
            "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull"
        ) {
            return Some(
                Finding::new(
                    CHECK,
                    Outcome::Fail,
                    format!(
                        "{image}: {reason}: {}",
                        waiting.message.as_deref().unwrap_or("no message")
                    ),
                )
                .fix(
                    "push the image to a registry the nodes reach (docs/operations.md), set the \
                     agent image (JOBSET_INPLACE_AGENT_IMAGE / the chart's agent image) and, \
                     for a private registry, imagePullSecrets in the injection config",
                ),
            );
        }
    }
    if !waited_out {
        return None;
    }
    let scheduled = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    let why = match scheduled {
        None => "was not scheduled (no node matches --nodes, or none has room)".to_owned(),
        Some(node) => format!(
            "was scheduled on {node} but its image is not pulled yet ({})",
            state
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.as_deref())
                .unwrap_or("no container status")
        ),
    };
    Some(
        Finding::new(
            CHECK,
            Outcome::Warn,
            format!("cannot tell: the pull-check pod for {image} {why}"),
        )
        .fix("check the pod's events, or run again with a longer --pull-timeout"),
    )
}

/// Where and how `run` probes.
#[derive(Clone, Debug)]
pub struct Probe {
    /// Namespace of the dry runs and the pull-check pod.
    pub namespace: String,
    pub agent_service_account: String,
    pub pull: Option<PullCheck>,
    /// Skip the dry runs (and the pull check): only read.
    pub read_only: bool,
}

#[derive(Clone, Debug)]
pub struct PullCheck {
    pub image: String,
    pub node_selector: BTreeMap<String, String>,
    pub pull_secrets: Vec<String>,
    pub timeout: Duration,
}

fn message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

async fn dry_run<K>(api: Api<K>, object: &Value) -> Answer
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
    let params = PostParams {
        dry_run: true,
        field_manager: Some(PROBE_NAME.to_owned()),
    };
    let created = api
        .create(&params, &object)
        .await
        .map_err(|e| message(&e))?;
    serde_json::to_value(&created).map_err(|e| e.to_string())
}

/// Runs the checks before the first JobSet; every call bounded by the client's timeouts (and
/// the pull check by its own).
pub async fn run(client: &kube::Client, probe: &Probe) -> Vec<Finding> {
    let mut out = Vec::new();
    out.push(match client.apiserver_version().await {
        Ok(info) => check_version(&info),
        Err(e) => Finding::new(
            "kubernetes-version",
            Outcome::Fail,
            format!("cannot read the API server's version: {}", message(&e)),
        ),
    });
    let deployments: Api<Deployment> = Api::all(client.clone());
    let by_name = ListParams::default().fields("metadata.name=jobset-controller-manager");
    out.push(match deployments.list(&by_name).await {
        Ok(list) => check_jobset_controller(&list.items),
        Err(e) => Finding::new(
            "jobset-controller",
            Outcome::Warn,
            format!("cannot list Deployments: {}", message(&e)),
        ),
    });
    let schemas: Api<FlowSchema> = Api::all(client.clone());
    let levels: Api<PriorityLevelConfiguration> = Api::all(client.clone());
    out.push(
        match (
            schemas.list(&ListParams::default()).await,
            levels.list(&ListParams::default()).await,
        ) {
            (Ok(s), Ok(l)) => check_flow_schemas(&s.items, &l.items),
            (Err(e), _) | (_, Err(e)) => Finding::new(
                "flow-schemas",
                Outcome::Warn,
                format!(
                    "cannot list FlowSchemas or priority levels: {}",
                    message(&e)
                ),
            ),
        },
    );
    if probe.read_only {
        return out;
    }

    let ns = &probe.namespace;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    out.push(check_restart_rule(
        &dry_run(pods.clone(), &restart_rule_pod(ns)).await,
    ));
    let jobsets: Api<JobSet> = Api::namespaced(client.clone(), ns);
    let plain = classify(&dry_run(jobsets.clone(), &probe_jobset(ns, false)).await);
    out.push(check_jobset_gate(&plain));
    out.push(check_injection(&plain));
    let refused = classify(&dry_run(jobsets, &probe_jobset(ns, true)).await);
    out.push(check_validation(&refused));
    if let Some(pull) = &probe.pull {
        out.push(pull_check(&pods, ns, pull).await);
    }
    out
}

/// Creates the pull-check pod, polls it until [`check_pull`] decides or `timeout` passes, and
/// deletes it (whatever happened).
async fn pull_check(pods: &Api<Pod>, namespace: &str, pull: &PullCheck) -> Finding {
    const CHECK: &str = "agent-image-pull";
    let object = pull_pod(
        namespace,
        &pull.image,
        &pull.node_selector,
        &pull.pull_secrets,
    );
    let pod: Pod = match serde_json::from_value(object) {
        Ok(p) => p,
        Err(e) => return Finding::new(CHECK, Outcome::Fail, e.to_string()),
    };
    let created = match pods.create(&PostParams::default(), &pod).await {
        Ok(p) => p,
        Err(e) => {
            return Finding::new(
                CHECK,
                Outcome::Fail,
                format!("cannot create the pull-check pod: {}", message(&e)),
            );
        }
    };
    let name = created.metadata.name.clone().unwrap_or_default();
    let deadline = tokio::time::Instant::now() + pull.timeout;
    let finding = loop {
        let waited_out = tokio::time::Instant::now() >= deadline;
        match pods.get(&name).await {
            Ok(pod) => {
                if let Some(f) = check_pull(&pod, &pull.image, waited_out) {
                    break f;
                }
            }
            Err(e) if waited_out => {
                break Finding::new(
                    CHECK,
                    Outcome::Warn,
                    format!("cannot read the pull-check pod {name}: {}", message(&e)),
                );
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let gone = pods
        .delete(
            &name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await;
    match gone {
        Ok(_) => finding,
        Err(e) => Finding {
            detail: format!(
                "{}; and the pull-check pod {namespace}/{name} could not be deleted: {}",
                finding.detail,
                message(&e)
            ),
            ..finding
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(minor: &str) -> Info {
        Info {
            major: "1".into(),
            minor: minor.into(),
            git_version: format!("v1.{minor}.0"),
            ..Info::default()
        }
    }

    #[test]
    fn kubernetes_1_35_or_later() {
        assert_eq!(check_version(&info("35")).verdict, Outcome::Ok);
        assert_eq!(check_version(&info("36+")).verdict, Outcome::Ok);
        let old = check_version(&info("34"));
        assert_eq!(old.verdict, Outcome::Fail, "{}", old.render());
        assert!(old.detail.contains(">= 1.35"), "{}", old.detail);
        assert!(old.fix.is_some());
        assert_eq!(check_version(&info("")).verdict, Outcome::Warn);
    }

    #[test]
    fn an_api_server_emulating_an_older_release_is_judged_as_that_release() {
        let emulating = |minor: &str| Info {
            emulation_major: Some("1".into()),
            emulation_minor: Some(minor.into()),
            ..info("35")
        };
        let old = check_version(&emulating("34"));
        assert_eq!(old.verdict, Outcome::Fail, "{}", old.render());
        assert!(
            old.detail.contains("v1.35.0 emulating 1.34"),
            "{}",
            old.detail
        );
        let same = check_version(&emulating("35"));
        assert_eq!(same.verdict, Outcome::Ok, "{}", same.render());
        assert!(!same.detail.contains("emulating"), "{}", same.detail);
        // Empty emulation fields (older API servers leave them out) fall back to major/minor.
        let empty = Info {
            emulation_major: Some(String::new()),
            emulation_minor: Some(String::new()),
            ..info("35")
        };
        assert_eq!(check_version(&empty).verdict, Outcome::Ok);
    }

    #[test]
    fn a_dropped_or_refused_rule_is_a_gate_off() {
        let sent = restart_rule_pod("default");
        assert_eq!(check_restart_rule(&Ok(sent.clone())).verdict, Outcome::Ok);
        let mut dropped = sent;
        dropped["spec"]["initContainers"][0]
            .as_object_mut()
            .expect("container")
            .remove("restartPolicyRules");
        let f = check_restart_rule(&Ok(dropped));
        assert_eq!(f.verdict, Outcome::Fail);
        assert!(f.detail.contains("dropped"), "{}", f.detail);
        let f = check_restart_rule(&Err("Unsupported value: \"RestartAllContainers\"".into()));
        assert_eq!(f.verdict, Outcome::Fail);
        assert!(
            f.fix
                .as_deref()
                .unwrap_or_default()
                .contains("RestartAllContainersOnContainerExits")
        );
    }

    const CALL_FAILED: &str = "Internal error occurred: failed calling webhook \
        \"validate.jobset-inplace.dev\": failed to call webhook: Post \
        \"https://127.0.0.1:1/validate?timeout=10s\": dial tcp 127.0.0.1:1: connect: connection refused (500)";
    const UNTRUSTED: &str = "Internal error occurred: failed calling webhook \
        \"validate.jobset-inplace.dev\": failed to call webhook: Post \"https://x/validate\": \
        tls: failed to verify certificate: x509: certificate signed by unknown authority (500)";
    const DENIED: &str = "admission webhook \"validate.jobset-inplace.dev\" denied the request: \
        spec.replicatedJobs[0].template.spec.template.spec.containers[0].env[0]: ... (422)";
    const GATE_OFF: &str = "admission webhook \"vjobset.kb.io\" denied the request: InPlaceRestart \
        restart strategy cannot be set when InPlaceRestart feature gate is disabled (422)";

    fn injected() -> Value {
        let mut js = probe_jobset("default", false);
        let template = &mut js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"];
        template["metadata"] = json!({"annotations": {INJECTED_ANNOTATION: "0.1.0"}});
        template["spec"]["initContainers"] = json!([{"name": agent_env::CONTAINER_NAME}]);
        js
    }

    #[test]
    fn the_answer_names_who_spoke() {
        assert_eq!(
            classify(&Err(CALL_FAILED.into())),
            JobSetAnswer::CallFailed {
                webhook: VALIDATE_WEBHOOK.into(),
                message: CALL_FAILED.into()
            }
        );
        assert!(
            matches!(classify(&Err(DENIED.into())), JobSetAnswer::Denied { webhook, .. } if webhook == VALIDATE_WEBHOOK)
        );
        assert!(matches!(
            classify(&Err(GATE_OFF.into())),
            JobSetAnswer::GateOff(_)
        ));
        assert!(matches!(
            classify(&Err(
                "the server could not find the requested resource (404)".into()
            )),
            JobSetAnswer::Other(_)
        ));
    }

    #[test]
    fn injection_passes_only_with_the_agent_and_the_stamp() {
        let ok = check_injection(&classify(&Ok(injected())));
        assert_eq!(ok.verdict, Outcome::Ok, "{}", ok.render());
        let plain = check_injection(&classify(&Ok(probe_jobset("default", false))));
        assert_eq!(plain.verdict, Outcome::Fail);
        assert!(
            plain.detail.contains("without the agent"),
            "{}",
            plain.detail
        );
        let down = check_injection(&classify(&Err(CALL_FAILED.into())));
        assert_eq!(down.verdict, Outcome::Fail);
        assert!(
            down.fix.as_deref().unwrap_or_default().contains("running"),
            "{down:?}"
        );
        let tls = check_injection(&classify(&Err(UNTRUSTED.into())));
        assert!(
            tls.fix.as_deref().unwrap_or_default().contains("caBundle"),
            "{tls:?}"
        );
        assert_eq!(
            check_injection(&classify(&Err(GATE_OFF.into()))).verdict,
            Outcome::Warn
        );
    }

    #[test]
    fn the_gate_and_validation_from_the_answers() {
        assert_eq!(
            check_jobset_gate(&classify(&Ok(injected()))).verdict,
            Outcome::Ok
        );
        assert_eq!(
            check_jobset_gate(&classify(&Err(DENIED.into()))).verdict,
            Outcome::Ok
        );
        let off = check_jobset_gate(&classify(&Err(GATE_OFF.into())));
        assert_eq!(off.verdict, Outcome::Fail);
        assert!(
            off.fix
                .as_deref()
                .unwrap_or_default()
                .contains("InPlaceRestart: true")
        );
        assert_eq!(
            check_jobset_gate(&classify(&Err(CALL_FAILED.into()))).verdict,
            Outcome::Warn
        );

        assert_eq!(
            check_validation(&classify(&Err(DENIED.into()))).verdict,
            Outcome::Ok
        );
        assert_eq!(
            check_validation(&classify(&Ok(injected()))).verdict,
            Outcome::Fail
        );
        assert_eq!(
            check_validation(&classify(&Err(CALL_FAILED.into()))).verdict,
            Outcome::Fail
        );
        assert_eq!(
            check_validation(&classify(&Err(GATE_OFF.into()))).verdict,
            Outcome::Warn
        );
    }

    #[test]
    fn versions_from_images() {
        assert_eq!(
            image_version("registry.k8s.io/jobset/jobset:v0.12.0"),
            "v0.12.0"
        );
        assert_eq!(image_version("localhost:5000/jobset"), "latest");
        assert_eq!(image_version("r/jobset@sha256:ab"), "sha256:ab");
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "jobset-controller-manager", "namespace": "jobset-system"},
            "spec": {"selector": {}, "template": {"spec": {"containers": [
                {"name": "manager", "image": "registry.k8s.io/jobset/jobset:v0.12.0"}]}}},
            "status": {"readyReplicas": 1}
        }))
        .expect("deployment");
        let f = check_jobset_controller(&[d]);
        assert_eq!(f.verdict, Outcome::Ok);
        assert!(
            f.detail.contains("version v0.12.0, 1 ready"),
            "{}",
            f.detail
        );
        assert_eq!(check_jobset_controller(&[]).verdict, Outcome::Warn);
    }

    #[test]
    fn flow_schemas_need_their_levels() {
        let schema: FlowSchema = serde_json::from_value(json!({
            "metadata": {"name": "jobset-inplace-reconciler"},
            "spec": {"priorityLevelConfiguration": {"name": "workload-high"}}
        }))
        .expect("schema");
        let level = |name: &str| -> PriorityLevelConfiguration {
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"type": "Limited"}}))
                .expect("level")
        };
        let ok = check_flow_schemas(std::slice::from_ref(&schema), &[level("workload-high")]);
        assert_eq!(ok.verdict, Outcome::Ok, "{}", ok.render());
        let bad = check_flow_schemas(&[schema], &[level("global-default")]);
        assert_eq!(bad.verdict, Outcome::Fail);
        assert!(
            bad.detail
                .contains("\"workload-high\", which does not exist"),
            "{}",
            bad.detail
        );
        assert_eq!(check_flow_schemas(&[], &[]).verdict, Outcome::Warn);
    }

    fn pull_status(node: Option<&str>, status: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"nodeName": node, "containers": [{"name": "pull-check"}]},
            "status": status
        }))
        .expect("pod")
    }

    #[test]
    fn pull_failures_are_reported_with_their_message() {
        let backoff = pull_status(
            Some("n1"),
            json!({"containerStatuses": [{"name": "pull-check",
            "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff",
                                  "message": "Back-off pulling image \"x\""}}}]}),
        );
        let f = check_pull(&backoff, "x", false).expect("decided");
        assert_eq!(f.verdict, Outcome::Fail);
        assert!(
            f.detail
                .contains("ImagePullBackOff: Back-off pulling image"),
            "{}",
            f.detail
        );

        let done = pull_status(
            Some("n1"),
            json!({"containerStatuses": [{"name": "pull-check",
            "image": "x", "imageID": "sha256:1", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0}}}]}),
        );
        let f = check_pull(&done, "x", false).expect("decided");
        assert_eq!(f.verdict, Outcome::Ok);
        assert!(f.detail.contains("node n1 pulled x"), "{}", f.detail);

        let pending = pull_status(None, json!({"phase": "Pending"}));
        assert_eq!(check_pull(&pending, "x", false), None, "still waiting");
        let f = check_pull(&pending, "x", true).expect("decided at the deadline");
        assert_eq!(f.verdict, Outcome::Warn);
        assert!(f.detail.contains("was not scheduled"), "{}", f.detail);
    }

    #[test]
    fn the_pull_pod_runs_on_the_training_nodes() {
        let selector = BTreeMap::from([("pool".to_owned(), "train".to_owned())]);
        let pod = pull_pod("ns", "img:1", &selector, &["regcred".to_owned()]);
        assert_eq!(pod["spec"]["nodeSelector"]["pool"], "train");
        assert_eq!(
            pod["spec"]["tolerations"][0]["operator"], "Exists",
            "tainted nodes too"
        );
        assert_eq!(pod["spec"]["imagePullSecrets"][0]["name"], "regcred");
        assert_eq!(pod["spec"]["containers"][0]["image"], "img:1");
        assert!(serde_json::from_value::<Pod>(pod).is_ok());
    }
}
