use super::*;
use axum::http::Request as HttpRequest;
use tower::ServiceExt as _;

fn webhook() -> Arc<Webhook> {
    Webhook::new(InjectionConfig::defaults(crate::protocol::Dialect::Epoch))
}

/// The admission routes and `/ping`, a route that only reads its body (as the test kit's
/// webhook harness mounts it): the budget and timeouts without a review.
fn router_with_ping(webhook: Arc<Webhook>, limits: BodyLimits) -> Router {
    async fn ping(State(handlers): State<Handlers>, request: Request) -> Response {
        match handlers.read_body(request).await {
            Ok(_) => json_response(200, b"{}".to_vec()),
            Err(answer) => answer,
        }
    }
    admission_routes()
        .route("/ping", axum::routing::get(ping).post(ping))
        .with_state(Handlers::new(webhook, limits))
}

async fn call(router: Router, request: HttpRequest<Body>) -> (u16, Option<String>, Vec<u8>) {
    let response = router.oneshot(request).await.expect("infallible");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    (status, content_type, body)
}

fn post(path: &str, content_type: Option<&str>, body: impl Into<Body>) -> HttpRequest<Body> {
    let mut builder = HttpRequest::post(path);
    if let Some(ct) = content_type {
        builder = builder.header(header::CONTENT_TYPE, ct);
    }
    builder.body(body.into()).expect("request")
}

fn assert_status_body(body: &[u8], code: u16) {
    let status: serde_json::Value = serde_json::from_slice(body).expect("json");
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["code"], code);
}

#[tokio::test]
async fn json_content_types_reach_review_others_get_415() {
    let hook = webhook();
    let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
    for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
        let expected = admission::review(endpoint, body, hook.config());
        let path = format!("/{}", endpoint.as_str());
        for ct in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON ;charset=UTF-8",
        ] {
            let (status, content_type, got) =
                call(router(hook.clone()), post(&path, Some(ct), &body[..])).await;
            assert_eq!(status, expected.http_status, "{ct}");
            assert_eq!(content_type.as_deref(), Some("application/json"));
            assert_eq!(got, expected.body, "{ct}");
        }
        for ct in [Some("text/json"), Some("application/jsonx"), Some(""), None] {
            let (status, content_type, got) =
                call(router(hook.clone()), post(&path, ct, &body[..])).await;
            assert_eq!(status, 415, "{ct:?}");
            assert_eq!(content_type.as_deref(), Some("application/json"));
            assert_status_body(&got, 415);
        }
    }
    let text = hook.metrics().encode();
    assert!(
        text.contains(
            r#"jobset_inplace_admission_requests_total{endpoint="mutate",outcome="error"} 7"#
        ),
        "{text}"
    );
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_while_streaming() {
    let hook = webhook();
    // Declared too large: refused before reading.
    let request = HttpRequest::post("/mutate")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, admission::MAX_BODY_BYTES + 1)
        .body(Body::empty())
        .expect("request");
    let (status, _, body) = call(router(hook.clone()), request).await;
    assert_eq!(status, 413);
    assert_status_body(&body, 413);

    // Streamed without a length: stops once past the limit.
    let chunk = bytes_chunk(1024 * 1024);
    let pulled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = pulled.clone();
    let stream = futures::stream::iter(0..100).map(move |_| {
        counter.fetch_add(1, Ordering::Relaxed);
        Ok::<_, std::io::Error>(chunk.clone())
    });
    let (status, _, body) = call(
        router(hook.clone()),
        post(
            "/validate",
            Some("application/json"),
            Body::from_stream(stream),
        ),
    )
    .await;
    assert_eq!(status, 413);
    assert_status_body(&body, 413);
    let pulled = pulled.load(Ordering::Relaxed);
    assert!(pulled <= 8, "read {pulled} MiB of a 100 MiB body");
}

