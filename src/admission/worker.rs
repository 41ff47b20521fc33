//! The workers' restart rule (docs/protocol.md, "Worker restart rules"): on every worker container
//! of an injected pod template that has no `restartPolicyRules` of its own, the mutation adds
//! `restartPolicy: Never` (where the container has none) and one rule that restarts the whole pod
//! in place on every exit code but 0 and those the Job's `podFailurePolicy` fails the Job (or the
//! index) on. Those stay pod failures, so the Job, and through JobSet's `failurePolicy.rules`
//! (which match Job failure reasons such as `PodFailurePolicy`, never exit codes) the JobSet,
//! still fail on them.

use super::patch::{Op, Ptr, add, to_json};
use super::pod::{self, Container, ContainerList, RESTART_ALL_CONTAINERS};
use super::view::{PodFailurePolicy, PodFailureRule, PodSpec};

/// Most values a restart rule's `exitCodes.values` may hold (the API server's limit).
pub const MAX_RULE_VALUES: usize = 255;

/// The Job's pod failure policy actions that end the Job (or its index) on a match.
const FATAL_ACTIONS: [&str; 2] = ["FailJob", "FailIndex"];
/// The actions that leave a failed pod to be replaced: a restart in place serves them as well.
const RETRY_ACTIONS: [&str; 2] = ["Count", "Ignore"];

/// What a worker container's rule can be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WorkerRule {
    /// `RestartAllContainers` on every exit code not in these (0 first, then the fatal codes in
    /// ascending order).
    NotIn(Vec<i64>),
    /// No rule is safe: why (for a warning).
    Unsafe(String),
}

/// What a Job's pod failure policy makes fatal: for every container (`all`), and for the
/// containers it names. Read once per pod template; each list holds at most
/// [`MAX_RULE_VALUES`] codes (past that, no rule is safe anyway).
#[derive(Clone, Debug)]
pub(crate) struct Fatal<'p> {
    all: Codes,
    named: std::collections::HashMap<&'p str, Codes>,
}

/// Fatal exit codes (sorted, deduplicated, 0 left out), or why no rule is safe.
type Codes = Result<Vec<i64>, String>;

fn extend(codes: &mut Codes, more: Codes) {
    match (codes.as_mut(), more) {
        (Err(_), _) => {}
        (Ok(_), Err(why)) => *codes = Err(why),
        (Ok(list), Ok(more)) => {
            list.extend(more);
            list.sort_unstable();
            list.dedup();
            if list.len() >= MAX_RULE_VALUES {
                *codes = Err(too_many(list.len()));
            }
        }
    }
}

fn too_many(n: usize) -> String {
    format!(
        "its podFailurePolicy fails on {}{n} exit codes, more than a restart rule can list ({})",
        if n >= MAX_RULE_VALUES {
            "at least "
        } else {
            ""
        },
        MAX_RULE_VALUES - 1
    )
}

impl<'p> Fatal<'p> {
    /// Reads a Job's pod failure policy.
    pub(crate) fn of(policy: Option<&'p PodFailurePolicy<'p>>) -> Self {
        let mut out = Fatal {
            all: Ok(Vec::new()),
            named: std::collections::HashMap::new(),
        };
        let Some(policy) = policy else {
            return out;
        };
        if !policy.wrong.is_empty() || policy.rules.as_ref().is_some_and(|l| l.1.count > 0) {
            out.all = Err("its podFailurePolicy cannot be read".to_owned());
            return out;
        }
        let rules = policy.rules.as_ref().map_or(&[][..], |l| l.0.as_slice());
        for (k, rule) in rules.iter().enumerate() {
            let (container, codes) = rule_codes(k, rule);
            match container {
                None => extend(&mut out.all, codes),
                Some(name) => extend(out.named.entry(name).or_insert(Ok(Vec::new())), codes),
            }
        }
        out
    }

    /// The rule for the worker container named `container`.
    pub(crate) fn rule(&self, container: &str) -> WorkerRule {
        let mut codes = self.all.clone();
        if let Some(own) = self.named.get(container) {
            extend(&mut codes, own.clone());
        }
        match codes {
            Err(why) => WorkerRule::Unsafe(why),
            Ok(fatal) => {
                let mut values = Vec::with_capacity(fatal.len() + 1);
                values.push(0);
                values.extend(fatal);
                WorkerRule::NotIn(values)
            }
        }
    }
}

