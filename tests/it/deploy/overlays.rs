//! Every overlay renders, and every object is a well-formed object of its kind

use super::*;

/// Kinds that live in no namespace.
fn cluster_scoped(kind: &str) -> bool {
    matches!(
        kind,
        "Namespace"
            | "ClusterRole"
            | "ClusterRoleBinding"
            | "MutatingWebhookConfiguration"
            | "ValidatingWebhookConfiguration"
            | "ValidatingAdmissionPolicy"
            | "ValidatingAdmissionPolicyBinding"
            | "CustomResourceDefinition"
            | "FlowSchema"
            | "PriorityLevelConfiguration"
    )
}

#[test]
fn every_overlay_renders_into_well_formed_objects() {
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let mut problems = Vec::new();
        let mut seen = BTreeSet::new();
        for o in &r.objects {
            let kind = o["kind"].as_str().unwrap_or_default();
            let id = format!("{kind} {}", o["metadata"]["name"].as_str().unwrap_or("?"));
            assert!(seen.insert(id.clone()), "{name}: {id} twice");
            problems.extend(check_object(o).into_iter().map(|p| format!("{id}: {p}")));
            // kustomize does not know every cluster-scoped kind: it would put a
            // ValidatingAdmissionPolicy in a namespace if the tree used `namespace:`.
            let ns = o["metadata"].get("namespace");
            if cluster_scoped(kind) {
                if ns.is_some() {
                    problems.push(format!("{id}: cluster-scoped, yet in namespace {ns:?}"));
                }
            } else if ns != Some(&json!(NAMESPACE)) {
                problems.push(format!("{id}: namespace {ns:?}, not {NAMESPACE}"));
            }
            if o["metadata"]["labels"]["app.kubernetes.io/part-of"] != "jobset-inplace" {
                problems.push(format!("{id}: no part-of label"));
            }
        }
        assert!(problems.is_empty(), "{name}:\n{}", problems.join("\n"));
        for required in [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ConfigMap",
            "Service",
            "Deployment",
            "PodDisruptionBudget",
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "FlowSchema",
        ] {
            assert!(!r.of_kind(required).is_empty(), "{name}: no {required}");
        }
    }
}

#[test]
fn the_strict_check_catches_typos() {
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                 "template": {"spec": {"containers": [{"name": "c", "image": "i", "readinessprobe": {}}]}}}});
    let problems = check_object(&deployment);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("readinessprobe"), "{problems:?}");
    let mut wrong_version = deployment.clone();
    wrong_version["apiVersion"] = json!("apps/v1beta1");
    assert!(!check_object(&wrong_version).is_empty());
    let vap = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "p"}, "spec": {"validation": [{"expression": "true"}]}});
    assert!(!check_object(&vap).is_empty());
}

/// Issue 21 item 10: what the image and CI are built from cannot change under them: every base
/// image but `scratch` is pinned by digest, every Debian package the builder installs by its
/// exact version (issue 34 item 6: `apt-get install NAME=VERSION`), and every tool CI or a
/// script installs by version (`cargo install --version X --locked`, `pip install NAME==X`).
#[test]
fn the_builder_image_and_the_ci_tools_are_pinned() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).expect(path);
    let mut problems = Vec::new();
    let mut images = 0;
    let dockerfile = read("Dockerfile");
    let mut packages = 0;
    for line in dockerfile
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
    {
        let Some((_, args)) = line.split_once("apt-get install ") else {
            continue;
        };
        for word in args
            .split_whitespace()
            .take_while(|w| !matches!(*w, "&&" | "\\" | ";"))
            .filter(|w| !w.starts_with('-'))
        {
            packages += 1;
            let pinned = word.split_once('=').is_some_and(|(name, version)| {
                !name.is_empty() && version.starts_with(|c: char| c.is_ascii_digit())
            });
            if !pinned {
                problems.push(format!(
                    "Dockerfile: apt-get install {word} has no exact version"
                ));
            }
        }
    }
    assert!(
        packages >= 3,
        "the builder's packages were not found: {packages}"
    );
    for line in dockerfile.lines() {
        let Some(rest) = line.trim().strip_prefix("FROM ") else {
            continue;
        };
        let image = rest
            .split_whitespace()
            .find(|w| !w.starts_with("--"))
            .unwrap_or("");
        if image == "scratch" {
            continue;
        }
        images += 1;
        let digest = image.split_once("@sha256:").map(|(_, d)| d);
        if !digest.is_some_and(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit())) {
            problems.push(format!("Dockerfile: {image} is not pinned by digest"));
        }
    }
    assert!(images >= 1, "no base image found");
    let mut installs = 0;
    for file in [
        ".ci/run",
        "scripts/cargo-deny.sh",
        "scripts/cargo-tool.sh",
        "scripts/check-image.sh",
        "scripts/check-monitoring.sh",
        "scripts/dist.sh",
        "scripts/fuzz-smoke.sh",
    ] {
        for line in read(file)
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
        {
            if line.contains("cargo install") {
                installs += 1;
                if !(line.contains("--version") && line.contains("--locked")) {
                    problems.push(format!("{file}: {}", line.trim()));
                }
            }
            if line.contains("pip")
                && let Some((_, args)) = line.split_once(" install ")
            {
                installs += 1;
                let packages = args
                    .split_whitespace()
                    .filter(|w| !w.starts_with('-') && !w.starts_with('>'))
                    .filter(|w| !w.starts_with("2>") && !w.starts_with('&'))
                    .filter(|w| !matches!(*w, "then" | ";" | "&&"))
                    .collect::<Vec<_>>();
                if packages.is_empty() || !packages.iter().all(|p| p.contains("==")) {
                    problems.push(format!("{file}: {}", line.trim()));
                }
            }
        }
    }
    assert!(installs >= 3, "the installs were not found: {installs}");
    assert!(problems.is_empty(), "not pinned: {problems:#?}");
}

