//! Chaos mode: seeded random faults on every request that does not opt out.
//!
//! With [`Chaos`] set ([`super::TestApiServer::set_chaos`]), each request to a resource draws,
//! with the configured probabilities: a latency spike, then a `500 InternalError`, a
//! `429 TooManyRequests` with a `Retry-After` header (and `details.retryAfterSeconds`), or, for
//! writes, a `409 Conflict`; a write that passes may still have its answer replaced by a 500 after
//! it was applied (the ambiguous failure of a real API server whose response is lost). Every watch
//! opened is cut (its connection aborted mid-stream, as [`super::TestApiServer::cut_watches`]
//! does) after a random lifetime.
//!
//! The deterministic rules ([`super::TestApiServer::fail_next`], `set_latency`) still apply, and
//! come first: a request a rule fails draws nothing.
//!
//! **Randomness and replay.** Nothing is drawn from a shared stream: each request's decisions
//! are a hash of the seed, the request's identity (verb, resource, namespace, name, and for
//! collections the label and field selectors) and how many requests with that identity came
//! before. The 3rd PATCH of pod `p` meets the same fate in every run with the same seed, whatever
//! the other clients did in between. A replay with the seed reproduces the faults exactly as far
//! as the clients send the same requests; timing (backoff jitter, process scheduling) can make
//! them send more or fewer, after which the runs drift apart.
//!
//! **Exempt clients.** Requests with the header [`EXEMPT_HEADER`] (any value) draw nothing:
//! the simulated kubelet and controllers send it ([`super::TestApiServer::exempt_client`]), so
//! that faults hit the components under test (agents and reconciler) rather than the simulated
//! environment, whose real counterparts retry until they succeed.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use super::error::ApiError;
use super::faults::Verb;

/// The header that exempts a request from chaos.
pub const EXEMPT_HEADER: &str = "x-jobset-inplace-chaos-exempt";

/// What chaos mode injects. Probabilities are per request, in `0.0..=1.0`.
#[derive(Clone, Debug, PartialEq)]
pub struct Chaos {
    pub seed: u64,
    /// `500 InternalError` before the request is handled.
    pub error_500: f64,
    /// `409 Conflict` before a write (create, update, patch, delete) is handled.
    pub conflict_409: f64,
    /// `429 TooManyRequests` with `Retry-After: retry_after_secs`.
    pub throttle_429: f64,
    pub retry_after_secs: u32,
    /// A write is applied, but its answer is replaced by a 500.
    pub lost_response: f64,
    /// A delay drawn from `spike` before the request is handled.
    pub latency_spike: f64,
    pub spike: (Duration, Duration),
    /// Every watch is cut after a lifetime drawn from this range (`None`: watches are not cut).
    pub watch_lifetime: Option<(Duration, Duration)>,
}

impl Chaos {
    /// The default mix: 5% 500s, 5% 409s on writes, 3% 429s with `Retry-After: 1`, 2% lost
    /// responses on writes, 5% latency spikes of 20-300 ms, every watch cut within 0.1-2 s.
    pub fn new(seed: u64) -> Self {
        Chaos {
            seed,
            error_500: 0.05,
            conflict_409: 0.05,
            throttle_429: 0.03,
            retry_after_secs: 1,
            lost_response: 0.02,
            latency_spike: 0.05,
            spike: (Duration::from_millis(20), Duration::from_millis(300)),
            watch_lifetime: Some((Duration::from_millis(100), Duration::from_secs(2))),
        }
    }

    /// Nothing injected (a base for tests that want one kind of fault).
    pub fn none(seed: u64) -> Self {
        Chaos {
            seed,
            error_500: 0.0,
            conflict_409: 0.0,
            throttle_429: 0.0,
            retry_after_secs: 1,
            lost_response: 0.0,
            latency_spike: 0.0,
            spike: (Duration::ZERO, Duration::ZERO),
            watch_lifetime: None,
        }
    }
}

/// Faults injected so far, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChaosStats {
    /// Requests that drew (not exempt, not failed by a deterministic rule).
    pub requests: u64,
    /// Requests exempt by [`EXEMPT_HEADER`].
    pub exempt: u64,
    pub error_500: u64,
    pub conflict_409: u64,
    pub throttle_429: u64,
    pub lost_responses: u64,
    pub latency_spikes: u64,
    /// Watches opened with a lifetime, and those actually cut (the others ended first).
    pub watches: u64,
    pub watch_cuts: u64,
}

