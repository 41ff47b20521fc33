//! The in-repo test API server, driven by the real `kube` client, watcher, reflector and
//! lease manager. Every test bounds its own time.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use jobset_inplace::jobset::JobSet;
use jobset_inplace_testkit::apiserver::{Options, TestApiServer, Verb};
use jobset_inplace_testkit::build;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::{Value, json};

async fn within<T>(secs: u64, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {secs} s"),
    }
}

/// The HTTP status and reason of a failed kube call.
fn api_err<T: Debug>(r: kube::Result<T>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The pod these tests store: one container `main` running busybox, in `ns`, with `labels`.
fn busybox(name: &str, ns: &str, labels: serde_json::Value) -> build::Pod {
    build::Pod::new(name)
        .namespace(ns)
        .labels(labels)
        .container("main", "busybox")
}

fn names<K: kube::ResourceExt>(items: &[K]) -> Vec<String> {
    items.iter().map(|o| o.name_any()).collect()
}

/// A plain HTTP client for raw requests (reqwest here needs a process-wide crypto provider).
fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

type WatcherItem = Result<watcher::Event<Pod>, watcher::Error>;

/// Polls a watcher stream from a task (a watcher only watches while polled) and forwards it.
fn drive(
    stream: impl futures::Stream<Item = WatcherItem> + Send + 'static,
) -> tokio::sync::mpsc::UnboundedReceiver<WatcherItem> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if tx.send(item).is_err() {
                break;
            }
        }
    });
    rx
}

type MetaItem = Result<watcher::Event<kube::core::PartialObjectMeta<Pod>>, watcher::Error>;

fn drive_meta(
    stream: impl futures::Stream<Item = MetaItem> + Send + 'static,
) -> tokio::sync::mpsc::UnboundedReceiver<MetaItem> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if tx.send(item).is_err() {
                break;
            }
        }
    });
    rx
}

async fn wait_for_watches(server: &TestApiServer, n: usize) {
    while server.watch_count() != n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

mod faults;
mod objects;
mod serving;
mod watches;
mod writes;
