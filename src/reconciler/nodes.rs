//! Lost nodes (docs/protocol.md, "A node lost"; docs/operations.md, "Node loss"): the pods of
//! InPlaceRestart JobSets bound to a node the reconciler takes for lost are failed and deleted
//! (the controller's `lost` room), so that their Jobs replace them; the replacements register the
//! next epoch and the others restart in place, as after any pod's replacement.
//!
//! Which nodes are taken for lost is the operator's choice, [`NodeLost`]:
//! - [`NodeLost::Fenced`] (the default): only a node known not to run anything any longer, a
//!   *fenced* one: its Node object deleted, or tainted `node.kubernetes.io/out-of-service` while
//!   its `Ready` condition is not `True` (the condition under which kube-controller-manager's pod
//!   garbage collector force-deletes the node's terminating pods, `pkg/controller/podgc`). A node
//!   that is only partitioned is never fenced by this product: two workers of one index cannot
//!   run at once unless the operator (or the cloud's node lifecycle) said the node is down.
//! - [`NodeLost::ForceAfterGrace`]: also a node whose `Ready` condition has been `Unknown` (its
//!   kubelet silent past the node controller's grace) for the grace, on this reconciler's clock.
//!   A partitioned node's old worker may then run beside its replacement until it reconnects.
//! - [`NodeLost::Off`]: Nodes are not watched.
//!
//! Pure: [`NodeHealth`] keeps, per node, since when this reconciler has seen it silent (its own
//! clock, never the node's or the API server's times: a clock skew can only make it wait longer,
//! and a new reconciler starts counting afresh), which nodes are fenced, and which were deleted
//! (for [`DELETED_MEMORY`]); [`read_node`] reads a Node; [`lost_pods`] picks the pods to fail.
//! `False` (the kubelet itself reports the node not ready) is not silence: that kubelet is alive
//! and ends its pods itself.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;

use crate::protocol::{AloneAgent, PodView};

/// The taint with which an operator says a node is down for good (Kubernetes'
/// `v1.TaintNodeOutOfService`; GA with NodeOutOfServiceVolumeDetach in 1.28).
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// How long a deleted node's name is remembered: its pods, if any are left, are the pod garbage
/// collector's after its 40 s quarantine anyway.
pub const DELETED_MEMORY: Duration = Duration::from_secs(600);

/// `--node-lost-grace` when `--node-lost force-after-grace` names none.
pub const DEFAULT_FORCE_GRACE: Duration = Duration::from_secs(30);

/// Which nodes the reconciler takes for lost (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeLost {
    /// Nodes are not watched; nothing is failed.
    Off,
    /// Deleted or out-of-service nodes only.
    Fenced,
    /// Fenced nodes, and nodes silent (`Ready` `Unknown`) for this long.
    ForceAfterGrace(Duration),
}

/// `--node-lost`, as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NodeLostMode {
    Fenced,
    ForceAfterGrace,
    Off,
}

impl NodeLost {
    /// Whether Nodes are watched at all.
    pub fn watches(self) -> bool {
        self != NodeLost::Off
    }

    /// The grace after which a silent node is lost, in `force-after-grace` only.
    pub fn grace(self) -> Option<Duration> {
        match self {
            NodeLost::ForceAfterGrace(g) => Some(g),
            NodeLost::Off | NodeLost::Fenced => None,
        }
    }

    /// One line for logs, events and `doctor`.
    pub fn describe(self) -> String {
        match self {
            NodeLost::Off => "off (Nodes not watched)".to_owned(),
            NodeLost::Fenced => {
                "fenced (pods failed and deleted only on a node deleted or tainted \
                 node.kubernetes.io/out-of-service)"
                    .to_owned()
            }
            NodeLost::ForceAfterGrace(g) => format!(
                "force-after-grace {}s (also on a node Ready=Unknown for {}s: a partitioned \
                 node's worker may run beside its replacement)",
                g.as_secs(),
                g.as_secs()
            ),
        }
    }
}

