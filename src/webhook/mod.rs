//! The `webhook` subcommand: the HTTPS admission server (docs/architecture.md, "Webhook" and "Admission").
//!
//! - `POST /mutate`, `POST /validate` over TLS on `--addr` (default `0.0.0.0:8443`), answering
//!   exactly what [`admission::review`] answers; 415 for a content type other than
//!   `application/json`, 413 for a body over [`admission::MAX_BODY_BYTES`];
//! - `/healthz`, `/readyz`, `/metrics` over plain HTTP on `--health-addr` (default
//!   `0.0.0.0:8081`);
//! - the serving certificate from `--tls-cert`/`--tls-key`, or generated with a CA into
//!   `--cert-dir` when neither is given, or with `--self-signed` kept in a Secret, renewed and
//!   rotated ([`self_signed`]); reloaded when its files change;
//! - limits on slow, idle, many and large clients: `--header-read-timeout`, `--idle-timeout`,
//!   `--body-read-timeout`, `--max-connections`, `--max-body-bytes-in-flight`;
//! - graceful shutdown on SIGTERM/SIGINT, after an optional drain (`--shutdown-delay`).
//!
//! [`serve`] runs it all on listeners the caller bound (tests and benchmarks bind
//! `127.0.0.1:0`).
//!
//! - [`routes`]: the routes and their handlers (body limits, the review, metrics);
//! - [`listener`]: the HTTPS and health listeners on [`crate::serving`]'s connection loop, TLS,
//!   graceful shutdown;
//! - [`tls`]: the serving certificate, reloaded when its files change;
//! - [`self_signed`]: `--self-signed`, certificates from a Secret the replicas keep renewed;
//! - [`metrics`]: the Prometheus metrics.

pub mod listener;
pub mod metrics;
pub mod routes;
pub mod self_signed;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

pub use listener::{ServeOptions, serve, serve_routes};
pub use routes::{
    BodyLimits, Handlers, Webhook, admission_routes, health_router, health_router_with, router,
    router_with,
};
pub use self_signed::serve_self_signed;
pub use tls::ReloadingCert;

