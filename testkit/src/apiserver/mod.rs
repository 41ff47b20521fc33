//! An in-process Kubernetes API server for tests (docs/architecture.md, "Test kit").
//!
//! [`TestApiServer`] speaks the Kubernetes REST and watch protocol over plain HTTP on loopback,
//! so the real `kube` client, `kube::runtime::watcher`, reflectors and `kube-lease-manager` run
//! against it unmodified. Objects are stored as [`serde_json::Value`], never as typed structs, so
//! no field is lost.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use jobset_inplace_testkit::apiserver::{TestApiServer, Verb};
//! use k8s_openapi::api::core::v1::Pod;
//! use kube::api::{Api, ListParams};
//!
//! let server = TestApiServer::start().await;
//! server.create("pods", serde_json::json!({
//!     "metadata": {"name": "p0", "namespace": "ns", "labels": {"app": "x"}},
//!     "spec": {"containers": [{"name": "c", "image": "i"}]},
//! }))?;
//! let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
//! let list = pods.list(&ListParams::default().labels("app=x")).await?;
//! assert_eq!(list.items.len(), 1);
//! assert_eq!(server.counters().get(Verb::List, "pods"), 1);
//! server.fail_next(1, Verb::Patch, "pods", 500); // the next pod PATCH answers 500
//! server.cut_watches();                           // every open watch stream is dropped
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! What it does (see the submodules for details):
//! - resources: pods (with `status`), jobsets and jobs (with `status`), jobsetepochs, events (core/v1 and
//!   events.k8s.io/v1), leases, serviceaccounts, rolebindings, namespaces and
//!   customresourcedefinitions by default ([`resources::default_resources`]); more can be
//!   registered through [`Options::resources`]; cluster-wide list/watch of namespaced ones;
//!   discovery (`/api`, `/apis`, `/api/v1`, `/apis/{g}/{v}`, aggregated discovery, `/version`);
//! - GET, LIST (label and field selectors, `limit`/`continue` consistent at the first page's
//!   resourceVersion, `resourceVersionMatch=Exact` served from the history), WATCH (resume from a
//!   resourceVersion, synthetic ADDED from `"0"`/absent (from a lagging watch cache if told,
//!   [`TestApiServer::lag_watch_cache`]), bookmarks, `timeoutSeconds`, `sendInitialEvents` with
//!   upstream's option validation and its `WatchList` gate ([`TestApiServer::set_watch_list`]), selector transitions as ADDED/DELETED, an ERROR 410 event for a
//!   version older than the history), CREATE (`generateName`), UPDATE (resourceVersion
//!   precondition), PATCH (merge, JSON, strategic as merge, server-side apply approximated),
//!   DELETE (finalizers, preconditions, optional graceful pod deletion, foreground propagation
//!   as the `foregroundDeletion` finalizer), deletecollection, the
//!   `status` subresource, `dryRun=All`;
//! - one resourceVersion counter for all resources, uids, `creationTimestamp`, `generation`;
//! - as the real server: JobSet and JobSetEpoch writes pruned and validated against their CRD
//!   schemas (a 422 naming each field, [`schema`]), pods given the real server's defaults
//!   (`restartPolicy`, `serviceAccountName`, `imagePullPolicy`, ...), a DELETE that removes an
//!   object answered with a `Status` (pods, service accounts and namespaces: the object);
//! - request counters by verb and resource, and fault injection: failures, latency, cut
//!   watches, history compaction; and a seeded chaos mode drawing 500s, 409s, 429s with
//!   `Retry-After`, lost write responses, latency spikes and watch cuts at random
//!   ([`chaos`]).
//!
//! Not supported: protobuf, table output, `PartialObjectMetadata` conversion (full objects are
//! returned), field ownership in `managedFields`, strategic-merge list merging (lists are
//! replaced), admission, validation beyond names, types and the CRD schemas, namespace
//! lifecycle (objects may be created in any namespace; deleting a namespace does not delete its
//! contents), garbage collection by owner references, and storage shared between core/v1 and
//! events.k8s.io/v1 events (they are separate stores here).

