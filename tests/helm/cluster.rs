//! On a real control plane: `helm install`, `upgrade --reset-then-reuse-values`, `rollback`,
//! `uninstall`.

use super::*;
use jobset_inplace_testkit::build::{JobSet, ReplicatedJob};

/// The kubeconfig of the real control plane, or `None` (and a loud SKIPPED) without one.
fn real_cluster(test: &str) -> Option<PathBuf> {
    let Some(path) = std::env::var_os(KUBECONFIG_ENV).filter(|p| !p.is_empty()) else {
        if std::env::var(REAL_CLUSTER_ENV).as_deref() == Ok("required") {
            panic!("{test}: {REAL_CLUSTER_ENV}=required but {KUBECONFIG_ENV} is not set");
        }
        eprintln!(
            "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
             !! SKIPPED {test}: no real control plane (run scripts/control-plane.sh up DIR\n\
             !! and set {KUBECONFIG_ENV}=DIR/kubeconfig)\n\
             !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
        );
        return None;
    };
    Some(PathBuf::from(path))
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
    run_bounded(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args),
        RUN_LIMIT,
    )
}

fn kubectl_json(kubeconfig: &Path, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    let out = kubectl(kubeconfig, &a).unwrap_or_else(|e| panic!("{e}"));
    serde_json::from_str(&out).expect("kubectl -o json")
}

/// `helm ARGS` against the cluster, in the release namespace.
fn helm_on(helm: &Path, kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
    run_bounded(
        Command::new(helm)
            .args(args)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--namespace", NAMESPACE]),
        RUN_LIMIT,
    )
}