use crate::admission::{self, InjectionConfig, config::InjectionArgs};
use crate::certs::{self, cluster, rotation};
use crate::protocol::Dialect;
use crate::settings::{Global, parse_bytes, parse_duration};
use crate::wire::jobset_crd::{self, Choice};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "--{given} is set but --{missing} (env {env}) is not: give both, or neither to use a generated pair in --cert-dir"
    )]
    HalfTlsPair {
        given: &'static str,
        missing: &'static str,
        env: &'static str,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Tls { path: PathBuf, reason: String },
    #[error("cannot set up tls: {0}")]
    TlsConfig(#[source] rustls::Error),
    #[error("cannot listen on {addr} ({flag}): {source}")]
    Bind {
        flag: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("--self-signed: cannot reach the Kubernetes API: {0}")]
    Cluster(#[source] kube::Error),
    #[error("--cert-dir {dir}: {source}")]
    CertDir {
        dir: PathBuf,
        #[source]
        source: certs::Error,
    },
    #[error("{0}")]
    Lifetimes(String),
    #[error(transparent)]
    Config(#[from] admission::Error),
    #[error("cannot decide the epoch protocol dialect (--protocol auto): {0}")]
    Dialect(String),
    #[error(
        "--metrics-secure: cannot reach the Kubernetes API to review scrapes' tokens: {0} (--metrics-secure=false serves /metrics over plain HTTP on --health-addr instead)"
    )]
    MetricsClient(#[source] kube::Error),
    #[error(transparent)]
    Metrics(#[from] crate::metrics_auth::StartError),
}

/// Flags of `jobset-inplace webhook`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Address of the HTTPS admission endpoints (/mutate, /validate).
    #[arg(
        long,
        env = "JOBSET_INPLACE_WEBHOOK_ADDR",
        default_value = "0.0.0.0:8443"
    )]
    pub addr: SocketAddr,

    /// Address of the plain-HTTP /healthz, /readyz (and /metrics with --metrics-secure=false).
    #[arg(
        long,
        env = "JOBSET_INPLACE_HEALTH_ADDR",
        default_value = "0.0.0.0:8081"
    )]
    pub health_addr: SocketAddr,

    #[command(flatten)]
    pub metrics: crate::metrics_auth::MetricsArgs,

    /// Serving certificate (PEM, leaf first). With --tls-key; reloaded when the file changes.
    #[arg(long, env = "JOBSET_INPLACE_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// Private key of --tls-cert (PEM).
    #[arg(long, env = "JOBSET_INPLACE_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// Without --tls-cert/--tls-key: where a CA and a serving certificate for localhost,
    /// 127.0.0.1 and ::1 are generated, and reused on the next start (trust ca.crt).
    #[arg(
        long,
        env = "JOBSET_INPLACE_CERT_DIR",
        default_value = "certs",
        value_name = "DIR"
    )]
    pub cert_dir: PathBuf,

    /// How often the certificate files are checked for a new pair.
    #[arg(long, env = "JOBSET_INPLACE_CERT_RELOAD_INTERVAL", default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub cert_reload_interval: Duration,

    /// Longest wait for a TLS handshake, and for a request's head (from the handshake for the
    /// first request, from its first byte for the next ones); the connection is closed after it.
    #[arg(long, env = "JOBSET_INPLACE_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub header_read_timeout: Duration,

    /// Longest a keep-alive connection may sit idle between requests. Above the API server's own
    /// idle timeout (90s), so that it, not the webhook, closes the connections it keeps.
    #[arg(long, env = "JOBSET_INPLACE_IDLE_TIMEOUT", default_value = "120s", value_parser = parse_duration, value_name = "DURATION")]
    pub idle_timeout: Duration,

    /// Longest wait for a request's body once its head is in: 408 after it.
    #[arg(long, env = "JOBSET_INPLACE_BODY_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub body_read_timeout: Duration,

    /// Most connections open at once, on each listener. Beyond it new connections wait, and idle
    /// ones (and handshakes or request heads stuck for a second) are closed to make room.
    #[arg(long, env = "JOBSET_INPLACE_MAX_CONNECTIONS", default_value_t = listener::DEFAULT_MAX_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    pub max_connections: u32,

    /// Most request-body bytes held in memory at once, across requests (`64Mi`, `512Ki`,
    /// bytes; at least 7Mi, one body at the size limit). Bytes are counted as they arrive; a
    /// request that finds no room waits up to a second, then gets 429 with Retry-After (the API
    /// server retries it).
    #[arg(long, env = "JOBSET_INPLACE_MAX_BODY_BYTES_IN_FLIGHT", default_value = "64Mi", value_parser = parse_body_budget, value_name = "BYTES")]
    pub max_body_bytes_in_flight: usize,

    /// On SIGTERM/SIGINT, how long to go on serving first: not ready, every answer closing its
    /// connection, while the Service's endpoints drop this pod. Clients then neither send a
    /// request on a connection being closed nor find the port closed (the API server retries
    /// neither for a webhook call). Keep it plus --shutdown-timeout below the pod's
    /// terminationGracePeriodSeconds.
    #[arg(long, env = "JOBSET_INPLACE_SHUTDOWN_DELAY", default_value = "0s", value_parser = parse_duration, value_name = "DURATION")]
    pub shutdown_delay: Duration,

    /// On SIGTERM/SIGINT, after --shutdown-delay, longest wait for in-flight requests.
    #[arg(long, env = "JOBSET_INPLACE_SHUTDOWN_TIMEOUT", default_value = "25s", value_parser = parse_duration, value_name = "DURATION")]
    pub shutdown_timeout: Duration,

    /// In a cluster without cert-manager: keep a self-signed CA and serving certificate in
    /// --secret (the first replica creates it, the others read it), set the CA as caBundle of
    /// --webhook-config, renew the serving certificate before it expires, and serve the files
    /// from --cert-dir.
    #[arg(long, env = "JOBSET_INPLACE_SELF_SIGNED", conflicts_with_all = ["tls_cert", "tls_key"])]
    pub self_signed: bool,

    /// With --self-signed: the webhook's Service (the certificate covers its DNS names).
    #[arg(
        long,
        env = "JOBSET_INPLACE_WEBHOOK_SERVICE",
        default_value = "jobset-inplace-webhook",
        value_name = "NAME"
    )]
    pub service: String,

    /// With --self-signed: the namespace of the Service and the Secret.
    #[arg(
        long,
        env = "POD_NAMESPACE",
        default_value = "jobset-inplace-system",
        value_name = "NS"
    )]
    pub namespace: String,

    /// With --self-signed: the Secret holding the certificates.
    #[arg(
        long,
        env = "JOBSET_INPLACE_CERT_SECRET",
        default_value = "jobset-inplace-webhook-tls",
        value_name = "NAME"
    )]
    pub secret: String,

    /// With --self-signed: the Mutating and Validating webhook configurations to set caBundle on.
    #[arg(
        long,
        env = "JOBSET_INPLACE_WEBHOOK_CONFIG",
        default_value = "jobset-inplace",
        value_name = "NAME"
    )]
    pub webhook_config: String,

    /// With --self-signed: how often the Secret is read (this replica's renewals and
    /// rotations, and loading another replica's), sooner when something falls due.
    #[arg(long, env = "JOBSET_INPLACE_CERT_RENEW_INTERVAL", default_value = "1m", value_parser = parse_duration, value_name = "DURATION")]
    pub cert_renew_interval: Duration,

    /// With --self-signed: lifetime of a serving certificate; a new one is issued once 2/3 of
    /// it has passed.
    #[arg(long, env = "JOBSET_INPLACE_SERVING_CERT_VALIDITY", default_value = "90d", value_parser = parse_duration, value_name = "DURATION")]
    pub serving_cert_validity: Duration,

    /// With --self-signed: lifetime of a CA; once 2/3 of it has passed, the CA is rotated.
    #[arg(long, env = "JOBSET_INPLACE_CA_VALIDITY", default_value = "1095d", value_parser = parse_duration, value_name = "DURATION")]
    pub ca_validity: Duration,

    /// With --self-signed: how long a new CA is trusted (caBundle) before it signs, and how long
    /// the old one stays trusted after.
    #[arg(long, env = "JOBSET_INPLACE_CA_OVERLAP", default_value = "7d", value_parser = parse_duration, value_name = "DURATION")]
    pub ca_overlap: Duration,

    /// Longest wait for one Kubernetes API request: the JobSet CRD read at start (`--protocol
    /// auto`) and, with --self-signed, each certificate check (retried with backoff).
    #[arg(long, env = "JOBSET_INPLACE_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub request_timeout: Duration,

    #[command(flatten)]
    pub injection: InjectionArgs,
}