/// `--node-lost` and `--node-lost-grace` resolved. Backward compatible: a grace given alone was
/// only ever the force-deletion's (before the modes, `--node-lost-grace` was the one setting), so
/// it selects `force-after-grace`, and `0` alone still turns the watch off. A grace beside a mode
/// it does not apply to is refused rather than ignored.
pub fn resolve_node_lost(
    mode: Option<NodeLostMode>,
    grace: Option<Duration>,
) -> Result<NodeLost, String> {
    let zero = grace.is_some_and(|g| g.is_zero());
    match (mode, grace) {
        (None, None) | (Some(NodeLostMode::Fenced), None) => Ok(NodeLost::Fenced),
        (None, Some(_)) if zero => Ok(NodeLost::Off),
        (None, Some(g)) => Ok(NodeLost::ForceAfterGrace(g)),
        (Some(NodeLostMode::Off), None) => Ok(NodeLost::Off),
        (Some(NodeLostMode::Off), Some(_)) if zero => Ok(NodeLost::Off),
        (Some(NodeLostMode::ForceAfterGrace), None) => {
            Ok(NodeLost::ForceAfterGrace(DEFAULT_FORCE_GRACE))
        }
        (Some(NodeLostMode::ForceAfterGrace), Some(_)) if zero => Err(
            "--node-lost-grace 0 with --node-lost force-after-grace: give a grace of 1s or more, \
             or --node-lost off"
                .to_owned(),
        ),
        (Some(NodeLostMode::ForceAfterGrace), Some(g)) => Ok(NodeLost::ForceAfterGrace(g)),
        (Some(m @ (NodeLostMode::Fenced | NodeLostMode::Off)), Some(_)) => Err(format!(
            "--node-lost-grace applies to --node-lost force-after-grace only, not {}",
            match m {
                NodeLostMode::Fenced => "fenced",
                _ => "off",
            }
        )),
    }
}

/// What a Node's `Ready` condition says of its kubelet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// `Unknown`: the kubelet has not been heard from within the node controller's grace.
    Silent,
    /// `True`.
    Ready,
    /// `False`, absent (a node still registering), or anything else: the kubelet speaks for
    /// itself, or nothing says it is gone.
    Heard,
}

/// What the reconciler reads of a Node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeState {
    pub readiness: Readiness,
    /// Tainted [`OUT_OF_SERVICE_TAINT`] (any effect, any value).
    pub out_of_service: bool,
}

impl NodeState {
    /// Fenced: out of service and not `Ready`, as the pod garbage collector's `gcTerminating`
    /// requires (`!IsNodeReady(node) && TaintKeyExists(taints, out-of-service)`).
    pub fn fenced(self) -> bool {
        self.out_of_service && self.readiness != Readiness::Ready
    }
}

/// The `Ready` condition of `node`, read ([`Readiness`]).
pub fn readiness(node: &Node) -> Readiness {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "Unknown" => Readiness::Silent,
        Some(c) if c.status == "True" => Readiness::Ready,
        _ => Readiness::Heard,
    }
}

/// `node` read ([`NodeState`]).
pub fn read_node(node: &Node) -> NodeState {
    let out_of_service = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT));
    NodeState {
        readiness: readiness(node),
        out_of_service,
    }
}

/// Since when each silent node has been seen silent, on this reconciler's clock; which nodes
/// are fenced; which were deleted, and when.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeHealth {
    silent_since: BTreeMap<String, Instant>,
    fenced: BTreeSet<String>,
    deleted: BTreeMap<String, Instant>,
    /// Every node seen since the last relist began (a relist that misses one: it was deleted).
    known: BTreeSet<String>,
}

impl NodeHealth {
    /// One observation of a node at `now`. Returns whether the sets of silent, fenced or
    /// deleted nodes changed.
    pub fn observe(&mut self, name: &str, state: NodeState, now: Instant) -> bool {
        self.known.insert(name.to_owned());
        let mut changed = self.deleted.remove(name).is_some();
        changed |= if state.fenced() {
            self.fenced.insert(name.to_owned())
        } else {
            self.fenced.remove(name)
        };
        changed
            | match state.readiness {
                Readiness::Ready | Readiness::Heard => self.silent_since.remove(name).is_some(),
                Readiness::Silent => {
                    if self.silent_since.contains_key(name) {
                        false
                    } else {
                        self.silent_since.insert(name.to_owned(), now);
                        true
                    }
                }
            }
    }

    /// The node was deleted (its Node object gone): fenced, as Kubernetes takes it (the pod
    /// garbage collector force-deletes the pods of a node that no longer exists).
    pub fn delete(&mut self, name: &str, now: Instant) -> bool {
        self.silent_since.remove(name);
        self.fenced.remove(name);
        self.known.remove(name);
        self.deleted.insert(name.to_owned(), now).is_none()
    }