/// The container a pod failure policy rule is restricted to, and the codes it makes fatal.
fn rule_codes<'p>(k: usize, rule: &'p PodFailureRule<'p>) -> (Option<&'p str>, Codes) {
    let Some(codes) = &rule.on_exit_codes else {
        if !rule.wrong.is_empty() {
            return (
                None,
                Err(format!("its podFailurePolicy.rules[{k}] cannot be read")),
            );
        }
        // onPodConditions: not about exit codes.
        return (None, Ok(Vec::new()));
    };
    let container = codes.container_name.as_deref();
    let action = rule.action.as_deref().unwrap_or("");
    if RETRY_ACTIONS.contains(&action) {
        return (container, Ok(Vec::new()));
    }
    let values = codes.values.as_ref();
    if !rule.wrong.is_empty() || !codes.wrong.is_empty() || values.is_some_and(|v| v.1.count > 0) {
        let why = format!("its podFailurePolicy.rules[{k}].onExitCodes cannot be read");
        return (container, Err(why));
    }
    if !FATAL_ACTIONS.contains(&action) {
        let why =
            format!("its podFailurePolicy.rules[{k}] has the action {action:?}, unknown here");
        return (container, Err(why));
    }
    let values = values.map_or(&[][..], |v| v.0.as_slice());
    let codes = match codes.operator.as_deref() {
        Some("In") => {
            let mut list: Vec<i64> = values.iter().copied().filter(|c| *c != 0).collect();
            list.sort_unstable();
            list.dedup();
            if list.len() >= MAX_RULE_VALUES {
                Err(too_many(list.len()))
            } else {
                Ok(list)
            }
        }
        Some("NotIn") => {
            let shown: Vec<i64> = values.iter().copied().take(8).collect();
            let more = if values.len() > 8 { ", ..." } else { "" };
            Err(format!(
                "its podFailurePolicy.rules[{k}] ({action}) fails on every exit code but \
                 {shown:?}{more}"
            ))
        }
        other => Err(format!(
            "its podFailurePolicy.rules[{k}] has the operator {:?}, unknown here",
            other.unwrap_or("")
        )),
    };
    (container, codes)
}

/// The rule for the worker container `container` of a Job whose pod failure policy is `policy`.
#[cfg(test)]
pub(crate) fn worker_rule(policy: Option<&PodFailurePolicy<'_>>, container: &str) -> WorkerRule {
    Fatal::of(policy).rule(container)
}

/// The container is a worker that gets the rule: a regular container (not `agent`, the index of
/// a main-container agent) with no `restartPolicyRules` and a `restartPolicy` that is absent or
/// `Never` (a container restarted by itself is left to it), read whole.
fn takes_rule(c: &Container<'_>, agent: Option<usize>) -> bool {
    c.list == ContainerList::Regular
        && !c.malformed
        && Some(c.index) != agent
        && c.view.wrong.is_empty()
        && c.view.restart_policy_rules.is_none()
        && c.restart_policy().is_none_or(|p| p == "Never")
}

/// A pod template the workers' rule goes into.
#[derive(Clone, Copy)]
pub(crate) struct WorkerPod<'r, 'a> {
    /// Where the pod spec is (`/spec/replicatedJobs/<i>/template/spec/template/spec`).
    pub(crate) ptr: &'r Ptr,
    pub(crate) spec: &'r PodSpec<'a>,
    /// The Job's `podFailurePolicy`.
    pub(crate) policy: Option<&'r PodFailurePolicy<'a>>,
    /// The index of a main-container agent in `containers`.
    pub(crate) agent: Option<usize>,
    /// The index of its replicatedJob.
    pub(crate) replicated_job: usize,
}

