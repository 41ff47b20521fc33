//! A harness for the webhook tests and benches: a webhook started in-process on ephemeral
//! loopback ports with certificates generated into a temporary directory, the real binary as a
//! child process ([`Replica`]), and a minimal HTTP/1.1 client over tokio-rustls (one connection,
//! keep-alive, peer certificate visible) trusting only the generated CA. The fixture requests are
//! [`crate::fixtures`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::response::IntoResponse;
use axum::routing::get;
use clap::Parser as _;
use jobset_inplace::admission::InjectionConfig;
use jobset_inplace::certs;
use jobset_inplace::cli::{Cli, Command};
use jobset_inplace::webhook::{self, Handlers, ServeOptions, Webhook};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

/// The webhook's admission routes and `GET|POST /ping`: a trivial route that reads its body
/// (under the same limits and budget) and answers `{}`. Not in the product: a TLS liveness
/// check for the tests and the benchmark's ceiling (the same connection handling without a
/// review).
pub fn routes_with_ping() -> Router<Handlers> {
    webhook::admission_routes().route("/ping", get(ping).post(ping))
}

async fn ping(State(handlers): State<Handlers>, request: Request) -> axum::response::Response {
    match handlers.read_body(request).await {
        Ok(_) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            "{}",
        )
            .into_response(),
        Err(answer) => answer,
    }
}

pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The injection config of `jobset-inplace webhook` without flags (env may still set some).
pub fn default_config() -> InjectionConfig {
    config_from_flags(&[])
}

/// The injection config of `jobset-inplace webhook <flags>`.
pub fn config_from_flags(flags: &[&str]) -> InjectionConfig {
    let cli = Cli::try_parse_from(["jobset-inplace", "webhook"].iter().chain(flags))
        .expect("webhook parses");
    let global = cli.global();
    match cli.command {
        Command::Webhook(args) => {
            InjectionConfig::load(&args.injection, global.protocol).expect("default config loads")
        }
        _ => unreachable!("parsed as webhook"),
    }
}

pub struct TestServer {
    pub https: SocketAddr,
    pub health: SocketAddr,
    pub dir: tempfile::TempDir,
    pub config: InjectionConfig,
    pub connector: TlsConnector,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), webhook::Error>>>,
}

impl TestServer {
    /// Starts a webhook on `127.0.0.1:0` (both listeners) with a CA and serving certificate
    /// generated into a temporary directory, polling them every `reload_interval`, and waits
    /// for `/readyz`.
    pub async fn start(reload_interval: Duration) -> TestServer {
        Self::start_with(reload_interval, default_config()).await
    }

    /// [`Self::start`] with an injection config.
    pub async fn start_with(reload_interval: Duration, config: InjectionConfig) -> TestServer {
        Self::start_custom(config, |options| options.reload_interval = reload_interval).await
    }

