//! The monitoring that ships (deploy/components/monitoring's PrometheusRule and the Grafana
//! dashboard deploy/grafana/jobset-inplace.json) reads metrics that exist: a webhook and a
//! reconciler run in-process, answer admissions (one denied) and carry out a group restart, and
//! every metric name in the alerts' and the panels' PromQL must be a series in their /metrics.
//! Also: the latency buckets reach past the webhook timeout, a denial is counted under its rule,
//! and the certificate expiry gauge holds the served certificate's notAfter.
//!
//! Names are read out of PromQL with a small lexer (string literals, label matchers, range and
//! subquery brackets, `by`/`without`/`on`/`ignoring`/`group_*` label lists, numbers and
//! durations are skipped; an identifier followed by `(` is a function or an aggregation), not a
//! full parser: enough for the expressions here, and its own test below covers the cases it
//! must get right.

use std::collections::BTreeSet;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use jobset_inplace::protocol::Dialect;
use jobset_inplace::reconciler;
use jobset_inplace_testkit::apiserver::TestApiServer;
use jobset_inplace_testkit::build::{JobSet, Pod, ReplicatedJob};
use jobset_inplace_testkit::webhook_harness as support;
use serde_json::{Value, json};
use tokio::sync::oneshot;

const LIMIT: Duration = Duration::from_secs(60);
const NS: &str = "team-a";
/// Series Prometheus makes itself, not the binaries.
const FROM_PROMETHEUS: [&str; 1] = ["up"];

async fn bounded<F: Future<Output = ()>>(f: F) {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("the test finished in time");
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------------------------
// PromQL names
// ---------------------------------------------------------------------------------------------

const KEYWORDS: [&str; 11] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
];

