//! The agent's Kubernetes client: kube's stack (its base URI, authentication and extra headers
//! layers, the product's `Retry-After` carrying, no retry layer) over **one HTTP/2 connection**
//! to an `https://` API server.
//!
//! Why our own stack: kube 5's client speaks HTTP/1.1 only (its `hyper-rustls` connector enables
//! `http1` alone), so an agent start's two concurrent requests (its pod's GET and the watch of
//! its epochs, which holds its connection open) took two connections, two TLS handshakes and two
//! of the API server's connection slots: 10,000 handshakes per group restart at 5,000 pods
//! (issue 44). Here the connector negotiates `h2` (ALPN) and the pool is HTTP/2 only, so every
//! request of the agent's life (the GET, the watch, the registration, every watch resumed) is a
//! stream of the one connection. kube-apiserver serves HTTP/2 on its TLS port (Go's `net/http`
//! with `golang.org/x/net/http2`, k8s.io/apiserver `pkg/server/secure_serving.go`); a proxy in
//! between that does not negotiate `h2` makes the agent's requests fail at the handshake, which
//! the agent reports and retries as any connection error.
//!
//! Plain `http://` (the simulator, local runs) and configurations this stack does not cover (a
//! proxy URL, a TLS server name override) keep kube's own HTTP/1.1 client
//! ([`crate::retry::client_without_retries`]).

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::{ClientBuilder, ConfigExt, DynBody};
use tower::{BoxError, ServiceBuilder, ServiceExt as _};

/// The agent's client for `config` (see the module's documentation).
pub fn agent_client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    if !speaks_http2(&config) {
        return crate::retry::client_without_retries(config);
    }
    let tls = config.rustls_client_config()?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    http.set_nodelay(true);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http2()
        .wrap_connector(http);
    let mut builder = hyper_util::client::legacy::Builder::new(TokioExecutor::new());
    // HTTP/2 only: the pool then lets a request wait for the connection another request is
    // opening, instead of opening a second one (hyper-util's pool, `connecting`).
    builder.http2_only(true);
    // A connection silent for 30 s is pinged; unanswered within 20 s, it is closed, and the
    // watch on it ends (the agent resumes it).
    builder.http2_keep_alive_interval(std::time::Duration::from_secs(30));
    builder.http2_keep_alive_timeout(std::time::Duration::from_secs(20));
    builder.timer(hyper_util::rt::TokioTimer::new());
    let client = builder.build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(client)
        .map_response(|response| {
            response.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>
            })
        })
        .boxed();
    Ok(
        ClientBuilder::new(service, config.default_namespace.clone())
            .with_layer(&tower::util::AndThenLayer::new(
                crate::retry::carry_retry_after,
            ))
            .build(),
    )
}

/// Whether [`agent_client`] builds its HTTP/2 stack for `config`: an `https://` API server,
/// reached directly (no proxy) under its own name.
pub fn speaks_http2(config: &kube::Config) -> bool {
    config.cluster_url.scheme_str() == Some("https")
        && config.proxy_url.is_none()
        && config.tls_server_name.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> kube::Config {
        let mut c = kube::Config::new(url.parse().expect("url"));
        c.root_cert = Some(Vec::new());
        c
    }

    #[test]
    fn https_alone_takes_the_http2_stack() {
        assert!(speaks_http2(&config("https://10.0.0.1:443")));
        assert!(!speaks_http2(&config("http://127.0.0.1:8080")));
        let mut proxied = config("https://10.0.0.1:443");
        proxied.proxy_url = Some("http://proxy:3128".parse().expect("url"));
        assert!(!speaks_http2(&proxied));
        let mut renamed = config("https://10.0.0.1:443");
        renamed.tls_server_name = Some("kubernetes".into());
        assert!(!speaks_http2(&renamed));
    }

    #[tokio::test]
    async fn both_stacks_build_without_a_server() {
        agent_client(config("https://10.0.0.1:443")).expect("the HTTP/2 stack");
        agent_client(config("http://127.0.0.1:8080")).expect("kube's own");
    }
}
