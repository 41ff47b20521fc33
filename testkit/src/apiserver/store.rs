//! The core of the test API server, without HTTP: objects keyed by resource, namespace and name;
//! one resourceVersion counter; a bounded history of changes; watchers; and the write semantics
//! (create, update, patch, delete, status subresource, finalizers).
//!
//! Everything here is synchronous and runs under the server's one lock; nothing awaits.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, OnceLock};

use axum::body::Bytes;
use base64::Engine as _;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::defaults;
use super::error::ApiError;
use super::patch::{self, Owners, PatchType};
use super::resources::{Registry, ResId, ResourceType};
use super::selector::{FieldSelector, LabelSelector};

mod writes;

/// `(namespace, name)`; the namespace is `""` for cluster-scoped resources.
pub type Key = (String, String);

/// One stored version of an object: the JSON value, its serialized bytes (written once, reused
/// by every GET, LIST and watch event), its resourceVersion and its field ownership.
#[derive(Debug)]
pub struct Entry {
    pub value: Value,
    pub json: Bytes,
    pub rv: u64,
    pub(crate) owners: Arc<Owners>,
}

impl Entry {
    fn new(value: Value, rv: u64, owners: Arc<Owners>) -> Arc<Entry> {
        let json = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        Arc::new(Entry {
            value,
            json,
            rv,
            owners,
        })
    }
}

/// A watch event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change in the history: the object after (for a deletion, its last state carrying the
/// deletion's resourceVersion) and before.
#[derive(Debug)]
pub(crate) struct Change {
    pub rv: u64,
    pub res: ResId,
    pub ty: EventType,
    pub key: Key,
    pub object: Arc<Entry>,
    pub prev: Option<Arc<Entry>>,
    /// `prev` stamped with `rv`: what a watcher that stops matching receives as DELETED.
    prev_stamped: OnceLock<Arc<Entry>>,
}

impl Change {
    fn deleted_object(&self) -> Arc<Entry> {
        if self.ty == EventType::Deleted {
            return self.object.clone();
        }
        self.prev_stamped
            .get_or_init(|| match &self.prev {
                Some(p) => {
                    let mut v = p.value.clone();
                    set_rv(&mut v, self.rv);
                    Entry::new(v, self.rv, p.owners.clone())
                }
                None => self.object.clone(),
            })
            .clone()
    }
}

/// What a watcher receives.
#[derive(Clone, Debug)]
pub(crate) struct Delivery {
    pub ty: EventType,
    pub entry: Arc<Entry>,
}

/// Which objects a watch or list selects.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    pub fn matches(&self, key: &Key, v: &Value) -> bool {
        self.namespace.as_ref().is_none_or(|ns| *ns == key.0)
            && self.labels.matches(v)
            && self.fields.matches(v)
    }

    /// The event a watcher with this filter receives for a change, as upstream's watch cache
    /// does: an object entering the selection is ADDED, one leaving it DELETED.
    fn classify(&self, c: &Change) -> Option<Delivery> {
        let now = c.ty != EventType::Deleted && self.matches(&c.key, &c.object.value);
        let before = c
            .prev
            .as_ref()
            .is_some_and(|p| self.matches(&c.key, &p.value));
        let (ty, entry) = match (before, now) {
            (false, false) => return None,
            (false, true) => (EventType::Added, c.object.clone()),
            (true, true) => (EventType::Modified, c.object.clone()),
            (true, false) => (EventType::Deleted, c.deleted_object()),
        };
        Some(Delivery { ty, entry })
    }
}

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchFrom {
    /// `resourceVersion` absent or `"0"`: synthetic ADDED events for the current objects.
    Current,
    /// Events after this resourceVersion, from the history.
    After(u64),
    /// `resourceVersion` absent or `"0"` on a watch cache that lags at this resourceVersion
    /// ([`crate::apiserver::TestApiServer::lag_watch_cache`]): synthetic ADDED events for the
    /// objects as they were then, followed by every change since, as kube-apiserver's cache
    /// delivers them while it catches up.
    CacheAt(u64),
}

