//! The admission rules as values (docs/architecture.md, "Add a validation rule"): every
//! [`super::Violation`] carries the [`Rule`] it breaks, and the webhook's denial metric, `check -o
//! json` and the docs count from that. Adding a rule is one line of [`rules!`] below (its variant,
//! its label, the value it requires if any: [`Rule::ALL`] and [`Rule::label`] are made from that
//! one list, so no variant can miss either) and its check in `validate.rs`; the tests fail until it
//! has a fixture under `fixtures/admission/` that breaks it (`tests/it/admission/fixtures.rs`) and
//! a row in docs/operations.md's table of the denial metric's `rule` label (`webhook::metrics`'s
//! tests), and the metric has its series from the start.

/// Declares [`Rule`] from one list: each rule's variant (with its doc), its label and, for a rule
/// that requires one value, that value as a constant of [`Rule`]. `ALL` and `label` come from the
/// same list, so a rule is in both or does not exist.
macro_rules! rules {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident => $label:literal $(, requires $name:ident: $ty:ty = $value:expr)?;
    )*) => {
        /// A rule a JobSet can break. A closed list: the metric's `rule` label is bounded whatever
        /// is sent.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Rule {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Rule {
            /// Every rule, in the order of their labels in metrics and in docs/operations.md.
            pub const ALL: [Rule; [$(Rule::$variant),*].len()] = [$(Rule::$variant),*];

            /// The `rule` label of `jobset_inplace_admission_denials_total` and `check -o json`.
            pub const fn label(self) -> &'static str {
                match self {
                    $(Rule::$variant => $label,)*
                }
            }

            $($(
                #[doc = concat!("The value [`Rule::", stringify!($variant), "`] requires.")]
                pub const $name: $ty = $value;
            )?)*
        }
    };
}

rules! {
    /// `backoffLimit` is not the largest (a failed pod would fail the Job instead of being
    /// restarted in place: the Job never fails on its own).
    BackoffLimit => "backoff_limit", requires BACKOFF_LIMIT: i64 = 2_147_483_647;
    /// `podReplacementPolicy` is not `Failed` (a replacement pod must not start while the old one
    /// terminates).
    PodReplacementPolicy => "pod_replacement_policy", requires POD_REPLACEMENT_POLICY: &'static str = "Failed";
    /// `completions` equals `parallelism`.
    Completions => "completions";
    /// A pod template runs no agent (and none is injected).
    AgentMissing => "agent_missing";
    /// A pod template runs the agent twice.
    AgentDuplicate => "agent_duplicate";
    /// A container's `restartPolicy` (the agent's `Always`; set where rules are).
    RestartPolicy => "restart_policy";
    /// `restartPolicyRules` (the agent's rule, the workers' actions).
    RestartRules => "restart_rules";
    /// The agent's env (the downward API entries, the protocol, the exit code, its port).
    AgentEnv => "agent_env";
    /// The agent's startup probe is its barrier.
    BarrierProbe => "barrier_probe";
    /// The barrier's port is declared by another container, or no configured port is free.
    BarrierPort => "barrier_port";
    /// The pod would hand the agent's token to every container (`automountServiceAccountToken`).
    AgentToken => "agent_token";
    /// A volume named as the agent's token volume that is not that volume, a mount of that
    /// volume by another container than the agent, or another service account token projected
    /// in a pod that runs as the agent's account.
    TokenVolume => "token_volume";
    /// A field the rules read has a JSON type they cannot read.
    Unreadable => "unreadable";
    /// The JobSet is too large to be judged (more list elements than are read).
    TooLarge => "too_large";
    /// The agent runs as the main container (`WORKER_COMMAND`): not offered, the kubelet backs
    /// off a container restarted under a `Restart` rule (docs/protocol.md).
    MainContainerAgent => "main_container_agent";
    /// A container other than the agent carries the agent sidecar's name.
    AgentName => "agent_name";
    /// A container shaped as the agent sidecar (an init container with a restart rule that
    /// restarts the pod, or the agent's name) does not run the configured agent image: a
    /// look-alike, which would be taken for the agent and given its token.
    AgentImage => "agent_image";
    /// `shareProcessNamespace` in a pod that runs as the agent's service account: a worker could
    /// read the agent's token through `/proc/<pid>/root`.
    ShareProcessNamespace => "share_process_namespace";
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
            // `ALL` is in the enum's order (which `Ord` and the metric's series follow).
            assert_eq!(*a as usize, i, "{a:?}");
        }
    }
}
