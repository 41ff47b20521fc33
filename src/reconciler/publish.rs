//! Publishing each JobSet's epochs for its agents ([`crate::wire::epochs`]): a watch of the
//! published objects, so that the leader only ever moves them forward and re-creates one that was
//! deleted, and the server-side apply that writes one.
//!
//! The JobSet's status stays the source of truth. A decision is published before its status
//! write (`controller/status.rs`, `write_epochs`); after each evaluation the object catches up with the
//! status (a new JobSet, a status written before). Both go through
//! [`crate::wire::epochs::publish`] (monotone, pure).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};

use super::key::Key;
use crate::retry::WatchBackoff;
use crate::wire::epochs::{self, Epochs, JobSetEpoch};

/// What is published, as the watch of the objects (and this process's own writes) show it.
#[derive(Debug, Default)]
pub struct Published {
    /// Per JobSet: the owner UID and the content of its object.
    objects: Mutex<HashMap<Key, (Option<String>, Epochs)>>,
    /// The watch has listed every object once: before that, a missing entry does not mean that
    /// there is no object, and nothing is written (it could move one backwards).
    synced: AtomicBool,
    /// The API server does not serve the kind (its CRD was never installed, or was removed):
    /// nothing can be published, agents watch their JobSet, and the status is written without
    /// waiting for a publication. Cleared when the objects can be listed again.
    unavailable: AtomicBool,
    /// Told when a 404 set `unavailable`: [`watch`] starts over with a list, whose end clears it.
    /// A 404 can pass: a kube-apiserver that is starting answers 404 for a custom resource's kind
    /// until its CRD informer has synced (apiextensions-apiserver's `crdHandler` sends a kind
    /// missing from its lister to the NotFound delegate), and a watch that resumed afterwards
    /// never lists again, so without this the flag stayed and nothing was published until the
    /// process restarted (the agents watching the object waited for ever: the failure matrix's
    /// API server row, on real nodes).
    relist: tokio::sync::Notify,
    /// The installed CRD is older than this reconciler and has no `jobSetUID` (the API server
    /// refuses an apply that sets it): applies leave it out, and the CRD's rule that epochs only
    /// grow is not there either. Said once.
    legacy_crd: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn key_of(obj: &JobSetEpoch) -> Option<Key> {
    Some(Key::new(
        obj.metadata.namespace.clone()?,
        obj.metadata.name.clone()?,
    ))
}

impl Published {
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    pub fn is_unavailable(&self) -> bool {
        self.unavailable.load(Ordering::Acquire)
    }

    /// The kind is not served (a 404 on it); says so once, and has the watch list the objects
    /// again ([`Published::relist`]): once that list succeeds, publishing resumes.
    pub fn mark_unavailable(&self) {
        if !self.unavailable.swap(true, Ordering::AcqRel) {
            tracing::error!(
                crd = epochs::CRD_NAME,
                "the JobSetEpoch kind is not served: publishing nothing, writing the status alone \
                 (agents watch their JobSet) until the objects can be listed again; install the \
                 CRD (it is in the install manifest) if it is missing"
            );
            self.relist.notify_one();
        }
    }

    /// Whether a JobSet has an object.
    pub fn contains(&self, key: &Key) -> bool {
        lock(&self.objects).contains_key(key)
    }

    /// The content to write for a JobSet ([`epochs::publish`]), or `None` when what is published
    /// is already right.
    pub fn next(&self, key: &Key, source: &epochs::Source<'_>) -> Option<Epochs> {
        let objects = lock(&self.objects);
        let current = objects
            .get(key)
            .map(|(owner, content)| (owner.as_deref(), *content));
        epochs::publish(current, source)
    }

    /// Records an object as read or written; returns its key when its content differs from what
    /// was known (the JobSet is then evaluated again, which repairs an object someone else
    /// changed).
    fn record(&self, obj: &JobSetEpoch) -> Option<Key> {
        let key = key_of(obj)?;
        let now = (
            obj.owner_uid().map(str::to_owned),
            obj.epochs.unwrap_or_default(),
        );
        let before = lock(&self.objects).insert(key.clone(), now.clone());
        (before != Some(now)).then_some(key)
    }

