//! Lost nodes (docs/protocol.md, "A node lost"): a node whose kubelet has gone silent (its
//! `Ready` condition `Unknown`, as the node lifecycle controller writes it once the node's lease
//! is not renewed within its `--node-monitor-grace-period`) for longer than the reconciler's
//! `--node-lost-grace` is taken for lost, and the pods of InPlaceRestart JobSets bound to it are
//! failed and deleted (the controller's `lost` room), so that their Jobs replace them; the
//! replacements register the next epoch and the others restart in place, as after any pod's
//! replacement.
//!
//! Pure: [`NodeHealth`] keeps, per node, since when this reconciler has seen it silent (its own
//! clock, never the node's or the API server's times: a clock skew can only make it wait longer,
//! and a new reconciler starts counting afresh); [`readiness`] reads a Node; [`lost_pods`] picks
//! the pods to fail. `False` (the kubelet itself reports the node not ready) is not silence: that
//! kubelet is alive and ends its pods itself.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;

use crate::protocol::{AloneAgent, PodView};

/// What a Node's `Ready` condition says of its kubelet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// `Unknown`: the kubelet has not been heard from within the node controller's grace.
    Silent,
    /// `True`, `False`, absent (a node still registering), or anything else: the kubelet speaks
    /// for itself, or nothing says it is gone.
    Heard,
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
        _ => Readiness::Heard,
    }
}

/// Since when each silent node has been seen silent, on this reconciler's clock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeHealth {
    silent_since: BTreeMap<String, Instant>,
}

impl NodeHealth {
    /// One observation of a node at `now`. Returns whether the set of silent nodes changed.
    pub fn observe(&mut self, name: &str, readiness: Readiness, now: Instant) -> bool {
        match readiness {
            Readiness::Heard => self.silent_since.remove(name).is_some(),
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

    /// The node was deleted: nothing is known of it any longer (its pods are the pod garbage
    /// collector's then).
    pub fn forget(&mut self, name: &str) -> bool {
        self.silent_since.remove(name).is_some()
    }

    /// A relist: the nodes not in `seen` are gone.
    pub fn retain(&mut self, seen: &BTreeSet<String>) {
        self.silent_since.retain(|name, _| seen.contains(name));
    }

    /// The nodes silent for at least `grace` at `now`.
    pub fn lost(&self, now: Instant, grace: Duration) -> BTreeSet<String> {
        self.silent_since
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) >= grace)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// How long until the next silent node that is not lost yet becomes lost (`None`: none).
    pub fn next_due(&self, now: Instant, grace: Duration) -> Option<Duration> {
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

    #[test]
    fn only_an_unknown_ready_condition_is_silence() {
        let cases = [
            (Some(vec![("Ready", "Unknown")]), Readiness::Silent),
            (
                Some(vec![("MemoryPressure", "Unknown"), ("Ready", "Unknown")]),
                Readiness::Silent,
            ),
            (Some(vec![("Ready", "True")]), Readiness::Heard),
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

    #[test]
    fn a_node_is_lost_after_the_grace_counted_from_the_first_silence_seen() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(10);
        let mut h = NodeHealth::default();
        assert!(h.observe("a", Readiness::Silent, t0));
        // Seen silent again later: the clock keeps its start.
        assert!(!h.observe("a", Readiness::Silent, t0 + Duration::from_secs(5)));
        assert!(h.lost(t0 + Duration::from_secs(9), grace).is_empty());
        assert_eq!(
            h.next_due(t0 + Duration::from_secs(9), grace),
            Some(Duration::from_secs(1))
        );
        assert_eq!(h.lost(t0 + grace, grace), BTreeSet::from(["a".to_owned()]));
        assert_eq!(h.next_due(t0 + grace, grace), None);
        // Heard again: not lost, and a new silence starts a new clock.
        assert!(h.observe("a", Readiness::Heard, t0 + Duration::from_secs(11)));
        assert!(h.lost(t0 + Duration::from_secs(20), grace).is_empty());
        assert!(!h.observe("a", Readiness::Heard, t0 + Duration::from_secs(12)));
        h.observe("a", Readiness::Silent, t0 + Duration::from_secs(15));
        assert!(h.lost(t0 + Duration::from_secs(24), grace).is_empty());
        assert_eq!(h.lost(t0 + Duration::from_secs(25), grace).len(), 1);
        // A zero grace: lost as soon as seen silent.
        let mut z = NodeHealth::default();
        z.observe("b", Readiness::Silent, t0);
        assert_eq!(z.lost(t0, Duration::ZERO).len(), 1);
    }

    #[test]
    fn deleted_and_unlisted_nodes_are_forgotten() {
        let t0 = Instant::now();
        let mut h = NodeHealth::default();
        h.observe("a", Readiness::Silent, t0);
        h.observe("b", Readiness::Silent, t0);
        h.observe("c", Readiness::Silent, t0);
        assert!(h.forget("a"));
        assert!(!h.forget("a"));
        h.retain(&BTreeSet::from(["b".to_owned()]));
        assert_eq!(h.silent(), 1);
        assert_eq!(h.lost(t0, Duration::ZERO), BTreeSet::from(["b".to_owned()]));
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
            job_leaving: false,
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