    /// A relist: the nodes known before and not in `seen` were deleted meanwhile.
    pub fn retain(&mut self, seen: &BTreeSet<String>, now: Instant) {
        let gone: Vec<String> = self.known.difference(seen).cloned().collect();
        for name in gone {
            self.delete(&name, now);
        }
        self.silent_since.retain(|name, _| seen.contains(name));
        self.fenced.retain(|name| seen.contains(name));
    }

    /// Forgets the nodes deleted longer than [`DELETED_MEMORY`] ago.
    pub fn prune(&mut self, now: Instant) {
        self.deleted
            .retain(|_, at| now.saturating_duration_since(*at) < DELETED_MEMORY);
    }

    /// The nodes taken for lost at `now` under `policy`.
    pub fn lost(&self, now: Instant, policy: NodeLost) -> BTreeSet<String> {
        if policy == NodeLost::Off {
            return BTreeSet::new();
        }
        let mut lost: BTreeSet<String> = self
            .fenced
            .iter()
            .chain(self.deleted.keys())
            .cloned()
            .collect();
        if let Some(grace) = policy.grace() {
            lost.extend(
                self.silent_since
                    .iter()
                    .filter(|(_, since)| now.saturating_duration_since(**since) >= grace)
                    .map(|(name, _)| name.clone()),
            );
        }
        lost
    }

    /// How long until the next silent node that is not lost yet becomes lost (`None`: none, or
    /// no grace in `policy`).
    pub fn next_due(&self, now: Instant, policy: NodeLost) -> Option<Duration> {
        let grace = policy.grace()?;
        self.silent_since
            .values()
            .map(|since| grace.saturating_sub(now.saturating_duration_since(*since)))
            .filter(|left| !left.is_zero())
            .min()
    }

