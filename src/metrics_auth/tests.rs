#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

fn header(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap()
}

#[test]
fn the_bearer_token_is_read_from_the_authorization_header() {
    assert_eq!(bearer_token(Some(&header("Bearer abc"))), Some("abc"));
    assert_eq!(bearer_token(Some(&header("bearer  abc "))), Some("abc"));
    assert_eq!(bearer_token(Some(&header("Basic abc"))), None);
    assert_eq!(bearer_token(Some(&header("Bearer "))), None);
    assert_eq!(bearer_token(Some(&header("Bearer"))), None);
    assert_eq!(bearer_token(None), None);
}

#[test]
fn the_answers_are_controller_runtimes() {
    let allowed = Ok(Verdict::Allowed { user: "u".into() });
    assert_eq!(answer(Some(&allowed)), None);
    assert_eq!(answer(None).unwrap().0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        answer(Some(&Ok(Verdict::Unauthenticated))).unwrap().0,
        StatusCode::UNAUTHORIZED
    );
    let forbidden = answer(Some(&Ok(Verdict::Forbidden {
        user: "system:serviceaccount:a:b".into(),
    })))
    .unwrap();
    assert_eq!(forbidden.0, StatusCode::FORBIDDEN);
    assert_eq!(
        forbidden.1,
        "Authorization denied for user system:serviceaccount:a:b\n"
    );
    assert_eq!(
        answer(Some(&Err("down".into()))).unwrap().0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
}

#[test]
fn verdicts_expire_and_the_cache_is_bounded() {
    let now = Instant::now();
    let mut cache = Cache::new(2);
    cache.put("a", Verdict::Allowed { user: "a".into() }, now);
    cache.put("f", Verdict::Forbidden { user: "f".into() }, now);
    assert_eq!(
        cache.get("a", now),
        Some(Verdict::Allowed { user: "a".into() })
    );
    // Forbidden expires after 30 s, allowed after 60 s.
    let later = now + Duration::from_secs(31);
    assert_eq!(cache.get("f", later), None);
    assert!(cache.get("a", later).is_some());
    assert_eq!(cache.get("a", now + Duration::from_secs(61)), None);
    // Full: the entry that expires first goes.
    let mut cache = Cache::new(2);
    cache.put("a", Verdict::Allowed { user: "a".into() }, now);
    cache.put("f", Verdict::Forbidden { user: "f".into() }, now);
    cache.put("u", Verdict::Unauthenticated, now);
    assert_eq!(cache.len(), 2);
    assert_eq!(cache.get("f", now), None);
    assert!(cache.get("a", now).is_some() && cache.get("u", now).is_some());
    // Replacing a key does not evict another.
    cache.put("a", Verdict::Forbidden { user: "a".into() }, now);
    assert_eq!(cache.len(), 2);
}

/// Answers from a table; counts its calls; sleeps `delay` first.
struct Fake {
    calls: AtomicUsize,
    delay: Duration,
}

impl Reviewer for Fake {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Verdict, String>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            match token {
                "scraper" => Ok(Verdict::Allowed {
                    user: "scraper".into(),
                }),
                "tenant" => Ok(Verdict::Forbidden {
                    user: "tenant".into(),
                }),
                "broken" => Err("the API server is down".into()),
                _ => Ok(Verdict::Unauthenticated),
            }
        })
    }
}

fn gate(delay: Duration, timeout: Duration) -> (Arc<Fake>, Arc<Gate>) {
    let fake = Arc::new(Fake {
        calls: AtomicUsize::new(0),
        delay,
    });
    let gate = Gate::new(
        fake.clone(),
        GateSettings {
            review_timeout: timeout,
            concurrent_reviews: 2,
            max_cached: 8,
        },
    );
    (fake, Arc::new(gate))
}

async fn scrape(gate: &Arc<Gate>, token: Option<&str>) -> (StatusCode, String) {
    use tower::ServiceExt as _;
    let mut request = axum::http::Request::get("/metrics");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = router(gate.clone(), Arc::new(|| "# EOF\n".to_owned()))
        .oneshot(request.body(axum::body::Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn each_scrape_is_reviewed_once_per_token_and_answered() {
    let (fake, gate) = gate(Duration::ZERO, Duration::from_secs(5));
    assert_eq!(
        scrape(&gate, Some("scraper")).await,
        (StatusCode::OK, "# EOF\n".into())
    );
    assert_eq!(scrape(&gate, Some("scraper")).await.0, StatusCode::OK);
    assert_eq!(
        fake.calls.load(Ordering::SeqCst),
        1,
        "the second from the cache"
    );
    assert_eq!(scrape(&gate, Some("tenant")).await.0, StatusCode::FORBIDDEN);
    assert_eq!(
        scrape(&gate, Some("stranger")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let calls = fake.calls.load(Ordering::SeqCst);
    assert_eq!(scrape(&gate, None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        fake.calls.load(Ordering::SeqCst),
        calls,
        "no review without a token"
    );
    // A failure is not cached.
    assert_eq!(
        scrape(&gate, Some("broken")).await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        scrape(&gate, Some("broken")).await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(fake.calls.load(Ordering::SeqCst), calls + 2);
    assert_eq!(gate.cached(), 3);
    // Only /metrics is served.
    use tower::ServiceExt as _;
    let other = router(gate.clone(), Arc::new(String::new))
        .oneshot(
            axum::http::Request::get("/healthz")
                .header("authorization", "Bearer scraper")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(start_paused = true)]
async fn a_review_that_does_not_answer_in_time_is_a_500() {
    let (_, gate) = gate(Duration::from_secs(60), Duration::from_secs(2));
    let started = tokio::time::Instant::now();
    assert_eq!(
        scrape(&gate, Some("scraper")).await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(gate.cached(), 0);
}

#[test]
fn the_generated_certificate_serves_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    assert!(self_signed_acceptor(&certificate_names()).is_ok());
}
