//! The webhook's Prometheus metrics (docs/architecture.md, "Names": prefixed `jobset_inplace_`).

use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use rustls::pki_types::CertificateDer;

use crate::admission::{Endpoint, ReviewOutcome, Rule};
use crate::certs::not_after;

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DenialLabels {
    endpoint: &'static str,
    rule: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    certificate: &'static str,
}

/// The `rule` label of a denial that breaks no rule of [`Rule`] (a malformed request or object).
/// The label's other values are [`Rule::label`]: a closed list, bounded whatever is sent.
pub const RULE_REQUEST: &str = "request";

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
/// - `jobset_inplace_admission_denials_total{endpoint,rule}`: denied requests by the rule they
///   broke ([`Rule::label`], `request`); a request breaking two rules counts once for each;
/// - `jobset_inplace_admission_responses_total{endpoint,code}`: HTTP status codes answered;
/// - `jobset_inplace_admission_in_flight_requests`: requests being answered;
/// - `jobset_inplace_tls_handshake_failures_total`: TLS handshakes that failed or timed out;
/// - `jobset_inplace_connections_open{listener}`: open connections (`https`, `health`);
/// - `jobset_inplace_connections_closed_by_server_total{listener,reason}`: connections the
///   server closed on its own: `header_timeout` (handshake or request head too slow),
///   `idle_timeout`, `evicted` (to make room under `--max-connections`), `slow_reader` (an
///   answer not taken at the floor rate, [`crate::serving::conn::MIN_ANSWER_BYTES_PER_SEC`]);
/// - `jobset_inplace_connection_limit_reached_total{listener}`: times every connection slot was
///   taken and new connections had to wait;
/// - `jobset_inplace_tls_certificate_reloads_total{result}`: reloads of the serving certificate
///   (`success`, `failure`);
/// - `jobset_inplace_tls_certificate_loaded_timestamp_seconds`: when the serving certificate in
///   use was loaded;
/// - `jobset_inplace_tls_certificate_not_after_seconds{certificate}`: when the certificates in
///   use expire, as Unix time: `serving` (the leaf) and `chain` (the earliest of every
///   certificate served, the CA or intermediates included when the certificate file carries
///   them; the same as `serving` when it holds the leaf alone); with `--self-signed` also `ca`
///   (the CA that signs the serving certificate) and, during the first phase of a CA rotation,
///   `ca_next` (the CA that will), as the last Secret read says;
/// - `jobset_inplace_tls_certificate_renewal_checks_total{result}`: `--self-signed` reads of
///   the Secret that brought it, the caBundle and the files up to date (`success`), or failed
///   (`failure`, retried with backoff);
/// - `jobset_inplace_build_info{version}`: always 1.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    // Pre-resolved children of the families: no family lock on the request path.
    requests: [[Counter; 4]; 2],
    duration: [Histogram; 2],
    responses: Family<ResponseLabels, Counter>,
    denials: Family<DenialLabels, Counter>,
    in_flight: Gauge,
    handshake_failures: Counter,
    https_connections: Gauge,
    health_connections: Gauge,
    closed_by_server: Family<CutLabels, Counter>,
    limit_reached: Family<ListenerLabels, Counter>,
    reloads: Family<ResultLabels, Counter>,
    cert_loaded: Gauge<f64, AtomicU64>,
    cert_not_after: Family<CertificateLabels, Gauge>,
    renewal_checks: Family<ResultLabels, Counter>,
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

        let denials = Family::<DenialLabels, Counter>::default();
        registry.register(
            "admission_denials",
            "AdmissionReview requests denied, by endpoint and the validation rule broken",
            denials.clone(),
        );
        let rule_names = Rule::ALL.iter().map(|r| r.label()).chain([RULE_REQUEST]);
        for rule in rule_names {
            for endpoint in ENDPOINTS {
                let _ = denials.get_or_create(&DenialLabels {
                    endpoint: endpoint.as_str(),
                    rule,
                });
            }
        }

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
            "Connections the server closed on its own, by listener and reason (header_timeout, idle_timeout, evicted, slow_reader)",
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

        let cert_not_after = Family::<CertificateLabels, Gauge>::default();
        registry.register_with_unit(
            "tls_certificate_not_after",
            "Unix time the certificates in use expire: the serving certificate, and the earliest of its chain",
            Unit::Seconds,
            cert_not_after.clone(),
        );

        let renewal_checks = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tls_certificate_renewal_checks",
            "Checks of the self-signed certificates' Secret, caBundle and files, by result",
            renewal_checks.clone(),
        );
        for result in ["success", "failure"] {
            let _ = renewal_checks.get_or_create(&ResultLabels { result });
        }

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
            denials,
            in_flight,
            handshake_failures,
            https_connections,
            health_connections,
            closed_by_server,
            limit_reached,
            reloads,
            cert_loaded,
            cert_not_after,
            renewal_checks,
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

    /// Counts a denied request once for each rule it breaks (its decision's [`Rule`]s, each
    /// once), or as [`RULE_REQUEST`] when it breaks none.
    pub fn denied(&self, endpoint: Endpoint, rules: &[Rule]) {
        let labels = rules.iter().map(|r| r.label());
        let request = rules.is_empty().then_some(RULE_REQUEST);
        for rule in labels.chain(request) {
            self.denials
                .get_or_create(&DenialLabels {
                    endpoint: endpoint.as_str(),
                    rule,
                })
                .inc();
        }
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
    pub fn connection_cut(&self, listener: &'static str, cut: crate::serving::conn::Cut) {
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

    /// Records a certificate (re)load, and when the loaded `chain` (leaf first) expires.
    pub fn certificate_loaded(&self, initial: bool, chain: &[CertificateDer<'_>]) {
        if !initial {
            self.reloads
                .get_or_create(&ResultLabels { result: "success" })
                .inc();
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.cert_loaded.set(now.as_secs_f64());
        let expiries: Vec<i64> = chain.iter().filter_map(|c| not_after(c)).collect();
        if let Some(serving) = chain.first().and_then(|c| not_after(c)) {
            self.cert_not_after
                .get_or_create(&CertificateLabels {
                    certificate: "serving",
                })
                .set(serving);
        }
        if let Some(earliest) = expiries.iter().min() {
            self.cert_not_after
                .get_or_create(&CertificateLabels {
                    certificate: "chain",
                })
                .set(*earliest);
        }
    }

    /// Records a successful check of the self-signed certificates: when the signing CA and the
    /// next CA expire (a missing one's series is removed).
    pub fn renewal_check_succeeded(
        &self,
        ca_not_after: Option<i64>,
        next_ca_not_after: Option<i64>,
    ) {
        self.renewal_checks
            .get_or_create(&ResultLabels { result: "success" })
            .inc();
        for (certificate, not_after) in [("ca", ca_not_after), ("ca_next", next_ca_not_after)] {
            let labels = CertificateLabels { certificate };
            match not_after {
                Some(at) => {
                    self.cert_not_after.get_or_create(&labels).set(at);
                }
                None => {
                    self.cert_not_after.remove(&labels);
                }
            }
        }
    }

    /// Counts a failed check of the self-signed certificates.
    pub fn renewal_check_failed(&self) {
        self.renewal_checks
            .get_or_create(&ResultLabels { result: "failure" })
            .inc();
    }

    pub fn certificate_reload_failed(&self) {
        self.reloads
            .get_or_create(&ResultLabels { result: "failure" })
            .inc();
    }

    /// The metrics in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        // With the process's and the API client's series.
        crate::telemetry::encode(&self.registry)
    }
}

fn new_duration_histogram() -> Histogram {
    // 50 µs .. ~1.6 s doubling, then 2.5, 5 and 10 s: the API server gives up on a webhook call
    // after its timeout (5 s in deploy/base/webhook-configurations.yaml, 10 s at most), and a
    // request near it must land in a bucket of its own, not in +Inf.
    Histogram::new(exponential_buckets(0.00005, 2.0, 16).chain([2.5, 5.0, 10.0]))
}

/// The listeners' connections, counted (`crate::serving` reports them through this).
impl crate::serving::Events for Metrics {
    fn connection(&self, tls: bool) -> Box<dyn Send> {
        Box::new(Metrics::connection(self, tls))
    }
    fn connection_cut(&self, listener: &'static str, cut: crate::serving::conn::Cut) {
        Metrics::connection_cut(self, listener, cut);
    }
    fn connection_limit_reached(&self, listener: &'static str) {
        Metrics::connection_limit_reached(self, listener);
    }
    fn handshake_failed(&self) {
        Metrics::handshake_failed(self);
    }
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
        // The process's own series (`process_*`, as every Prometheus client library names
        // them) are the only others.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(
                line.starts_with("jobset_inplace_") || line.starts_with("process_"),
                "{line}"
            );
        }
        assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");
    }

    #[test]
    fn latency_buckets_cover_the_webhook_timeout() {
        let metrics = Metrics::new();
        metrics.observe(
            Endpoint::Validate,
            ReviewOutcome::Allowed,
            200,
            Duration::from_millis(4_900),
        );
        let text = metrics.encode();
        for le in ["2.5", "5.0", "10.0"] {
            assert!(
                text.contains(&format!(
                    "jobset_inplace_admission_duration_seconds_bucket{{le=\"{le}\",endpoint=\"validate\"}}"
                )),
                "{le}: {text}"
            );
        }
        assert!(
            text.contains(
                r#"jobset_inplace_admission_duration_seconds_bucket{le="2.5",endpoint="validate"} 0"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"jobset_inplace_admission_duration_seconds_bucket{le="5.0",endpoint="validate"} 1"#
            ),
            "{text}"
        );
    }

    #[test]
    fn denials_count_each_rule_once_and_bounded() {
        let metrics = Metrics::new();
        metrics.denied(
            Endpoint::Validate,
            &[Rule::BackoffLimit, Rule::AgentMissing, Rule::TokenVolume],
        );
        metrics.denied(Endpoint::Validate, &[]);
        let text = metrics.encode();
        for (rule, n) in [
            ("backoff_limit", 1),
            ("agent_missing", 1),
            ("token_volume", 1),
            ("request", 1),
            ("completions", 0),
        ] {
            let line = format!(
                "jobset_inplace_admission_denials_total{{endpoint=\"validate\",rule=\"{rule}\"}} {n}"
            );
            assert!(text.contains(&line), "{line}\n{text}");
        }
        let series = text
            .lines()
            .filter(|l| l.starts_with("jobset_inplace_admission_denials_total{"))
            .count();
        assert_eq!(series, 2 * (Rule::ALL.len() + 1), "{text}");
    }

    /// Every rule has its metric label from the start (at 0), so a new rule's denials are
    /// counted under its own name and a dashboard sees it before the first denial.
    #[test]
    fn every_rule_has_a_denial_series_from_the_start() {
        let text = Metrics::new().encode();
        for rule in Rule::ALL {
            for endpoint in ["mutate", "validate"] {
                let line = format!(
                    "jobset_inplace_admission_denials_total{{endpoint=\"{endpoint}\",rule=\"{}\"}} 0",
                    rule.label()
                );
                assert!(text.contains(&line), "{line}\n{text}");
            }
        }
    }

    #[test]
    fn not_after_is_read_from_the_certificate() {
        let ca = crate::certs::generate_ca(Duration::from_secs(400 * 86_400)).expect("ca");
        let chain = crate::certs::parse_certs(ca.cert.as_bytes(), std::path::Path::new("ca.crt"))
            .expect("parse");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs() as i64;
        let got = not_after(&chain[0]).expect("not after");
        assert!(
            (got - (now + 400 * 86_400)).abs() < 3_600,
            "{got} vs {now} + 400 days"
        );
        assert_eq!(not_after(b"\x30\x03\x02\x01"), None);
        let metrics = Metrics::new();
        metrics.certificate_loaded(true, &chain);
        let text = metrics.encode();
        assert!(
            text.contains(&format!(
                "jobset_inplace_tls_certificate_not_after_seconds{{certificate=\"serving\"}} {got}"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "jobset_inplace_tls_certificate_not_after_seconds{{certificate=\"chain\"}} {got}"
            )),
            "{text}"
        );
    }

    #[test]
    fn ca_expiries_follow_the_renewal_checks() {
        let metrics = Metrics::new();
        let gauge = |text: &str, certificate: &str| {
            let prefix = format!(
                "jobset_inplace_tls_certificate_not_after_seconds{{certificate=\"{certificate}\"}} "
            );
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
        };
        let checks = |text: &str, result: &str| {
            let line = format!(
                "jobset_inplace_tls_certificate_renewal_checks_total{{result=\"{result}\"}} "
            );
            text.lines()
                .find_map(|l| l.strip_prefix(&line).map(str::to_owned))
        };
        let text = metrics.encode();
        assert_eq!(
            gauge(&text, "ca"),
            None,
            "no CA series before a check: {text}"
        );
        assert_eq!(checks(&text, "success").as_deref(), Some("0"));
        assert_eq!(checks(&text, "failure").as_deref(), Some("0"));

        metrics.renewal_check_succeeded(Some(2_000_000_000), Some(2_100_000_000));
        let text = metrics.encode();
        assert_eq!(gauge(&text, "ca").as_deref(), Some("2000000000"));
        assert_eq!(gauge(&text, "ca_next").as_deref(), Some("2100000000"));
        // The rotation's switch: one CA again, the next one's series gone.
        metrics.renewal_check_succeeded(Some(2_100_000_000), None);
        metrics.renewal_check_failed();
        let text = metrics.encode();
        assert_eq!(gauge(&text, "ca").as_deref(), Some("2100000000"));
        assert_eq!(gauge(&text, "ca_next"), None, "{text}");
        assert_eq!(checks(&text, "success").as_deref(), Some("2"));
        assert_eq!(checks(&text, "failure").as_deref(), Some("1"));
    }
}
