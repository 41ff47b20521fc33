//! The group-restart deadline (docs/protocol.md, "Deadline"): the pure decision of what the
//! reconciler does about a group restart that does not complete. No I/O, no clock: times are
//! [`Duration`]s since an origin the caller picks (the reconciler's start).
//!
//! A group restart starts when the deprecated epoch `D` is written and completes when the synced
//! epoch `S` is written above it ([`in_progress`]). The reconciler keeps, per JobSet, a
//! [`Clock`]: when it first saw the group restart in progress, and which step it took
//! ([`track`]). [`decide`] then says, from the clock, the JobSet and its pods:
//!
//! 1. once the timeout has passed since the start: delete the pods that have not registered an
//!    epoch above `D` ([`Action::DeleteUnregistered`]), so that their Jobs replace them;
//! 2. once the timeout has passed again since step 1: recreate every pod as JobSet's `Recreate`
//!    restart does, counted against `maxRestarts` ([`Action::Recreate`]), or fail the JobSet if
//!    that restart would pass `maxRestarts` ([`Action::Fail`]).
//!
//! The timeout comes from the reconciler's `--group-restart-timeout`, overridden per JobSet by
//! the annotation [`TIMEOUT_ANNOTATION`] ([`parse_timeout`], [`effective_timeout`]).
//! [`jobs_to_delete`] says which Jobs a recreation deletes, as JobSet's controller picks them.

use std::fmt;
use std::time::Duration;

use crate::protocol::{Epoch, EpochStatus, PodView, parse_epoch};

/// Annotation on a JobSet that overrides the reconciler's group-restart timeout for it.
pub const TIMEOUT_ANNOTATION: &str = "jobset-inplace.dev/group-restart-timeout";
/// The reconciler's `--group-restart-timeout` unless configured (docs/protocol.md, "Deadline",
/// says why two minutes).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest timeout accepted: the injected barrier probe gives up after a day anyway.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The shortest timeout accepted (but 0, off): a JobSet author cannot have the reconciler delete
/// and recreate pods faster than this.
pub const MIN_TIMEOUT: Duration = Duration::from_secs(1);
/// Label (and annotation) JobSet's controller sets on each child Job: the value of
/// `status.restarts` the Job was created for.
pub const RESTART_ATTEMPT_LABEL: &str = "jobset.sigs.k8s.io/restart-attempt";

/// A group restart is in progress: a deprecated epoch is written and the synced one is not
/// above it.
pub fn in_progress(status: EpochStatus) -> bool {
    match (status.deprecated, status.synced) {
        (Some(d), Some(s)) => s <= d,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

// ---------------------------------------------------------------------------------------------
// The timeout
// ---------------------------------------------------------------------------------------------

/// A timeout that is not a duration the deadline accepts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{value:?} is not a group-restart timeout: expected a duration like 90s, 5m or 1h30m (1s to \
     24h; 0 turns the deadline off)"
)]
pub struct TimeoutParseError {
    /// The value as written, cut at 64 characters.
    pub value: String,
}

/// Parses a timeout: a duration in the grammar of every flag and annotation
/// ([`crate::settings::parse_duration`]: `90s`, `2m`, `1h30m`, `1m30s`, `500ms`, a bare integer
/// of seconds), in whole milliseconds, from [`MIN_TIMEOUT`] to [`MAX_TIMEOUT`], or zero (`0`,
/// `0s`: off). `Ok(None)` means off. Never panics, whatever the text.
pub fn parse_timeout(text: &str) -> Result<Option<Duration>, TimeoutParseError> {
    let err = || TimeoutParseError {
        value: text.chars().take(64).collect(),
    };
    let text = text.trim();
    if text.len() > 32 {
        return Err(err());
    }
    let timeout = crate::settings::parse_duration(text).map_err(|_| err())?;
    if timeout > MAX_TIMEOUT
        || (!timeout.is_zero() && timeout < MIN_TIMEOUT)
        || timeout.subsec_nanos() % 1_000_000 != 0
    {
        return Err(err());
    }
    Ok((!timeout.is_zero()).then_some(timeout))
}

/// The timeout in force for a JobSet: its annotation's when it carries a valid one, else the
/// reconciler's `default` (`None`: off); a malformed annotation is returned too, to be reported.
pub fn effective_timeout(
    annotation: Option<&str>,
    default: Option<Duration>,
) -> (Option<Duration>, Option<TimeoutParseError>) {
    match annotation.map(parse_timeout) {
        None => (default, None),
        Some(Ok(timeout)) => (timeout, None),
        Some(Err(e)) => (default, Some(e)),
    }
}

