//! Metrics of the components' Kubernetes API client, as client-go's `rest_client_*` give JobSet
//! and Kueue: `jobset_inplace_api_client_requests_total{verb, resource, code}` and
//! `jobset_inplace_api_client_request_duration_seconds{verb, resource}` (to the response's head:
//! a watch counts until the server starts answering, not while it streams). A tower layer
//! ([`ApiClientLayer`]) on kube's client (`ClientBuilder::with_layer`) records them; the labels
//! come from the request alone ([`verb_and_resource`], pure and tested below), so their number is
//! bounded by the API calls the code makes. The families are the process's own (one client
//! stack per process may share them), registered by [`super::encode`] beside each registry.

use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use hyper::http::{Method, Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: String,
    pub resource: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    pub verb: String,
    pub resource: String,
}

type HistogramFn = fn() -> Histogram;

fn latency_histogram() -> Histogram {
    // 5 ms to about 10 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 12))
}

/// The process's API-client families.
pub struct ApiClientMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub duration: Family<LatencyLabels, Histogram, HistogramFn>,
}

static METRICS: LazyLock<ApiClientMetrics> = LazyLock::new(|| ApiClientMetrics {
    requests: Family::default(),
    duration: Family::new_with_constructor(latency_histogram),
});

/// The process's families.
pub fn metrics() -> &'static ApiClientMetrics {
    &METRICS
}

/// Registers the families in `registry` (prefix `jobset_inplace_api_client`).
pub fn register(registry: &mut Registry) {
    let r = registry.sub_registry_with_prefix("jobset_inplace_api_client");
    r.register(
        "requests",
        "Kubernetes API requests of this process's client, by verb, resource and HTTP code (`error`: no answer).",
        METRICS.requests.clone(),
    );
    r.register_with_unit(
        "request_duration",
        "Time from a Kubernetes API request to its answer's head, by verb and resource.",
        prometheus_client::registry::Unit::Seconds,
        METRICS.duration.clone(),
    );
}

/// The API verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
/// `deletecollection`) and the resource (`pods`, `jobsets/status`; `other` for paths outside
/// `/api` and `/apis`) of a request.
pub fn verb_and_resource(method: &Method, path: &str, query: Option<&str>) -> (String, String) {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    // After /api/v1 or /apis/GROUP/VERSION.
    let rest: &[&str] = match parts.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => &[],
    };
    // Namespaced: namespaces/NS/RESOURCE[/NAME[/SUB]]; else RESOURCE[/NAME[/SUB]].
    let rest = match rest {
        ["namespaces", _ns, resource, more @ ..] => {
            let mut v = vec![*resource];
            v.extend_from_slice(more);
            v
        }
        other => other.to_vec(),
    };
    let (resource, named) = match rest.as_slice() {
        [] => ("other".to_owned(), false),
        [resource] => ((*resource).to_owned(), false),
        [resource, _name] => ((*resource).to_owned(), true),
        [resource, _name, sub, ..] => (format!("{resource}/{sub}"), true),
    };
    let watch = query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match *method {
        Method::GET if watch => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb.to_owned(), resource)
}

/// The layer on kube's client stack.
#[derive(Clone, Copy, Debug, Default)]
pub struct ApiClientLayer;

impl<S> tower::Layer<S> for ApiClientLayer {
    type Service = ApiClientService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ApiClientService { inner }
    }
}

#[derive(Clone, Debug)]
pub struct ApiClientService<S> {
    inner: S,
}

impl<S, B, R> tower::Service<Request<B>> for ApiClientService<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (verb, resource) = verb_and_resource(
            request.method(),
            request.uri().path(),
            request.uri().query(),
        );
        let started = Instant::now();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let result = answer.await;
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "error".to_owned(),
            };
            METRICS
                .duration
                .get_or_create(&LatencyLabels {
                    verb: verb.clone(),
                    resource: resource.clone(),
                })
                .observe(started.elapsed().as_secs_f64());
            METRICS
                .requests
                .get_or_create(&RequestLabels {
                    verb,
                    resource,
                    code,
                })
                .inc();
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(method: Method, uri: &str) -> (String, String) {
        let (path, query) = uri
            .split_once('?')
            .map_or((uri, None), |(p, q)| (p, Some(q)));
        verb_and_resource(&method, path, query)
    }

    #[test]
    fn requests_are_named_by_verb_and_resource() {
        let pair = |v: &str, r: &str| (v.to_owned(), r.to_owned());
        assert_eq!(
            of(Method::GET, "/api/v1/namespaces/a/pods"),
            pair("list", "pods")
        );
        assert_eq!(
            of(
                Method::GET,
                "/api/v1/namespaces/a/pods?watch=true&resourceVersion=1"
            ),
            pair("watch", "pods")
        );
        assert_eq!(
            of(Method::GET, "/api/v1/pods?labelSelector=x"),
            pair("list", "pods")
        );
        assert_eq!(
            of(Method::DELETE, "/api/v1/namespaces/a/pods/p"),
            pair("delete", "pods")
        );
        assert_eq!(
            of(Method::PATCH, "/api/v1/namespaces/a/pods/p/status"),
            pair("patch", "pods/status")
        );
        assert_eq!(
            of(
                Method::PATCH,
                "/apis/jobset.x-k8s.io/v1alpha2/namespaces/a/jobsets/j/status"
            ),
            pair("patch", "jobsets/status")
        );
        assert_eq!(
            of(
                Method::GET,
                "/apis/coordination.k8s.io/v1/namespaces/s/leases/l"
            ),
            pair("get", "leases")
        );
        assert_eq!(of(Method::GET, "/api/v1/nodes"), pair("list", "nodes"));
        assert_eq!(
            of(Method::GET, "/api/v1/namespaces/a"),
            pair("get", "namespaces")
        );
        assert_eq!(
            of(Method::POST, "/apis/authentication.k8s.io/v1/tokenreviews"),
            pair("create", "tokenreviews")
        );
        assert_eq!(
            of(Method::DELETE, "/apis/batch/v1/namespaces/a/jobs"),
            pair("deletecollection", "jobs")
        );
        assert_eq!(of(Method::GET, "/version"), pair("list", "other"));
        assert_eq!(
            of(Method::PUT, "/api/v1/namespaces/a/configmaps/c"),
            pair("update", "configmaps")
        );
    }

    #[tokio::test]
    async fn the_layer_counts_each_request_by_its_answer() {
        use tower::{Layer as _, ServiceExt as _};
        let inner = tower::service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(
                Response::builder().status(404).body(()).expect("response"),
            )
        });
        let service = ApiClientLayer.layer(inner);
        let labels = RequestLabels {
            verb: "get".into(),
            resource: "layertests".into(),
            code: "404".into(),
        };
        let before = metrics().requests.get_or_create(&labels).get();
        let request = Request::get("/apis/x/v1/namespaces/a/layertests/n")
            .body(())
            .expect("request");
        let answer = service.oneshot(request).await.expect("answer");
        assert_eq!(answer.status(), 404);
        assert_eq!(metrics().requests.get_or_create(&labels).get(), before + 1);
    }
}