pub mod chaos;
mod defaults;
pub mod error;
pub mod faults;
mod http;
pub mod patch;
pub mod resources;
pub mod schema;
pub mod selector;
pub mod store;
mod watch;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::serve::ListenerExt as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use chaos::{Chaos, ChaosStats, EXEMPT_HEADER};
pub use error::ApiError;
pub use faults::{Counters, FaultRule, Matcher, Verb};

pub use patch::PatchType;
pub use resources::{Registry, ResourceType, default_resources};
pub use store::{Store, StoreOptions};

/// How to start a [`TestApiServer`].
#[derive(Clone, Debug)]
pub struct Options {
    /// The resources served (default: [`default_resources`]).
    pub resources: Vec<ResourceType>,
    /// Changes kept for resuming watches and consistent lists (default 10,000); older
    /// resourceVersions answer 410.
    pub history_capacity: usize,
    /// Events buffered per watcher (default 10,000); a watcher that falls further behind is
    /// closed, and its client re-watches, as with a real API server.
    pub watcher_buffer: usize,
    /// Interval of BOOKMARK events on watches that allow them (default 1 s).
    pub bookmark_interval: Duration,
    /// DELETE of a pod bound to a node (`spec.nodeName`) only sets `deletionTimestamp` with its
    /// grace period, as upstream does until the kubelet deletes it with grace period 0
    /// (default false: pods are deleted at once unless they have finalizers).
    pub graceful_pod_deletion: bool,
}

impl Default for Options {
    fn default() -> Self {
        let store = StoreOptions::default();
        Options {
            resources: default_resources(),
            history_capacity: store.history_capacity,
            watcher_buffer: store.watcher_buffer,
            bookmark_interval: Duration::from_secs(1),
            graceful_pod_deletion: store.graceful_pod_deletion,
        }
    }
}

/// State shared by the HTTP handlers, the watch streams and the [`TestApiServer`] handle.
pub(crate) struct Shared {
    registry: Arc<Registry>,
    store: Mutex<Store>,
    faults: Mutex<faults::Faults>,
    chaos: Mutex<Option<chaos::ChaosState>>,
    counters: Mutex<Counters>,
    /// What watches delivered, per resource ([`ResId`] order).
    delivered: Vec<DeliveryCounter>,
    bookmark_period: Mutex<Duration>,
    /// kube-apiserver's `WatchList` feature gate (streaming lists; on by default since 1.34).
    watch_list: AtomicBool,
    /// Where the watch cache lags, if it does ([`TestApiServer::lag_watch_cache`]).
    watch_cache_lag: Mutex<Option<u64>>,
    shutting_down: AtomicBool,
    writes: Mutex<Vec<WriteRecord>>,
}

/// What the watches of one resource delivered ([`TestApiServer::deliveries`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delivered {
    pub events: u64,
    pub bookmarks: u64,
    /// Bytes of the events (`ERROR` included, bookmarks not).
    pub bytes: u64,
    /// Bytes of the bookmarks.
    pub bookmark_bytes: u64,
}

#[derive(Debug, Default)]
pub(crate) struct DeliveryCounter {
    events: std::sync::atomic::AtomicU64,
    bookmarks: std::sync::atomic::AtomicU64,
    bytes: std::sync::atomic::AtomicU64,
    bookmark_bytes: std::sync::atomic::AtomicU64,
}