/// A registered watch: its initial events, its live channel and the resourceVersion at start.
pub(crate) struct WatchStart {
    pub id: u64,
    pub initial: Vec<Delivery>,
    pub rx: mpsc::Receiver<Delivery>,
    pub rv: u64,
}

/// Watchers of one resource, bucketed so a change visits only the watchers that may care:
/// those pinned to its object (a `metadata.name` field selector), to its namespace, or to all.
#[derive(Default)]
struct Watchers {
    buckets: HashMap<Bucket, HashMap<u64, Reg>>,
    index: HashMap<u64, Bucket>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Bucket {
    Object(Key),
    Namespace(String),
    All,
}

struct Reg {
    filter: Arc<Filter>,
    tx: mpsc::Sender<Delivery>,
}

impl Watchers {
    fn remove(&mut self, id: u64) -> bool {
        let Some(b) = self.index.remove(&id) else {
            return false;
        };
        if let Some(m) = self.buckets.get_mut(&b) {
            m.remove(&id);
            if m.is_empty() {
                self.buckets.remove(&b);
            }
        }
        true
    }
}

/// Parameters of a write.
#[derive(Clone, Debug, Default)]
pub struct WriteOpts {
    /// Compute and return the result without storing it (`dryRun=All`).
    pub dry_run: bool,
    /// `fieldManager`.
    pub field_manager: Option<String>,
    /// `force` (server-side apply: take fields from other managers).
    pub force: bool,
    /// Keep `status` as given (direct seeding; HTTP writes to the main resource never do).
    pub keep_status: bool,
}

/// The part of an object a write addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
}

/// Parameters of a delete (from `DeleteOptions`).
#[derive(Clone, Debug, Default)]
pub struct DeleteOpts {
    pub dry_run: bool,
    pub grace_period_seconds: Option<i64>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    /// `propagationPolicy: Foreground`: the object gets the `foregroundDeletion` finalizer
    /// and `deletionTimestamp`, as upstream; removing its dependents and then the finalizer is
    /// the caller's (upstream's garbage collector; the simulated one in tests). `Background`
    /// and `Orphan` delete at once (no garbage collection here).
    pub foreground: bool,
}

/// The finalizer of a foreground deletion (upstream's `metav1.FinalizerDeleteDependents`).
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

/// A LIST request.
#[derive(Clone, Debug, Default)]
pub struct ListQuery {
    pub filter: Filter,
    pub limit: Option<usize>,
    /// The opaque `continue` token of a previous page.
    pub continue_token: Option<String>,
    /// Serve the list as of this resourceVersion (`resourceVersionMatch=Exact`).
    pub exact_rv: Option<u64>,
}

/// One page of a LIST.
#[derive(Clone, Debug)]
pub struct ListPage {
    pub items: Vec<Arc<Entry>>,
    pub rv: u64,
    pub continue_token: Option<String>,
}

/// Tunables of a store.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    pub history_capacity: usize,
    pub watcher_buffer: usize,
    pub graceful_pod_deletion: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            history_capacity: 10_000,
            watcher_buffer: 10_000,
            graceful_pod_deletion: false,
        }
    }
}

/// The object store.
pub struct Store {
    registry: Arc<Registry>,
    objects: Vec<BTreeMap<Key, Arc<Entry>>>,
    rv: u64,
    history: VecDeque<Arc<Change>>,
    /// Changes that left the history, to be dropped once the lock is released (see
    /// [`Store::take_evicted`]): freeing an old object is most of a write's cost in the lock.
    evicted: Vec<Arc<Change>>,
    /// Watches and consistent lists can resume from any resourceVersion at or after this one.
    oldest: u64,
    watchers: Vec<Watchers>,
    /// Per resource, the resourceVersion of its latest change (0: none yet).
    last_change: Vec<u64>,
    next_watcher: u64,
    rng: u64,
    uid_seed: u64,
    opts: StoreOptions,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.finish()
}

