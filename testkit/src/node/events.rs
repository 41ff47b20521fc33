//! The kubelet's Warning events for failed startup probes, written as the real kubelet writes
//! them: `reason: Unhealthy`, "Startup probe failed: …" (`pkg/kubelet/prober/prober.go`,
//! `probe`), through client-go's event recorder (`tools/record`, `EventCorrelator`): the first
//! one created, each identical one after it a patch of its `count` (the `EventLogger`'s
//! de-duplication), and at most 25 writes per pod at once, then one per 5 minutes (the
//! `EventSourceObjectSpamFilter`'s token bucket: burst 25, 1/300 per second). Measured on the
//! real node: 12 such events per waiting pod in a 20 s wait before the agent held its probe
//! (docs/protocol.md, "The held probe"): the test kit's node writes them too, so that a
//! measurement at scale pays what a real node's kubelet makes the API server pay.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The spam filter's burst.
pub(crate) const BURST: f64 = 25.0;
/// Its refill period: one token per 5 minutes.
pub(crate) const REFILL: Duration = Duration::from_secs(300);

/// What the recorder does with one failed probe of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// The first: create the Event (`count: 1`).
    Create,
    /// An identical one: patch the Event's `count` to this.
    Patch(i32),
    /// Over the spam filter's budget: not written.
    Dropped,
}

#[derive(Clone, Debug)]
struct Recorded {
    count: i32,
    tokens: f64,
    refilled: Instant,
}

/// Per pod (by UID): how many identical events were recorded, and the spam filter's tokens.
#[derive(Debug, Default)]
pub(crate) struct ProbeEvents {
    pods: BTreeMap<String, Recorded>,
}

impl ProbeEvents {
    /// A startup probe of pod `uid` failed at `now`.
    pub(crate) fn failed(&mut self, uid: &str, now: Instant) -> Write {
        let r = self.pods.entry(uid.to_owned()).or_insert(Recorded {
            count: 0,
            tokens: BURST,
            refilled: now,
        });
        let elapsed = now.saturating_duration_since(r.refilled).as_secs_f64();
        r.tokens = (r.tokens + elapsed / REFILL.as_secs_f64()).min(BURST);
        r.refilled = now;
        if r.tokens < 1.0 {
            return Write::Dropped;
        }
        r.tokens -= 1.0;
        r.count += 1;
        if r.count == 1 {
            Write::Create
        } else {
            Write::Patch(r.count)
        }
    }

    /// A pod is gone: forget it.
    pub(crate) fn forget(&mut self, uid: &str) {
        self.pods.remove(uid);
    }
}

/// The Event's name, as the kubelet's recorder makes it: the pod's name and a unique suffix (its
/// UID and the first failure's time here).
pub(crate) fn event_name(pod: &str, uid: &str) -> String {
    let short: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(10)
        .collect();
    format!("{pod}.unhealthy-{short}")
}

/// The Event the kubelet creates for a pod's first failed startup probe of its agent container.
pub(crate) fn event(
    namespace: &str,
    pod: &str,
    uid: &str,
    container: &str,
    node: &str,
    message: &str,
) -> serde_json::Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(pod, uid), "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod, "uid": uid,
            "fieldPath": format!("spec.initContainers{{{container}}}"),
        },
        "reason": "Unhealthy",
        "message": message,
        "type": "Warning",
        "source": {"component": "kubelet", "host": node},
        "reportingComponent": "kubelet",
        "reportingInstance": node,
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_events_are_one_event_counted_up_to_the_spam_filter_s_burst() {
        let mut e = ProbeEvents::default();
        let t0 = Instant::now();
        assert_eq!(e.failed("a", t0), Write::Create);
        for n in 2..=25 {
            assert_eq!(e.failed("a", t0), Write::Patch(n));
        }
        assert_eq!(e.failed("a", t0), Write::Dropped, "the 26th at once");
        // Another pod has a budget of its own.
        assert_eq!(e.failed("b", t0), Write::Create);
        // One token back after 5 minutes.
        let later = t0 + REFILL;
        assert_eq!(e.failed("a", later), Write::Patch(26));
        assert_eq!(e.failed("a", later), Write::Dropped);
        e.forget("a");
        assert_eq!(e.failed("a", later), Write::Create);
    }
}