impl ChaosStats {
    /// Faults of every kind (latency spikes and watch cuts included).
    pub fn faults(&self) -> u64 {
        self.error_500
            + self.conflict_409
            + self.throttle_429
            + self.lost_responses
            + self.latency_spikes
            + self.watch_cuts
    }

    /// The sum of two runs' stats.
    pub fn add(&mut self, o: &ChaosStats) {
        self.requests += o.requests;
        self.exempt += o.exempt;
        self.error_500 += o.error_500;
        self.conflict_409 += o.conflict_409;
        self.throttle_429 += o.throttle_429;
        self.lost_responses += o.lost_responses;
        self.latency_spikes += o.latency_spikes;
        self.watches += o.watches;
        self.watch_cuts += o.watch_cuts;
    }
}

impl fmt::Display for ChaosStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} faults in {} requests ({} exempt): 500: {}, 409: {}, 429: {}, lost responses: {}, \
             latency spikes: {}, watch cuts: {} of {} watches",
            self.faults(),
            self.requests,
            self.exempt,
            self.error_500,
            self.conflict_409,
            self.throttle_429,
            self.lost_responses,
            self.latency_spikes,
            self.watch_cuts,
            self.watches
        )
    }
}

/// What chaos does to one request.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Plan {
    pub delay: Duration,
    pub error: Option<ApiError>,
    /// Apply the write, then answer 500.
    pub lose_response: bool,
    /// Cut the watch after this long.
    pub watch_cut: Option<Duration>,
}

/// Chaos mode's state: the config, and per request identity how many came before.
#[derive(Debug)]
pub(crate) struct ChaosState {
    config: Chaos,
    /// Request identity hash → requests seen with it. One entry per distinct object or query
    /// the clients touched, for the life of the chaos config.
    ordinals: HashMap<u64, u64>,
    stats: ChaosStats,
}

fn is_write(verb: Verb) -> bool {
    matches!(
        verb,
        Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection
    )
}

/// SplitMix64: a tiny, well-mixed generator; seeded per request.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        // Always draw, so that one decision's probability does not shift the others.
        let x = self.unit();
        x < p
    }

    fn between(&mut self, (lo, hi): (Duration, Duration)) -> Duration {
        let x = self.unit();
        if hi <= lo {
            return lo;
        }
        lo + (hi - lo).mul_f64(x)
    }
}

