//! `/metrics` over HTTPS behind the API server's authentication and authorization, as JobSet
//! and Kueue serve theirs (controller-runtime's `filters.WithAuthenticationAndAuthorization`):
//! the bearer token of each scrape goes to a TokenReview; the user it names goes to a
//! SubjectAccessReview for `get` on the non-resource URL `/metrics`. No token: 401. A token the
//! API server does not accept: 401. A user without that permission: 403. A review that fails
//! or does not answer in time: 500. Plain HTTP (the health listener's `/metrics`, no review) is
//! the explicit choice `--metrics-secure=false`.
//!
//! Bounded: each review has a timeout ([`GateSettings::review_timeout`]); at most
//! [`GateSettings::concurrent_reviews`] reviews are in flight (a scrape that finds none free
//! within the timeout gets 500); verdicts are cached per token for a short time (allowed and
//! unauthenticated 60 s, forbidden 30 s: controller-runtime caches a TokenReview 1 min, an
//! allowed SubjectAccessReview 5 min and a denied one 30 s), at most
//! [`GateSettings::max_cached`] tokens, the oldest dropped first; a failed review is not
//! cached. A token is at most the request head (the listener's head limit).
//!
//! The certificate: generated in memory at start (a CA and a serving certificate from
//! [`crate::certs`], for `localhost` and the pod's host name), as controller-runtime does when
//! no certificate directory is given; scrapers skip verification as JobSet's and Kueue's
//! ServiceMonitors do (docs/security.md, "Metrics").
//!
//! The pure parts ([`bearer_token`], [`answer`], [`Cache`]) are plain functions with their
//! unit tests below.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

/// The one non-resource URL a scraper must be allowed to `get`.
pub const METRICS_PATH: &str = "/metrics";

/// What the API server said of one token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Authenticated, and allowed to `get` `/metrics`.
    Allowed { user: String },
    /// Authenticated, not allowed.
    Forbidden { user: String },
    /// Not a token the API server accepts.
    Unauthenticated,
}

impl Verdict {
    /// How long the verdict is reused for the same token.
    pub fn ttl(&self) -> Duration {
        match self {
            Verdict::Allowed { .. } | Verdict::Unauthenticated => Duration::from_secs(60),
            Verdict::Forbidden { .. } => Duration::from_secs(30),
        }
    }
}

/// The bearer token of an `Authorization` header: `Bearer <token>` (the scheme in any case),
/// none when absent, another scheme, or empty.
pub fn bearer_token(value: Option<&HeaderValue>) -> Option<&str> {
    let text = value?.to_str().ok()?.trim();
    let (scheme, token) = text.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The status and body of a scrape refused (none when it is let through): controller-runtime's
/// filter's answers.
pub fn answer(verdict: Option<&Result<Verdict, String>>) -> Option<(StatusCode, String)> {
    match verdict {
        None | Some(Ok(Verdict::Unauthenticated)) => {
            Some((StatusCode::UNAUTHORIZED, "Unauthorized\n".to_owned()))
        }
        Some(Ok(Verdict::Allowed { .. })) => None,
        Some(Ok(Verdict::Forbidden { user })) => Some((
            StatusCode::FORBIDDEN,
            format!("Authorization denied for user {user}\n"),
        )),
        Some(Err(_)) => Some((
            StatusCode::INTERNAL_SERVER_ERROR,
            "Authentication or authorization failed\n".to_owned(),
        )),
    }
}

/// Verdicts by token, each until its expiry, at most `max` tokens.
#[derive(Debug)]
pub struct Cache {
    entries: HashMap<String, (Verdict, Instant)>,
    max: usize,
}

impl Cache {
    pub fn new(max: usize) -> Self {
        Cache {
            entries: HashMap::new(),
            max: max.max(1),
        }
    }

    /// The verdict on `token` still valid at `now`.
    pub fn get(&mut self, token: &str, now: Instant) -> Option<Verdict> {
        match self.entries.get(token) {
            Some((verdict, until)) if *until > now => Some(verdict.clone()),
            Some(_) => {
                self.entries.remove(token);
                None
            }
            None => None,
        }
    }

    /// Keeps `verdict` on `token` from `now` for [`Verdict::ttl`]: when full, the expired
    /// entries go, then the one that expires first.
    pub fn put(&mut self, token: &str, verdict: Verdict, now: Instant) {
        if !self.entries.contains_key(token) && self.entries.len() >= self.max {
            self.entries.retain(|_, (_, until)| *until > now);
            if self.entries.len() >= self.max
                && let Some(first) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, until))| *until)
                    .map(|(token, _)| token.clone())
            {
                self.entries.remove(&first);
            }
        }
        let until = now + verdict.ttl();
        self.entries.insert(token.to_owned(), (verdict, until));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Who reviews a token: the API server ([`ApiReviewer`]), or a fake in tests.