    fn remove(&self, key: &Key) {
        lock(&self.objects).remove(key);
    }

    /// Forgets a deleted JobSet's entry (its object goes with it).
    pub fn forget(&self, key: &Key) {
        self.remove(key);
    }

    /// Entries held, for [`crate::reconciler::controller::StateSizes`].
    pub fn len(&self) -> usize {
        lock(&self.objects).len()
    }

    pub fn is_empty(&self) -> bool {
        lock(&self.objects).is_empty()
    }
}

/// Follows the published objects; `changed` is told about each JobSet whose object changed or
/// went away, so that it is evaluated (and its object repaired) again, and `synced` when the
/// objects have been listed (each time: the JobSets evaluated before could not publish).
pub async fn watch(
    api: Api<JobSetEpoch>,
    config: watcher::Config,
    published: &Published,
    changed: impl Fn(Key),
    synced: impl Fn(),
) {
    // Each pass lists the objects first (the watcher's start); a 404 ends the pass
    // ([`Published::relist`]), so that the list's end clears it.
    loop {
        let stream = watcher(api.clone(), config.clone()).backoff(WatchBackoff::new());
        follow(stream, published, &changed, &synced).await;
        if published.is_unavailable() {
            tracing::info!("listing the JobSetEpoch objects again after a 404");
        } else {
            return;
        }
    }
}

/// One pass of [`watch`]: until the stream ends, or a 404 asks for a new list.
async fn follow(
    stream: impl futures::Stream<Item = Result<Event<JobSetEpoch>, watcher::Error>>,
    published: &Published,
    changed: &impl Fn(Key),
    synced: &impl Fn(),
) {
    futures::pin_mut!(stream);
    let mut relist: Option<Vec<Key>> = None;
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            () = published.relist.notified() => return,
        };
        let Some(event) = event else {
            return;
        };
        match event {
            Ok(Event::Init) => relist = Some(Vec::new()),
            Ok(Event::InitApply(obj)) => {
                if let (Some(seen), Some(key)) = (relist.as_mut(), key_of(&obj)) {
                    seen.push(key);
                }
                if let Some(key) = published.record(&obj) {
                    changed(key);
                }
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = relist.take() {
                    let seen: std::collections::HashSet<Key> = seen.into_iter().collect();
                    let gone: Vec<Key> = lock(&published.objects)
                        .keys()
                        .filter(|k| !seen.contains(*k))
                        .cloned()
                        .collect();
                    for key in gone {
                        published.remove(&key);
                        changed(key);
                    }
                }
                published.synced.store(true, Ordering::Release);
                published.unavailable.store(false, Ordering::Release);
                synced();
            }
            Ok(Event::Apply(obj)) => {
                if let Some(key) = published.record(&obj) {
                    changed(key);
                }
            }
            Ok(Event::Delete(obj)) => {
                if let Some(key) = key_of(&obj) {
                    published.remove(&key);
                    changed(key);
                }
            }
            Err(e) => {
                if not_served(&e) {
                    published.mark_unavailable();
                } else {
                    tracing::warn!(error = %e, "JobSetEpoch watch failed; retrying");
                }
            }
        }
    }
}

/// The watch failed because the API server does not serve the kind.
fn not_served(e: &watcher::Error) -> bool {
    let api = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s,
        watcher::Error::WatchError(s) => s,
        _ => return false,
    };
    api.code == 404
}