impl DeliveryCounter {
    pub(crate) fn count(&self, bytes: usize, bookmark: bool) {
        let (n, b) = if bookmark {
            (&self.bookmarks, &self.bookmark_bytes)
        } else {
            (&self.events, &self.bytes)
        };
        n.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn reset(&self) {
        self.events.store(0, Ordering::Relaxed);
        self.bookmarks.store(0, Ordering::Relaxed);
        self.bytes.store(0, Ordering::Relaxed);
        self.bookmark_bytes.store(0, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Delivered {
        Delivered {
            events: self.events.load(Ordering::Relaxed),
            bookmarks: self.bookmarks.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            bookmark_bytes: self.bookmark_bytes.load(Ordering::Relaxed),
        }
    }
}

impl Shared {
    pub(crate) fn delivered(&self, res: resources::ResId, bytes: usize, bookmark: bool) {
        if let Some(d) = self.delivered.get(res) {
            d.count(bytes, bookmark);
        }
    }
}

/// The header that names a client ([`TestApiServer::client_named`]) in the write log and in
/// per-client faults.
pub const CLIENT_HEADER: &str = "x-jobset-inplace-test-client";

/// One write the server applied, in the order applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteRecord {
    /// The client's name ([`CLIENT_HEADER`]), if it gave one.
    pub client: Option<String>,
    pub verb: Verb,
    /// As the counters name it (`jobsets/status`, `leases`, ...).
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// When it was answered.
    pub at: std::time::Instant,
}

/// The write log keeps this many of the latest writes (a long benchmark writes millions).
const WRITE_LOG_CAPACITY: usize = 100_000;

impl Shared {
    pub(crate) fn record_write(&self, record: WriteRecord) {
        let mut writes = lock(&self.writes);
        if writes.len() >= WRITE_LOG_CAPACITY {
            writes.drain(..WRITE_LOG_CAPACITY / 2);
        }
        writes.push(record);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The locked store. Unlocks before it drops what the store let go of (objects that left the
/// history), so freeing them does not hold up other requests: fields drop in order, the lock
/// first.
pub(crate) struct StoreGuard<'a> {
    store: MutexGuard<'a, Store>,
    evicted: Vec<Arc<store::Change>>,
}

impl std::ops::Deref for StoreGuard<'_> {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

impl std::ops::DerefMut for StoreGuard<'_> {
    fn deref_mut(&mut self) -> &mut Store {
        &mut self.store
    }
}

impl Drop for StoreGuard<'_> {
    fn drop(&mut self) {
        self.evicted = self.store.take_evicted();
    }
}

impl Shared {
    pub(crate) fn store(&self) -> StoreGuard<'_> {
        StoreGuard {
            store: lock(&self.store),
            evicted: Vec::new(),
        }
    }

    pub(crate) fn faults(&self) -> MutexGuard<'_, faults::Faults> {
        lock(&self.faults)
    }

    pub(crate) fn chaos(&self) -> MutexGuard<'_, Option<chaos::ChaosState>> {
        lock(&self.chaos)
    }

    pub(crate) fn count(&self, verb: Verb, resource: &str) {
        *lock(&self.counters)
            .by
            .entry((verb, resource.to_owned()))
            .or_default() += 1;
    }

    pub(crate) fn bookmark_period(&self) -> Duration {
        *lock(&self.bookmark_period)
    }

    pub(crate) fn watch_list(&self) -> bool {
        self.watch_list.load(Ordering::Acquire)
    }

    pub(crate) fn watch_cache_lag(&self) -> Option<u64> {
        *lock(&self.watch_cache_lag)
    }

    pub(crate) fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }
}

/// A running test API server on `127.0.0.1`. Dropping it closes its watches and stops it (best
/// effort); [`TestApiServer::shutdown`] also waits for it to stop.
pub struct TestApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestApiServer {
    /// Starts a server with the default [`Options`] on an ephemeral loopback port.
    ///
    /// # Panics
    /// If no loopback port can be bound (see [`TestApiServer::try_start`]).
    pub async fn start() -> Self {
        Self::start_with(Options::default()).await
    }

    /// Starts a server with `opts`.
    ///
    /// # Panics
    /// If no loopback port can be bound (see [`TestApiServer::try_start`]).
    pub async fn start_with(opts: Options) -> Self {
        match Self::try_start(opts).await {
            Ok(s) => s,
            Err(e) => panic!("test API server: cannot listen on 127.0.0.1: {e}"),
        }
    }