pub trait Reviewer: Send + Sync {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Verdict, String>>;
}

/// A TokenReview, then a SubjectAccessReview of `get` on [`METRICS_PATH`] for the user it
/// names (with its groups, uid and extra), through the component's own client.
pub struct ApiReviewer {
    client: kube::Client,
}

impl ApiReviewer {
    pub fn new(client: kube::Client) -> Self {
        ApiReviewer { client }
    }

    async fn review_now(&self, token: &str) -> Result<Verdict, String> {
        let reviews: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..Default::default()
        };
        let reviewed = reviews
            .create(&Default::default(), &review)
            .await
            .map_err(|e| format!("TokenReview: {e}"))?;
        let status = reviewed.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => user,
            _ => return Ok(Verdict::Unauthenticated),
        };
        let name = user.username.clone().unwrap_or_default();
        let access: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
        let question = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.to_owned()),
                    verb: Some("get".to_owned()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answered = access
            .create(&Default::default(), &question)
            .await
            .map_err(|e| format!("SubjectAccessReview: {e}"))?;
        let allowed = answered.status.is_some_and(|s| s.allowed);
        Ok(if allowed {
            Verdict::Allowed { user: name }
        } else {
            Verdict::Forbidden { user: name }
        })
    }
}

impl Reviewer for ApiReviewer {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Verdict, String>> {
        Box::pin(self.review_now(token))
    }
}

/// The gate's bounds.
#[derive(Clone, Copy, Debug)]
pub struct GateSettings {
    /// Longest wait for a free review slot plus both reviews.
    pub review_timeout: Duration,
    /// Most reviews in flight at once.
    pub concurrent_reviews: usize,
    /// Most tokens whose verdicts are kept.
    pub max_cached: usize,
}

impl Default for GateSettings {
    fn default() -> Self {
        GateSettings {
            // controller-runtime's TokenReview timeout.
            review_timeout: Duration::from_secs(10),
            concurrent_reviews: 8,
            max_cached: 1024,
        }
    }
}

/// What decides each scrape: the reviewer, its cache and bounds.
pub struct Gate {
    reviewer: Arc<dyn Reviewer>,
    cache: Mutex<Cache>,
    slots: Semaphore,
    settings: GateSettings,
}

impl Gate {
    pub fn new(reviewer: Arc<dyn Reviewer>, settings: GateSettings) -> Self {
        Gate {
            reviewer,
            cache: Mutex::new(Cache::new(settings.max_cached)),
            slots: Semaphore::new(settings.concurrent_reviews.max(1)),
            settings,
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        match self.cache.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The verdict on `token`: cached, or reviewed within the timeout.
    pub async fn verdict(&self, token: &str) -> Result<Verdict, String> {
        if let Some(verdict) = self.cache().get(token, Instant::now()) {
            return Ok(verdict);
        }
        let limit = self.settings.review_timeout;
        let reviewed = tokio::time::timeout(limit, async {
            let _slot = self
                .slots
                .acquire()
                .await
                .map_err(|_| "the review slots are closed".to_owned())?;
            self.reviewer.review(token).await
        })
        .await
        .map_err(|_| format!("no review within {} s", limit.as_secs_f64()))??;
        self.cache().put(token, reviewed.clone(), Instant::now());
        Ok(reviewed)
    }

    /// How many tokens have a cached verdict.
    pub fn cached(&self) -> usize {
        self.cache().len()
    }
}

/// The middleware of the metrics router: lets through what [`answer`] lets through.
pub async fn authorize(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    let verdict = match bearer_token(request.headers().get(header::AUTHORIZATION)) {
        None => None,
        Some(token) => Some(gate.verdict(token).await),
    };
    match answer(verdict.as_ref()) {
        None => next.run(request).await,
        Some((status, body)) => {
            if let Some(Err(e)) = &verdict {
                tracing::warn!(error = %e, "cannot review a scrape's token");
            } else {
                tracing::debug!(status = status.as_u16(), "refused a scrape");
            }
            (status, body).into_response()
        }
    }
}

/// `/metrics` (the text of `encode`) behind the gate; nothing else.
pub fn router(gate: Arc<Gate>, encode: Arc<dyn Fn() -> String + Send + Sync>) -> axum::Router {
    use axum::routing::get;
    axum::Router::new()
        .route(
            METRICS_PATH,
            get(move || {
                let encode = encode.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, crate::telemetry::METRICS_CONTENT_TYPE)],
                        encode(),
                    )
                }
            }),
        )
        .layer(axum::middleware::from_fn_with_state(gate, authorize))
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot generate the metrics listener's certificate: {0}")]
    Certificate(#[source] crate::certs::Error),
    #[error("the metrics listener's certificate: {0}")]
    Tls(String),
}