/// A duration as [`parse_timeout`] reads it back: `2m`, `1m30s`, `1s500ms`, `250ms`.
pub fn display_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, milli) = (rest / 1_000, rest % 1_000);
    [(h, "h"), (m, "m"), (s, "s"), (milli, "ms")]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The clock
// ---------------------------------------------------------------------------------------------

/// The step a group restart's deadline has reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Within the first window: the group restart may still complete in place.
    Waiting,
    /// Step 1 done at `at`: the unregistered pods were deleted; their replacements have one more
    /// window.
    UnregisteredDeleted { at: Duration },
}

/// Where one JobSet's group restart stands, as the reconciler keeps it (in memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clock {
    /// When the group restart was first seen in progress (or the JobSet last recreated during
    /// it).
    pub started: Duration,
    /// `status.restarts` then: a recreation (ours or JobSet's own) starts a new clock.
    pub restarts: i32,
    /// The deprecated epoch first seen: the group restart is to the epoch above it.
    pub deprecated: Epoch,
    pub step: Step,
}

/// The clock after observing the JobSet's epoch fields and `status.restarts` at `now`: none
/// when no group restart is in progress; the same while it goes on; a new one when it starts or
/// when the JobSet was recreated since (a new `status.restarts`). A deprecated field that is gone
/// (another writer wiped it: JobSet's own controller drops the `epoch` dialect's fields it does
/// not know from every status it writes) is no news: the clock is kept until the field is written
/// again or the group restart is seen completed, so that wipes cannot postpone the deadline.
pub fn track(
    clock: Option<Clock>,
    status: EpochStatus,
    restarts: i32,
    now: Duration,
) -> Option<Clock> {
    let same = clock.filter(|c| c.restarts == restarts);
    let Some(deprecated) = status.deprecated.filter(|_| in_progress(status)) else {
        return same.filter(|_| status.deprecated.is_none());
    };
    same.or(Some(Clock {
        started: now,
        restarts,
        deprecated,
        step: Step::Waiting,
    }))
}

// ---------------------------------------------------------------------------------------------
// The decision
// ---------------------------------------------------------------------------------------------

/// A pod to delete: its name and the UID the decision saw (the delete's precondition).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    pub name: String,
    pub uid: String,
}

/// What the deadline asks for now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing: no group restart in progress, the deadline is off, or every expected pod has
    /// registered above the deprecated epoch (the synced epoch's write is due, not the pods).
    None,
    /// Look again after this long (never zero).
    WaitFor(Duration),
    /// Step 1: delete these pods (possibly none: the missing pods are not there to delete).
    DeleteUnregistered(Vec<PodRef>),
    /// Step 2: a JobSet restart, as JobSet's `Recreate`: write these counts, then delete the
    /// JobSet's Jobs of earlier restarts ([`jobs_to_delete`]).
    Recreate {
        restarts: i32,
        restarts_count_towards_max: i32,
    },
    /// Step 2 when the restart would pass `maxRestarts`: fail the JobSet.
    Fail {
        restarts_count_towards_max: i32,
        max_restarts: i32,
    },
}

/// What [`decide`] reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input<'a> {
    pub status: EpochStatus,
    /// Sum over replicatedJobs of `replicas * parallelism`.
    pub expected_pods: i64,
    pub pods: &'a [PodView],
    /// `status.restarts`.
    pub restarts: i32,
    /// `status.restartsCountTowardsMax`.
    pub restarts_count_towards_max: i32,
    /// `spec.failurePolicy.maxRestarts` (absent is 0).
    pub max_restarts: i32,
    /// The timeout in force; `None`: the deadline is off.
    pub timeout: Option<Duration>,
    /// The clock after [`track`] at `now`.
    pub clock: Option<Clock>,
    pub now: Duration,
}

/// The deadline's decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    /// How many counted pods (not failed, not terminating) have not registered an epoch above
    /// the deprecated one (none, a malformed one, or one at or below it).
    pub unregistered: usize,
    /// Those pods, by name, once the deadline acts (step 1 or 2); empty while it waits, so that
    /// the evaluations during a group restart of thousands of pods copy nothing.
    pub unregistered_pods: Vec<PodRef>,
    /// Expected pods that are not there (or failed, or terminating).
    pub missing: i64,
}