    /// Starts a server with `opts`, or returns why it could not listen.
    pub async fn try_start(opts: Options) -> std::io::Result<Self> {
        let registry = Arc::new(Registry::new(opts.resources));
        let store = Store::new(
            registry.clone(),
            StoreOptions {
                history_capacity: opts.history_capacity.max(1),
                watcher_buffer: opts.watcher_buffer.max(1),
                graceful_pod_deletion: opts.graceful_pod_deletion,
            },
        );
        let delivered = (0..registry.types().len())
            .map(|_| DeliveryCounter::default())
            .collect();
        let shared = Arc::new(Shared {
            delivered,
            registry,
            store: Mutex::new(store),
            faults: Mutex::new(faults::Faults::default()),
            chaos: Mutex::new(None),
            counters: Mutex::new(Counters::default()),
            bookmark_period: Mutex::new(opts.bookmark_interval),
            watch_list: AtomicBool::new(true),
            watch_cache_lag: Mutex::new(None),
            writes: Mutex::new(Vec::new()),
            shutting_down: AtomicBool::new(false),
        });
        // A deep accept queue: a thousand simulated agents reconnect at once after a group
        // restart, and tokio's default backlog (1,024) overflowed: dropped SYNs, retried by the
        // kernel after 1 s and 3 s, stalled whole rounds. The kernel caps it at somaxconn.
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let listener = socket.listen(65_535)?;
        let addr = listener.local_addr()?;
        let listener = listener.tap_io(|tcp| {
            // Small watch chunks must not wait for Nagle.
            let _ = tcp.set_nodelay(true);
        });
        let app = http::router(shared.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(TestApiServer {
            shared,
            addr,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A `kube::Config` for this server: plain HTTP, no auth, default namespace `default`,
    /// connect timeout 5 s, write timeout 10 s, no read timeout (watches stay open; the watcher
    /// has its own idle timeout), kube's default retries of 429/503/504.
    pub fn config(&self) -> kube::Config {
        let uri = match self.url().parse::<axum::http::Uri>() {
            Ok(u) => u,
            Err(e) => panic!("test API server: bad URL {}: {e}", self.url()),
        };
        let mut c = kube::Config::new(uri);
        c.default_namespace = "default".to_owned();
        c.connect_timeout = Some(Duration::from_secs(5));
        c.write_timeout = Some(Duration::from_secs(10));
        c.read_timeout = None;
        // No TLS is used over http://; an empty root store avoids loading the platform's.
        c.root_cert = Some(Vec::new());
        c
    }

    /// A `kube::Client` for this server.
    ///
    /// # Panics
    /// If kube cannot build a client from [`TestApiServer::config`] (it can for any `http://`
    /// URL).
    pub fn client(&self) -> kube::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        match kube::Client::try_from(self.config()) {
            Ok(c) => c,
            Err(e) => panic!("test API server: cannot build a kube client: {e}"),
        }
    }

    /// A `kube::Client` whose requests carry its `name` ([`CLIENT_HEADER`]): its writes are
    /// logged under that name ([`TestApiServer::writes`]) and
    /// [`TestApiServer::silence_client`] can stop answering it alone.
    ///
    /// # Panics
    /// As [`TestApiServer::client`], and if `name` is not a valid header value.
    pub fn client_named(&self, name: &str) -> kube::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut config = self.config();
        let value = match axum::http::HeaderValue::from_str(name) {
            Ok(v) => v,
            Err(e) => panic!("test API server: bad client name {name:?}: {e}"),
        };
        config
            .headers
            .push((axum::http::HeaderName::from_static(CLIENT_HEADER), value));
        match kube::Client::try_from(config) {
            Ok(c) => c,
            Err(e) => panic!("test API server: cannot build a kube client: {e}"),
        }
    }

    /// The writes applied so far, in order (creates, updates, patches, deletes of any
    /// resource, with the client that sent it); the latest 50,000 to 100,000 of them.
    pub fn writes(&self) -> Vec<WriteRecord> {
        lock(&self.shared.writes).clone()
    }

    /// From now on, requests of the client `name` ([`TestApiServer::client_named`]) with this
    /// verb on this resource (either may be `None` for any) are accepted and never answered,
    /// until [`TestApiServer::clear_faults`]; other clients are served as usual.
    pub fn silence_client<'a>(
        &self,
        name: &str,
        verb: impl Into<Option<Verb>>,
        resource: impl Into<Option<&'a str>>,
    ) {
        let resource = resource.into().map(|r| self.canonical(r));
        self.shared.faults().silence_client(
            name,
            Matcher {
                verb: verb.into(),
                resource,
            },
        );
    }

    /// A `kube::Client` whose requests carry [`EXEMPT_HEADER`]: chaos mode leaves them alone
    /// (deterministic fault rules still apply). For the simulated environment's own writes.
    ///
    /// # Panics
    /// As [`TestApiServer::client`].
    pub fn exempt_client(&self) -> kube::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut config = self.config();
        config.headers.push((
            axum::http::HeaderName::from_static(EXEMPT_HEADER),
            axum::http::HeaderValue::from_static("true"),
        ));
        match kube::Client::try_from(config) {
            Ok(c) => c,
            Err(e) => panic!("test API server: cannot build a kube client: {e}"),
        }
    }

