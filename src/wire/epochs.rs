//! `JobSetEpoch`: the two epochs of one JobSet, for its agents (docs/protocol.md, "How agents
//! learn the epochs").
//!
//! The JobSet's status stays the protocol's source of truth, but every write to a JobSet (JobSet's
//! own controller rewrites its status many times during a group restart) would reach every agent
//! watching it, pod templates included. The reconciler leader therefore copies the two epochs into
//! this small object, named like the JobSet, in its namespace and owned by it, and writes it only
//! when an epoch moves: each agent then receives a few hundred bytes per epoch change, whatever
//! else writes the JobSet and however large it is.
//!
//! The reconciler publishes each decision here before it writes it to the status, so that what
//! agents read never lags the status (docs/protocol.md says why that order matters), and copies
//! whatever else the status holds. Each field only grows ([`publish`], pure): a wipe of the
//! status never reaches it. Where another controller decides the epochs, the object only tells
//! agents to watch the JobSet ([`Epochs::watch_job_set`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::protocol::{AgentView, Epoch, EpochStatus};

pub const GROUP: &str = "jobset-inplace.dev";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "jobset-inplace.dev/v1alpha1";
pub const KIND: &str = "JobSetEpoch";
pub const PLURAL: &str = "jobsetepochs";
/// The CRD's name (`<plural>.<group>`).
pub const CRD_NAME: &str = "jobsetepochs.jobset-inplace.dev";
/// The field manager of the reconciler's server-side applies of this object.
pub const FIELD_MANAGER: &str = "jobset-inplace-reconciler";

/// One JobSet's epochs, as its agents read them. Read leniently: a field of an unexpected type
/// reads as absent rather than failing the whole event.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct JobSetEpoch {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "lenient")]
    pub epochs: Option<Epochs>,
}

/// The content the reconciler publishes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Epochs {
    /// The JobSet's deprecated epoch: agents at or below it restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<Epoch>,
    /// The JobSet's synced epoch: agents at it lift their barrier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced: Option<Epoch>,
    /// The JobSet does not use the protocol (any more): not `InPlaceRestart`, or in-place restart
    /// disabled by its annotation. Agents lift their barrier at once.
    #[serde(default)]
    pub bypass: bool,
    /// Another controller (JobSet's own) decides the epochs: agents watch the JobSet itself. A
    /// copy made after the fact would lag the decisions, and a new pod reading a lagging synced
    /// epoch could register an epoch synced without it.
    #[serde(default)]
    pub watch_job_set: bool,
}

fn lenient<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Epochs>, D::Error> {
    let value = Value::deserialize(d)?;
    Ok(serde_json::from_value(value).ok())
}

crate::jobset::namespaced_resource!(JobSetEpoch, KIND, GROUP, VERSION, API_VERSION, PLURAL);

impl JobSetEpoch {
    /// The UID of the JobSet that owns it (its controller owner reference), if any.
    pub fn owner_uid(&self) -> Option<&str> {
        self.metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.as_str())
    }

    /// The epochs are decided elsewhere: agents must watch the JobSet ([`Epochs::watch_job_set`]).
    pub fn delegates(&self) -> bool {
        self.epochs.is_some_and(|e| e.watch_job_set)
    }

    /// What an agent decides on ([`crate::protocol::agent_decide`]).
    pub fn agent_view(&self) -> AgentView {
        let epochs = self.epochs.unwrap_or_default();
        AgentView {
            in_place_restart: !epochs.bypass,
            disabled: false,
            status: EpochStatus {
                deprecated: epochs.deprecated,
                synced: epochs.synced,
            },
        }
    }
}

/// What the reconciler knows of one JobSet when it publishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source<'a> {
    pub uid: &'a str,
    /// The JobSet's epoch fields, as last written or read.
    pub status: EpochStatus,
    /// The agents must not wait (see [`Epochs::bypass`]).
    pub bypass: bool,
    /// Another controller decides the epochs (see [`Epochs::watch_job_set`]).
    pub delegate: bool,
}

/// The content to publish for a JobSet, given what is published now (`current`: the object's
/// owner UID and content, `None` when there is none), or `None` when nothing needs writing.
///
/// Each epoch is the maximum of the published one and the status's, so a status wiped or read
/// stale never moves the object backwards; an object owned by another JobSet of the same name (a
/// JobSet deleted and created again before the garbage collector removed it) is replaced.
pub fn publish(current: Option<(Option<&str>, Epochs)>, source: &Source<'_>) -> Option<Epochs> {
    let kept = match current {
        Some((Some(owner), epochs)) if owner == source.uid => Some(epochs),
        _ => None,
    };
    let max = |a: Option<Epoch>, b: Option<Epoch>| a.max(b);
    let next = Epochs {
        deprecated: max(kept.and_then(|k| k.deprecated), source.status.deprecated),
        synced: max(kept.and_then(|k| k.synced), source.status.synced),
        bypass: source.bypass,
        watch_job_set: source.delegate,
    };
    (kept != Some(next)).then_some(next)
}

