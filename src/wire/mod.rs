//! The wire contract: what crosses between the components through Kubernetes objects and a
//! pod's environment rather than through calls. The webhook writes it into pod templates, the
//! agent and the reconciler read it back; keeping it at the bottom of the crate lets each of them
//! depend on it and none on another. See docs/architecture.md ("Layers").
//!
//! - [`agent_env`]: the agent container's name, env variables and built-in defaults;
//! - [`pod`]: [`WatchedPod`], a pod reduced to what the epoch protocol reads;
//! - [`epochs`]: [`epochs::JobSetEpoch`], the per-JobSet copy of the two epochs its agents watch;
//! - [`jobset_crd`]: which dialect the installed JobSet CRD speaks (the cluster decides it).
//!
//! The JobSet side of the contract (the full model and the agent's summary) is [`crate::jobset`];
//! the annotations, labels and status fields are [`crate::protocol`].

pub mod agent_env;
pub mod epochs;
pub mod jobset_crd;
pub mod pod;

pub use pod::WatchedPod;