    /// A `kube::Client` served in memory: each request goes straight to this server's router,
    /// through no socket, carrying the given headers (e.g. [`EXEMPT_HEADER`]). Everything the
    /// server does per request and per watch (routing, the store, watch delivery and its
    /// counters) is the same; only the loopback TCP connection is left out. For simulations of
    /// thousands of in-process agents, whose watches would otherwise each hold a socket at both
    /// ends in one process (2 open files per agent: 10,000 agents pass a limit of 20,000).
    pub fn in_memory_client(&self, headers: &[(&'static str, &'static str)]) -> kube::Client {
        let headers: Vec<(axum::http::HeaderName, axum::http::HeaderValue)> = headers
            .iter()
            .map(|(n, v)| {
                (
                    axum::http::HeaderName::from_static(n),
                    axum::http::HeaderValue::from_static(v),
                )
            })
            .collect();
        let headers = Arc::new(headers);
        let router = http::router(self.shared.clone()).layer(axum::middleware::map_request(
            move |mut request: axum::extract::Request| {
                let headers = headers.clone();
                async move {
                    for (name, value) in headers.iter() {
                        request.headers_mut().insert(name.clone(), value.clone());
                    }
                    request
                }
            },
        ));
        kube::Client::new(router, "default")
    }

    /// Closes every watch, stops accepting connections and waits (up to 5 s) for the server to
    /// stop.
    pub async fn shutdown(mut self) {
        self.begin_stop();
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }

