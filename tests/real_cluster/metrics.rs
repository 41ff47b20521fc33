//! `/metrics` over HTTPS behind the API server's authentication and authorization (issue 47,
//! "Day 2"), on the real API server: the webhook binary, its reviews made with its own service
//! account's token through the overlay's RBAC (deploy/base/metrics-rbac.yaml), scraped with
//! service-account tokens: bound to the ClusterRole jobset-inplace-metrics-reader 200, without
//! it 403, a token the API server does not accept 401, no token 401; nothing on the health port.

use super::*;

/// GET `https://127.0.0.1:port/metrics` (the certificate not verified, as the ServiceMonitor
/// does) with `token` as bearer: the status and the body.
async fn scrape(port: u16, token: Option<&str>) -> (u16, String) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let mut request = client.get(format!("https://127.0.0.1:{port}/metrics"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("scrape");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_metrics_answer_by_the_api_servers_review() {
    with_cluster(
        "secure_metrics_answer_by_the_api_servers_review",
        |cluster| async move {
            install(&cluster, "epoch").await;
            let ns = TestNamespace::create(&cluster, "metrics-auth").await;
            let binding = format!("{}-scraper", ns.name);
            let mut cluster_objects = ClusterObjects {
                kubeconfig: cluster.kubeconfig.clone(),
                objects: Vec::new(),
            };
            apply(
                &cluster,
                &[
                    json!({"apiVersion": "v1", "kind": "ServiceAccount",
                           "metadata": {"name": "scraper", "namespace": ns.name}}),
                    json!({"apiVersion": "v1", "kind": "ServiceAccount",
                           "metadata": {"name": "tenant", "namespace": ns.name}}),
                ],
            )
            .await
            .expect("the accounts");
            cluster_objects
                .objects
                .push(("clusterrolebinding.rbac.authorization.k8s.io", binding.clone()));
            apply(
                &cluster,
                &[json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                         "metadata": {"name": binding},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                     "name": "jobset-inplace-metrics-reader"},
                         "subjects": [{"kind": "ServiceAccount", "name": "scraper",
                                       "namespace": ns.name}]})],
            )
            .await
            .expect("the scraper's binding");

            // The webhook reviews with its own account's token, as in its pod.
            let webhook_token =
                account_token(&cluster, SYSTEM_NAMESPACE, "jobset-inplace-webhook").await;
            let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
            let kubeconfig = dir.path().join("kubeconfig");
            std::fs::write(
                &kubeconfig,
                format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
                     certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    token: {webhook_token}\n\
                     contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
                    cluster.server, cluster.ca_data
                ),
            )
            .expect("kubeconfig");
            let (health, metrics) = (free_port(), free_port());
            let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobset-inplace"))
                .env_clear()
                .env("KUBECONFIG", &kubeconfig)
                // The dialect as the overlay's config gives it (the account may not read CRDs).
                .args(["--protocol", "epoch", "webhook", "--addr", "127.0.0.1:0"])
                .args(["--health-addr", &format!("127.0.0.1:{health}")])
                .args(["--metrics-addr", &format!("127.0.0.1:{metrics}")])
                .arg("--cert-dir")
                .arg(dir.path().join("certs"))
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("start the webhook");
            eventually("the webhook is ready", Duration::from_secs(30), || {
                http_ok(health, "/readyz")
            })
            .await;

            let scraper = account_token(&cluster, &ns.name, "scraper").await;
            let tenant = account_token(&cluster, &ns.name, "tenant").await;
            // RBAC takes a moment to see a new binding: the scraper is let in eventually.
            eventually("the scraper gets 200", Duration::from_secs(30), || {
                let scraper = scraper.clone();
                async move {
                    match scrape(metrics, Some(&scraper)).await {
                        (200, body) if body.contains("jobset_inplace_admission_requests_total") => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                }
            })
            .await;
            let (status, body) = scrape(metrics, Some(&tenant)).await;
            assert_eq!(status, 403, "{body}");
            assert_eq!(
                body,
                format!("Authorization denied for user system:serviceaccount:{}:tenant\n", ns.name)
            );
            assert_eq!(scrape(metrics, None).await.0, 401);
            assert_eq!(scrape(metrics, Some("not-a-token")).await.0, 401);
            // Again, from the cache.
            assert_eq!(scrape(metrics, Some(&scraper)).await.0, 200);
            // The health port no longer serves /metrics.
            let plain = http_ok(health, "/metrics").await;
            assert!(
                matches!(&plain, Err(line) if line.contains(" 404 ")),
                "{plain:?}"
            );
            let _ = child.kill().await;
            drop(cluster_objects);
            drop(ns);
        },
    )
    .await;
}