/// Adds the worker rule to every worker of a pod template that takes one. A worker for which no
/// rule is safe gets none and a warning. Pods restarted by the kubelet itself (`restartPolicy:
/// OnFailure`) are left alone. Stops adding once past `max_bytes` of operations.
pub(crate) fn add_worker_rules(
    pod: WorkerPod<'_, '_>,
    max_bytes: usize,
    ops: &mut Vec<Op>,
    warnings: &mut Vec<String>,
) {
    let WorkerPod {
        ptr: pod_ptr,
        spec: pod_spec,
        policy,
        agent,
        replicated_job,
    } = pod;
    if pod_spec.restart_policy.as_deref() == Some("OnFailure") {
        return;
    }
    let fatal = Fatal::of(policy);
    // The rule's JSON, serialized once per list of values (most pods need one).
    let mut texts: Vec<(Vec<i64>, String)> = Vec::new();
    let mut added = 0;
    for c in pod::containers(pod_spec, ContainerList::Regular) {
        if !takes_rule(&c, agent) {
            continue;
        }
        if added > max_bytes {
            // Past the patch limit already: the caller refuses the injection as too large.
            return;
        }
        match fatal.rule(c.name()) {
            WorkerRule::NotIn(values) => {
                let container = pod_ptr.key(c.list.key()).idx(c.index);
                if c.restart_policy().is_none() {
                    let op = add(container.key("restartPolicy"), to_json(&"Never"));
                    added += op.path.len() + op.value.len();
                    ops.push(op);
                }
                let text = match texts.iter().position(|(v, _)| *v == values) {
                    Some(i) => texts[i].1.clone(),
                    None => {
                        let rule = serde_json::json!([{
                            "action": RESTART_ALL_CONTAINERS,
                            "exitCodes": {"operator": "NotIn", "values": values},
                        }]);
                        let text = to_json(&rule);
                        if texts.len() < 8 {
                            texts.push((values, text.clone()));
                        }
                        text
                    }
                };
                let op = add(container.key("restartPolicyRules"), text);
                added += op.path.len() + op.value.len();
                ops.push(op);
            }
            WorkerRule::Unsafe(why) => {
                if warnings.len() > super::warnings::MAX_WARNINGS {
                    warnings.push(String::new());
                    continue;
                }
                warnings.push(format!(
                    "spec.replicatedJobs[{replicated_job}]: container {}: no restart rule added, \
                     {why}: a crash of it fails its pod, which is replaced before the group \
                     restarts",
                    super::warnings::clip(c.name().to_owned())
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::lenient::Lenient;
    use serde_json::{Value, json};

    fn policy(value: &Value) -> PodFailurePolicy<'_> {
        Lenient::<PodFailurePolicy<'_>>::from_value(value).unwrap_or_default()
    }

    fn rule(value: Value, container: &str) -> WorkerRule {
        worker_rule(Some(&policy(&value)), container)
    }

    #[test]
    fn no_policy_restarts_on_every_non_zero_exit() {
        assert_eq!(worker_rule(None, "w"), WorkerRule::NotIn(vec![0]));
        assert_eq!(rule(json!({}), "w"), WorkerRule::NotIn(vec![0]));
    }

    #[test]
    fn fatal_codes_are_left_to_the_job() {
        let p = json!({"rules": [
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42, 13]}},
            {"action": "FailIndex", "onExitCodes": {"containerName": "w", "operator": "In", "values": [7, 13]}},
            {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [99]}},
            {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [1]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {"action": "FailJob", "onExitCodes": {"containerName": "other", "operator": "In", "values": [5]}},
        ]});
        assert_eq!(rule(p.clone(), "w"), WorkerRule::NotIn(vec![0, 7, 13, 42]));
        assert_eq!(rule(p, "x"), WorkerRule::NotIn(vec![0, 13, 42]));
    }

    #[test]
    fn no_rule_is_safe_where_almost_every_code_is_fatal() {
        let not_in = json!({"rules": [{"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [1]}}]});
        assert!(
            matches!(rule(not_in.clone(), "w"), WorkerRule::Unsafe(w) if w.contains("every exit code but [1]"))
        );
        let elsewhere = json!({"rules": [{"action": "FailJob", "onExitCodes": {"containerName": "x", "operator": "NotIn", "values": [1]}}]});
        assert_eq!(rule(elsewhere, "w"), WorkerRule::NotIn(vec![0]));
        let unknown = json!({"rules": [{"action": "FailJob", "onExitCodes": {"operator": "Between", "values": [1]}}]});
        assert!(matches!(rule(unknown, "w"), WorkerRule::Unsafe(_)));
        let action = json!({"rules": [{"action": "Explode", "onExitCodes": {"operator": "In", "values": [1]}}]});
        assert!(matches!(rule(action, "w"), WorkerRule::Unsafe(_)));
        let unreadable = json!({"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": ["13"]}}]});
        assert!(matches!(rule(unreadable, "w"), WorkerRule::Unsafe(_)));
        let many: Vec<i64> = (1..=255).collect();
        let many = json!({"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": many}}]});
        assert!(matches!(rule(many, "w"), WorkerRule::Unsafe(w) if w.contains("more than")));
        let most: Vec<i64> = (1..=254).collect();
        let most = json!({"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": most}}]});
        assert!(matches!(rule(most, "w"), WorkerRule::NotIn(v) if v.len() == MAX_RULE_VALUES));
    }
}