/// FNV-1a: a stable hash of a request's identity (std's hashers are randomly keyed).
fn fnv(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

impl ChaosState {
    pub(crate) fn new(config: Chaos) -> Self {
        ChaosState {
            config,
            ordinals: HashMap::new(),
            stats: ChaosStats::default(),
        }
    }

    pub(crate) fn stats(&self) -> ChaosStats {
        self.stats
    }

    pub(crate) fn exempt(&mut self) {
        self.stats.exempt += 1;
    }

    pub(crate) fn watch_cut(&mut self) {
        self.stats.watch_cuts += 1;
    }

    pub(crate) fn lost_response(&mut self) {
        self.stats.lost_responses += 1;
    }

    /// Draws the fate of a request. `identity` names what it addresses (resource counter name,
    /// namespace, name, selectors).
    pub(crate) fn plan(&mut self, verb: Verb, identity: &[&str]) -> Plan {
        let c = &self.config;
        let mut id = vec![verb.as_str()];
        id.extend_from_slice(identity);
        let key = fnv(&id);
        let ordinal = self.ordinals.entry(key).or_default();
        let n = *ordinal;
        *ordinal += 1;
        let mut rng =
            SplitMix(c.seed ^ key.rotate_left(29) ^ n.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        // Draw every decision in a fixed order.
        let spike = rng.chance(c.latency_spike);
        let spike_len = rng.between(c.spike);
        let e500 = rng.chance(c.error_500);
        let e429 = rng.chance(c.throttle_429);
        let e409 = rng.chance(c.conflict_409);
        let lose = rng.chance(c.lost_response);
        let lifetime = c.watch_lifetime.map(|range| rng.between(range));

        self.stats.requests += 1;
        let mut plan = Plan::default();
        if spike && !spike_len.is_zero() {
            self.stats.latency_spikes += 1;
            plan.delay = spike_len;
        }
        if e500 {
            self.stats.error_500 += 1;
            plan.error = Some(ApiError::from_code(500));
        } else if e429 {
            self.stats.throttle_429 += 1;
            plan.error = Some(ApiError::from_code(429).with_retry_after(c.retry_after_secs));
        } else if e409 && is_write(verb) {
            self.stats.conflict_409 += 1;
            plan.error = Some(ApiError::from_code(409));
        } else if lose && is_write(verb) {
            // Counted when the write succeeded and its answer was replaced.
            plan.lose_response = true;
        } else if verb == Verb::Watch && lifetime.is_some() {
            self.stats.watches += 1;
            plan.watch_cut = lifetime;
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plans(seed: u64, n: usize) -> Vec<Plan> {
        let mut s = ChaosState::new(Chaos::new(seed));
        (0..n)
            .map(|i| {
                let name = format!("p{}", i % 7);
                s.plan(Verb::Patch, &["pods", "ns", &name])
            })
            .collect()
    }

    #[test]
    fn a_seed_replays_and_seeds_differ() {
        assert_eq!(plans(7, 500), plans(7, 500));
        assert_ne!(plans(7, 500), plans(8, 500));
    }

    #[test]
    fn a_request_fate_does_not_depend_on_other_requests() {
        let mut a = ChaosState::new(Chaos::new(3));
        let mut b = ChaosState::new(Chaos::new(3));
        let mine: Vec<Plan> = (0..50)
            .map(|_| a.plan(Verb::Get, &["pods", "ns", "mine"]))
            .collect();
        let interleaved: Vec<Plan> = (0..50)
            .map(|i| {
                b.plan(Verb::Get, &["pods", "ns", &format!("other{i}")]);
                b.plan(Verb::Get, &["pods", "ns", "mine"])
            })
            .collect();
        assert_eq!(mine, interleaved);
    }

    #[test]
    fn rates_are_close_to_the_config() {
        let mut s = ChaosState::new(Chaos::new(11));
        for i in 0..20_000 {
            let verb = if i % 2 == 0 { Verb::Patch } else { Verb::Get };
            s.plan(verb, &["pods", "ns", &format!("p{}", i % 100)]);
        }
        let st = s.stats();
        let near = |n: u64, p: f64, of: f64| (n as f64 - p * of).abs() < 0.25 * p * of + 20.0;
        assert!(near(st.error_500, 0.05, 20_000.0), "{st}");
        assert!(near(st.throttle_429, 0.03 * 0.95, 20_000.0), "{st}");
        assert!(near(st.conflict_409, 0.05 * 0.92, 10_000.0), "{st}");
        assert!(near(st.latency_spikes, 0.05, 20_000.0), "{st}");
        assert_eq!(st.watches, 0, "no watch was opened");
    }

    #[test]
    fn conflicts_only_on_writes_and_cuts_only_on_watches() {
        let mut c = Chaos::none(1);
        c.conflict_409 = 1.0;
        c.watch_lifetime = Some((Duration::from_millis(5), Duration::from_millis(10)));
        let mut s = ChaosState::new(c);
        assert_eq!(
            s.plan(Verb::Patch, &["pods"]).error.map(|e| e.code),
            Some(409)
        );
        let get = s.plan(Verb::Get, &["pods"]);
        assert_eq!((get.error, get.watch_cut), (None, None));
        let watch = s.plan(Verb::Watch, &["pods"]);
        assert!(watch.error.is_none());
        let cut = watch.watch_cut.expect("a lifetime");
        assert!(cut >= Duration::from_millis(5) && cut <= Duration::from_millis(10));
        let mut c = Chaos::none(1);
        c.throttle_429 = 1.0;
        c.retry_after_secs = 3;
        let e = ChaosState::new(c)
            .plan(Verb::Get, &["pods"])
            .error
            .expect("429");
        assert_eq!((e.code, e.retry_after), (429, Some(3)));
    }
}
