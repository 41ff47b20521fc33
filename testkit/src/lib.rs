//! The test kit of jobset-inplace: everything the product's tests, benches and fuzz targets share,
//! kept out of the product crate so that no build of the binary compiles it.
//!
//! - [`apiserver`]: an in-process Kubernetes API server ([`apiserver::TestApiServer`]) that the
//!   real `kube` client, watchers and `kube-lease-manager` run against unmodified, with request
//!   counters and fault injection;
//! - [`kubelet`]: a simulated kubelet and Job/JobSet controllers ([`kubelet::Simulation`]) that
//!   run the real agent and reconciler in every pod of a JobSet, and check the protocol's
//!   invariant throughout. It recognises agents as Kubernetes would see them (container lists,
//!   names, env, restart rules), never through the product's admission code;
//! - [`node`]: a kubelet for any API server (only a `kube::Client`): it registers a `Node`, binds
//!   and runs a namespace's pods with the real agent binary, as `tests/real_cluster/` needs;
//! - [`build`]: builders of the JobSets, pods and Jobs tests write (no test makes its own);
//! - [`cluster`]: what the tests against a real control plane share (polling, namespaces and
//!   objects deleted on drop, Kueue's queues);
//! - [`fixtures`]: the repository's fixtures (`fixtures/`) as tests read them;
//! - [`oracle`]: a second, independent way to compute an answer the product computes (admission
//!   through a `Value`), for equivalence tests and fuzzing;
//! - [`generators`]: data shared by property tests, fuzz targets and benches;
//! - [`reconciler`]: the options of a reconciler started in-process;
//! - [`webhook_harness`]: a webhook in-process or as a child process, and a TLS client for it.
//!
//! See docs/architecture.md ("Test kit").
#![forbid(unsafe_code)]

pub mod apiserver;
pub mod build;
pub mod cluster;
pub mod fixtures;
pub mod generators;
pub mod kubelet;
pub mod node;
pub mod oracle;
pub mod process;
pub mod reconciler;
pub mod webhook_harness;
