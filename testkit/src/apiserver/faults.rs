//! Request verbs, request counters and fault injection.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::error::ApiError;

/// The Kubernetes verb of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    pub const ALL: [Verb; 8] = [
        Verb::Get,
        Verb::List,
        Verb::Watch,
        Verb::Create,
        Verb::Update,
        Verb::Patch,
        Verb::Delete,
        Verb::DeleteCollection,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A snapshot of the request counters: requests by verb and resource, where the resource is the
/// server's short name (`pods`, `jobsets`, `leases`, `events.events.k8s.io`, ...) with
/// `/status` appended for the status subresource. Every request the resource handlers receive
/// counts, including those answered with an injected fault; discovery requests do not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub by: BTreeMap<(Verb, String), u64>,
}

impl Counters {
    /// Requests with this verb on this resource (exactly; `pods` does not include
    /// `pods/status`).
    pub fn get(&self, verb: Verb, resource: &str) -> u64 {
        self.by
            .get(&(verb, resource.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// All requests.
    pub fn total(&self) -> u64 {
        self.by.values().sum()
    }

    /// Requests with this verb on any resource.
    pub fn verb(&self, verb: Verb) -> u64 {
        self.by
            .iter()
            .filter(|((v, _), _)| *v == verb)
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests of any verb on this resource or its subresources (`pods` counts `pods/status`).
    pub fn resource(&self, resource: &str) -> u64 {
        self.by
            .iter()
            .filter(|((_, r), _)| {
                r == resource
                    || r.strip_prefix(resource)
                        .is_some_and(|rest| rest.starts_with('/'))
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// Writes (create, update, patch, delete, deletecollection) on any resource.
    pub fn writes(&self) -> u64 {
        [
            Verb::Create,
            Verb::Update,
            Verb::Patch,
            Verb::Delete,
            Verb::DeleteCollection,
        ]
        .into_iter()
        .map(|v| self.verb(v))
        .sum()
    }

    /// What happened since `earlier` (counters only grow between resets).
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            by: self
                .by
                .iter()
                .map(|(k, n)| {
                    (
                        k.clone(),
                        n.saturating_sub(earlier.by.get(k).copied().unwrap_or(0)),
                    )
                })
                .filter(|(_, n)| *n > 0)
                .collect(),
        }
    }
}

impl fmt::Display for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for ((verb, res), n) in &self.by {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{verb} {res}: {n}")?;
        }
        Ok(())
    }
}

/// Which requests a fault or latency rule applies to. `None` matches anything; a resource
/// matches exactly (`pods` is not `pods/status`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Matcher {
    pub verb: Option<Verb>,
    pub resource: Option<String>,
}

impl Matcher {
    pub fn any() -> Self {
        Matcher::default()
    }

    pub fn new(verb: impl Into<Option<Verb>>, resource: Option<&str>) -> Self {
        Matcher {
            verb: verb.into(),
            resource: resource.map(str::to_owned),
        }
    }

    pub(crate) fn matches(&self, verb: Verb, resource: &str) -> bool {
        self.verb.is_none_or(|v| v == verb)
            && self.resource.as_deref().is_none_or(|r| r == resource)
    }

    /// Number of requirements (more is more specific).
    fn specificity(&self) -> u8 {
        u8::from(self.verb.is_some()) + u8::from(self.resource.is_some())
    }
}

/// An injected failure for the next `remaining` matching requests.
#[derive(Clone, Debug)]
pub struct FaultRule {
    pub matcher: Matcher,
    pub remaining: u32,
    pub error: ApiError,
}

/// Fault injection state.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    rules: Vec<FaultRule>,
    latency: Vec<(Matcher, Duration)>,
    /// Requests that are accepted and never answered (a watch gets its 200 and then nothing,
    /// not even a bookmark): the faults that do not end, as a peer that went silent without a
    /// FIN or RST looks to a client. `(matcher, remaining uses)`.
    silent: Vec<(Matcher, u32)>,
    /// Clients (by [`super::CLIENT_HEADER`]) whose matching requests go unanswered until the
    /// faults are cleared: a server that stops answering one client while it answers others.
    silent_clients: Vec<(String, Matcher)>,
}

impl Faults {
    pub(crate) fn add(&mut self, rule: FaultRule) {
        if rule.remaining > 0 {
            self.rules.push(rule);
        }
    }

    /// The injected error for this request, if a rule matches (consuming one of its uses).
    pub(crate) fn take(&mut self, verb: Verb, resource: &str) -> Option<ApiError> {
        let i = self
            .rules
            .iter()
            .position(|r| r.matcher.matches(verb, resource))?;
        let rule = &mut self.rules[i];
        rule.remaining = rule.remaining.saturating_sub(1);
        let err = rule.error.clone();
        if rule.remaining == 0 {
            self.rules.remove(i);
        }
        Some(err)
    }

    pub(crate) fn add_silent(&mut self, m: Matcher, n: u32) {
        if n > 0 {
            self.silent.push((m, n));
        }
    }

    pub(crate) fn silence_client(&mut self, client: &str, m: Matcher) {
        self.silent_clients.push((client.to_owned(), m));
    }