/// The deadline's decision for one JobSet. Pure; never panics, whatever the input.
pub fn decide(input: &Input<'_>) -> Decision {
    let mut decision = Decision {
        action: Action::None,
        unregistered: 0,
        unregistered_pods: Vec::new(),
        missing: 0,
    };
    let (Some(timeout), Some(clock), Some(deprecated)) =
        (input.timeout, input.clock, input.status.deprecated)
    else {
        return decision;
    };
    if !in_progress(input.status) {
        return decision;
    }
    let counted = || input.pods.iter().filter(|p| !p.failed && !p.terminating);
    let unregistered = |p: &&PodView| {
        p.epoch_annotation
            .as_deref()
            .and_then(|a| parse_epoch(a).ok())
            .is_none_or(|e| e <= deprecated)
    };
    decision.unregistered = counted().filter(unregistered).count();
    let present = i64::try_from(counted().count()).unwrap_or(i64::MAX);
    decision.missing = input.expected_pods.saturating_sub(present).max(0);
    if decision.unregistered == 0 && decision.missing == 0 {
        return decision;
    }
    let (from, last_step) = match clock.step {
        Step::Waiting => (clock.started, false),
        Step::UnregisteredDeleted { at } => (at, true),
    };
    let due = from.saturating_add(timeout);
    if input.now < due {
        decision.action = Action::WaitFor(due - input.now);
        return decision;
    }
    decision.unregistered_pods = counted()
        .filter(unregistered)
        .map(|p| PodRef {
            name: p.name.clone(),
            uid: p.uid.clone(),
        })
        .collect();
    decision.unregistered_pods.sort();
    decision.action = if !last_step {
        Action::DeleteUnregistered(decision.unregistered_pods.clone())
    } else {
        let count = i64::from(input.restarts_count_towards_max);
        let max = i64::from(input.max_restarts.max(0));
        match (
            input.restarts.checked_add(1),
            input.restarts_count_towards_max.checked_add(1),
        ) {
            (Some(restarts), Some(restarts_count_towards_max)) if count < max => Action::Recreate {
                restarts,
                restarts_count_towards_max,
            },
            _ => Action::Fail {
                restarts_count_towards_max: input.restarts_count_towards_max,
                max_restarts: input.max_restarts,
            },
        }
    };
    decision
}

/// `a, b, c and 5 more`: at most `max` names of a list, for an event.
pub fn name_list<S: AsRef<str>>(names: &[S], max: usize) -> String {
    let shown: Vec<&str> = names.iter().take(max).map(AsRef::as_ref).collect();
    let rest = names.len().saturating_sub(shown.len());
    match (shown.is_empty(), rest) {
        (true, _) => "none".to_owned(),
        (false, 0) => shown.join(", "),
        (false, n) => format!("{} and {n} more", shown.join(", ")),
    }
}

// ---------------------------------------------------------------------------------------------
// Recreation: which Jobs go
// ---------------------------------------------------------------------------------------------

/// What a recreation reads of one Job of the JobSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobView<'a> {
    pub name: &'a str,
    pub uid: &'a str,
    /// The UID of its controller owner reference (a JobSet owns its Jobs through one).
    pub controller_uid: Option<&'a str>,
    /// Its [`RESTART_ATTEMPT_LABEL`], as written.
    pub restart_attempt: Option<&'a str>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
}

/// A Job to delete: its name and UID (the delete's precondition).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRef {
    pub name: String,
    pub uid: String,
}

/// The Jobs a JobSet restart to `restarts` deletes, as JobSet's controller picks them: those the
/// JobSet (by UID) controls whose restart-attempt label is below `restarts`, or is not a number
/// (JobSet's controller treats both as a previous run's), and that are not already being
/// deleted.
pub fn jobs_to_delete(jobs: &[JobView<'_>], jobset_uid: &str, restarts: i32) -> Vec<JobRef> {
    if jobset_uid.is_empty() {
        return Vec::new();
    }
    jobs.iter()
        .filter(|j| j.controller_uid == Some(jobset_uid) && !j.deleting)
        .filter(|j| {
            j.restart_attempt
                .and_then(|a| a.trim().parse::<i64>().ok())
                .is_none_or(|a| a < i64::from(restarts))
        })
        .map(|j| JobRef {
            name: j.name.to_owned(),
            uid: j.uid.to_owned(),
        })
        .collect()
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Waiting => f.write_str("waiting"),
            Step::UnregisteredDeleted { .. } => f.write_str("unregistered pods deleted"),
        }
    }
}

#[cfg(test)]
mod tests;