/// The server-side apply body of a JobSet's object: its name, its owner (the JobSet, as
/// controller, not blocking the JobSet's deletion), the JobSet's UID again as `jobSetUID` (the
/// CRD's CEL rule lets the epochs start over only when it changes: its own rules cannot read
/// `metadata.ownerReferences`) and its epochs.
pub fn apply_body(namespace: &str, jobset: &str, uid: &str, epochs: &Epochs) -> Value {
    let owner = OwnerReference {
        api_version: crate::jobset::API_VERSION.to_owned(),
        kind: crate::jobset::KIND.to_owned(),
        name: jobset.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(false),
    };
    json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": jobset,
            "namespace": namespace,
            "labels": {crate::protocol::JOBSET_NAME_LABEL: jobset},
            "ownerReferences": [owner],
        },
        "jobSetUID": uid,
        "epochs": epochs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(uid: &str, d: Option<Epoch>, s: Option<Epoch>, bypass: bool) -> Source<'_> {
        Source {
            uid,
            status: EpochStatus {
                deprecated: d,
                synced: s,
            },
            bypass,
            delegate: false,
        }
    }

    fn ep(d: Option<Epoch>, s: Option<Epoch>) -> Epochs {
        Epochs {
            deprecated: d,
            synced: s,
            ..Epochs::default()
        }
    }

    #[test]
    fn delegation_is_published_and_read() {
        let now = ep(Some(1), Some(2));
        let source = Source {
            delegate: true,
            ..src("u", Some(1), Some(2), false)
        };
        let next = publish(Some((Some("u"), now)), &source).expect("a change");
        assert!(next.watch_job_set);
        assert_eq!((next.deprecated, next.synced), (Some(1), Some(2)));
        let obj = JobSetEpoch {
            epochs: Some(next),
            ..Default::default()
        };
        assert!(obj.delegates());
    }

    #[test]
    fn first_publication_copies_the_status() {
        assert_eq!(
            publish(None, &src("u", None, Some(1), false)),
            Some(ep(None, Some(1)))
        );
        // Even an empty status is published: agents learn the object exists.
        assert_eq!(
            publish(None, &src("u", None, None, false)),
            Some(ep(None, None))
        );
    }

    #[test]
    fn nothing_to_write_when_equal() {
        let now = ep(Some(1), Some(2));
        assert_eq!(
            publish(Some((Some("u"), now)), &src("u", Some(1), Some(2), false)),
            None
        );
    }

    #[test]
    fn never_backwards_whatever_the_status_says() {
        let now = ep(Some(3), Some(4));
        for d in [None, Some(0), Some(2), Some(3)] {
            for s in [None, Some(1), Some(4)] {
                assert_eq!(
                    publish(Some((Some("u"), now)), &src("u", d, s, false)),
                    None,
                    "status {d:?}/{s:?} is at or below what is published"
                );
            }
        }
        assert_eq!(
            publish(Some((Some("u"), now)), &src("u", Some(4), None, false)),
            Some(ep(Some(4), Some(4)))
        );
    }

    #[test]
    fn exhaustive_monotone_and_from_the_status() {
        let values = [None, Some(0), Some(1), Some(2), Some(3)];
        for pd in values {
            for ps in values {
                for sd in values {
                    for ss in values {
                        for bypass in [false, true] {
                            let current = ep(pd, ps);
                            let next =
                                publish(Some((Some("u"), current)), &src("u", sd, ss, bypass))
                                    .unwrap_or(current);
                            assert!(next.deprecated >= pd && next.synced >= ps, "monotone");
                            assert!(
                                next.deprecated == pd || next.deprecated == sd,
                                "a deprecated epoch the status held"
                            );
                            assert!(
                                next.synced == ps || next.synced == ss,
                                "a synced epoch the status held"
                            );
                            assert_eq!(next.bypass, bypass);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn another_owner_is_replaced() {
        let old = ep(Some(7), Some(8));
        assert_eq!(
            publish(Some((Some("old"), old)), &src("new", None, None, false)),
            Some(ep(None, None))
        );
        assert_eq!(
            publish(Some((None, old)), &src("new", None, Some(1), false)),
            Some(ep(None, Some(1))),
            "an object without an owner is not trusted"
        );
    }

    #[test]
    fn bypass_is_published_either_way() {
        let now = ep(Some(1), Some(2));
        let next = publish(Some((Some("u"), now)), &src("u", Some(1), Some(2), true));
        assert_eq!(
            next,
            Some(Epochs {
                bypass: true,
                ..now
            })
        );
        let view = JobSetEpoch {
            epochs: next,
            ..Default::default()
        }
        .agent_view();
        assert!(!view.in_place_restart);
    }

    #[test]
    fn agents_read_leniently() {
        let obj: JobSetEpoch = serde_json::from_value(json!({
            "metadata": {"name": "js", "ownerReferences": [
                {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "js", "uid": "u1", "controller": true}
            ]},
            "epochs": {"deprecated": "three", "synced": 4}
        }))
        .expect("an unexpected type does not fail the object");
        assert_eq!(obj.epochs, None);
        assert_eq!(obj.owner_uid(), Some("u1"));
        let obj: JobSetEpoch = serde_json::from_value(
            json!({"metadata": {}, "epochs": {"deprecated": 3, "synced": 4, "x": 1}}),
        )
        .expect("parses");
        assert_eq!(obj.epochs, Some(ep(Some(3), Some(4))));
        assert_eq!(obj.agent_view().status.synced, Some(4));
    }

    #[test]
    fn the_apply_body_names_its_owner() {
        let body = apply_body("ns", "js", "u1", &ep(Some(1), Some(2)));
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "u1");
        assert_eq!(body["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(
            body["metadata"]["ownerReferences"][0]["blockOwnerDeletion"],
            false
        );
        assert_eq!(
            body["epochs"],
            json!({"deprecated": 1, "synced": 2, "bypass": false, "watchJobSet": false})
        );
        let back: JobSetEpoch = serde_json::from_value(body).expect("reads back");
        assert_eq!(back.owner_uid(), Some("u1"));
    }
}