#[tokio::test]
async fn a_body_that_stalls_gets_408() {
    let limits = BodyLimits {
        read_timeout: Duration::from_millis(200),
        ..BodyLimits::default()
    };
    let stream = futures::stream::iter([Ok::<_, std::io::Error>(bytes_chunk(10))])
        .chain(futures::stream::pending());
    let started = Instant::now();
    let (status, _, body) = call(
        router_with(webhook(), limits),
        post(
            "/validate",
            Some("application/json"),
            Body::from_stream(stream),
        ),
    )
    .await;
    assert_eq!(status, 408);
    assert_status_body(&body, 408);
    assert!(started.elapsed() >= Duration::from_millis(200));
}

/// A request holding all but one byte of the budget (body sent but for its last byte), and
/// the router.
async fn budget_held(
    read_timeout: Duration,
) -> (
    Router,
    tokio::sync::mpsc::Sender<axum::body::Bytes>,
    tokio::task::JoinHandle<(u16, Option<String>, Vec<u8>)>,
) {
    let limits = BodyLimits {
        read_timeout,
        bytes_in_flight: admission::MAX_BODY_BYTES,
    };
    let router = router_with_ping(webhook(), limits);
    let (tx, rx) = tokio::sync::mpsc::channel::<axum::body::Bytes>(2);
    tx.send(bytes_chunk(admission::MAX_BODY_BYTES - 1))
        .await
        .expect("send");
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    let holder = HttpRequest::post("/ping")
        .header(header::CONTENT_LENGTH, admission::MAX_BODY_BYTES)
        .body(Body::from_stream(stream))
        .expect("request");
    let holder = tokio::spawn(call(router.clone(), holder));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!holder.is_finished());
    (router, tx, holder)
}