    /// [`Self::start`] with an injection config and options adjusted by `adjust`.
    pub async fn start_custom(
        config: InjectionConfig,
        adjust: impl FnOnce(&mut ServeOptions),
    ) -> TestServer {
        install_provider();
        let dir = tempfile::tempdir().expect("tempdir");
        let ensured = certs::ensure(dir.path(), &certs::local_names()).expect("certs");
        let https = TcpListener::bind("127.0.0.1:0").await.expect("bind https");
        let health = TcpListener::bind("127.0.0.1:0").await.expect("bind health");
        let https_addr = https.local_addr().expect("addr");
        let health_addr = health.local_addr().expect("addr");
        let mut options = ServeOptions::new(&ensured.tls_cert, &ensured.tls_key);
        options.shutdown_grace = Duration::from_secs(5);
        adjust(&mut options);
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(webhook::serve_routes(
            https,
            health,
            Webhook::new(config.clone()),
            routes_with_ping(),
            options,
            async move {
                let _ = rx.await;
            },
        ));
        let server = TestServer {
            https: https_addr,
            health: health_addr,
            connector: connector_for(&ensured.ca_cert),
            dir,
            config,
            shutdown: Some(tx),
            task: Some(task),
        };
        for _ in 0..200 {
            if let Ok((200, _)) = server.health_get("/readyz").await {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the webhook did not get ready");
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join(certs::CA_CERT_FILE)
    }

    /// GET on the plain-HTTP health listener: (status, body).
    pub async fn health_get(&self, path: &str) -> std::io::Result<(u16, String)> {
        health_get(self.health, path).await
    }

    /// A new TLS connection to the HTTPS listener.
    pub async fn connect(&self) -> std::io::Result<Conn> {
        Conn::connect(self.https, &self.connector).await
    }

    /// Triggers the shutdown without waiting for it.
    pub fn trigger_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Shuts the server down and checks `serve` returned `Ok` in time.
    pub async fn stop(mut self) {
        self.trigger_shutdown();
        if let Some(task) = self.task.take() {
            let result = tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("serve returns after shutdown")
                .expect("serve task did not panic");
            result.expect("serve returned Ok");
        }
    }

    /// Waits for the serve task to end, after [`Self::trigger_shutdown`].
    pub async fn join(&mut self, limit: Duration) -> Result<(), webhook::Error> {
        let task = self.task.take().expect("not joined yet");
        tokio::time::timeout(limit, task)
            .await
            .expect("serve returns in time")
            .expect("serve task did not panic")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.trigger_shutdown();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// GET on a plain-HTTP health listener: (status, body).
pub async fn health_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut tcp = TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await?;
    let response =
        parse_response(&raw).ok_or_else(|| std::io::Error::other("incomplete response"))?;
    Ok((
        response.status,
        String::from_utf8_lossy(&response.body).into_owned(),
    ))
}

/// A rustls client config trusting only the CA in `ca_cert` (ring provider).
pub fn client_config(ca_cert: &Path) -> rustls::ClientConfig {
    let pem = std::fs::read(ca_cert).expect("read ca.crt");
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs::parse_certs(&pem, ca_cert).expect("parse ca.crt") {
        roots.add(cert).expect("trust anchor");
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

pub fn connector_for(ca_cert: &Path) -> TlsConnector {
    TlsConnector::from(Arc::new(client_config(ca_cert)))
}

/// An HTTP response: status, lower-cased headers, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses one complete response with a `content-length` (or delimited by the end of `raw`).
/// `None` while incomplete.
pub fn parse_response(raw: &[u8]) -> Option<Response> {
    let (response, _) = parse_response_prefix(raw, true)?;
    Some(response)
}

fn parse_response_prefix(raw: &[u8], eof: bool) -> Option<(Response, usize)> {
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&raw[..head_end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            Some((n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        })
        .collect();
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok());
    let end = match length {
        Some(len) if raw.len() >= head_end + len => head_end + len,
        Some(_) => return None,
        None if eof => raw.len(),
        None => return None,
    };
    Some((
        Response {
            status,
            headers,
            body: raw[head_end..end].to_vec(),
        },
        end,
    ))
}

/// One TLS connection speaking HTTP/1.1 with keep-alive.
pub struct Conn {
    stream: tokio_rustls::client::TlsStream<TcpStream>,
    buf: Vec<u8>,
}

impl Conn {
    pub async fn connect(addr: SocketAddr, connector: &TlsConnector) -> std::io::Result<Conn> {
        Self::connect_as(addr, connector, "localhost").await
    }

    /// [`Conn::connect`], verifying the server's certificate for `server_name` (a Service's
    /// DNS name, say, as the API server does).
    pub async fn connect_as(
        addr: SocketAddr,
        connector: &TlsConnector,
        server_name: &str,
    ) -> std::io::Result<Conn> {
        let name = ServerName::try_from(server_name.to_owned())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let stream = connector.connect(name, tcp).await?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(16 * 1024),
        })
    }

    /// The server's leaf certificate (DER).
    pub fn peer_certificate(&self) -> Option<CertificateDer<'static>> {
        self.stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|certs| certs.first())
            .map(|c| c.clone().into_owned())
    }

    /// Encodes a request with a body and `content-length`.
    pub fn encode(method: &str, path: &str, content_type: Option<&str>, body: &[u8]) -> Vec<u8> {
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\n",
            body.len()
        );
        if let Some(ct) = content_type {
            request.push_str(&format!("content-type: {ct}\r\n"));
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body);
        bytes
    }

    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await
    }

    /// Reads one response (the connection stays usable when the server keeps it alive).
    pub async fn read_response(&mut self) -> std::io::Result<Response> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some((response, used)) = parse_response_prefix(&self.buf, false) {
                self.buf.drain(..used);
                return Ok(response);
            }
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return match parse_response_prefix(&self.buf, true) {
                    Some((response, _)) => {
                        self.buf.clear();
                        Ok(response)
                    }
                    None => Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "connection closed before a complete response",
                    )),
                };
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> std::io::Result<Response> {
        self.send(&Self::encode(method, path, content_type, body))
            .await?;
        self.read_response().await
    }

    /// POSTs `body` as `application/json`.
    pub async fn post_json(&mut self, path: &str, body: &[u8]) -> std::io::Result<Response> {
        self.request("POST", path, Some("application/json"), body)
            .await
    }
}

