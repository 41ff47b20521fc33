//! The provisioner (`provision_loop`): keeps every namespace's agent ServiceAccount and
//! RoleBinding as the JobSets need them ([`super::provision`] has the objects and the pure rules).
//!
//! A namespace whose provisioning or removal fails is tried again after a backoff of its own
//! ([`provision::Failures`]: 1 s doubling to 5 min), while the others go on; the failure is a
//! WARN and a Warning event `AgentProvisioningFailed` on the namespace's InPlaceRestart JobSets
//! (their agents cannot register until it is fixed) once per reason and again every 10 minutes,
//! a count in `provision_failures_total{reason}` each time, and the namespaces failing now are
//! `provision_failing_namespaces` (issue 21, item 8: a pre-created account or binding, or a
//! terminating namespace, was retried every second with a WARN each time).
//!
//! Our own loop rather than a kube-runtime `Controller` over namespaces: what a namespace needs is
//! derived from the JobSet index, not from the namespace object.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kube::runtime::events::EventType;

use super::report::emit;
use super::state::{Shared, lock};
use crate::reconciler::{flow_schema, provision};
use crate::retry::Backoff;

/// How often the provisioner applies everything again.
const PROVISION_RESYNC: Duration = Duration::from_secs(600);
/// JobSets of one namespace told about its failure.
const EVENTS_PER_NAMESPACE: usize = 8;

/// Keeps every namespace's agent ServiceAccount and RoleBinding as the JobSets need them. Runs
/// on the leader, once the JobSet cache is complete (a partial view would drop subjects). A
/// binding no longer needed is removed once no pod of a JobSet is left in its namespace (one
/// removed under a running pod would strand its agent); the ServiceAccount stays.
pub(super) async fn provision_loop(shared: Arc<Shared>) {
    let Some(settings) = shared.settings.provision.clone() else {
        return;
    };
    let mut applied: HashMap<String, BTreeSet<String>> = HashMap::new();
    // The namespaces holding a binding of ours, as listed at each full pass (`None` until a
    // list succeeded) and kept up to date by what this loop applies and removes.
    let mut provisioned: Option<BTreeSet<String>> = None;
    let mut failures = provision::Failures::default();
    // The list of our bindings, when it fails: its own backoff.
    let mut list_backoff = Backoff::new(provision::RETRY_MIN, provision::RETRY_MAX);
    let mut list_due = Instant::now();
    let mut leader = shared.leader.clone();
    let mut last_full_pass = Instant::now();
    // The namespaces the agents' FlowSchema was last applied with, and its retries.
    let mut flow_applied: Option<BTreeSet<String>> = None;
    let mut flow_backoff = Backoff::new(provision::RETRY_MIN, provision::RETRY_MAX);
    let mut flow_due = Instant::now();
    let mut flow_said: Option<String> = None;
    loop {
        if leader.wait_for(|l| *l).await.is_err() {
            return;
        }
        // Every so often everything is applied again (a no-op unless someone removed or changed
        // it), so a deleted ServiceAccount or RoleBinding comes back.
        if last_full_pass.elapsed() > PROVISION_RESYNC {
            applied.clear();
            flow_applied = None;
            provisioned = None;
            last_full_pass = Instant::now();
        }
        if provisioned.is_none() && Instant::now() >= list_due {
            match shared
                .api
                .bounded(
                    "provision_list",
                    provision::list_provisioned(&shared.api.client),
                )
                .await
            {
                Ok(namespaces) => {
                    provisioned = Some(namespaces);
                    list_backoff.reset();
                }
                Err(e) => {
                    let retry_in = list_backoff.advance();
                    list_due = Instant::now() + retry_in;
                    tracing::warn!(error = ?e, ?retry_in, "cannot list the agent's role bindings; retrying");
                }
            }
        }
        if shared.jobsets_synced.load(Ordering::Acquire) {
            let named = lock(&shared.index).service_accounts_by_namespace();
            let enabled = lock(&shared.enabled_namespaces).clone();
            let desired = provision::desired_subjects(&named, &enabled, &settings);
            applied.retain(|ns, _| desired.contains_key(ns));
            failures.retain(|ns| {
                desired.contains_key(ns) || provisioned.as_ref().is_some_and(|p| p.contains(ns))
            });
            // Bindings no JobSet needs any longer go, once no pod of a JobSet is left in their
            // namespace (judged on a complete pod cache only).
            if shared.pods_synced.load(Ordering::Acquire)
                && let Some(known) = provisioned.as_mut()
            {
                let with_pods = lock(&shared.index).namespaces_with_pods();
                let stale: Vec<String> = provision::stale(known, &desired, &with_pods)
                    .into_iter()
                    .filter(|ns| failures.is_due(ns, Instant::now()))
                    .map(str::to_owned)
                    .collect();
                for namespace in stale {
                    let remove = provision::remove(&shared.api.client, &namespace);
                    match shared.api.fenced("provision_remove", remove).await {
                        Ok(()) => {
                            tracing::info!(namespace = %namespace, "agent role binding removed: no JobSet needs it");
                            known.remove(&namespace);
                            failures.succeeded(&namespace);
                        }
                        Err(e) => failed(&shared, &mut failures, &namespace, "remove", e.as_ref()),
                    }
                }
            }
            if let Some(name) = settings.flow_schema.as_deref() {
                let namespaces: BTreeSet<String> = desired.keys().cloned().collect();
                if flow_applied.as_ref() != Some(&namespaces) && Instant::now() >= flow_due {
                    let apply = flow_schema::apply(
                        &shared.api.client,
                        name,
                        &namespaces,
                        &settings.service_account,
                    );
                    match shared.api.fenced("flow_schema_apply", apply).await {
                        Ok(()) => {
                            tracing::info!(
                                flow_schema = name,
                                namespaces = namespaces.len(),
                                "the agents' FlowSchema follows the provisioned namespaces"
                            );
                            flow_applied = Some(namespaces);
                            flow_backoff.reset();
                            flow_said = None;
                        }
                        Err(e) => {
                            let retry_in = flow_backoff.advance();
                            flow_due = Instant::now() + retry_in;
                            let error = e.map_or_else(
                                || "the API server did not answer in time".to_owned(),
                                |e| e.to_string(),
                            );
                            // Said once per error, not at every retry.
                            if flow_said.as_deref() != Some(error.as_str()) {
                                tracing::warn!(flow_schema = name, %error, ?retry_in, "cannot apply the agents' FlowSchema (the chart creates it; is flowControl.agents.enabled off?): the agents' requests stay in the built-in service-accounts schema; retrying with backoff");
                                flow_said = Some(error);
                            }
                        }
                    }
                }
            }
            for (namespace, subjects) in desired {
                if applied.get(&namespace) == Some(&subjects)
                    || !failures.is_due(&namespace, Instant::now())
                {
                    continue;
                }
                let apply = provision::apply(&shared.api.client, &namespace, &subjects, &settings);
                match shared.api.fenced("provision_apply", apply).await {
                    Ok(()) => {
                        match failures.succeeded(&namespace) {
                            Some(n) => {
                                tracing::info!(namespace = %namespace, subjects = ?subjects, failures = n, "agent service account and role binding applied after failures")
                            }
                            None => {
                                tracing::info!(namespace = %namespace, subjects = ?subjects, "agent service account and role binding applied")
                            }
                        }
                        if let Some(p) = provisioned.as_mut() {
                            p.insert(namespace.clone());
                        }
                        applied.insert(namespace, subjects);
                    }
                    Err(e) => failed(&shared, &mut failures, &namespace, "provision", e.as_ref()),
                }
            }
        }
        shared
            .metrics
            .provision_failing_namespaces
            .set(i64::try_from(failures.len()).unwrap_or(i64::MAX));
        // Until the next failing namespace (or the list) is due, a change, or the resync.
        let now = Instant::now();
        let list_wait = provisioned.is_none().then_some(list_due);
        let flow_wait =
            (settings.flow_schema.is_some() && flow_applied.is_none()).then_some(flow_due);
        let wait = failures
            .next_due()
            .into_iter()
            .chain(list_wait)
            .chain(flow_wait)
            .min()
            .map_or(PROVISION_RESYNC, |due| due.saturating_duration_since(now))
            .min(PROVISION_RESYNC);
        let _ = tokio::time::timeout(wait, shared.provision_wake.notified()).await;
    }
}