/// Every object the release names, as (kind, namespace, name), from `helm get manifest`.
fn release_objects(helm: &Path, kubeconfig: &Path) -> Vec<(String, String, String)> {
    let text =
        helm_on(helm, kubeconfig, &["get", "manifest", RELEASE]).unwrap_or_else(|e| panic!("{e}"));
    parse_yaml_stream(&text, "helm get manifest")
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default().to_owned(),
                o["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

/// The resource name kubectl takes for a kind of the chart.
fn resource_of(kind: &str) -> String {
    match kind {
        "PodDisruptionBudget" => "poddisruptionbudgets.policy".to_owned(),
        "FlowSchema" => "flowschemas.flowcontrol.apiserver.k8s.io".to_owned(),
        "ValidatingAdmissionPolicy" => {
            "validatingadmissionpolicies.admissionregistration.k8s.io".to_owned()
        }
        "ValidatingAdmissionPolicyBinding" => {
            "validatingadmissionpolicybindings.admissionregistration.k8s.io".to_owned()
        }
        "CustomResourceDefinition" => "customresourcedefinitions.apiextensions.k8s.io".to_owned(),
        other => other.to_lowercase(),
    }
}

fn exists(kubeconfig: &Path, kind: &str, namespace: &str, name: &str) -> bool {
    let resource = resource_of(kind);
    let mut args = vec![
        "get",
        resource.as_str(),
        name,
        "--ignore-not-found",
        "-o",
        "name",
    ];
    if !namespace.is_empty() {
        args.extend(["-n", namespace]);
    }
    !kubectl(kubeconfig, &args)
        .unwrap_or_else(|e| panic!("{e}"))
        .trim()
        .is_empty()
}

fn reconciler_args(kubeconfig: &Path) -> Vec<String> {
    let d = kubectl_json(
        kubeconfig,
        &[
            "-n",
            NAMESPACE,
            "get",
            "deployment",
            "jobset-inplace-reconciler",
        ],
    );
    strings(&d["spec"]["template"]["spec"]["containers"][0]["args"])
}

/// Polls `check` every 500 ms until it returns `Ok`; panics with its last error after `limit`.
fn eventually<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        match check() {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => panic!("{what}: not within {limit:?}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

#[test]
fn helm_installs_upgrades_rolls_back_and_uninstalls_on_a_real_control_plane() {
    let test = "helm_installs_upgrades_rolls_back_and_uninstalls_on_a_real_control_plane";
    let Some(kubeconfig) = real_cluster(test) else {
        return;
    };
    let Some(helm) = helm() else { return };
    let k = kubeconfig.as_path();
    let chart = chart_dir().display().to_string();
    let ns = "helm-jobsets";
    // Leftovers of an interrupted run go first.
    let _ = helm_on(
        &helm,
        k,
        &["uninstall", RELEASE, "--wait", "--timeout", "2m"],
    );
    let _ = kubectl(
        k,
        &[
            "delete",
            "namespace",
            ns,
            "--ignore-not-found",
            "--wait=true",
        ],
    );

    // install
    kubectl(k, &["create", "namespace", ns]).unwrap_or_else(|e| panic!("{e}"));
    let out = helm_on(
        &helm,
        k,
        &[
            "install",
            RELEASE,
            &chart,
            "--create-namespace",
            "--set",
            "dialect=jobset-native",
        ],
    )
    .unwrap_or_else(|e| panic!("helm install: {e}"));
    eprintln!("{out}");
    let installed = release_objects(&helm, k);
    assert!(
        installed.len() > 30,
        "the release names {} objects",
        installed.len()
    );
    for (kind, namespace, name) in &installed {
        assert!(
            exists(k, kind, namespace, name),
            "{kind} {namespace}/{name} was not created"
        );
    }
    for kind in [
        "mutatingwebhookconfiguration",
        "validatingwebhookconfiguration",
    ] {
        let c = kubectl_json(k, &["get", kind, "jobset-inplace"]);
        assert_eq!(
            c["webhooks"][0]["clientConfig"]["service"]["namespace"], NAMESPACE,
            "{kind}"
        );
        assert_eq!(
            c["metadata"]["annotations"]["meta.helm.sh/release-name"],
            RELEASE
        );
    }
    assert!(
        !reconciler_args(k)
            .iter()
            .any(|a| a.starts_with("--group-restart-timeout"))
    );
    // The API server type-checks each admission policy against the schemas of what it matches
    // (kube-controller-manager's status controller): no warnings.
    let policies: Vec<&str> = installed
        .iter()
        .filter(|(kind, _, _)| kind == "ValidatingAdmissionPolicy")
        .map(|(_, _, name)| name.as_str())
        .collect();
    assert!(policies.len() >= 5, "policies: {policies:?}");
    for name in policies {
        let status = eventually(
            &format!("policy {name} type-checked"),
            Duration::from_secs(90),
            || {
                let p = kubectl_json(k, &["get", "validatingadmissionpolicy", name]);
                let done = p["status"]["observedGeneration"] == p["metadata"]["generation"]
                    && p["status"]["typeChecking"].is_object();
                if done {
                    Ok(p["status"].clone())
                } else {
                    Err(format!("status {}", p["status"]))
                }
            },
        );
        assert!(
            status["typeChecking"]["expressionWarnings"].is_null(),
            "policy {name}: type-check warnings: {status}"
        );
    }

    // A JobSet created under the release (not InPlaceRestart: no webhook pod runs here to
    // answer for one), which the upgrade must leave as stored.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let manifest = dir.path().join("jobset.json");
    std::fs::write(
        &manifest,
        JobSet::new("helm-before")
            .namespace(ns)
            .no_failure_policy()
            .no_status()
            .replicated_jobs([ReplicatedJob::new("workers")
                .pod_spec("restartPolicy", json!("Never"))
                .containers(
                    json!([{"name": "train", "image": "busybox:1.36", "command": ["true"]}]),
                )])
            .build()
            .to_string(),
    )
    .expect("write");
    kubectl(k, &["create", "-f", &manifest.display().to_string()])
        .unwrap_or_else(|e| panic!("{e}"));
    let before = kubectl_json(k, &["-n", ns, "get", "jobset", "helm-before"]);
    // The release's webhook configurations are live: an InPlaceRestart JobSet goes to them, and
    // with no webhook pod to answer (none runs on this control plane) the validating one fails
    // closed, by name.
    let in_place = dir.path().join("in-place.json");
    std::fs::write(
        &in_place,
        JobSet::new("helm-in-place")
            .namespace(ns)
            .no_status()
            .replicated_jobs([ReplicatedJob::new("workers")
                .pod_spec("restartPolicy", json!("Never"))
                .containers(
                    json!([{"name": "train", "image": "busybox:1.36", "command": ["true"]}]),
                )])
            // What JobSet's own validation asks of an in-place JobSet (our webhook would add
            // it), so that only ours can refuse it.
            .max_restarts(3)
            .as_jobset_requires()
            .build()
            .to_string(),
    )
    .expect("write");
    let refused = kubectl(
        k,
        &[
            "create",
            "--dry-run=server",
            "-f",
            &in_place.display().to_string(),
        ],
    )
    .expect_err("an InPlaceRestart JobSet got through without its webhook");
    assert!(
        refused.contains("validate.jobset-inplace.dev"),
        "refused, but not by our webhook: {refused}"
    );

    // upgrade to a changed value
    helm_on(
        &helm,
        k,
        &[
            "upgrade",
            RELEASE,
            &chart,
            // Not --reuse-values, which takes the old chart's defaults as the new one's
            // (docs/operations.md, "Installing with Helm").
            "--reset-then-reuse-values",
            "--set",
            "reconciler.groupRestartTimeout=5m",
        ],
    )
    .unwrap_or_else(|e| panic!("helm upgrade: {e}"));
    assert!(
        reconciler_args(k).contains(&"--group-restart-timeout=5m".to_owned()),
        "the upgrade reached the reconciler: {:?}",
        reconciler_args(k)
    );
    let after = kubectl_json(k, &["-n", ns, "get", "jobset", "helm-before"]);
    // Not the resourceVersion: JobSet's controller writes the status of a JobSet it has just
    // seen created (its Jobs, its conditions) whenever it gets to it, which lost a race with the
    // upgrade in a CI run. What the upgrade must not write: the spec (its generation), the labels,
    // the annotations.
    for field in ["generation", "labels", "annotations"] {
        assert_eq!(
            before["metadata"][field], after["metadata"][field],
            "the upgrade wrote the JobSet's {field}"
        );
    }
    assert_eq!(before["spec"], after["spec"]);
    let cm = kubectl_json(
        k,
        &["-n", NAMESPACE, "get", "configmap", "jobset-inplace-config"],
    );
    assert_eq!(
        cm["data"]["protocol"], "attempt",
        "--reset-then-reuse-values kept the dialect given at install"
    );

    // rollback to the first revision
    helm_on(&helm, k, &["rollback", RELEASE, "1"]).unwrap_or_else(|e| panic!("helm rollback: {e}"));
    assert!(
        !reconciler_args(k)
            .iter()
            .any(|a| a.starts_with("--group-restart-timeout")),
        "the rollback took the timeout back out: {:?}",
        reconciler_args(k)
    );
    // Nor does the rollback write the JobSet that runs under it (docs/operations.md, "Rolling
    // back").
    let rolled = kubectl_json(k, &["-n", ns, "get", "jobset", "helm-before"]);
    for field in ["generation", "labels", "annotations"] {
        assert_eq!(
            before["metadata"][field], rolled["metadata"][field],
            "the rollback wrote the JobSet's {field}"
        );
    }
    assert_eq!(before["spec"], rolled["spec"]);
    let history =
        helm_on(&helm, k, &["history", RELEASE, "-o", "json"]).unwrap_or_else(|e| panic!("{e}"));
    let history: Value = serde_json::from_str(&history).expect("history JSON");
    assert_eq!(
        history.as_array().map(Vec::len),
        Some(3),
        "install, upgrade, rollback: {history}"
    );

    // uninstall: nothing the release named is left
    let objects = release_objects(&helm, k);
    helm_on(
        &helm,
        k,
        &["uninstall", RELEASE, "--wait", "--timeout", "2m"],
    )
    .unwrap_or_else(|e| panic!("helm uninstall: {e}"));
    // The JobSetEpoch CRD stays (crds.keep, helm.sh/resource-policy: keep): deleting it would
    // delete what running JobSets' agents watch. Everything else of the release goes.
    let kept = ("CustomResourceDefinition", "", JOBSETEPOCH_CRD);
    assert!(
        objects
            .iter()
            .any(|(kind, _, name)| kind == kept.0 && name == kept.2),
        "the release installed the JobSetEpoch CRD: {objects:?}"
    );
    let left: Vec<_> = objects
        .iter()
        .filter(|(kind, _, name)| !(kind == kept.0 && name == kept.2))
        .filter(|(kind, namespace, name)| exists(k, kind, namespace, name))
        .collect();
    assert!(
        left.is_empty(),
        "left behind after helm uninstall: {left:?}"
    );
    assert!(
        exists(k, kept.0, kept.1, kept.2),
        "helm uninstall deleted the JobSetEpoch CRD"
    );
    kubectl(
        k,
        &[
            "delete",
            "crd",
            JOBSETEPOCH_CRD,
            "--wait=true",
            "--timeout=60s",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        helm_on(&helm, k, &["status", RELEASE]).is_err(),
        "the release is gone"
    );
    // What stays (deploy/README.md): the namespace (Helm's --create-namespace does not delete
    // it) and the JobSet of the workload namespace; the runtime's Secret, Lease and agent
    // accounts would too, but no pod ran here to make them.
    assert!(exists(k, "Namespace", "", NAMESPACE));
    let remaining = kubectl(
        k,
        &[
            "-n",
            NAMESPACE,
            "get",
            "all,configmap,secret,serviceaccount,role,rolebinding,lease",
            "-o",
            "name",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let ours: Vec<&str> = remaining
        .lines()
        .filter(|l| l.contains("jobset-inplace"))
        .collect();
    assert!(ours.is_empty(), "left in {NAMESPACE}: {ours:?}");
    let cluster = kubectl(k, &["get", "clusterrole,clusterrolebinding,mutatingwebhookconfiguration,validatingwebhookconfiguration,validatingadmissionpolicy,validatingadmissionpolicybinding,flowschema,crd", "-o", "name"])
        .unwrap_or_else(|e| panic!("{e}"));
    let ours: Vec<&str> = cluster
        .lines()
        .filter(|l| l.contains("jobset-inplace"))
        .collect();
    assert!(ours.is_empty(), "cluster-scoped objects left: {ours:?}");
    assert!(
        exists(k, "JobSet", ns, "helm-before"),
        "the workload's JobSet stays"
    );
    // Gone before the next test (tests/real_cluster/ applies the overlays into the same
    // namespace on the same control plane in CI).
    for n in [ns, NAMESPACE] {
        kubectl(
            k,
            &["delete", "namespace", n, "--wait=true", "--timeout=120s"],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
}