/// Writes a JobSet's object (server-side apply, forced: the reconciler owns every field it
/// sets) and records the result. Against a CRD older than this reconciler (no `jobSetUID`:
/// the reconciler rolled out before the install manifest's CRD), the field is left out from then
/// on, so that publishing goes on.
pub async fn apply(
    api: &Api<JobSetEpoch>,
    published: &Published,
    key: &Key,
    uid: &str,
    content: &Epochs,
) -> Result<(), kube::Error> {
    let mut body = epochs::apply_body(&key.namespace, &key.name, uid, content);
    let params = PatchParams::apply(epochs::FIELD_MANAGER).force();
    if published.legacy_crd.load(Ordering::Acquire) {
        strip_job_set_uid(&mut body);
    }
    let written = match api.patch(&key.name, &params, &Patch::Apply(&body)).await {
        Err(e) if undeclared_job_set_uid(&e) => {
            if !published.legacy_crd.swap(true, Ordering::AcqRel) {
                tracing::error!(
                    crd = epochs::CRD_NAME,
                    error = %e,
                    "the JobSetEpoch CRD is older than this reconciler (no jobSetUID): publishing                      without it; the API server does not refuse a move back of the epochs until                      the install manifest's CRD is applied"
                );
            }
            strip_job_set_uid(&mut body);
            api.patch(&key.name, &params, &Patch::Apply(&body)).await?
        }
        other => other?,
    };
    published.record(&written);
    Ok(())
}

fn strip_job_set_uid(body: &mut serde_json::Value) {
    if let Some(o) = body.as_object_mut() {
        o.remove("jobSetUID");
    }
}

/// The API server refused the apply because the CRD does not declare `jobSetUID` (a server-side
/// apply answers 500 "field not declared in schema"; strict field validation, 422).
fn undeclared_job_set_uid(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if matches!(s.code, 400 | 422 | 500)
        && s.message.contains("jobSetUID")
        && (s.message.contains("not declared") || s.message.contains("unknown field")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::EpochStatus;
    use serde_json::json;

    fn object(name: &str, uid: &str, d: i32, s: i32) -> JobSetEpoch {
        serde_json::from_value(epochs::apply_body(
            "ns",
            name,
            uid,
            &Epochs {
                deprecated: Some(d),
                synced: Some(s),
                bypass: false,
                watch_job_set: false,
            },
        ))
        .expect("parses")
    }

    /// What a real API server (1.35) answers to an apply of `jobSetUID` against the CRD of an
    /// earlier version (seen in tests/real_cluster/ before the CRD was updated).
    #[test]
    fn an_older_crd_is_recognised() {
        let status = |code: u16, message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, "")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(undeclared_job_set_uid(&status(
            500,
            "failed to create typed patch object (ns/js; jobset-inplace.dev/v1alpha1,              Kind=JobSetEpoch): .jobSetUID: field not declared in schema"
        )));
        assert!(undeclared_job_set_uid(&status(
            422,
            ".jobSetUID: unknown field \"jobSetUID\""
        )));
        assert!(!undeclared_job_set_uid(&status(
            500,
            "etcdserver: request timed out"
        )));
        assert!(!undeclared_job_set_uid(&status(
            422,
            "JobSetEpoch.jobset-inplace.dev \"js\" is invalid: <nil>: Invalid value: \"object\": \
             a JobSet's epochs only grow"
        )));
        let mut body = epochs::apply_body("ns", "js", "u", &Epochs::default());
        strip_job_set_uid(&mut body);
        assert!(body.get("jobSetUID").is_none() && body.get("epochs").is_some());
    }

    #[test]
    fn records_report_changes_only() {
        let p = Published::default();
        let obj = object("js", "u", 1, 2);
        assert_eq!(p.record(&obj), Some(Key::new("ns", "js")));
        assert_eq!(p.record(&obj), None, "the same content again is no change");
        assert!(p.contains(&Key::new("ns", "js")));
        let source = epochs::Source {
            uid: "u",
            status: EpochStatus {
                deprecated: Some(1),
                synced: Some(2),
            },
            bypass: false,
            delegate: false,
        };
        assert_eq!(p.next(&Key::new("ns", "js"), &source), None);
        let source = epochs::Source {
            status: EpochStatus {
                deprecated: Some(2),
                synced: Some(2),
            },
            ..source
        };
        assert_eq!(
            p.next(&Key::new("ns", "js"), &source),
            Some(Epochs {
                deprecated: Some(2),
                synced: Some(2),
                bypass: false,
                watch_job_set: false,
            })
        );
        p.forget(&Key::new("ns", "js"));
        assert!(p.is_empty());
        let unnamed: JobSetEpoch = serde_json::from_value(json!({"metadata": {}})).expect("parses");
        assert_eq!(p.record(&unnamed), None);
    }
}