/// Now, RFC 3339 with seconds (as `creationTimestamp`).
pub(crate) fn timestamp_in(secs: i64) -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    let t = now
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs))
        .unwrap_or(now);
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn set_rv(v: &mut Value, rv: u64) {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

fn meta(v: &Value) -> Option<&Map<String, Value>> {
    v.get("metadata").and_then(Value::as_object)
}

fn meta_str<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    meta(v)
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn has_finalizers(v: &Value) -> bool {
    meta(v)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

/// Anything other than `metadata` and `status` differs (the rule for bumping `generation`).
fn spec_changed(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a != b;
    };
    let skip = |k: &str| matches!(k, "metadata" | "status" | "apiVersion" | "kind");
    let differs = |x: &Map<String, Value>, y: &Map<String, Value>| {
        x.iter()
            .filter(|(k, _)| !skip(k))
            .any(|(k, v)| y.get(k) != Some(v))
    };
    differs(a, b) || differs(b, a)
}

/// Checks `apiVersion`/`kind` (when given) and sets them.
fn normalize_type(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
    let Some(m) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(format!(
            "the body of the request must be a {} object",
            rt.kind
        )));
    };
    let api_version = rt.api_version();
    if let Some(v) = m.get("apiVersion").and_then(Value::as_str)
        && !v.is_empty()
        && v != api_version
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({v}) does not match the expected API version ({api_version})"
        )));
    }
    if let Some(k) = m.get("kind").and_then(Value::as_str)
        && !k.is_empty()
        && k != rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            rt.kind
        )));
    }
    m.insert("apiVersion".into(), Value::String(api_version));
    m.insert("kind".into(), Value::String(rt.kind.to_string()));
    match m.get("metadata") {
        None | Some(Value::Null) => {
            m.insert("metadata".into(), json!({}));
        }
        Some(Value::Object(_)) => {}
        Some(_) => return Err(ApiError::bad_request("metadata must be an object")),
    }
    Ok(())
}

/// Runs `f` on the object's `metadata` map (made empty when absent), then puts it back in place.
fn with_meta<R>(obj: &mut Value, f: impl FnOnce(&mut Map<String, Value>) -> R) -> R {
    let mut m = match obj.get_mut("metadata") {
        Some(Value::Object(m)) => std::mem::take(m),
        _ => Map::new(),
    };
    let r = f(&mut m);
    if let Some(o) = obj.as_object_mut() {
        o.insert("metadata".into(), Value::Object(m));
    }
    r
}

fn validate_name(rt: &ResourceType, name: &str) -> Result<(), String> {
    if name.len() > 253 {
        return Err("must be no more than 253 characters".into());
    }
    if rt.group == "rbac.authorization.k8s.io" {
        if name == "." || name == ".." || name.contains(['/', '%']) {
            return Err("may not contain '/' or '%' or be '.' or '..'".into());
        }
        return Ok(());
    }
    let ok = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character".into())
    }
}