/// The metric names an expression reads.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // The last identifier was a keyword that takes a label list: skip the `( ... )` after it.
    let mut label_list_next = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                // A string literal, with backslash escapes (none in raw backtick strings).
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' && c != '`' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            '{' | '[' => {
                // Label matchers, or a range / subquery: skip to the closing bracket (strings
                // inside may hold brackets).
                let close = if c == '{' { '}' } else { ']' };
                i += 1;
                while i < chars.len() && chars[i] != close {
                    if chars[i] == '"' || chars[i] == '\'' {
                        let quote = chars[i];
                        i += 1;
                        while i < chars.len() && chars[i] != quote {
                            if chars[i] == '\\' {
                                i += 1;
                            }
                            i += 1;
                        }
                    }
                    i += 1;
                }
                i += 1;
            }
            '(' if label_list_next => {
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                i += 1;
                label_list_next = false;
            }
            '$' => {
                // A Grafana variable ($__rate_interval, ${datasource}).
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || "_{}".contains(chars[i])) {
                    i += 1;
                }
            }
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                // A number or a duration (5m, 1h30m, 1e3, 0x1f).
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let keyword = KEYWORDS.contains(&word.as_str());
                // `sum by (le) (...)`, `max without (pod) (...)`: an aggregation whose
                // grouping comes first.
                let rest: String = chars[j..].iter().take(8).collect();
                let grouping_next = ["by", "without"].iter().any(|g| {
                    rest.strip_prefix(g)
                        .is_some_and(|r| r.starts_with(|c: char| c.is_whitespace() || c == '('))
                });
                if keyword {
                    label_list_next = matches!(
                        word.as_str(),
                        "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                    );
                } else if !grouping_next
                    && chars.get(j) != Some(&'(')
                    && !["inf", "nan"].contains(&word.to_ascii_lowercase().as_str())
                {
                    // Not a function or aggregation call.
                    names.insert(word);
                }
            }
            c if c.is_whitespace() => i += 1,
            _ => {
                label_list_next = false;
                i += 1;
            }
        }
    }
    names
}

#[test]
fn the_name_lexer_gets_promql_right() {
    let cases: [(&str, &[&str]); 8] = [
        (
            r#"sum by (le, endpoint) (rate(a_bucket{x="y{z}", w=~"by(q)"}[5m]))"#,
            &["a_bucket"],
        ),
        ("(max(is_leader) or vector(0)) < 1", &["is_leader"]),
        (
            "min by (namespace, pod) (not_after) - time() < 14 * 86400",
            &["not_after"],
        ),
        ("sum(up{job=\"j\"}) < 1 or absent(up{job=\"j\"})", &["up"]),
        (
            "a / on(pod) group_left(version) b offset 1h > bool 0.5e3",
            &["a", "b"],
        ),
        (
            "increase(c_total{result='failure'}[$__rate_interval]) > 0",
            &["c_total"],
        ),
        (
            "histogram_quantile(0.99, sum without (pod) (rate(h_bucket[1h30m:1m])))",
            &["h_bucket"],
        ),
        ("x > +Inf or y != NaN", &["x", "y"]),
    ];
    for (expr, want) in cases {
        let got = metric_names(expr);
        let want: BTreeSet<String> = want.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(got, want, "{expr}");
    }
}

/// Every `expr` of the PrometheusRule, with its alert's name.
fn rule_exprs() -> Vec<(String, String)> {
    let path = repo().join("deploy/components/monitoring/prometheusrule.yaml");
    let text = std::fs::read_to_string(&path).expect("read the PrometheusRule");
    let rule: Value = serde_saphyr::from_str(&text).expect("PrometheusRule YAML");
    assert_eq!(rule["kind"], "PrometheusRule");
    let mut out = Vec::new();
    for group in rule["spec"]["groups"].as_array().expect("groups") {
        for r in group["rules"].as_array().expect("rules") {
            let name = r["alert"]
                .as_str()
                .or_else(|| r["record"].as_str())
                .expect("alert or record");
            let expr = r["expr"].as_str().expect("expr");
            out.push((format!("alert {name}"), expr.to_owned()));
        }
    }
    assert!(out.len() >= 6, "{out:?}");
    out
}

/// Every `expr` of the dashboard's panels (and of its template variables' queries).
fn dashboard_exprs() -> Vec<(String, String)> {
    let path = repo().join("deploy/grafana/jobset-inplace.json");
    let text = std::fs::read_to_string(&path).expect("read the dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut out = Vec::new();
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or("?");
        assert!(
            ids.insert(panel["id"].to_string()),
            "panel id twice: {title}"
        );
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr");
            assert!(!expr.trim().is_empty(), "{title}: empty expr");
            out.push((format!("panel {title:?}"), expr.to_owned()));
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(query) = var["query"]["query"].as_str() {
            // label_values(metric, label)
            let metric = query
                .strip_prefix("label_values(")
                .and_then(|q| q.split(',').next())
                .expect("a label_values query");
            out.push((format!("variable {}", var["name"]), metric.to_owned()));
        }
    }
    assert!(out.len() >= 10, "{out:?}");
    out
}

/// The sample names of a text exposition (`name{labels} value` or `name value`).
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The two components' /metrics
// ---------------------------------------------------------------------------------------------

/// A webhook's /metrics after a patched mutation and a denied validation of the story-1 JobSet.
async fn webhook_metrics() -> String {
    let server = support::TestServer::start(Duration::from_secs(5)).await;
    let fixture = repo().join("fixtures/admission/story1-plain/request.json");
    let body = std::fs::read(&fixture).expect("fixture");
    let mut conn = server.connect().await.expect("connect");
    let mutate = conn.post_json("/mutate", &body).await.expect("mutate");
    assert_eq!(mutate.status, 200);
    let validate = conn.post_json("/validate", &body).await.expect("validate");
    assert_eq!(validate.status, 200);
    let answer: Value = serde_json::from_slice(&validate.body).expect("review");
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    drop(conn);
    let (status, text) = server.health_get("/metrics").await.expect("metrics");
    assert_eq!(status, 200);

    // The served certificate's notAfter, as Unix time.
    let cert = std::fs::read(server.dir.path().join(jobset_inplace::certs::TLS_CERT_FILE))
        .expect("tls.crt");
    let chain =
        jobset_inplace::certs::parse_certs(&cert, std::path::Path::new("tls.crt")).expect("parse");
    let not_after = jobset_inplace::certs::not_after(&chain[0]).expect("notAfter");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    assert!(not_after > now + 14 * 86_400, "{not_after}");
    let line = format!(
        "jobset_inplace_tls_certificate_not_after_seconds{{certificate=\"serving\"}} {not_after}"
    );
    assert!(text.contains(&line), "{line} missing from\n{text}");
    server.stop().await;
    text
}

/// A reconciler's /metrics after one group restart of a two-pod JobSet (epoch dialect).
async fn reconciler_metrics() -> String {
    let dialect = Dialect::Epoch;
    let server = TestApiServer::start().await;
    server
        .create(
            "jobsets",
            JobSet::new("js")
                .namespace(NS)
                .max_restarts(10)
                .replicated_jobs([ReplicatedJob::new("rj0").pods(2)])
                .build(),
        )
        .expect("jobset");
    for i in 0..2 {
        server
            .create(
                "pods",
                jobset_inplace_testkit::reconciler::member_of(
                    &server,
                    Pod::worker(NS, "js", &format!("js-{i}")).running().build(),
                ),
            )
            .expect("pod");
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let options = jobset_inplace_testkit::reconciler::options(dialect, "r1");
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(reconciler::run(
        server.client(),
        options,
        Some(listener),
        async {
            let _ = stopped.await;
        },
    ));
    let set_epoch = |pod: usize, epoch: i64| {
        let patch =
            json!({"metadata": {"annotations": {dialect.pod_annotation(): epoch.to_string()}}});
        server
            .patch("pods", NS, &format!("js-{pod}"), &patch)
            .expect("pod annotation");
    };
    let synced = || {
        server.get("jobsets", NS, "js").expect("jobset")["status"][dialect.synced_field()].as_i64()
    };
    let until = |what: &'static str, want: i64| {
        let synced = &synced;
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while synced() != Some(want) {
                assert!(tokio::time::Instant::now() < deadline, "never {what}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    set_epoch(0, 1);
    set_epoch(1, 1);
    until("synced at 1", 1).await;
    set_epoch(0, 2);
    // The group restart starts (the deprecated epoch written) only if the reconciler sees one pod
    // ahead of the other: wait for it before moving the second.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while server.get("jobsets", NS, "js").expect("jobset")["status"][dialect.deprecated_field()]
        .as_i64()
        != Some(1)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never deprecated at 1"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    set_epoch(1, 2);
    until("synced at 2 (a group restart)", 2).await;
    // The reconciler records the duration after its write's answer: the metrics may lag the
    // synced epoch a moment.
    let lines = [
        "jobset_inplace_reconciler_group_restarts_total 1",
        "jobset_inplace_reconciler_group_restart_duration_seconds_count 1",
        "jobset_inplace_reconciler_jobset_deprecated_epoch{jobset_namespace=\"team-a\",jobset=\"js\"} 1",
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let text = loop {
        let (status, text) = support::health_get(addr, "/metrics")
            .await
            .expect("metrics");
        assert_eq!(status, 200);
        match lines.iter().find(|line| !text.contains(*line)) {
            None => break text,
            Some(line) if tokio::time::Instant::now() >= deadline => {
                panic!("{line} missing from\n{text}")
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    let _ = stop.send(());
    run.await.expect("joins").expect("clean stop");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_alerts_and_the_dashboard_read_is_exported() {
    support::install_provider();
    bounded(async {
        let webhook = webhook_metrics().await;
        let reconciler = reconciler_metrics().await;

        // A denial is counted under the rule it broke: the story-1 JobSet has no agent.
        let line = "jobset_inplace_admission_denials_total{endpoint=\"validate\",rule=\"agent_missing\"} 1";
        assert!(webhook.contains(line), "{line} missing from\n{webhook}");
        // The latency histogram reaches past the API server's 5 s timeout.
        for le in ["5.0", "10.0"] {
            let bucket = format!(
                "jobset_inplace_admission_duration_seconds_bucket{{le=\"{le}\",endpoint=\"validate\"}} 1"
            );
            assert!(webhook.contains(&bucket), "{bucket} missing from\n{webhook}");
        }

        let mut exported = sample_names(&webhook);
        exported.extend(sample_names(&reconciler));
        let mut missing = Vec::new();
        let mut read = BTreeSet::new();
        for (source, expr) in rule_exprs().into_iter().chain(dashboard_exprs()) {
            let names = metric_names(&expr);
            assert!(!names.is_empty(), "{source}: no metric in {expr:?}");
            for name in names {
                if FROM_PROMETHEUS.contains(&name.as_str()) {
                    continue;
                }
                if !exported.contains(&name) {
                    missing.push(format!("{source}: {name} (in {expr:?})"));
                }
                read.insert(name);
            }
        }
        assert!(
            missing.is_empty(),
            "metrics read but not exported:\n{}\n\nexported: {exported:?}",
            missing.join("\n")
        );
        println!("{} metric names read by the alerts and the dashboard, all exported: {read:?}", read.len());
    })
    .await;
}

/// The value of the sample `series` (the name and its labels, as written) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Issue 47: the reconciler binary (its own client, as deployed) serves the process's
/// `process_*` series and its API client's requests by verb, resource and code, with sane
/// values: a resident size between 1 MiB and 1 GiB, a few open descriptors under the limit, a
/// start within the last hour, and the lists and watches of its caches answered 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_and_api_client_metrics_have_sane_values() {
    bounded(async {
        let server = TestApiServer::start().await;
        let process = jobset_inplace_testkit::process::ReconcilerProcess::spawn(
            std::path::Path::new(env!("CARGO_BIN_EXE_jobset-inplace")),
            &server,
            Dialect::Epoch,
            &[],
        )
        .expect("the reconciler process");
        let listed = "jobset_inplace_api_client_requests_total{verb=\"list\",resource=\"jobsets\",code=\"200\"}";
        let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
        let text = loop {
            if let Ok((200, text)) = support::health_get(process.health, "/metrics").await
                && sample(&text, listed).is_some_and(|n| n >= 1.0)
            {
                break text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {listed} within 40 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let resident = sample(&text, "process_resident_memory_bytes").expect("resident");
        assert!(
            (1024.0 * 1024.0..1024.0 * 1024.0 * 1024.0).contains(&resident),
            "{resident}"
        );
        let open = sample(&text, "process_open_fds").expect("open fds");
        let max = sample(&text, "process_max_fds").expect("max fds");
        assert!(open >= 3.0 && open < max, "{open} of {max}");
        assert!(sample(&text, "process_cpu_seconds_total").expect("cpu") >= 0.0);
        assert!(sample(&text, "process_virtual_memory_bytes").expect("virtual") >= resident);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        let started = sample(&text, "process_start_time_seconds").expect("start");
        assert!(started > now - 3600.0 && started <= now + 1.0, "{started} vs {now}");
        let watched = "jobset_inplace_api_client_requests_total{verb=\"watch\",resource=\"pods\",code=\"200\"}";
        let latency = "jobset_inplace_api_client_request_duration_seconds_count{verb=\"list\",resource=\"jobsets\"}";
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (_, text) = support::health_get(process.health, "/metrics")
                .await
                .expect("metrics");
            if sample(&text, watched).is_some_and(|n| n >= 1.0)
                && sample(&text, latency).is_some_and(|n| n >= 1.0)
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{watched} and {latency} missing from\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        drop(process);
        server.shutdown().await;
    })
    .await;
}

/// The anchor GitHub gives a Markdown heading: lower case, punctuation but `-` and `_` dropped,
/// spaces made `-`.
fn heading_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn heading_anchors_are_githubs() {
    assert_eq!(
        heading_anchor("`doctor`: the checks and what to do"),
        "doctor-the-checks-and-what-to-do"
    );
    assert_eq!(
        heading_anchor(
            "The agent was not injected, or every InPlaceRestart JobSet is refused: the webhook is down"
        ),
        "the-agent-was-not-injected-or-every-inplacerestart-jobset-is-refused-the-webhook-is-down"
    );
}

/// Issue 47: every alert has a `runbook_url` to a section of docs/troubleshooting.md that exists
/// (the chart's default base, `metrics.prometheusRule.runbookBaseUrl`).
#[test]
fn every_alert_has_a_runbook_url_to_a_troubleshooting_section() {
    let base =
        "https://github.com/jobset-inplace/jobset-inplace/blob/main/docs/troubleshooting.md#";
    let text = std::fs::read_to_string(repo().join("docs/troubleshooting.md")).expect("read");
    let anchors: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| heading_anchor(l.trim_start_matches('#')))
        .collect();
    let path = repo().join("deploy/components/monitoring/prometheusrule.yaml");
    let rule: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&path).expect("read")).expect("YAML");
    let mut alerts = 0;
    for group in rule["spec"]["groups"].as_array().expect("groups") {
        for r in group["rules"].as_array().expect("rules") {
            let Some(name) = r["alert"].as_str() else {
                continue;
            };
            alerts += 1;
            let url = r["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: no runbook_url"));
            let anchor = url
                .strip_prefix(base)
                .unwrap_or_else(|| panic!("{name}: {url} is not under {base}"));
            assert!(
                anchors.contains(anchor),
                "{name}: no section #{anchor} in docs/troubleshooting.md: {anchors:?}"
            );
        }
    }
    assert!(alerts >= 13, "{alerts} alerts");
}