/// `jobset-inplace webhook` as a child process on ephemeral loopback ports (learnt from its
/// "webhook serving" log line), serving `--tls-cert`/`--tls-key`; killed when dropped.
pub struct Replica {
    pub child: tokio::process::Child,
    pub https: SocketAddr,
    pub health: SocketAddr,
    /// Its log lines (JSON), as they come.
    pub logs: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Replica {
    /// Starts the binary with `--tls-cert cert --tls-key key` and `extra` flags, and waits until
    /// `/readyz` answers 200. The binary is `bin` (a test's `CARGO_BIN_EXE_jobset-inplace`), or
    /// `$JOBSET_INPLACE_WEBHOOK_BIN` when set (e.g. the musl build the image ships).
    pub async fn start(bin: &str, cert: &Path, key: &Path, extra: &[&str]) -> Replica {
        use tokio::io::AsyncBufReadExt as _;
        let bin = std::env::var_os("JOBSET_INPLACE_WEBHOOK_BIN").unwrap_or_else(|| bin.into());
        let mut child = tokio::process::Command::new(bin)
            .args(["--log-format", "json", "webhook"])
            .args(["--addr", "127.0.0.1:0", "--health-addr", "127.0.0.1:0"])
            // /metrics on the health port, as the tests read it (no API server to review tokens).
            .arg("--metrics-secure=false")
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn jobset-inplace webhook");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let logs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut addrs = None;
        while addrs.is_none() {
            let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
                .await
                .expect("the webhook logs in time")
                .expect("read stderr");
            let Some(line) = line else {
                panic!(
                    "the webhook exited before serving: {:?}",
                    logs.lock().expect("logs")
                );
            };
            if let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line)
                && entry["message"] == "webhook serving"
            {
                let addr = |field: &str| -> SocketAddr {
                    entry[field]
                        .as_str()
                        .and_then(|a| a.parse().ok())
                        .unwrap_or_else(|| panic!("no {field} address in {line}"))
                };
                addrs = Some((addr("https"), addr("health")));
            }
            logs.lock().expect("logs").push(line);
        }
        let collected = logs.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                collected.lock().expect("logs").push(line);
            }
        });
        let (https, health) = addrs.expect("addresses");
        let replica = Replica {
            child,
            https,
            health,
            logs,
        };
        for _ in 0..500 {
            if let Ok((200, _)) = replica.health_get("/readyz").await {
                return replica;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the webhook replica did not get ready");
    }

    pub fn pid(&self) -> i32 {
        self.child.id().expect("running") as i32
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
    }

    /// Waits for the process to exit.
    pub async fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .expect("the webhook exits in time")
            .expect("wait")
    }

    /// GET on the plain-HTTP health listener: (status, body).
    pub async fn health_get(&self, path: &str) -> std::io::Result<(u16, String)> {
        health_get(self.health, path).await
    }

    /// VmRSS of the process, in KiB (Linux).
    pub fn rss_kib(&self) -> Option<u64> {
        u32::try_from(self.pid())
            .ok()
            .and_then(|pid| crate::process::proc_status_kib(pid, "VmRSS"))
    }

    /// VmHWM (peak resident set) of the process, in KiB (Linux).
    pub fn peak_rss_kib(&self) -> Option<u64> {
        u32::try_from(self.pid())
            .ok()
            .and_then(|pid| crate::process::proc_status_kib(pid, "VmHWM"))
    }
}

/// A bench setting from the environment, else `default` (also when it does not parse).
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