    /// Whether this client's request is to go unanswered.
    pub(crate) fn client_silenced(&self, client: Option<&str>, verb: Verb, resource: &str) -> bool {
        client.is_some_and(|c| {
            self.silent_clients
                .iter()
                .any(|(who, m)| who == c && m.matches(verb, resource))
        })
    }

    /// Whether this request is to go unanswered (consuming one use of the matching rule).
    pub(crate) fn take_silent(&mut self, verb: Verb, resource: &str) -> bool {
        let Some(i) = self
            .silent
            .iter()
            .position(|(m, _)| m.matches(verb, resource))
        else {
            return false;
        };
        self.silent[i].1 -= 1;
        if self.silent[i].1 == 0 {
            self.silent.remove(i);
        }
        true
    }

    pub(crate) fn clear(&mut self) {
        self.rules.clear();
        self.latency.clear();
        self.silent.clear();
        self.silent_clients.clear();
    }

    /// Sets (or, with zero, removes) the latency for requests matching `m`.
    pub(crate) fn set_latency(&mut self, m: Matcher, d: Duration) {
        self.latency.retain(|(x, _)| *x != m);
        if !d.is_zero() {
            self.latency.push((m, d));
        }
    }

    /// The latency of a request: that of the most specific matching rule.
    pub(crate) fn latency(&self, verb: Verb, resource: &str) -> Duration {
        self.latency
            .iter()
            .filter(|(m, _)| m.matches(verb, resource))
            .max_by_key(|(m, _)| m.specificity())
            .map(|(_, d)| *d)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_consumed_in_order() {
        let mut f = Faults::default();
        f.add(FaultRule {
            matcher: Matcher::new(Verb::Patch, Some("pods")),
            remaining: 2,
            error: ApiError::from_code(500),
        });
        f.add(FaultRule {
            matcher: Matcher::any(),
            remaining: 1,
            error: ApiError::from_code(503),
        });
        assert_eq!(f.take(Verb::Get, "pods").map(|e| e.code), Some(503));
        assert_eq!(f.take(Verb::Get, "pods").map(|e| e.code), None);
        assert_eq!(f.take(Verb::Patch, "pods/status").map(|e| e.code), None);
        assert_eq!(f.take(Verb::Patch, "pods").map(|e| e.code), Some(500));
        assert_eq!(f.take(Verb::Patch, "pods").map(|e| e.code), Some(500));
        assert_eq!(f.take(Verb::Patch, "pods").map(|e| e.code), None);
    }

    #[test]
    fn silent_rules_are_consumed() {
        let mut f = Faults::default();
        f.add_silent(Matcher::new(Verb::Watch, Some("jobsets")), 2);
        assert!(!f.take_silent(Verb::Watch, "pods"));
        assert!(f.take_silent(Verb::Watch, "jobsets"));
        assert!(f.take_silent(Verb::Watch, "jobsets"));
        assert!(!f.take_silent(Verb::Watch, "jobsets"));
        f.add_silent(Matcher::any(), 1);
        f.clear();
        assert!(!f.take_silent(Verb::Get, "pods"));
        f.silence_client("r1", Matcher::new(None, Some("leases")));
        assert!(f.client_silenced(Some("r1"), Verb::Update, "leases"));
        assert!(f.client_silenced(Some("r1"), Verb::Get, "leases"));
        assert!(!f.client_silenced(Some("r1"), Verb::Patch, "jobsets/status"));
        assert!(!f.client_silenced(Some("r2"), Verb::Update, "leases"));
        assert!(!f.client_silenced(None, Verb::Update, "leases"));
    }

    #[test]
    fn most_specific_latency_wins() {
        let mut f = Faults::default();
        f.set_latency(Matcher::any(), Duration::from_millis(5));
        f.set_latency(
            Matcher::new(Verb::List, Some("pods")),
            Duration::from_millis(50),
        );
        assert_eq!(f.latency(Verb::List, "pods"), Duration::from_millis(50));
        assert_eq!(f.latency(Verb::Get, "pods"), Duration::from_millis(5));
        f.set_latency(Matcher::any(), Duration::ZERO);
        assert_eq!(f.latency(Verb::Get, "pods"), Duration::ZERO);
    }

    #[test]
    fn counters_sum() {
        let mut c = Counters::default();
        c.by.insert((Verb::Patch, "pods".into()), 3);
        c.by.insert((Verb::Patch, "pods/status".into()), 2);
        c.by.insert((Verb::List, "jobsets".into()), 1);
        assert_eq!(c.get(Verb::Patch, "pods"), 3);
        assert_eq!(c.resource("pods"), 5);
        assert_eq!(c.verb(Verb::Patch), 5);
        assert_eq!(c.writes(), 5);
        assert_eq!(c.total(), 6);
        let mut later = c.clone();
        later.by.insert((Verb::List, "jobsets".into()), 4);
        assert_eq!(later.since(&c).total(), 3);
        assert_eq!(
            c.to_string(),
            "list jobsets: 1, patch pods: 3, patch pods/status: 2"
        );
    }
}