fn encode_continue(rv: u64, key: &Key) -> String {
    let raw = json!({"rv": rv, "start": [key.0, key.1]}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_continue(token: &str) -> Result<(u64, Key), ApiError> {
    let bad = || ApiError::bad_request("continue key is not valid");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = v.get("start").and_then(Value::as_array).ok_or_else(bad)?;
    match (
        start.first().and_then(Value::as_str),
        start.get(1).and_then(Value::as_str),
    ) {
        (Some(ns), Some(name)) => Ok((rv, (ns.to_owned(), name.to_owned()))),
        _ => Err(bad()),
    }
}

impl Store {
    pub fn new(registry: Arc<Registry>, opts: StoreOptions) -> Self {
        let n = registry.types().len();
        let seed = random_seed();
        Store {
            registry,
            objects: (0..n).map(|_| BTreeMap::new()).collect(),
            // resourceVersion "0" means "any" to clients, so real versions start above it.
            rv: 1,
            history: VecDeque::new(),
            evicted: Vec::new(),
            oldest: 1,
            watchers: (0..n).map(|_| Watchers::default()).collect(),
            last_change: vec![0; n],
            next_watcher: 0,
            rng: seed,
            uid_seed: seed.rotate_left(17) ^ 0x5DEE_CE66_D1CE_4E5B,
            opts,
        }
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The current resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// Watches and lists at resourceVersions below this answer 410.
    pub fn oldest_rv(&self) -> u64 {
        self.oldest
    }

    pub fn len(&self, res: ResId) -> usize {
        self.objects[res].len()
    }

    pub fn is_empty(&self, res: ResId) -> bool {
        self.objects[res].is_empty()
    }

    fn uid(&mut self) -> String {
        let a = splitmix(&mut self.uid_seed);
        let b = splitmix(&mut self.uid_seed);
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            0x8000 | ((b >> 48) & 0x3fff),
            b & 0xffff_ffff_ffff
        )
    }

    fn random_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut x = splitmix(&mut self.rng);
        (0..5)
            .map(|_| {
                let c = ALPHABET[(x % ALPHABET.len() as u64) as usize];
                x /= ALPHABET.len() as u64;
                char::from(c)
            })
            .collect()
    }

    fn key(&self, res: ResId, ns: &str, name: &str) -> Key {
        if self.registry.get(res).namespaced {
            (ns.to_owned(), name.to_owned())
        } else {
            (String::new(), name.to_owned())
        }
    }

    pub fn get(&self, res: ResId, ns: &str, name: &str) -> Option<Arc<Entry>> {
        self.objects[res].get(&self.key(res, ns, name)).cloned()
    }

    pub(crate) fn get_or_404(
        &self,
        res: ResId,
        ns: &str,
        name: &str,
    ) -> Result<Arc<Entry>, ApiError> {
        self.get(res, ns, name)
            .ok_or_else(|| ApiError::not_found(self.registry.get(res), name))
    }

    // ---------------------------------------------------------------------------------------
    // History and watchers
    // ---------------------------------------------------------------------------------------

    /// The changes that left the history since the last call, for the caller to drop outside
    /// the lock.
    pub(crate) fn take_evicted(&mut self) -> Vec<Arc<Change>> {
        std::mem::take(&mut self.evicted)
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// The resourceVersion of the latest change to `res` (created, updated, deleted), 0 if none:
    /// what lets a simulated controller skip a pass when nothing it reads moved, as a real one
    /// reconciles only on an event.
    pub(crate) fn last_change(&self, res: ResId) -> u64 {
        self.last_change.get(res).copied().unwrap_or(0)
    }

    fn publish(&mut self, change: Change) {
        if let Some(last) = self.last_change.get_mut(change.res) {
            *last = (*last).max(change.rv);
        }
        let change = Arc::new(change);
        self.history.push_back(change.clone());
        while self.history.len() > self.opts.history_capacity {
            if let Some(old) = self.history.pop_front() {
                self.oldest = self.oldest.max(old.rv);
                self.evicted.push(old);
            }
        }
        let watchers = &mut self.watchers[change.res];
        if watchers.index.is_empty() {
            return;
        }
        let mut dead = Vec::new();
        let buckets = [
            Bucket::Object(change.key.clone()),
            Bucket::Namespace(change.key.0.clone()),
            Bucket::All,
        ];
        for b in &buckets {
            let Some(regs) = watchers.buckets.get(b) else {
                continue;
            };
            for (id, reg) in regs {
                if let Some(d) = reg.filter.classify(&change)
                    && reg.tx.try_send(d).is_err()
                {
                    // Full (a slow watcher) or closed: drop it; the client re-watches from the
                    // last resourceVersion it saw, as with a real API server.
                    dead.push(*id);
                }
            }
        }
        for id in dead {
            watchers.remove(id);
        }
    }

    fn put_entry(
        &mut self,
        res: ResId,
        key: Key,
        mut value: Value,
        owners: Owners,
        prev: Option<Arc<Entry>>,
    ) -> Arc<Entry> {
        let rv = self.next_rv();
        set_rv(&mut value, rv);
        let entry = Entry::new(value, rv, Arc::new(owners));
        self.objects[res].insert(key.clone(), entry.clone());
        let ty = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.publish(Change {
            rv,
            res,
            ty,
            key,
            object: entry.clone(),
            prev,
            prev_stamped: OnceLock::new(),
        });
        entry
    }

    fn remove_entry(
        &mut self,
        res: ResId,
        key: Key,
        prev: Arc<Entry>,
        mut last: Value,
    ) -> Arc<Entry> {
        let rv = self.next_rv();
        set_rv(&mut last, rv);
        let entry = Entry::new(last, rv, prev.owners.clone());
        self.objects[res].remove(&key);
        self.publish(Change {
            rv,
            res,
            ty: EventType::Deleted,
            key,
            object: entry.clone(),
            prev: Some(prev),
            prev_stamped: OnceLock::new(),
        });
        entry
    }

    /// Registers a watcher. Fails with 410 `Expired` when `from` is older than the history.
    pub(crate) fn watch(
        &mut self,
        res: ResId,
        filter: Filter,
        from: WatchFrom,
    ) -> Result<WatchStart, ApiError> {
        let initial: Vec<Delivery> = match from {
            WatchFrom::Current => {
                let (lo, hi) = ns_bounds(filter.namespace.as_deref());
                self.objects[res]
                    .range((lo, hi))
                    .filter(|(k, e)| filter.matches(k, &e.value))
                    .map(|(_, e)| Delivery {
                        ty: EventType::Added,
                        entry: e.clone(),
                    })
                    .collect()
            }
            WatchFrom::After(rv) => self.changes_after(res, &filter, rv)?,
            WatchFrom::CacheAt(rv) => {
                let rv = rv.clamp(self.oldest, self.rv);
                let then = self.list(
                    res,
                    &ListQuery {
                        filter: filter.clone(),
                        limit: None,
                        continue_token: None,
                        exact_rv: Some(rv),
                    },
                )?;
                let mut initial: Vec<Delivery> = then
                    .items
                    .into_iter()
                    .map(|entry| Delivery {
                        ty: EventType::Added,
                        entry,
                    })
                    .collect();
                initial.extend(self.changes_after(res, &filter, rv)?);
                initial
            }
        };
        let bucket = match (filter.fields.name(), &filter.namespace) {
            (Some(name), Some(ns)) => Bucket::Object((ns.clone(), name.to_owned())),
            (Some(name), None) if !self.registry.get(res).namespaced => {
                Bucket::Object((String::new(), name.to_owned()))
            }
            (_, Some(ns)) => Bucket::Namespace(ns.clone()),
            _ => Bucket::All,
        };
        let (tx, rx) = mpsc::channel(self.opts.watcher_buffer.max(1));
        self.next_watcher += 1;
        let id = self.next_watcher;
        let w = &mut self.watchers[res];
        w.index.insert(id, bucket.clone());
        w.buckets.entry(bucket).or_default().insert(
            id,
            Reg {
                filter: Arc::new(filter),
                tx,
            },
        );
        Ok(WatchStart {
            id,
            initial,
            rx,
            rv: self.rv,
        })
    }

    /// The changes of `res` after `rv` that `filter` selects, as watch events.
    fn changes_after(
        &self,
        res: ResId,
        filter: &Filter,
        rv: u64,
    ) -> Result<Vec<Delivery>, ApiError> {
        if rv < self.oldest {
            return Err(ApiError::expired(rv, self.oldest));
        }
        let start = self.history.partition_point(|c| c.rv <= rv);
        Ok(self
            .history
            .range(start..)
            .filter(|c| c.res == res)
            .filter_map(|c| filter.classify(c))
            .collect())
    }

    /// Unregisters a watcher (its stream ended).
    pub(crate) fn unwatch(&mut self, res: ResId, id: u64) {
        self.watchers[res].remove(id);
    }

    /// Closes every watch; returns how many were open.
    pub fn close_watchers(&mut self) -> usize {
        let mut n = 0;
        for w in &mut self.watchers {
            n += w.index.len();
            *w = Watchers::default();
        }
        n
    }

    /// Number of open watches.
    pub fn watcher_count(&self) -> usize {
        self.watchers.iter().map(|w| w.index.len()).sum()
    }

    /// The resourceVersion a bookmark may carry for a watcher whose channel is `rx`: the current
    /// one if the watcher has been handed every change so far, else none.
    pub(crate) fn bookmark_rv(&self, rx: &mpsc::Receiver<Delivery>) -> Option<u64> {
        rx.is_empty().then_some(self.rv)
    }

    /// Forgets history up to `rv`: watches and lists from older versions answer 410.
    pub fn compact(&mut self, rv: u64) {
        let rv = rv.min(self.rv);
        self.oldest = self.oldest.max(rv);
        while self.history.front().is_some_and(|c| c.rv <= rv) {
            self.history.pop_front();
        }
    }

    // ---------------------------------------------------------------------------------------
    // Reads
    // ---------------------------------------------------------------------------------------

    /// LIST: selectors, pagination (`limit`/`continue`, consistent at the first page's
    /// resourceVersion), and exact-version reads from the history.
    pub fn list(&self, res: ResId, q: &ListQuery) -> Result<ListPage, ApiError> {
        let (snap, after) = match &q.continue_token {
            Some(t) => {
                let (rv, key) = decode_continue(t)?;
                if rv < self.oldest {
                    return Err(ApiError::continue_expired());
                }
                (rv, Some(key))
            }
            None => (q.exact_rv.unwrap_or(self.rv), None),
        };
        if snap < self.oldest {
            return Err(ApiError::expired(snap, self.oldest));
        }
        let snap = snap.min(self.rv);
        // The objects as of `snap`: the current ones, overlaid by the state before the first
        // later change of every key changed since.
        let mut overlay: BTreeMap<Key, Option<Arc<Entry>>> = BTreeMap::new();
        if snap < self.rv {
            let start = self.history.partition_point(|c| c.rv <= snap);
            for c in self.history.range(start..).filter(|c| c.res == res) {
                overlay
                    .entry(c.key.clone())
                    .or_insert_with(|| c.prev.clone());
            }
        }
        let ns = q.filter.namespace.as_deref();
        let (ns_lo, hi) = ns_bounds(ns);
        let lo = match after {
            Some(k) => Bound::Excluded(k),
            None => ns_lo,
        };
        let range = (lo, hi);
        let mut merged = merge_sorted(self.objects[res].range(range.clone()), overlay.range(range))
            .filter(|(k, e)| q.filter.matches(k, &e.value));
        let limit = q.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let mut items = Vec::new();
        let mut last: Option<&Key> = None;
        for (k, e) in merged.by_ref() {
            items.push(e.clone());
            last = Some(k);
            if items.len() >= limit {
                break;
            }
        }
        let continue_token = match last {
            Some(k) if items.len() >= limit && merged.next().is_some() => {
                Some(encode_continue(snap, k))
            }
            _ => None,
        };
        Ok(ListPage {
            items,
            rv: snap,
            continue_token,
        })
    }
}

/// Key bounds of one namespace (or everything).
fn ns_bounds(ns: Option<&str>) -> (Bound<Key>, Bound<Key>) {
    match ns {
        None => (Bound::Unbounded, Bound::Unbounded),
        Some(ns) => {
            // Keys of `ns` sort between (ns, "") and (ns + "\0", ""), exclusive.
            let mut next = ns.to_owned();
            next.push('\0');
            (
                Bound::Included((ns.to_owned(), String::new())),
                Bound::Excluded((next, String::new())),
            )
        }
    }
}

/// Merges the current objects with the overlay of older states (the overlay wins on equal
/// keys; an overlay of `None` hides the key), both sorted by key.
fn merge_sorted<'a>(
    current: impl Iterator<Item = (&'a Key, &'a Arc<Entry>)>,
    overlay: impl Iterator<Item = (&'a Key, &'a Option<Arc<Entry>>)>,
) -> impl Iterator<Item = (&'a Key, &'a Arc<Entry>)> {
    let mut cur = current.peekable();
    let mut ov = overlay.peekable();
    std::iter::from_fn(move || {
        loop {
            let from_overlay = match (cur.peek(), ov.peek()) {
                (None, None) => return None,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some((ck, _)), Some((ok, _))) => {
                    if ok == ck {
                        cur.next();
                        true
                    } else {
                        ok < ck
                    }
                }
            };
            if !from_overlay {
                return cur.next();
            }
            match ov.next() {
                Some((k, Some(e))) => return Some((k, e)),
                Some((_, None)) => continue,
                None => return None,
            }
        }
    })
}

#[cfg(test)]
mod tests;