impl Args {
    /// The certificate pair to serve: the flags, or a generated pair in --cert-dir.
    async fn tls_files(&self) -> Result<(PathBuf, PathBuf), Error> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok((cert.clone(), key.clone())),
            (Some(_), None) => Err(Error::HalfTlsPair {
                given: "tls-cert",
                missing: "tls-key",
                env: "JOBSET_INPLACE_TLS_KEY",
            }),
            (None, Some(_)) => Err(Error::HalfTlsPair {
                given: "tls-key",
                missing: "tls-cert",
                env: "JOBSET_INPLACE_TLS_CERT",
            }),
            (None, None) => {
                let dir = self.cert_dir.clone();
                let target = dir.clone();
                let ensured = tokio::task::spawn_blocking(move || {
                    certs::ensure(&target, &certs::local_names())
                })
                .await
                .unwrap_or_else(|e| Err(certs::Error::GenerateTask(e)))
                .map_err(|source| Error::CertDir { dir, source })?;
                let ca = ensured.ca_cert.display().to_string();
                tracing::info!(
                    ca = %ca,
                    ca_action = ?ensured.ca,
                    serving_action = ?ensured.serving,
                    "no --tls-cert/--tls-key: serving a generated certificate for localhost, \
                     127.0.0.1 and ::1; trust it with `curl --cacert {ca}`"
                );
                Ok((ensured.tls_cert, ensured.tls_key))
            }
        }
    }

    /// How [`serve`] runs with these flags, serving `cert` and `key`.
    pub fn serve_options(&self, cert: PathBuf, key: PathBuf) -> ServeOptions {
        ServeOptions {
            reload_interval: self.cert_reload_interval,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: self.max_connections as usize,
            body: BodyLimits {
                read_timeout: self.body_read_timeout,
                bytes_in_flight: self.max_body_bytes_in_flight,
            },
            shutdown_delay: self.shutdown_delay,
            shutdown_grace: self.shutdown_timeout,
            metrics_on_health: !self.metrics.metrics_secure,
            ..ServeOptions::new(cert, key)
        }
    }

    /// `--self-signed`: the lifetimes, checked against the read interval.
    pub fn policy(&self) -> Result<rotation::Policy, Error> {
        let policy = rotation::Policy {
            ca_validity: self.ca_validity,
            serving_validity: self.serving_cert_validity,
            overlap: self.ca_overlap,
        };
        policy
            .check(self.cert_renew_interval)
            .map_err(Error::Lifetimes)?;
        Ok(policy)
    }

    /// `--self-signed`: what keeps the certificates, talking to `client`.
    pub fn renewer(&self, client: kube::Client) -> Result<cluster::Renewer, Error> {
        let target = cluster::Target {
            namespace: self.namespace.clone(),
            secret: self.secret.clone(),
            webhook_config: Some(self.webhook_config.clone()),
            names: certs::service_names(&self.service, &self.namespace),
            dir: self.cert_dir.clone(),
            install_ca_key: false,
        };
        Ok(cluster::Renewer::new(
            client,
            target,
            self.policy()?,
            self.request_timeout,
        ))
    }

    /// The dialect to inject: `--protocol`, else the config file's `protocol`, else the
    /// cluster's JobSet CRD; without any cluster config (a webhook run outside a cluster, no
    /// kubeconfig) the default `epoch`.
    async fn dialect(&self, global: Global) -> Result<Choice, Error> {
        if let Some(d) = global.protocol {
            return Ok(jobset_crd::explicit(d, &format!("--protocol {d}")));
        }
        if let Some((d, source)) = admission::config::file_protocol(&self.injection) {
            return Ok(jobset_crd::explicit(d, &source));
        }
        let mut config = match kube::Config::infer().await {
            Ok(config) => config,
            // In a pod without API access (no token mounted) guessing would inject the wrong
            // dialect into every JobSet.
            Err(e) if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
                return Err(Error::Dialect(format!(
                    "cannot reach the API server to read the JobSet CRD ({e}): mount a token \
                     with `get` on customresourcedefinitions/{}, or set the protocol \
                     (--protocol, or `protocol` in the config file)",
                    jobset_crd::CRD_NAME
                )));
            }
            Err(e) => {
                return Ok(Choice {
                    dialect: Dialect::default(),
                    why: format!("no cluster to ask ({e}): the default"),
                });
            }
        };
        config.connect_timeout = Some(self.request_timeout);
        config.read_timeout = Some(self.request_timeout);
        let client = kube::Client::try_from(config).map_err(Error::Cluster)?;
        jobset_crd::read(&client, self.request_timeout)
            .await
            .map_err(Error::Dialect)
    }

    pub async fn run(self, global: Global) -> Result<ExitCode, Error> {
        let mut config = InjectionConfig::load(&self.injection, global.protocol)
            .map_err(admission::Error::from)?;
        let choice = self.dialect(global).await?;
        tracing::info!(dialect = %choice.dialect, why = %choice.why, "epoch protocol dialect");
        config.protocol = choice.dialect;
        let renewer = if self.self_signed {
            self.policy()?;
            let config = kube::Config::infer()
                .await
                .map_err(|e| Error::Cluster(kube::Error::InferConfig(e)))?;
            let client = kube::client::ClientBuilder::try_from(config)
                .map_err(Error::Cluster)?
                .with_layer(&crate::telemetry::api_client::ApiClientLayer)
                .build();
            Some(self.renewer(client)?)
        } else {
            None
        };
        let (cert, key) = match &renewer {
            Some(renewer) => renewer.tls_files(),
            None => self.tls_files().await?,
        };
        let https = bind("--addr", self.addr).await?;
        let health = bind("--health-addr", self.health_addr).await?;
        let options = self.serve_options(cert, key);
        let webhook = Webhook::new(config);
        let secure_metrics = if self.metrics.metrics_secure {
            let client = crate::metrics_auth::client()
                .await
                .map_err(Error::MetricsClient)?;
            let encoded = webhook.clone();
            Some(
                crate::metrics_auth::start(
                    self.metrics.metrics_addr,
                    client,
                    Arc::new(move || encoded.metrics().encode()),
                )
                .await?,
            )
        } else {
            None
        };
        let shutdown = crate::shutdown::shutdown_signal();
        match renewer {
            Some(renewer) => {
                serve_self_signed(
                    https,
                    health,
                    webhook,
                    options,
                    renewer,
                    self.cert_renew_interval,
                    shutdown,
                )
                .await?
            }
            None => serve(https, health, webhook, options, shutdown).await?,
        }
        if let Some(running) = secure_metrics {
            running.stop().await;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// `--max-body-bytes-in-flight`: a size ([`parse_bytes`]) of at least one body at the limit.
fn parse_body_budget(text: &str) -> Result<usize, String> {
    let bytes = parse_bytes(text)?;
    if bytes < admission::MAX_BODY_BYTES {
        return Err(format!(
            "{text:?} is below {} bytes (7Mi), the largest request body",
            admission::MAX_BODY_BYTES
        ));
    }
    Ok(bytes)
}

async fn bind(flag: &'static str, addr: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { flag, addr, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// The `webhook` subcommand's flags alone (the full command line is composed in `cli.rs`,
    /// whose tests parse it whole).
    #[derive(Debug, Parser)]
    #[command(name = "webhook")]
    struct Webhook {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn body_budget_sizes() {
        assert!(parse_body_budget("7Mi").is_ok());
        assert!(parse_body_budget("6Mi").is_err());
    }

    fn webhook_args(args: &[&str]) -> Args {
        Webhook::try_parse_from(["webhook"].iter().chain(args))
            .expect("parses")
            .args
    }

    #[tokio::test]
    async fn half_a_tls_pair_is_a_one_line_error_naming_the_missing_flag() {
        let args = webhook_args(&["--tls-cert", "/tmp/x.crt"]);
        let err = args.run(Global::default()).await.expect_err("half pair");
        let message = err.to_string();
        assert!(message.contains("--tls-key"), "{message}");
        assert!(message.contains("JOBSET_INPLACE_TLS_KEY"), "{message}");
        assert!(!message.contains('\n'), "{message}");

        let args = webhook_args(&["--tls-key", "/tmp/x.key"]);
        let message = args.tls_files().await.expect_err("half pair").to_string();
        assert!(
            message.starts_with("--tls-key is set but --tls-cert"),
            "{message}"
        );
    }

    #[test]
    fn defaults() {
        let args = webhook_args(&[]);
        assert_eq!(args.addr.to_string(), "0.0.0.0:8443");
        assert_eq!(args.health_addr.to_string(), "0.0.0.0:8081");
        assert_eq!(args.cert_dir, PathBuf::from("certs"));
        assert_eq!(args.shutdown_timeout, Duration::from_secs(25));
        assert_eq!(args.idle_timeout, Duration::from_secs(120));
        assert_eq!(args.body_read_timeout, Duration::from_secs(10));
        assert_eq!(args.max_connections, 512);
        assert_eq!(args.max_body_bytes_in_flight, 64 << 20);
        // --self-signed: read every minute; serving 90 days, CA 3 years, overlap 7 days.
        assert_eq!(args.cert_renew_interval, Duration::from_secs(60));
        assert_eq!(
            args.policy().expect("the defaults work together"),
            rotation::Policy::DEFAULT
        );
        assert_eq!(args.request_timeout, Duration::from_secs(10));
    }

    #[tokio::test]
    async fn lifetimes_that_do_not_fit_the_read_interval_stop_the_start() {
        for (flags, named) in [
            (
                &[
                    "--cert-renew-interval",
                    "1h",
                    "--serving-cert-validity",
                    "5h",
                ][..],
                "--serving-cert-validity",
            ),
            (&["--ca-overlap", "1m"][..], "--ca-overlap"),
            (&["--ca-validity", "30d"][..], "--ca-validity"),
        ] {
            let mut all = vec!["--self-signed"];
            all.extend_from_slice(flags);
            let err = webhook_args(&all)
                .run(Global::default())
                .await
                .expect_err("refused");
            let message = err.to_string();
            assert!(message.contains(named), "{flags:?}: {message}");
            assert!(!message.contains('\n'), "{message}");
        }
    }

    #[test]
    fn connection_and_body_limits() {
        let args = webhook_args(&[
            "--max-connections",
            "8",
            "--max-body-bytes-in-flight",
            "16Mi",
            "--idle-timeout",
            "30s",
        ]);
        assert_eq!(args.max_connections, 8);
        assert_eq!(args.max_body_bytes_in_flight, 16 << 20);
        assert_eq!(args.idle_timeout, Duration::from_secs(30));
        for bad in [
            ["--max-connections", "0"],
            ["--max-body-bytes-in-flight", "1Mi"],
            ["--max-body-bytes-in-flight", "lots"],
        ] {
            let err =
                Webhook::try_parse_from(["webhook"].iter().chain(&bad)).expect_err("rejected");
            let line = crate::settings::with_env_tip(err, &Webhook::command())
                .render()
                .to_string();
            assert!(line.contains(bad[0]), "{line}");
            assert!(line.contains("JOBSET_INPLACE_"), "{line}");
        }
    }
}