/// Issue 34 item 3: deploy/README.md's NetworkPolicy for the workload namespaces admits the
/// agent's barrier port (its default) from the node addresses only, and every other port (TCP
/// below and above it, UDP, SCTP) from anywhere, as without the policy; it is a valid object.
#[test]
fn the_barrier_network_policy_admits_only_the_nodes_to_the_barrier() {
    use jobset_inplace::wire::agent_env::DEFAULT_BARRIER_PORT;
    let readme = std::fs::read_to_string(deploy_dir().join("README.md")).expect("README");
    let block = readme
        .split("```yaml")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .find(|b| b.contains("jobset-inplace-barrier-from-nodes"))
        .expect("the barrier's NetworkPolicy block");
    let indent = block
        .lines()
        .find(|l| !l.trim().is_empty())
        .map_or(0, |l| l.len() - l.trim_start().len());
    let text: String = block
        .lines()
        .map(|l| l.get(indent..).unwrap_or("").to_owned() + "\n")
        .collect();
    let policy: Value = serde_saphyr::from_str(&text).expect("yaml");
    let problems = check_object(&policy);
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    let barrier = i64::from(DEFAULT_BARRIER_PORT);
    let mut open: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    let mut barrier_rules = 0;
    for rule in policy["spec"]["ingress"].as_array().expect("ingress") {
        let ports = rule["ports"].as_array().expect("ports");
        match rule.get("from") {
            Some(from) => {
                barrier_rules += 1;
                let from = from.as_array().expect("from");
                assert!(
                    from.iter().all(|f| f
                        .as_object()
                        .is_some_and(|f| f.len() == 1 && f.contains_key("ipBlock"))),
                    "only ipBlocks (the nodes): {from:?}"
                );
                assert_eq!(ports, &vec![json!({"port": barrier, "protocol": "TCP"})]);
            }
            None => {
                for p in ports {
                    let start = p["port"].as_i64().expect("port");
                    let end = p["endPort"].as_i64().unwrap_or(start);
                    let protocol = p["protocol"].as_str().unwrap_or("TCP").to_owned();
                    open.entry(protocol).or_default().push((start, end));
                }
            }
        }
    }
    assert_eq!(barrier_rules, 1);
    let covers = |protocol: &str, port: i64| {
        open.get(protocol)
            .is_some_and(|r| r.iter().any(|(a, b)| (*a..=*b).contains(&port)))
    };
    for port in 1..=65535 {
        assert_eq!(covers("TCP", port), port != barrier, "TCP {port}");
        assert!(covers("UDP", port), "UDP {port}");
        assert!(covers("SCTP", port), "SCTP {port}");
    }
}

/// Issue 34 item 6: the image check fails when the pinned hadolint cannot run (it passed,
/// printing "NOT RUN"): a hadolint of another version on PATH is not taken for it, and with
/// PyPI out of reach (its index on a closed loopback port) none can be installed.
#[test]
fn the_image_check_fails_when_the_pinned_hadolint_cannot_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    let fake = bin.join("hadolint");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'Haskell Dockerfile Linter 1.0.0'\nexit 0\n",
    )
    .expect("fake hadolint");
    let mut perms = std::fs::metadata(&fake).expect("meta").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&fake, perms).expect("chmod");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let result = run_bounded(
        Command::new(root.join("scripts/check-image.sh"))
            .arg("--lint-only")
            .current_dir(root)
            .env("PATH", path)
            .env("CHECK_IMAGE_WORK", dir.path().join("work"))
            .env("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
            .env("PIP_RETRIES", "0")
            .env("PIP_TIMEOUT", "2")
            .env("PIP_NO_CACHE_DIR", "1")
            .env("PIP_CONFIG_FILE", "/dev/null")
            .env_remove("PIP_FIND_LINKS"),
        Duration::from_secs(120),
    );
    let Err(e) = result else {
        panic!("the image check passed without its pinned hadolint: {result:?}");
    };
    assert!(
        e.contains("hadolint 2.15.1: neither on PATH nor installable"),
        "{e}"
    );
}

/// Issue 47: CI runs `cargo deny` (licences, sources, bans; the advisories against a clone of the
/// RustSec database where one is given, never fetched), with the tool pinned; the unmaintained
/// rustls-pemfile (RUSTSEC-2025-0134) is in neither lock file.
#[test]
fn ci_checks_the_dependencies_with_cargo_deny() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).expect(path);
    let deny = read("deny.toml");
    for needle in [
        "db-path = \"target/advisory-dbs\"",
        "[licenses]",
        "[bans]",
        "[sources]",
        "unknown-git = \"deny\"",
    ] {
        assert!(deny.contains(needle), "deny.toml lacks {needle}");
    }
    let script = read("scripts/cargo-deny.sh");
    assert!(
        script.contains("version=0.20.2"),
        "cargo-deny is not pinned"
    );
    assert!(
        script.contains("--frozen"),
        "cargo deny may fetch the database"
    );
    assert!(
        script.contains("--manifest-path \"$manifest\"") && script.contains("fuzz/Cargo.toml"),
        "the fuzz targets are not checked"
    );
    assert!(
        script.contains("advisories SKIPPED"),
        "without a database the advisories check must say it did not run"
    );
    assert!(
        read(".ci/run")
            .lines()
            .any(|l| l.trim() == "scripts/cargo-deny.sh"),
        ".ci/run does not run scripts/cargo-deny.sh"
    );
    for lock in ["Cargo.lock", "fuzz/Cargo.lock"] {
        assert!(
            !read(lock).contains("name = \"rustls-pemfile\""),
            "{lock} still has rustls-pemfile"
        );
    }
}