/// A TLS acceptor with a serving certificate generated now for `names` (valid a year, signed by
/// a CA generated with it and then dropped).
pub fn self_signed_acceptor(names: &[String]) -> Result<TlsAcceptor, Error> {
    let validity = Duration::from_secs(365 * 24 * 3600);
    let ca = crate::certs::generate_ca(validity).map_err(Error::Certificate)?;
    let pair = crate::certs::issue_serving(&ca, names, validity).map_err(Error::Certificate)?;
    let chain = crate::certs::parse_certs(pair.cert.as_bytes(), std::path::Path::new("memory"))
        .map_err(Error::Certificate)?;
    let key = crate::certs::parse_private_key(pair.key.as_bytes())
        .map_err(Error::Tls)?
        .ok_or_else(|| Error::Tls("no private key".to_owned()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
    .map_err(|e| Error::Tls(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(|e| Error::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The names of the generated certificate: loopback and this host's name.
pub fn certificate_names() -> Vec<String> {
    let mut names = crate::certs::local_names();
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let host = host.trim();
        if !host.is_empty() && crate::certs::check_names(&[host.to_owned()]).is_ok() {
            names.push(host.to_owned());
        }
    }
    names
}

/// Serves [`router`] over TLS on `listener` (the health listener's limits: connection cap
/// with eviction, head and idle timeouts) until `shutdown`; then in-flight scrapes get a
/// second.
pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send,
) {
    use crate::serving::{Common, Limits, accept_loop, conn};
    let limits = crate::telemetry::HealthLimits::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let serving = accept_loop(
        listener,
        Some(acceptor),
        router,
        Common {
            metrics: None,
            answers: conn::AnswerBudget::new(conn::DEFAULT_ANSWER_BYTES_IN_FLIGHT),
            draining: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        },
        Limits {
            timeouts: conn::Timeouts {
                handshake: limits.header_read_timeout,
                header_read: limits.header_read_timeout,
                idle: limits.idle_timeout,
            },
            max_connections: limits.max_connections,
            max_header_bytes: limits.max_header_bytes,
        },
        stop_rx,
    );
    tokio::pin!(serving);
    tokio::select! {
        () = &mut serving => return,
        () = shutdown => {}
    }
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(1), serving).await;
}

#[cfg(test)]
mod tests;

/// How `/metrics` is served: the flags of the webhook and the reconciler.
#[derive(Clone, Debug, clap::Args)]
pub struct MetricsArgs {
    /// Serve /metrics over HTTPS on --metrics-addr, each scrape's bearer token reviewed by the
    /// API server (TokenReview, then SubjectAccessReview of `get` on the non-resource URL
    /// /metrics), as JobSet and Kueue do. false: /metrics over plain HTTP on --health-addr,
    /// unauthenticated.
    #[arg(long, env = "JOBSET_INPLACE_METRICS_SECURE", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub metrics_secure: bool,

    /// Address of the HTTPS /metrics (with --metrics-secure, the default).
    #[arg(
        long,
        env = "JOBSET_INPLACE_METRICS_ADDR",
        default_value = "0.0.0.0:8082"
    )]
    pub metrics_addr: std::net::SocketAddr,
}

/// The HTTPS metrics listener, running.
pub struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops it: in-flight scrapes get a second.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Binds `addr` and serves the gated `/metrics` of `encode` on it, reviewing tokens through
/// `client`, with a certificate generated now.
pub async fn start(
    addr: std::net::SocketAddr,
    client: kube::Client,
    encode: Arc<dyn Fn() -> String + Send + Sync>,
) -> Result<Running, StartError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })?;
    let acceptor = self_signed_acceptor(&certificate_names())?;
    let gate = Arc::new(Gate::new(
        Arc::new(ApiReviewer::new(client)),
        GateSettings::default(),
    ));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tracing::info!(metrics = %addr, "serving /metrics over HTTPS, authenticated and authorized by the API server");
    let task = tokio::spawn(serve(listener, acceptor, router(gate, encode), async {
        let _ = stopped.await;
    }));
    Ok(Running { stop, task })
}

/// Why [`start`] failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on --metrics-addr {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] Error),
}

/// The client of the reviews: the process's kubeconfig or in-cluster account, each call
/// bounded (connect and read 10 s; [`Gate`] bounds the whole review as well).
pub async fn client() -> Result<kube::Client, kube::Error> {
    let mut config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(10));
    config.write_timeout = Some(Duration::from_secs(10));
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&crate::telemetry::api_client::ApiClientLayer)
        .build())
}