#[tokio::test]
async fn bodies_wait_briefly_for_room_in_the_budget() {
    let (router, tx, holder) = budget_held(Duration::from_secs(10)).await;
    // Two bytes do not fit: the request waits.
    let waiter = tokio::spawn(call(router.clone(), post("/ping", None, "{}")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "waits while the budget is taken");

    tx.send(bytes_chunk(1)).await.expect("send");
    drop(tx);
    let (status, _, _) = holder.await.expect("holder");
    assert_eq!(status, 200);
    let (status, _, body) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("answered once there is room")
        .expect("waiter");
    assert_eq!((status, body.as_slice()), (200, &b"{}"[..]));
}

#[tokio::test]
async fn no_room_within_a_second_is_429_with_retry_after() {
    let (router, tx, holder) = budget_held(Duration::from_secs(10)).await;
    let started = Instant::now();
    let response = router
        .clone()
        .oneshot(post("/validate", Some("application/json"), "{}"))
        .await
        .expect("infallible");
    assert!(started.elapsed() >= BODY_BUDGET_WAIT);
    assert_eq!(response.status(), 429);
    assert_eq!(
        response.headers().get(header::RETRY_AFTER),
        Some(&HeaderValue::from_static("1"))
    );
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert_status_body(&body, 429);
    drop(tx);
    // The holder's body ends short of its declared length: an error, its bytes returned.
    let _ = holder.await.expect("holder");
    let (status, _, _) = call(router, post("/ping", None, "{}")).await;
    assert_eq!(status, 200);
}

/// Issue 21, item 2: costly reviews hold at most their slots; one that finds none within
/// [`LARGE_REVIEW_WAIT`] is shed (429, `Retry-After`, `Connection: close`) while a small one
/// beside it is reviewed at once.
#[tokio::test]
async fn large_reviews_past_their_slots_are_shed_and_small_ones_go_on() {
    let handlers = Handlers::new(webhook(), BodyLimits::default());
    let slots = handlers.large_reviews.clone();
    let held = slots
        .clone()
        .acquire_many_owned(u32::try_from(large_review_slots()).expect("few slots"))
        .await
        .expect("slots");
    let router = admission_routes().with_state(handlers);
    let large = format!("{{\"padding\": \"{}\"}}", "x".repeat(LARGE_REVIEW_BYTES));
    let started = Instant::now();
    let response = router
        .clone()
        .oneshot(post("/validate", Some("application/json"), large.clone()))
        .await
        .expect("infallible");
    assert!(started.elapsed() >= LARGE_REVIEW_WAIT);
    assert_eq!(response.status(), 429);
    assert_eq!(
        response.headers().get(header::CONNECTION),
        Some(&HeaderValue::from_static("close"))
    );
    assert!(response.headers().get(header::RETRY_AFTER).is_some());
    // A small review does not wait for a slot (it is reviewed: 400, no uid in "{}").
    let started = Instant::now();
    let (status, _, _) = call(
        router.clone(),
        post("/validate", Some("application/json"), "{}"),
    )
    .await;
    assert_eq!(status, 400);
    assert!(started.elapsed() < LARGE_REVIEW_WAIT);
    // Once a slot is free the large one is reviewed (400 as well).
    drop(held);
    let (status, _, _) = call(router, post("/validate", Some("application/json"), large)).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn the_budget_is_returned_after_each_request() {
    let limits = BodyLimits {
        read_timeout: Duration::from_secs(5),
        bytes_in_flight: admission::MAX_BODY_BYTES,
    };
    let router = router_with(webhook(), limits);
    let big = vec![b' '; admission::MAX_BODY_BYTES];
    // Each request takes the whole budget: they only pass one after the other if each gives
    // it back, whatever its answer (a chunked body, an over-limit one, a review).
    for _ in 0..3 {
        let (status, _, _) = call(
            router.clone(),
            post("/mutate", Some("application/json"), big.clone()),
        )
        .await;
        assert_eq!(status, 400);
        let stream =
            futures::stream::iter(0..8).map(|_| Ok::<_, std::io::Error>(bytes_chunk(1024 * 1024)));
        let (status, _, _) = call(
            router.clone(),
            post(
                "/validate",
                Some("application/json"),
                Body::from_stream(stream),
            ),
        )
        .await;
        assert_eq!(status, 413);
    }
}

fn bytes_chunk(len: usize) -> axum::body::Bytes {
    axum::body::Bytes::from(vec![b' '; len])
}

use futures::StreamExt as _;

#[tokio::test]
async fn ping_and_unknown_routes() {
    let hook = webhook();
    let ping = router_with_ping(hook.clone(), BodyLimits::default());
    let (status, _, body) = call(ping, post("/ping", None, "x")).await;
    assert_eq!((status, body.as_slice()), (200, &b"{}"[..]));
    // The production routes have no `/ping`.
    let (status, _, _) = call(router(hook.clone()), post("/ping", None, "x")).await;
    assert_eq!(status, 404);
    let get = HttpRequest::get("/mutate")
        .body(Body::empty())
        .expect("request");
    let (status, _, _) = call(router(hook.clone()), get).await;
    assert_eq!(status, 405);
    let (status, _, _) = call(router(hook), post("/other", None, "x")).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn readiness_follows_the_flag() {
    let hook = webhook();
    let get = |path: &str| HttpRequest::get(path).body(Body::empty()).expect("request");
    assert_eq!(
        call(health_router(hook.clone()), get("/readyz")).await.0,
        503
    );
    assert_eq!(
        call(health_router(hook.clone()), get("/healthz")).await.0,
        200
    );
    hook.set_ready(true);
    assert_eq!(
        call(health_router(hook.clone()), get("/readyz")).await.0,
        200
    );
    let (status, content_type, body) = call(health_router(hook), get("/metrics")).await;
    assert_eq!(status, 200);
    assert_eq!(
        content_type.as_deref(),
        Some(super::super::metrics::CONTENT_TYPE)
    );
    assert!(String::from_utf8_lossy(&body).contains("jobset_inplace_build_info"));
}
