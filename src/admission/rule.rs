//! The admission rules as values (docs/architecture.md, "Add a validation rule"): every
//! [`super::Violation`] carries the [`Rule`] it breaks, and the webhook's denial metric, `check -o
//! json` and the docs count from that. Adding a rule is one variant here (its label in
//! [`Rule::label`], an entry of [`Rule::ALL`]) and its check in `validate.rs`; the tests fail
//! until it has a fixture under `fixtures/admission/` that breaks it.

/// A rule a JobSet can break. A closed list: the metric's `rule` label is bounded whatever is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// `backoffLimit` is 0 (a failed pod fails the Job instead of being restarted in place).
    BackoffLimit,
    /// `podReplacementPolicy` is `Failed`.
    PodReplacementPolicy,
    /// `completions` equals `parallelism`.
    Completions,
    /// A pod template runs no agent (and none is injected).
    AgentMissing,
    /// A pod template runs the agent twice.
    AgentDuplicate,
    /// A container's `restartPolicy` (the agent's `Always`; set where rules are).
    RestartPolicy,
    /// `restartPolicyRules` (the agent's rule, the workers' actions).
    RestartRules,
    /// The agent's env (the downward API entries, the protocol, the exit code, its port).
    AgentEnv,
    /// The agent's startup probe is its barrier.
    BarrierProbe,
    /// The barrier's port is declared by another container, or no configured port is free.
    BarrierPort,
    /// The pod would hand the agent's token to every container (`automountServiceAccountToken`).
    AgentToken,
    /// A volume named as the agent's token volume that is not that volume, a mount of that
    /// volume by another container than the agent, or another service account token projected
    /// in a pod that runs as the agent's account.
    TokenVolume,
    /// A field the rules read has a JSON type they cannot read.
    Unreadable,
    /// The JobSet is too large to be judged (more list elements than are read).
    TooLarge,
    /// The agent runs as the main container (`WORKER_COMMAND`): not offered, the kubelet backs
    /// off a container restarted under a `Restart` rule (docs/protocol.md).
    MainContainerAgent,
    /// A container other than the agent carries the agent sidecar's name.
    AgentName,
}

impl Rule {
    /// Every rule, in the order of their labels in metrics.
    pub const ALL: [Rule; 16] = [
        Rule::BackoffLimit,
        Rule::PodReplacementPolicy,
        Rule::Completions,
        Rule::AgentMissing,
        Rule::AgentDuplicate,
        Rule::RestartPolicy,
        Rule::RestartRules,
        Rule::AgentEnv,
        Rule::BarrierProbe,
        Rule::BarrierPort,
        Rule::AgentToken,
        Rule::TokenVolume,
        Rule::Unreadable,
        Rule::TooLarge,
        Rule::MainContainerAgent,
        Rule::AgentName,
    ];

    /// The `rule` label of `jobset_inplace_admission_denials_total` and `check -o json`.
    pub fn label(self) -> &'static str {
        match self {
            Rule::BackoffLimit => "backoff_limit",
            Rule::PodReplacementPolicy => "pod_replacement_policy",
            Rule::Completions => "completions",
            Rule::AgentMissing => "agent_missing",
            Rule::AgentDuplicate => "agent_duplicate",
            Rule::RestartPolicy => "restart_policy",
            Rule::RestartRules => "restart_rules",
            Rule::AgentEnv => "agent_env",
            Rule::BarrierProbe => "barrier_probe",
            Rule::BarrierPort => "barrier_port",
            Rule::AgentToken => "agent_token",
            Rule::TokenVolume => "token_volume",
            Rule::Unreadable => "unreadable",
            Rule::TooLarge => "too_large",
            Rule::MainContainerAgent => "main_container_agent",
            Rule::AgentName => "agent_name",
        }
    }
}

/// Adds `rule` to `rules` unless it is there (a denial counts each rule it breaks once).
pub(crate) fn note(rules: &mut Vec<Rule>, rule: Rule) {
    if !rules.contains(&rule) {
        rules.push(rule);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_has_its_own_label() {
        for (i, a) in Rule::ALL.iter().enumerate() {
            for b in &Rule::ALL[i + 1..] {
                assert_ne!(a, b);
                assert_ne!(a.label(), b.label(), "{a:?} {b:?}");
            }
        }
    }
}