    /// How many nodes are silent now.
    pub fn silent(&self) -> usize {
        self.silent_since.len()
    }
}
/// The pods to fail: counted ones (neither failed nor terminating) bound to a lost node.
pub fn lost_pods(pods: &[PodView], lost: &BTreeSet<String>) -> Vec<AloneAgent> {
    pods.iter()
        .filter(|p| !p.failed && !p.terminating && !p.node.is_empty() && lost.contains(&p.node))
        .map(|p| AloneAgent {
            pod: p.name.clone(),
            uid: p.uid.clone(),
            node: p.node.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};

    fn node(conditions: Option<Vec<(&str, &str)>>) -> Node {
        Node {
            status: Some(NodeStatus {
                conditions: conditions.map(|cs| {
                    cs.into_iter()
                        .map(|(t, s)| NodeCondition {
                            type_: t.to_owned(),
                            status: s.to_owned(),
                            ..NodeCondition::default()
                        })
                        .collect()
                }),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    fn silent() -> NodeState {
        NodeState {
            readiness: Readiness::Silent,
            out_of_service: false,
        }
    }

    fn ready() -> NodeState {
        NodeState {
            readiness: Readiness::Ready,
            out_of_service: false,
        }
    }

    const FORCE_10S: NodeLost = NodeLost::ForceAfterGrace(Duration::from_secs(10));

    #[test]
    fn only_an_unknown_ready_condition_is_silence() {
        let cases = [
            (Some(vec![("Ready", "Unknown")]), Readiness::Silent),
            (
                Some(vec![("MemoryPressure", "Unknown"), ("Ready", "Unknown")]),
                Readiness::Silent,
            ),
            (Some(vec![("Ready", "True")]), Readiness::Ready),
            (Some(vec![("Ready", "False")]), Readiness::Heard),
            (Some(vec![("Ready", "unknown")]), Readiness::Heard),
            (Some(vec![("MemoryPressure", "Unknown")]), Readiness::Heard),
            (Some(vec![]), Readiness::Heard),
            (None, Readiness::Heard),
        ];
        for (conditions, want) in cases {
            assert_eq!(readiness(&node(conditions.clone())), want, "{conditions:?}");
        }
        assert_eq!(readiness(&Node::default()), Readiness::Heard);
    }

    /// Fenced as the pod garbage collector's `gcTerminating` takes it: the out-of-service taint
    /// (any effect or value) on a node whose `Ready` is not `True`.
    #[test]
    fn a_node_is_fenced_by_the_out_of_service_taint_while_not_ready() {
        use k8s_openapi::api::core::v1::{NodeSpec, Taint};
        let tainted = |key: &str, effect: &str, ready: &str| {
            let mut n = node(Some(vec![("Ready", ready)]));
            n.spec = Some(NodeSpec {
                taints: Some(vec![Taint {
                    key: key.to_owned(),
                    effect: effect.to_owned(),
                    value: Some("nodeshutdown".to_owned()),
                    ..Taint::default()
                }]),
                ..NodeSpec::default()
            });
            read_node(&n)
        };
        for effect in ["NoExecute", "NoSchedule"] {
            assert!(tainted(OUT_OF_SERVICE_TAINT, effect, "Unknown").fenced());
            assert!(tainted(OUT_OF_SERVICE_TAINT, effect, "False").fenced());
            assert!(!tainted(OUT_OF_SERVICE_TAINT, effect, "True").fenced());
            assert!(!tainted("node.kubernetes.io/unreachable", effect, "Unknown").fenced());
        }
        assert!(!read_node(&node(Some(vec![("Ready", "Unknown")]))).fenced());
        assert!(!read_node(&Node::default()).fenced());
    }

    #[test]
    fn a_node_is_lost_after_the_grace_counted_from_the_first_silence_seen() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(10);
        let mut h = NodeHealth::default();
        assert!(h.observe("a", silent(), t0));
        // Seen silent again later: the clock keeps its start.
        assert!(!h.observe("a", silent(), t0 + Duration::from_secs(5)));
        assert!(h.lost(t0 + Duration::from_secs(9), FORCE_10S).is_empty());
        assert_eq!(
            h.next_due(t0 + Duration::from_secs(9), FORCE_10S),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            h.lost(t0 + grace, FORCE_10S),
            BTreeSet::from(["a".to_owned()])
        );
        assert_eq!(h.next_due(t0 + grace, FORCE_10S), None);
        // Heard again: not lost, and a new silence starts a new clock.
        assert!(h.observe("a", ready(), t0 + Duration::from_secs(11)));
        assert!(h.lost(t0 + Duration::from_secs(20), FORCE_10S).is_empty());
        assert!(!h.observe("a", ready(), t0 + Duration::from_secs(12)));
        h.observe("a", silent(), t0 + Duration::from_secs(15));
        assert!(h.lost(t0 + Duration::from_secs(24), FORCE_10S).is_empty());
        assert_eq!(h.lost(t0 + Duration::from_secs(25), FORCE_10S).len(), 1);
    }

    /// The fenced default never takes a node for lost on silence alone, however long; only a
    /// deletion or the out-of-service taint; `off` takes none.
    #[test]
    fn the_fenced_default_waits_for_a_fence_however_long_a_node_is_silent() {
        let t0 = Instant::now();
        let mut h = NodeHealth::default();
        h.observe("a", silent(), t0);
        let day = t0 + Duration::from_secs(86_400);
        assert!(h.lost(day, NodeLost::Fenced).is_empty());
        assert_eq!(h.next_due(t0, NodeLost::Fenced), None);
        assert_eq!(h.lost(day, FORCE_10S).len(), 1);
        // The operator's taint: lost at once, in every mode but off.
        let fenced = NodeState {
            readiness: Readiness::Silent,
            out_of_service: true,
        };
        assert!(h.observe("a", fenced, day));
        assert_eq!(
            h.lost(day, NodeLost::Fenced),
            BTreeSet::from(["a".to_owned()])
        );
        assert_eq!(h.lost(day, FORCE_10S).len(), 1);
        assert!(h.lost(day, NodeLost::Off).is_empty());
        // The taint removed (the node repaired): no longer fenced.
        assert!(h.observe("a", silent(), day));
        assert!(h.lost(day, NodeLost::Fenced).is_empty());
        // A Ready node with the taint is not fenced (the pod GC's rule too).
        let tainted_ready = NodeState {
            readiness: Readiness::Ready,
            out_of_service: true,
        };
        h.observe("b", tainted_ready, t0);
        assert!(h.lost(day, NodeLost::Fenced).is_empty());
    }

    #[test]
    fn deleted_nodes_are_lost_until_forgotten_and_a_relist_finds_the_missing() {
        let t0 = Instant::now();
        let mut h = NodeHealth::default();
        h.observe("a", silent(), t0);
        h.observe("b", silent(), t0);
        h.observe("c", ready(), t0);
        h.observe("d", ready(), t0);
        assert!(h.delete("a", t0));
        assert!(!h.delete("a", t0));
        assert_eq!(
            h.lost(t0, NodeLost::Fenced),
            BTreeSet::from(["a".to_owned()])
        );
        // A relist without c (deleted while the watch was down): lost as well; d still there.
        h.retain(
            &BTreeSet::from(["b".to_owned(), "d".to_owned()]),
            t0 + Duration::from_secs(1),
        );
        assert_eq!(
            h.lost(t0, NodeLost::Fenced),
            BTreeSet::from(["a".to_owned(), "c".to_owned()])
        );
        assert_eq!(h.silent(), 1);
        // A node of the same name registers again: its own kubelet speaks for it.
        assert!(h.observe("c", ready(), t0 + Duration::from_secs(2)));
        assert_eq!(
            h.lost(t0, NodeLost::Fenced),
            BTreeSet::from(["a".to_owned()])
        );
        // Forgotten after DELETED_MEMORY.
        h.prune(t0 + DELETED_MEMORY - Duration::from_secs(1));
        assert_eq!(h.lost(t0, NodeLost::Fenced).len(), 1);
        h.prune(t0 + DELETED_MEMORY);
        assert!(h.lost(t0, NodeLost::Fenced).is_empty());
        assert_eq!(h.lost(t0, NodeLost::Off), BTreeSet::new());
    }

    /// Every combination of `--node-lost` and `--node-lost-grace`.
    #[test]
    fn the_flags_resolve_to_one_mode_and_contradictions_are_refused() {
        use NodeLostMode as M;
        let s = Duration::from_secs;
        let ok = |m, g| resolve_node_lost(m, g).expect("resolves");
        assert_eq!(ok(None, None), NodeLost::Fenced);
        assert_eq!(ok(Some(M::Fenced), None), NodeLost::Fenced);
        // Before the modes, the grace alone was the force-deletion's, and 0 turned it off.
        assert_eq!(ok(None, Some(s(2))), NodeLost::ForceAfterGrace(s(2)));
        assert_eq!(ok(None, Some(s(0))), NodeLost::Off);
        assert_eq!(ok(Some(M::Off), None), NodeLost::Off);
        assert_eq!(ok(Some(M::Off), Some(s(0))), NodeLost::Off);
        assert_eq!(
            ok(Some(M::ForceAfterGrace), None),
            NodeLost::ForceAfterGrace(DEFAULT_FORCE_GRACE)
        );
        assert_eq!(
            ok(Some(M::ForceAfterGrace), Some(s(5))),
            NodeLost::ForceAfterGrace(s(5))
        );
        for (m, g) in [
            (M::ForceAfterGrace, s(0)),
            (M::Fenced, s(5)),
            (M::Fenced, s(0)),
            (M::Off, s(5)),
        ] {
            assert!(resolve_node_lost(Some(m), Some(g)).is_err(), "{m:?} {g:?}");
        }
        assert!(NodeLost::Fenced.watches() && !NodeLost::Off.watches());
        assert_eq!(NodeLost::Fenced.grace(), None);
        assert!(NodeLost::ForceAfterGrace(s(30)).describe().contains("30s"));
    }

    fn pod(name: &str, node: &str, failed: bool, terminating: bool) -> PodView {
        PodView {
            name: name.to_owned(),
            uid: format!("uid-{name}"),
            failed,
            terminating,
            epoch_annotation: Some("1".to_owned()),
            max_restart_count: 0,
            counted_in_last_sync: false,
            old_workers: crate::protocol::OldWorkers::No,
            node: node.to_owned(),
            restart_begun: false,
        }
    }

    /// Every combination of a pod's state and node: only counted pods on a lost node are failed.
    #[test]
    fn only_counted_pods_on_a_lost_node_are_failed() {
        let lost = BTreeSet::from(["gone".to_owned()]);
        for node in ["gone", "alive", ""] {
            for failed in [false, true] {
                for terminating in [false, true] {
                    let pods = [pod("p", node, failed, terminating)];
                    let got = lost_pods(&pods, &lost);
                    let want = node == "gone" && !failed && !terminating;
                    assert_eq!(!got.is_empty(), want, "{node} {failed} {terminating}");
                    if want {
                        assert_eq!(
                            got,
                            vec![AloneAgent {
                                pod: "p".to_owned(),
                                uid: "uid-p".to_owned(),
                                node: "gone".to_owned()
                            }]
                        );
                    }
                }
            }
        }
        assert!(lost_pods(&[pod("p", "gone", false, false)], &BTreeSet::new()).is_empty());
    }
}
