//! Issue 24: doctor before the first JobSet; issue 23: the cluster decides the dialect

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_the_cluster_before_the_first_jobset() {
    with_cluster(
        "doctor_checks_the_cluster_before_the_first_jobset",
        |cluster| async move {
            let ns = TestNamespace::create(&cluster, "doctor").await;
            let webhook = serve_webhook(&cluster).await;
            // The webhook on loopback injects the epoch dialect (its default outside a cluster).
            ensure_epoch_status_fields(&cluster).await;
            let global = ["--protocol", "epoch"];
            let args = ["-n", ns.name.as_str()];
            // The API server picks up new webhook configurations within a few seconds.
            let report = eventually(
                "doctor sees the webhook",
                Duration::from_secs(60),
                || async {
                    let (report, _) = doctor(&cluster, &global, &args).await;
                    if finding(&report, "webhook-injection")["verdict"] == "ok" {
                        Ok(report)
                    } else {
                        Err(format!("{report:#}"))
                    }
                },
            )
            .await;
            for check in [
                "kubernetes-version",
                "restart-all-containers",
                "jobset-in-place-restart-gate",
                "webhook-injection",
                "webhook-validation",
                "flow-schemas",
            ] {
                assert_eq!(
                    finding(&report, check)["verdict"],
                    "ok",
                    "{check}: {report:#}"
                );
            }
            assert!(
                finding(&report, "kubernetes-version")["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("v1.35")),
                "{report:#}"
            );
            // No Deployment runs JobSet here (its controller is a process): a warning, not a failure.
            assert_eq!(finding(&report, "jobset-controller")["verdict"], "warn");
            // Nothing of the dry runs was stored.
            let jobsets = jobset_api(&cluster.client, &ns.name);
            assert!(
                jobsets
                    .list(&ListParams::default())
                    .await
                    .expect("list")
                    .items
                    .is_empty()
            );
            let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns.name);
            assert!(
                pods.list(&ListParams::default())
                    .await
                    .expect("list")
                    .items
                    .is_empty()
            );

            // The pull check: no kubelet here, so the pod is never scheduled: a warning that says
            // so at its deadline, and the pod deleted. (ErrImagePull itself: the unit tests of
            // check_pull, and the real node.)
            let (report, _) = doctor(
                &cluster,
                &global,
                &[
                    "-n",
                    &ns.name,
                    "--pull-check",
                    "--agent-image",
                    "registry.invalid/jobset-inplace:none",
                    "--nodes",
                    "pool=train",
                    "--pull-timeout",
                    "3s",
                ],
            )
            .await;
            let pull = finding(&report, "agent-image-pull");
            assert_eq!(pull["verdict"], "warn", "{pull:#}");
            assert!(
                pull["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("was not scheduled")),
                "{pull:#}"
            );
            let left = pods
                .list(&ListParams::default().labels("app.kubernetes.io/name=jobset-inplace-doctor"))
                .await
                .expect("list");
            assert!(
                left.items
                    .iter()
                    .all(|p| p.metadata.deletion_timestamp.is_some()),
                "the pull-check pod is deleted: {:?}",
                left.items
                    .iter()
                    .map(|p| &p.metadata.name)
                    .collect::<Vec<_>>()
            );

            // The webhook down: mutation is skipped (failurePolicy Ignore), validation fails closed;
            // doctor names both and exits 1.
            webhook.stop().await;
            let (report, code) = doctor(&cluster, &global, &args).await;
            assert_eq!(code, Some(1), "{report:#}");
            let injection = finding(&report, "webhook-injection");
            assert_eq!(injection["verdict"], "fail", "{report:#}");
            let validation = finding(&report, "webhook-validation");
            assert_eq!(validation["verdict"], "fail", "{report:#}");
            assert!(
                validation["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("cannot call webhook validate.jobset-inplace.dev")),
                "{validation:#}"
            );
            assert!(
                validation["fix"]
                    .as_str()
                    .is_some_and(|f| f.contains("running")),
                "{validation:#}"
            );

            delete_webhook_configurations(&cluster).await;
            drop(ns);
        },
    )
    .await;
}

/// Starts `jobset-inplace <component>` as the admin with `--protocol auto`, and returns the
/// dialect it logs (or, if it exits first, its exit code and output).
async fn component_dialect(cluster: &Cluster, args: &[&str]) -> Result<String, String> {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobset-inplace"))
        .env_clear()
        .env("KUBECONFIG", &cluster.kubeconfig)
        .args(["--log-format", "json"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the component");
    use tokio::io::AsyncBufReadExt as _;
    // Logs and the final error both go to stderr.
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            // The JSON log line (not the refusal, which names the same words).
            let v: Value = serde_json::from_str(&line).unwrap_or_default();
            if v["message"] == "epoch protocol dialect" {
                return Ok(format!(
                    "{} ({})",
                    v["dialect"].as_str().unwrap_or(&line),
                    v["why"].as_str().unwrap_or_default()
                ));
            }
            seen.push(line);
        }
        let status = child.wait().await.expect("wait");
        Err(format!("exited {status}: {}", seen.join("\n")))
    })
    .await
    .unwrap_or_else(|_| panic!("no dialect logged within 60 s: {seen:?}"));
    let _ = child.kill().await;
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_decides_the_dialect() {
    with_cluster("the_cluster_decides_the_dialect", |cluster| async move {
        let reconciler = [
            "reconciler",
            "--health-addr",
            "127.0.0.1:0",
            "--metrics-secure=false",
            "--leader-elect=false",
        ];
        let webhook_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
        let cert_dir = webhook_dir.path().display().to_string();
        let webhook = [
            "webhook",
            "--addr",
            "127.0.0.1:0",
            "--health-addr",
            "127.0.0.1:0",
            "--metrics-secure=false",
            "--cert-dir",
            cert_dir.as_str(),
        ];

        // JobSet's CRD as released: attempt.
        set_jobset_crd_fields(&cluster, true, false).await;
        for component in [&reconciler[..], &webhook[..]] {
            let dialect = component_dialect(&cluster, component).await;
            let dialect = dialect.unwrap_or_else(|e| panic!("{}: {e}", component[0]));
            assert!(
                dialect.starts_with("attempt ("),
                "{}: {dialect}",
                component[0]
            );
            assert!(
                dialect.contains("previousInPlaceRestartAttempt"),
                "{dialect}"
            );
        }
        // doctor without an installation to hold it to (a system namespace with none; one that
        // names its dialect: doctor_fails_when_the_installed_dialect_and_the_crd_disagree).
        let empty = TestNamespace::create(&cluster, "rc-noinstall").await;
        let (report, _) = doctor(
            &cluster,
            &[],
            &["--read-only", "--system-namespace", &empty.name],
        )
        .await;
        drop(empty);
        let crd = finding(&report, "jobset-crd");
        assert!(
            crd["detail"]
                .as_str()
                .is_some_and(|d| d.starts_with("the attempt protocol")),
            "{crd:#}"
        );

        // Patched with the epoch fields (as the epoch variants install it): epoch.
        set_jobset_crd_fields(&cluster, true, true).await;
        for component in [&reconciler[..], &webhook[..]] {
            let dialect = component_dialect(&cluster, component).await;
            let dialect = dialect.unwrap_or_else(|e| panic!("{}: {e}", component[0]));
            assert!(
                dialect.starts_with("epoch ("),
                "{}: {dialect}",
                component[0]
            );
        }
        // --protocol still overrides it.
        let mut forced = vec!["--protocol", "attempt"];
        forced.extend_from_slice(&reconciler);
        let dialect = component_dialect(&cluster, &forced).await.expect("starts");
        assert!(
            dialect.starts_with("attempt (--protocol attempt"),
            "{dialect}"
        );

        // Neither pair: each refuses to start, saying why. (The CRD is put back before the
        // verdicts: the other tests need it.)
        set_jobset_crd_fields(&cluster, false, false).await;
        let mut refusals = Vec::new();
        for component in [&reconciler[..], &webhook[..]] {
            refusals.push((component[0], component_dialect(&cluster, component).await));
        }
        // As the control plane installed it, with the epoch fields the other tests add.
        set_jobset_crd_fields(&cluster, true, true).await;
        for (component, refusal) in refusals {
            let err = refusal.expect_err("refuses to start");
            assert!(
                err.contains("cannot decide the epoch protocol dialect"),
                "{component}: {err}"
            );
            assert!(err.contains("has neither"), "{err}");
        }
    })
    .await;
}

/// `doctor -o json` against the control plane of the kubeconfig at `path` (another than the
/// tests' own): its report, exit code and stderr.
async fn doctor_at(path: &std::ffi::OsStr) -> (Value, Option<i32>, String) {
    run_doctor(Path::new(path), &[], &[]).await
}

/// On a second control plane started with both gates off
/// (`JOBSET_INPLACE_APISERVER_FEATURE_GATES=RestartAllContainersOnContainerExits=false
/// JOBSET_INPLACE_JOBSET_IN_PLACE_RESTART=false scripts/control-plane.sh up DIR`), named by
/// `JOBSET_INPLACE_GATES_OFF_KUBECONFIG`: doctor fails both gate checks with the real refusals.
/// Skipped (loudly) without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_the_gates_that_are_off() {
    let Some(path) = std::env::var_os("JOBSET_INPLACE_GATES_OFF_KUBECONFIG") else {
        eprintln!(
            "!! SKIPPED doctor_names_the_gates_that_are_off: set \
             JOBSET_INPLACE_GATES_OFF_KUBECONFIG to a control plane with both gates off"
        );
        return;
    };
    let (report, code, stderr) = doctor_at(&path).await;
    assert_eq!(code, Some(1), "{stderr}");
    let rule = finding(&report, "restart-all-containers");
    assert_eq!(rule["verdict"], "fail", "{rule:#}");
    assert!(
        rule["detail"]
            .as_str()
            .is_some_and(|d| d.contains("restartPolicyRules")),
        "{rule:#}"
    );
    let gate = finding(&report, "jobset-in-place-restart-gate");
    assert_eq!(gate["verdict"], "fail", "{gate:#}");
    assert!(
        gate["detail"]
            .as_str()
            .is_some_and(|d| d.contains("InPlaceRestart feature gate is disabled")),
        "{gate:#}"
    );
}

/// On a third control plane whose API server emulates Kubernetes 1.34
/// (`JOBSET_INPLACE_APISERVER_EMULATED_VERSION=1.34
/// JOBSET_INPLACE_APISERVER_FEATURE_GATES=ContainerRestartRules=true scripts/control-plane.sh up
/// DIR`: kube-apiserver 1.35's `--emulated-version`, which serves 1.34's APIs and feature gates),
/// named by `JOBSET_INPLACE_OLD_KUBERNETES_KUBECONFIG`: doctor fails the version check, naming
/// the emulated release, and the restart-rule dry run, which 1.34 refuses. Skipped (loudly)
/// without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_fails_an_api_server_older_than_1_35() {
    let Some(path) = std::env::var_os("JOBSET_INPLACE_OLD_KUBERNETES_KUBECONFIG") else {
        eprintln!(
            "!! SKIPPED doctor_fails_an_api_server_older_than_1_35: set \
             JOBSET_INPLACE_OLD_KUBERNETES_KUBECONFIG to a control plane emulating 1.34"
        );
        return;
    };
    let (report, code, stderr) = doctor_at(&path).await;
    assert_eq!(code, Some(1), "{stderr}");
    let version = finding(&report, "kubernetes-version");
    assert_eq!(version["verdict"], "fail", "{version:#}");
    assert!(
        version["detail"]
            .as_str()
            .is_some_and(|d| d.contains("emulating 1.34") && d.contains(">= 1.35")),
        "{version:#}"
    );
    let rule = finding(&report, "restart-all-containers");
    assert_eq!(rule["verdict"], "fail", "{rule:#}");
}