/// One failed provisioning (`what`: `provision` or `remove`) of a namespace: counted, backed
/// off, and said when [`provision::Failures::failed`] says so.
fn failed(
    shared: &Shared,
    failures: &mut provision::Failures,
    namespace: &str,
    what: &str,
    error: Option<&kube::Error>,
) {
    let reason = provision::failure_reason(error);
    shared.metrics.provision_failure(reason);
    let plan = failures.failed(namespace, reason, Instant::now());
    let error = error.map_or_else(
        || "the API server did not answer in time".to_owned(),
        |e| match e {
            kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
            other => other.to_string(),
        },
    );
    if !plan.say {
        tracing::debug!(namespace, what, reason, %error, failures = plan.failures, retry_in = ?plan.retry_in, "agent provisioning still failing");
        return;
    }
    tracing::warn!(namespace, what, reason, %error, failures = plan.failures, retry_in = ?plan.retry_in, "cannot provision the agent's service account and role binding; retrying with backoff (said again only if the reason changes, or in 10 minutes)");
    if what != "provision" {
        return;
    }
    let hint = match reason {
        "conflict" => {
            "; a ServiceAccount or RoleBinding of that name that the reconciler did not make is left alone: remove it, or grant its account the agent role yourself"
        }
        "forbidden" => "; is the namespace being deleted?",
        _ => "",
    };
    let note = format!(
        "cannot provision the agent's ServiceAccount and RoleBinding jobset-inplace-agent in \
         namespace {namespace}: {reason}: {error}{hint}; the agents of this JobSet cannot register \
         until it is; retrying with backoff"
    );
    let note: String = note.chars().take(1000).collect();
    let index = lock(&shared.index);
    let keys: Vec<_> = index
        .in_place_restart_keys()
        .into_iter()
        .filter(|k| k.namespace == namespace)
        .take(EVENTS_PER_NAMESPACE)
        .collect();
    for key in keys {
        if let Some(state) = index.jobset(&key) {
            emit(
                shared,
                &key,
                state,
                EventType::Warning,
                "AgentProvisioningFailed",
                note.clone(),
            );
        }
    }
}
