//! Printing and replaying traces: a counterexample is shown step by step, and a recorded trace
//! (a list of actions) is replayed as a regression test.

use std::fmt::Write;

use super::{Action, Agent, Pod, ProtocolModel, RecPod, Seen, State, Status};
use stateright::Model;

fn show(e: Option<i32>) -> String {
    e.map_or_else(|| "-".to_owned(), |e| e.to_string())
}

fn pod(st: &State, i: usize, p: &Pod) -> String {
    if p.failed {
        let replaced = if p.replaced { ", replaced" } else { "" };
        return format!("pod{i}: Failed{replaced}");
    }
    let agent = match p.agent {
        Agent::Starting => "starting".to_owned(),
        Agent::Registering { epoch, read } => format!("registering {epoch} (read {read})"),
        Agent::Watching {
            epoch,
            view,
            decided,
            lifted,
        } => format!(
            "epoch {epoch}, {}, {} {view}",
            if lifted { "lifted" } else { "barrier up" },
            if decided { "acted on" } else { "delivered" },
        ),
        Agent::Exited => "exited".to_owned(),
        Agent::Gone => "gone".to_owned(),
    };
    let mut out = format!(
        "pod{i}: annotation {}, agent {agent}, worker {}",
        show(p.annotation),
        p.worker
            .map_or_else(|| "stopped".to_owned(), |e| format!("runs at {e}"))
    );
    if let Some(k) = p.worker.and_then(|w| ProtocolModel::doomed_by(st, p, w)) {
        let _ = write!(out, " (owes a restart since failure {})", k + 1);
    }
    if let Some(e) = p.late {
        let _ = write!(out, ", registration of {e} in flight");
    }
    if p.restarting {
        out.push_str(", AllContainersRestarting=True");
    }
    out
}

fn seen(r: &RecPod) -> String {
    let mut out = match r.seen {
        None => "?".to_owned(),
        Some(Seen { failed: true, .. }) => "Failed".to_owned(),
        Some(Seen { annotation, .. }) => show(annotation),
    };
    if r.seen.is_some_and(|s| s.restarting) {
        out.push_str(" restarting");
    }
    if r.begun {
        out.push_str(" (begun)");
    }
    if r.counted {
        out.push('*');
    }
    out
}

fn status(s: &Option<Status>) -> String {
    s.map_or_else(|| "?".to_owned(), |s| s.to_string())
}

/// A multi-line picture of one state.
pub fn state(s: &State) -> String {
    let mut out = format!(
        "  JobSet {}; published {}; reconciler sees {} and pods [{}] (* counted when it wrote S={})",
        s.status,
        status(&s.published),
        status(&s.rec_status),
        s.rec_pods.iter().map(seen).collect::<Vec<_>>().join(", "),
        show(s.rec_last_synced),
    );
    for (i, p) in s.pods.iter().enumerate() {
        let _ = write!(out, "\n  {}", pod(s, i, p));
    }
    if !s.rec_queue.is_empty() {
        let queue: Vec<String> = s
            .rec_queue
            .iter()
            .map(|(i, seen)| {
                format!(
                    "pod{i}={}",
                    self::seen(&RecPod {
                        seen: Some(*seen),
                        ..RecPod::default()
                    })
                )
            })
            .collect();
        let _ = write!(
            out,
            "\n  pod events on their way to the reconciler: {}",
            queue.join(", ")
        );
    }
    if s.violations != 0 {
        let _ = write!(out, "\n  violations: {:#06b}", s.violations);
    }
    out
}

/// A numbered trace: each action and the state after it.
pub fn render(model: &ProtocolModel, actions: &[Action]) -> String {
    let mut out = String::new();
    let states = replay(model, actions);
    let _ = writeln!(out, "initial state:\n{}", state(&states[0]));
    for (n, (a, s)) in actions.iter().zip(&states[1..]).enumerate() {
        let _ = writeln!(out, "{:>2}. {a:?}\n{}", n + 1, state(s));
    }
    out
}

/// The states a sequence of actions goes through, from the initial state. Panics when an
/// action is not enabled (a recorded trace that no longer applies).
pub fn replay(model: &ProtocolModel, actions: &[Action]) -> Vec<State> {
    let mut states = model.init_states();
    states.truncate(1);
    for (n, a) in actions.iter().enumerate() {
        let current = states.last().expect("an initial state");
        let next = model.step(current, *a).unwrap_or_else(|| {
            panic!(
                "step {} ({a:?}) is not enabled in\n{}",
                n + 1,
                state(current)
            )
        });
        states.push(next);
    }
    states
}
