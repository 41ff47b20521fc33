//! The workers' restart rule (docs/protocol.md, "Worker restart rules"): on every worker container
//! of an injected pod template that has no `restartPolicyRules` of its own, the mutation adds
//! `restartPolicy: Never` (where the container has none) and one rule that restarts the whole pod
//! in place on every exit code but 0 and those the Job's `podFailurePolicy` fails the Job (or the
//! index) on. Those stay pod failures, so the Job, and through JobSet's `failurePolicy.rules`
//! (which match Job failure reasons such as `PodFailurePolicy`, never exit codes) the JobSet,
//! still fail on them.

use super::patch::{Op, Ptr, add, to_json};
use super::pod::{self, Container, ContainerList, RESTART_ALL_CONTAINERS};
use super::view::{PodFailurePolicy, PodSpec};

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

/// The rule for the worker container `container` of a Job whose pod failure policy is `policy`.
pub(crate) fn worker_rule(policy: Option<&PodFailurePolicy<'_>>, container: &str) -> WorkerRule {
    let mut fatal: Vec<i64> = Vec::new();
    if let Some(policy) = policy {
        if !policy.wrong.is_empty() {
            return WorkerRule::Unsafe("its podFailurePolicy cannot be read".to_owned());
        }
        let rules = policy.rules.as_ref().map_or(&[][..], |l| l.0.as_slice());
        if policy.rules.as_ref().is_some_and(|l| l.1.count > 0) {
            return WorkerRule::Unsafe("its podFailurePolicy.rules cannot be read".to_owned());
        }
        for (k, rule) in rules.iter().enumerate() {
            let Some(codes) = &rule.on_exit_codes else {
                if !rule.wrong.is_empty() {
                    return WorkerRule::Unsafe(format!(
                        "its podFailurePolicy.rules[{k}] cannot be read"
                    ));
                }
                // onPodConditions: not about exit codes.
                continue;
            };
            if codes
                .container_name
                .as_deref()
                .is_some_and(|name| name != container)
            {
                continue;
            }
            let action = rule.action.as_deref().unwrap_or("");
            if RETRY_ACTIONS.contains(&action) {
                continue;
            }
            let values = codes.values.as_ref();
            if !rule.wrong.is_empty()
                || !codes.wrong.is_empty()
                || values.is_some_and(|v| v.1.count > 0)
            {
                return WorkerRule::Unsafe(format!(
                    "its podFailurePolicy.rules[{k}].onExitCodes cannot be read"
                ));
            }
            if !FATAL_ACTIONS.contains(&action) {
                return WorkerRule::Unsafe(format!(
                    "its podFailurePolicy.rules[{k}] has the action {action:?}, unknown here"
                ));
            }
            let values = values.map_or(&[][..], |v| v.0.as_slice());
            match codes.operator.as_deref() {
                Some("In") => fatal.extend(values.iter().copied().filter(|c| *c != 0)),
                Some("NotIn") => {
                    return WorkerRule::Unsafe(format!(
                        "its podFailurePolicy.rules[{k}] ({action}) fails on every exit code but \
                         {values:?}"
                    ));
                }
                other => {
                    return WorkerRule::Unsafe(format!(
                        "its podFailurePolicy.rules[{k}] has the operator {:?}, unknown here",
                        other.unwrap_or("")
                    ));
                }
            }
        }
    }
    fatal.sort_unstable();
    fatal.dedup();
    if fatal.len() + 1 > MAX_RULE_VALUES {
        return WorkerRule::Unsafe(format!(
            "its podFailurePolicy fails on {} exit codes, more than a restart rule can list ({})",
            fatal.len(),
            MAX_RULE_VALUES - 1
        ));
    }
    let mut values = Vec::with_capacity(fatal.len() + 1);
    values.push(0);
    values.extend(fatal);
    WorkerRule::NotIn(values)
}

/// The container is a worker that gets the rule: a regular container (not `agent`, the index of
/// a main-container agent) with no `restartPolicyRules` and a `restartPolicy` that is absent or
/// `Never` (a container restarted by itself is left to it), read whole.
fn takes_rule(c: &Container<'_>, agent: Option<usize>) -> bool {
    c.list == ContainerList::Regular
        && Some(c.index) != agent
        && c.view.wrong.is_empty()
        && c.view.restart_policy_rules.is_none()
        && c.restart_policy().is_none_or(|p| p == "Never")
}

/// Adds the worker rule to every worker of a pod template (at `pod_ptr`) that takes one;
/// `agent`: the index of a main-container agent in `containers`. A worker for which no rule is
/// safe gets none and a warning. Pods restarted by the kubelet itself (`restartPolicy:
/// OnFailure`) are left alone.
pub(crate) fn add_worker_rules(
    pod_ptr: &Ptr,
    pod_spec: &PodSpec<'_>,
    policy: Option<&PodFailurePolicy<'_>>,
    agent: Option<usize>,
    replicated_job: usize,
    ops: &mut Vec<Op>,
    warnings: &mut Vec<String>,
) {
    if pod_spec.restart_policy.as_deref() == Some("OnFailure") {
        return;
    }
    for c in pod::containers(pod_spec, ContainerList::Regular) {
        if !takes_rule(&c, agent) {
            continue;
        }
        match worker_rule(policy, c.name()) {
            WorkerRule::NotIn(values) => {
                let container = pod_ptr.key(c.list.key()).idx(c.index);
                if c.restart_policy().is_none() {
                    ops.push(add(container.key("restartPolicy"), to_json(&"Never")));
                }
                let rule = serde_json::json!([{
                    "action": RESTART_ALL_CONTAINERS,
                    "exitCodes": {"operator": "NotIn", "values": values},
                }]);
                ops.push(add(container.key("restartPolicyRules"), to_json(&rule)));
            }
            WorkerRule::Unsafe(why) => {
                if warnings.len() > super::validate::MAX_WARNINGS {
                    warnings.push(String::new());
                    continue;
                }
                warnings.push(format!(
                    "spec.replicatedJobs[{replicated_job}]: container {}: no restart rule added, \
                     {why}: a crash of it fails its pod, which is replaced before the group \
                     restarts",
                    super::validate::clip(c.name().to_owned())
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