    fn begin_stop(&mut self) {
        self.shared.shutting_down.store(true, Ordering::Release);
        self.shared.store().close_watchers();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    // -----------------------------------------------------------------------------------------
    // Direct access (no HTTP, not counted, no faults; changes are seen by watchers)
    // -----------------------------------------------------------------------------------------

    /// The resources this server serves, and their names.
    pub fn registry(&self) -> &Registry {
        &self.shared.registry
    }

    fn resolve(&self, resource: &str) -> Result<usize, ApiError> {
        self.shared.registry.resolve(resource).ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                format!("the server doesn't have a resource type {resource:?}"),
            )
        })
    }

    fn resolve_kube<K: kube::Resource<DynamicType = ()>>(&self) -> Result<usize, ApiError> {
        self.shared.registry.by_kube::<K>().ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                format!("the server doesn't serve {}", K::api_version(&())),
            )
        })
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store().rv()
    }

    /// An object (`ns` is ignored for cluster-scoped resources), as stored.
    pub fn get(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let res = self.resolve(resource).ok()?;
        self.shared
            .store()
            .get(res, ns, name)
            .map(|e| e.value.clone())
    }

    /// [`Self::get`] without copying the object: the stored entry (its `value` and `json`).
    pub fn get_shared(&self, resource: &str, ns: &str, name: &str) -> Option<Arc<store::Entry>> {
        let res = self.resolve(resource).ok()?;
        self.shared.store().get(res, ns, name)
    }

    /// The objects of a resource (in one namespace, or all), sorted by namespace and name.
    pub fn list(&self, resource: &str, ns: Option<&str>) -> Vec<Value> {
        self.list_shared(resource, ns)
            .iter()
            .map(|e| e.value.clone())
            .collect()
    }

    /// The resourceVersion of the latest change to any object of `resource` (0: none yet, or
    /// an unknown resource).
    pub fn last_change(&self, resource: &str) -> u64 {
        self.resolve(resource)
            .map(|res| self.shared.store().last_change(res))
            .unwrap_or(0)
    }

    /// [`TestApiServer::list`]'s objects shared with the store rather than copied: for observers
    /// that read many objects often.
    pub fn list_shared(&self, resource: &str, ns: Option<&str>) -> Vec<Arc<store::Entry>> {
        let Ok(res) = self.resolve(resource) else {
            return Vec::new();
        };
        let q = store::ListQuery {
            filter: store::Filter {
                namespace: ns.map(str::to_owned),
                ..store::Filter::default()
            },
            ..store::ListQuery::default()
        };
        self.shared
            .store()
            .list(res, &q)
            .map(|p| p.items)
            .unwrap_or_default()
    }

    /// Number of objects of a resource.
    pub fn count(&self, resource: &str) -> usize {
        self.resolve(resource)
            .map(|res| self.shared.store().len(res))
            .unwrap_or(0)
    }

    /// Creates an object, in `metadata.namespace` (default `default`), keeping its `status`
    /// (unlike an HTTP create); 409 if it exists.
    pub fn create(&self, resource: &str, obj: Value) -> Result<Value, ApiError> {
        let res = self.resolve(resource)?;
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or("default")
            .to_owned();
        let wo = store::WriteOpts {
            keep_status: true,
            ..store::WriteOpts::default()
        };
        let e = self.shared.store().create(res, &ns, obj, &wo)?;
        Ok(e.value.clone())
    }

    /// Creates or replaces an object, status included (a `metadata.resourceVersion` in `obj`
    /// is a precondition).
    pub fn put(&self, resource: &str, obj: Value) -> Result<Value, ApiError> {
        let res = self.resolve(resource)?;
        let e = self.shared.store().put(res, obj)?;
        Ok(e.value.clone())
    }

    /// Creates or replaces many objects under one lock; returns how many.
    pub fn seed(
        &self,
        resource: &str,
        objs: impl IntoIterator<Item = Value>,
    ) -> Result<usize, ApiError> {
        let res = self.resolve(resource)?;
        let mut store = self.shared.store();
        let mut n = 0;
        for obj in objs {
            store.put(res, obj)?;
            n += 1;
        }
        Ok(n)
    }

    /// Applies a JSON merge patch to the whole object, status included.
    pub fn patch(
        &self,
        resource: &str,
        ns: &str,
        name: &str,
        merge_patch: &Value,
    ) -> Result<Value, ApiError> {
        let res = self.resolve(resource)?;
        let mut store = self.shared.store();
        let cur = store.get_or_404(res, ns, name)?;
        let mut obj = cur.value.clone();
        json_patch::merge(&mut obj, merge_patch);
        let e = store.put(res, obj)?;
        Ok(e.value.clone())
    }

    /// Deletes an object as a DELETE would (with finalizers it only gets `deletionTimestamp`).
    /// Returns the object and whether it is gone.
    pub fn delete(&self, resource: &str, ns: &str, name: &str) -> Result<(Value, bool), ApiError> {
        let res = self.resolve(resource)?;
        let (e, gone) = self
            .shared
            .store()
            .delete(res, ns, name, &store::DeleteOpts::default())?;
        Ok((e.value.clone(), gone))
    }

    /// A typed object, e.g. `server.get_as::<Pod>("ns", "p")`.
    pub fn get_as<K>(&self, ns: &str, name: &str) -> Option<K>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        let res = self.resolve_kube::<K>().ok()?;
        let e = self.shared.store().get(res, ns, name)?;
        serde_json::from_slice(&e.json).ok()
    }

    /// Typed objects (in one namespace, or all).
    pub fn list_as<K>(&self, ns: Option<&str>) -> Vec<K>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        let Ok(res) = self.resolve_kube::<K>() else {
            return Vec::new();
        };
        self.list(self.shared.registry.name(res), ns)
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect()
    }

    /// Creates or replaces a typed object, status included.
    pub fn put_as<K>(&self, obj: &K) -> Result<K, ApiError>
    where
        K: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let res = self.resolve_kube::<K>()?;
        let v = serde_json::to_value(obj)
            .map_err(|e| ApiError::bad_request(format!("cannot serialize: {e}")))?;
        let e = self.shared.store().put(res, v)?;
        serde_json::from_slice(&e.json)
            .map_err(|e| ApiError::internal(format!("cannot read back: {e}")))
    }

    // -----------------------------------------------------------------------------------------
    // Counters and fault injection
    // -----------------------------------------------------------------------------------------

    /// Requests received so far by verb and resource (see [`Counters`]).
    pub fn counters(&self) -> Counters {
        lock(&self.shared.counters).clone()
    }

    /// Empties the write log ([`TestApiServer::writes`]).
    pub fn clear_writes(&self) {
        lock(&self.shared.writes).clear();
    }

    pub fn reset_counters(&self) {
        *lock(&self.shared.counters) = Counters::default();
        for d in &self.shared.delivered {
            d.reset();
        }
    }

    /// What watches have delivered so far, per resource (name as in [`Counters`]): events
    /// (`ADDED`, `MODIFIED`, `DELETED`, `ERROR`), bookmarks, and the bytes of both. Reset with
    /// [`TestApiServer::reset_counters`].
    pub fn deliveries(&self) -> std::collections::BTreeMap<String, Delivered> {
        self.shared
            .delivered
            .iter()
            .enumerate()
            .map(|(res, d)| (self.shared.registry.name(res).to_owned(), d.snapshot()))
            .filter(|(_, d)| *d != Delivered::default())
            .collect()
    }

    /// The canonical counter name of a resource name given by a test (`jobsets.jobset.x-k8s.io`
    /// → `jobsets`, `pods/status` stays).
    fn canonical(&self, resource: &str) -> String {
        let (base, sub) = match resource.split_once('/') {
            Some((b, s)) => (b, Some(s)),
            None => (resource, None),
        };
        let base = match self.shared.registry.resolve(base) {
            Some(res) => self.shared.registry.name(res).to_owned(),
            None => base.to_owned(),
        };
        match sub {
            Some(s) => format!("{base}/{s}"),
            None => base,
        }
    }

    /// The next `n` requests with this verb on this resource (either may be `None` for any)
    /// fail with `code` (a `Status` with upstream's reason for it: 500 `InternalError`, 409
    /// `Conflict`, 429 `TooManyRequests`, ...).
    pub fn fail_next<'a>(
        &self,
        n: u32,
        verb: impl Into<Option<Verb>>,
        resource: impl Into<Option<&'a str>>,
        code: u16,
    ) {
        self.fail_next_with(n, verb, resource, ApiError::from_code(code));
    }

    /// As [`TestApiServer::fail_next`] with 429 and a `Retry-After` of `retry_after_secs`.
    pub fn throttle_next<'a>(
        &self,
        n: u32,
        verb: impl Into<Option<Verb>>,
        resource: impl Into<Option<&'a str>>,
        retry_after_secs: u32,
    ) {
        let e = ApiError::from_code(429).with_retry_after(retry_after_secs);
        self.fail_next_with(n, verb, resource, e);
    }

    /// The next `n` matching requests fail with `error`.
    pub fn fail_next_with<'a>(
        &self,
        n: u32,
        verb: impl Into<Option<Verb>>,
        resource: impl Into<Option<&'a str>>,
        error: ApiError,
    ) {
        let resource = resource.into().map(|r| self.canonical(r));
        self.shared.faults().add(FaultRule {
            matcher: Matcher {
                verb: verb.into(),
                resource,
            },
            remaining: n,
            error,
        });
    }

    /// The next `n` requests with this verb on this resource (either may be `None` for any)
    /// are accepted and never answered: a watch gets its `200` and then nothing, not even a
    /// bookmark; any other request gets no response at all. Only the client's own timeouts end
    /// them (or the client closing the connection). Later requests are served as usual.
    pub fn silence_next<'a>(
        &self,
        n: u32,
        verb: impl Into<Option<Verb>>,
        resource: impl Into<Option<&'a str>>,
    ) {
        let resource = resource.into().map(|r| self.canonical(r));
        self.shared.faults().add_silent(
            Matcher {
                verb: verb.into(),
                resource,
            },
            n,
        );
    }

    /// Delays every request by `d` before it is handled (zero removes the delay).
    pub fn set_latency(&self, d: Duration) {
        self.shared.faults().set_latency(Matcher::any(), d);
    }

    /// Delays matching requests by `d` (the most specific matching rule applies).
    pub fn set_latency_for<'a>(
        &self,
        verb: impl Into<Option<Verb>>,
        resource: impl Into<Option<&'a str>>,
        d: Duration,
    ) {
        let resource = resource.into().map(|r| self.canonical(r));
        self.shared.faults().set_latency(
            Matcher {
                verb: verb.into(),
                resource,
            },
            d,
        );
    }

    /// Removes every pending failure and latency.
    pub fn clear_faults(&self) {
        self.shared.faults().clear();
    }

    /// Drops every open watch connection mid-stream (clients see the connection end and
    /// re-watch); returns how many were open.
    pub fn cut_watches(&self) -> usize {
        self.shared.store().close_watchers()
    }

    /// Number of open watches.
    pub fn watch_count(&self) -> usize {
        self.shared.store().watcher_count()
    }

    /// Forgets the history up to `rv`: watches from older versions get an ERROR 410 event, and
    /// lists with older continue tokens or exact versions answer 410.
    pub fn compact(&self, rv: u64) {
        self.shared.store().compact(rv);
    }

    /// Forgets the whole history; returns the current resourceVersion (watches from any older
    /// version get 410).
    pub fn compact_all(&self) -> u64 {
        let mut s = self.shared.store();
        let rv = s.rv();
        s.compact(rv);
        rv
    }

    /// Changes the BOOKMARK interval of watches started from now on.
    pub fn set_bookmark_interval(&self, d: Duration) {
        *lock(&self.shared.bookmark_period) = d;
    }

    /// Turns kube-apiserver's `WatchList` feature gate off (`false`: a watch with
    /// `sendInitialEvents` is refused, 422, as upstream refuses it) or on again (the default,
    /// as in Kubernetes 1.34 and later).
    pub fn set_watch_list(&self, on: bool) {
        self.shared.watch_list.store(on, Ordering::Release);
    }

    /// Makes the watch cache lag at `rv` (`None`: current again): a watch opened without a
    /// resourceVersion (or from `"0"`) starts from the objects as they were at `rv`, then
    /// delivers every change since, as kube-apiserver serves such a watch from its watch cache
    /// at no guaranteed freshness (k8s.io/apiserver `pkg/storage/cacher/cacher.go`,
    /// `getWatchCacheResourceVersion`'s legacy case). Streaming lists (`sendInitialEvents`),
    /// lists and GETs stay consistent reads.
    pub fn lag_watch_cache(&self, rv: Option<u64>) {
        *lock(&self.shared.watch_cache_lag) = rv;
    }

    /// Turns chaos mode on with `chaos` (replacing any previous config and its counts), or off
    /// with `None`. See [`chaos`].
    pub fn set_chaos(&self, chaos: Option<Chaos>) {
        *self.shared.chaos() = chaos.map(chaos::ChaosState::new);
    }

    /// What chaos mode injected since it was last set (zero when off).
    pub fn chaos_stats(&self) -> ChaosStats {
        self.shared
            .chaos()
            .as_ref()
            .map(chaos::ChaosState::stats)
            .unwrap_or_default()
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.begin_stop();
    }
}
