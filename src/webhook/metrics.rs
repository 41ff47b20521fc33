//! The webhook's Prometheus metrics (docs/architecture.md, "Names": prefixed `jobset_inplace_`).

use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::admission::{Endpoint, ReviewOutcome};

/// The content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = crate::telemetry::METRICS_CONTENT_TYPE;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResponseLabels {
    endpoint: &'static str,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CutLabels {
    listener: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

const ENDPOINTS: [Endpoint; 2] = [Endpoint::Mutate, Endpoint::Validate];
const OUTCOMES: [ReviewOutcome; 4] = [
    ReviewOutcome::Allowed,
    ReviewOutcome::Denied,
    ReviewOutcome::Patched,
    ReviewOutcome::Error,
];

fn endpoint_index(endpoint: Endpoint) -> usize {
    match endpoint {
        Endpoint::Mutate => 0,
        Endpoint::Validate => 1,
    }
}

fn outcome_index(outcome: ReviewOutcome) -> usize {
    match outcome {
        ReviewOutcome::Allowed => 0,
        ReviewOutcome::Denied => 1,
        ReviewOutcome::Patched => 2,
        ReviewOutcome::Error => 3,
    }
}

/// Every metric of the webhook, registered in one registry.
///
/// - `jobset_inplace_admission_requests_total{endpoint,outcome}`: requests to `/mutate` and
///   `/validate` by outcome (`allowed`, `denied`, `patched`, `error`; HTTP-level rejections such as
///   413 and 415 count as `error`);
/// - `jobset_inplace_admission_duration_seconds{endpoint}`: time from the request's head to its
///   answer (reading the body included);
/// - `jobset_inplace_admission_responses_total{endpoint,code}`: HTTP status codes answered;
/// - `jobset_inplace_admission_in_flight_requests`: requests being answered;
/// - `jobset_inplace_tls_handshake_failures_total`: TLS handshakes that failed or timed out;
/// - `jobset_inplace_connections_open{listener}`: open connections (`https`, `health`);
/// - `jobset_inplace_connections_closed_by_server_total{listener,reason}`: connections the
///   server closed on its own: `header_timeout` (handshake or request head too slow),
///   `idle_timeout`, `evicted` (to make room under `--max-connections`);
/// - `jobset_inplace_connection_limit_reached_total{listener}`: times every connection slot was
///   taken and new connections had to wait;
/// - `jobset_inplace_tls_certificate_reloads_total{result}`: reloads of the serving certificate
///   (`success`, `failure`);
/// - `jobset_inplace_tls_certificate_loaded_timestamp_seconds`: when the serving certificate in
///   use was loaded;
/// - `jobset_inplace_build_info{version}`: always 1.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    // Pre-resolved children of the families: no family lock on the request path.
    requests: [[Counter; 4]; 2],
    duration: [Histogram; 2],
    responses: Family<ResponseLabels, Counter>,
    in_flight: Gauge,
    handshake_failures: Counter,
    https_connections: Gauge,
    health_connections: Gauge,
    closed_by_server: Family<CutLabels, Counter>,
    limit_reached: Family<ListenerLabels, Counter>,
    reloads: Family<ResultLabels, Counter>,
    cert_loaded: Gauge<f64, AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("jobset_inplace");

        let requests_family = Family::<RequestLabels, Counter>::default();
        registry.register(
            "admission_requests",
            "AdmissionReview requests answered, by endpoint and outcome",
            requests_family.clone(),
        );
        let requests = ENDPOINTS.map(|endpoint| {
            OUTCOMES.map(|outcome| {
                requests_family.get_or_create_owned(&RequestLabels {
                    endpoint: endpoint.as_str(),
                    outcome: outcome.as_str(),
                })
            })
        });

        let duration_family =
            Family::<EndpointLabels, Histogram>::new_with_constructor(new_duration_histogram);
        registry.register_with_unit(
            "admission_duration",
            "Time to answer an AdmissionReview request, reading the body included",
            Unit::Seconds,
            duration_family.clone(),
        );
        let duration = ENDPOINTS.map(|endpoint| {
            duration_family.get_or_create_owned(&EndpointLabels {
                endpoint: endpoint.as_str(),
            })
        });

        let responses = Family::<ResponseLabels, Counter>::default();
        registry.register(
            "admission_responses",
            "HTTP responses of /mutate and /validate, by status code",
            responses.clone(),
        );

        let in_flight = Gauge::default();
        registry.register(
            "admission_in_flight_requests",
            "AdmissionReview requests being answered",
            in_flight.clone(),
        );

        let handshake_failures = Counter::default();
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes that failed or timed out",
            handshake_failures.clone(),
        );

        let connections = Family::<Vec<(&'static str, &'static str)>, Gauge>::default();
        registry.register(
            "connections_open",
            "Open client connections, by listener",
            connections.clone(),
        );
        let https_connections = connections.get_or_create_owned(&vec![("listener", "https")]);
        let health_connections = connections.get_or_create_owned(&vec![("listener", "health")]);

        let closed_by_server = Family::<CutLabels, Counter>::default();
        registry.register(
            "connections_closed_by_server",
            "Connections the server closed on its own, by listener and reason (header_timeout, idle_timeout, evicted)",
            closed_by_server.clone(),
        );
        let limit_reached = Family::<ListenerLabels, Counter>::default();
        registry.register(
            "connection_limit_reached",
            "Times every connection slot of a listener was taken and new connections waited",
            limit_reached.clone(),
        );

        let reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tls_certificate_reloads",
            "Reloads of the serving certificate after its files changed, by result",
            reloads.clone(),
        );
        for result in ["success", "failure"] {
            let _ = reloads.get_or_create(&ResultLabels { result });
        }

        let cert_loaded = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "tls_certificate_loaded_timestamp",
            "Unix time the serving certificate in use was loaded",
            Unit::Seconds,
            cert_loaded.clone(),
        );

        let build_info = Family::<Vec<(&'static str, &'static str)>, Gauge>::default();
        build_info
            .get_or_create(&vec![("version", env!("CARGO_PKG_VERSION"))])
            .set(1);
        registry.register("build_info", "The running build", build_info);

        Metrics {
            registry,
            requests,
            duration,
            responses,
            in_flight,
            handshake_failures,
            https_connections,
            health_connections,
            closed_by_server,
            limit_reached,
            reloads,
            cert_loaded,
        }
    }

    /// Records one answered `/mutate` or `/validate` request.
    pub fn observe(
        &self,
        endpoint: Endpoint,
        outcome: ReviewOutcome,
        code: u16,
        elapsed: Duration,
    ) {
        let e = endpoint_index(endpoint);
        self.requests[e][outcome_index(outcome)].inc();
        self.duration[e].observe(elapsed.as_secs_f64());
        self.responses
            .get_or_create(&ResponseLabels {
                endpoint: endpoint.as_str(),
                code,
            })
            .inc();
    }

    /// Counts a request in flight until the guard is dropped.
    pub fn in_flight(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    /// Counts an open connection of a listener until the guard is dropped.
    pub fn connection(&self, tls: bool) -> InFlight {
        let gauge = if tls {
            &self.https_connections
        } else {
            &self.health_connections
        };
        gauge.inc();
        InFlight(gauge.clone())
    }

    /// Counts a connection the server closed on its own.
    pub fn connection_cut(&self, listener: &'static str, cut: crate::webhook::conn::Cut) {
        self.closed_by_server
            .get_or_create(&CutLabels {
                listener,
                reason: cut.as_str(),
            })
            .inc();
    }

    /// Counts a time every connection slot of `listener` was taken.
    pub fn connection_limit_reached(&self, listener: &'static str) {
        self.limit_reached
            .get_or_create(&ListenerLabels { listener })
            .inc();
    }

    pub fn handshake_failed(&self) {
        self.handshake_failures.inc();
    }

    /// Records a certificate (re)load.
    pub fn certificate_loaded(&self, initial: bool) {
        if !initial {
            self.reloads
                .get_or_create(&ResultLabels { result: "success" })
                .inc();
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.cert_loaded.set(now.as_secs_f64());
    }

    pub fn certificate_reload_failed(&self) {
        self.reloads
            .get_or_create(&ResultLabels { result: "failure" })
            .inc();
    }

    /// The metrics in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

fn new_duration_histogram() -> Histogram {
    // 50 µs .. ~1.6 s.
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

/// Decrements a gauge when dropped.
#[derive(Debug)]
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_and_counted() {
        let metrics = Metrics::new();
        metrics.observe(
            Endpoint::Mutate,
            ReviewOutcome::Patched,
            200,
            Duration::from_micros(300),
        );
        metrics.observe(
            Endpoint::Validate,
            ReviewOutcome::Error,
            415,
            Duration::from_micros(10),
        );
        let text = metrics.encode();
        assert!(
            text.contains(
                r#"jobset_inplace_admission_requests_total{endpoint="mutate",outcome="patched"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"jobset_inplace_admission_requests_total{endpoint="validate",outcome="error"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"jobset_inplace_admission_duration_seconds_count{endpoint="mutate"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"jobset_inplace_admission_responses_total{endpoint="validate",code="415"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains("jobset_inplace_build_info{version="),
            "{text}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("jobset_inplace_"), "{line}");
        }
    }
}
