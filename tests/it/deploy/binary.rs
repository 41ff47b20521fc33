//! The injection config loads; the flags, env, mounts and probes of the manifests agree with the
//! binary.

use super::*;

#[test]
fn the_injection_config_loads_with_each_overlays_dialect() {
    use jobset_inplace::admission::config::{DEFAULT_IMAGE, DEFAULT_SERVICE_ACCOUNT};
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let dialect = overlay_dialect(name);
        let cm = r.config_map();
        let text = cm["data"]["config.yaml"].as_str().expect("config.yaml");
        // The file names its dialect: whatever the defaults started from, it wins.
        for start in Dialect::ALL {
            assert_eq!(load_config(start, text).protocol, dialect, "{name}");
        }
        let config = load_config(Dialect::Epoch, text);
        assert_eq!(
            cm["data"]["protocol"],
            dialect.as_str(),
            "{name}: reconciler's dialect"
        );
        assert_eq!(config.service_account, DEFAULT_SERVICE_ACCOUNT, "{name}");
        assert_eq!(
            config,
            {
                let mut d = InjectionConfig::defaults(dialect);
                d.image = config.image.clone();
                d
            },
            "{name}: the file spells out the built-in defaults, so --help tells the truth"
        );

        // The agent image: the webhook's own image, through the env that overrides the file.
        let webhook = r.container("jobset-inplace-webhook", "webhook");
        let image = webhook["image"].as_str().expect("image");
        assert_eq!(image, DEFAULT_IMAGE, "{name}: the image is this version's");
        assert_eq!(
            env_value(webhook, "JOBSET_INPLACE_AGENT_IMAGE").map(|e| &e["value"]),
            Some(&json!(image)),
            "{name}"
        );
        assert!(
            text.lines().all(|l| !l.starts_with("image:")),
            "{name}: image is the env's"
        );

        // Both Deployments use the generated ConfigMap (its hashed name).
        let cm_name = &cm["metadata"]["name"];
        let volumes =
            &r.deployment("jobset-inplace-webhook")["spec"]["template"]["spec"]["volumes"];
        assert!(
            volumes
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| v["configMap"]["name"] == *cm_name),
            "{name}: webhook mounts {cm_name}"
        );
        let reconciler = r.container("jobset-inplace-reconciler", "reconciler");
        assert_eq!(
            env_value(reconciler, "JOBSET_INPLACE_PROTOCOL")
                .map(|e| &e["valueFrom"]["configMapKeyRef"]),
            Some(&json!({"name": cm_name, "key": "protocol"})),
            "{name}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Flags, env, mounts and probes agree with the binary
// ---------------------------------------------------------------------------------------------

/// Env names the binary reads for a subcommand: its flags' and the global flags' env, plus the
/// downward-API names the reconciler reads directly.
fn known_env(sub: &str) -> BTreeSet<String> {
    let root = Cli::command();
    let sub = root.find_subcommand(sub).expect("subcommand").clone();
    root.get_arguments()
        .chain(sub.get_arguments())
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .chain(["POD_NAME".to_owned(), "POD_NAMESPACE".to_owned()])
        .collect()
}

fn check_probes(what: &str, container: &Value, health_port: u16) {
    assert_eq!(port_named(container, "health"), health_port, "{what}");
    for (probe, path) in [
        ("startupProbe", "/readyz"),
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
    ] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{what} {probe}");
        assert_eq!(get["port"], "health", "{what} {probe}");
    }
}

#[test]
fn container_flags_env_and_mounts_are_what_the_binary_takes() {
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        // Webhook.
        let pod = &r.deployment("jobset-inplace-webhook")["spec"]["template"]["spec"];
        let c = r.container("jobset-inplace-webhook", "webhook");
        let Sub::Webhook(args) = parse_args(c).command else {
            panic!("{name}: the webhook container runs `webhook`")
        };
        assert_eq!(args.addr.port(), port_named(c, "https"), "{name}");
        check_probes(name, c, args.health_addr.port());
        // Drained before it stops, and done before the kubelet's SIGKILL.
        let grace = pod["terminationGracePeriodSeconds"]
            .as_f64()
            .unwrap_or(30.0);
        assert!(args.shutdown_delay > std::time::Duration::ZERO, "{name}");
        assert!(
            (args.shutdown_delay + args.shutdown_timeout).as_secs_f64() < grace,
            "{name}: --shutdown-delay + --shutdown-timeout within the grace period {grace} s"
        );
        let config = args.injection.config.as_deref().expect("--config");
        let (mount, volume) = mount_for(pod, c, config);
        assert_eq!(mount["mountPath"], json!(config), "{name}");
        assert_eq!(
            volume["configMap"]["name"],
            r.config_map()["metadata"]["name"],
            "{name}"
        );
        let service = r.get("Service", "jobset-inplace-webhook");
        assert_eq!(args.self_signed, SELF_SIGNED.contains(&name), "{name}");
        if args.self_signed {
            let (mount, volume) = mount_for(pod, c, &args.cert_dir);
            assert!(volume["emptyDir"].is_object(), "{name}: writable cert dir");
            assert_ne!(mount["readOnly"], true, "{name}");
            assert_eq!(
                args.service,
                service["metadata"]["name"].as_str().unwrap_or_default()
            );
            assert_eq!(args.namespace, NAMESPACE);
            assert_eq!(args.secret, "jobset-inplace-webhook-tls");
            assert_eq!(
                pod["automountServiceAccountToken"], true,
                "{name}: it talks to the API"
            );
        } else {
            for (file, key) in [(&args.tls_cert, "tls.crt"), (&args.tls_key, "tls.key")] {
                let file = file.as_deref().expect("--tls-cert and --tls-key");
                let (mount, volume) = mount_for(pod, c, file);
                let mount_path = mount["mountPath"].as_str().unwrap_or_default();
                let rel = file.strip_prefix(mount_path).expect("under the mount");
                assert_eq!(
                    volume["secret"]["secretName"], "jobset-inplace-webhook-tls",
                    "{name}"
                );
                let items = volume["secret"]["items"].as_array().expect("items");
                assert!(
                    items
                        .iter()
                        .any(|i| i["key"] == key && i["path"] == json!(rel)),
                    "{name}: {key} at {}",
                    file.display()
                );
                assert!(
                    items.iter().all(|i| i["key"] != "ca.key"),
                    "{name}: the CA key stays out of the pod"
                );
            }
            // Its token is mounted only for the reviews of scrapers' tokens (secure metrics).
            assert_eq!(
                pod["automountServiceAccountToken"], true,
                "{name}: the metrics reviews"
            );
            assert!(
                args.metrics.metrics_secure,
                "{name}: /metrics over HTTPS, reviewed"
            );
        }
        let known = known_env("webhook");
        for e in c["env"].as_array().into_iter().flatten() {
            let env = e["name"].as_str().unwrap_or_default();
            assert!(known.contains(env), "{name}: the webhook reads no {env}");
        }

        // Reconciler.
        let c = r.container("jobset-inplace-reconciler", "reconciler");
        let Sub::Reconciler(args) = parse_args(c).command else {
            panic!("{name}: the reconciler container runs `reconciler`")
        };
        assert!(args.leader_elect, "{name}");
        assert!(args.provision_service_accounts, "{name}");
        assert_eq!(args.agent_cluster_role, "jobset-inplace-agent");
        check_probes(name, c, args.health_addr.port());
        let known = known_env("reconciler");
        for e in c["env"].as_array().into_iter().flatten() {
            let env = e["name"].as_str().unwrap_or_default();
            assert!(known.contains(env), "{name}: the reconciler reads no {env}");
        }
        for (env, field) in [
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
        ] {
            assert_eq!(
                env_value(c, env).map(|e| &e["valueFrom"]["fieldRef"]["fieldPath"]),
                Some(&json!(field)),
                "{name}: {env} from the downward API"
            );
        }
        assert_eq!(
            r.deployment("jobset-inplace-reconciler")["spec"]["replicas"],
            2,
            "{name}"
        );
    }
}

#[tokio::test]
async fn the_probe_paths_are_served() {
    use tower::ServiceExt;
    let health = jobset_inplace::telemetry::health_router(jobset_inplace::telemetry::Health::new(
        || true,
        String::new,
    ));
    for path in ["/readyz", "/healthz"] {
        let request = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .expect("request");
        let response =
            tokio::time::timeout(Duration::from_secs(10), health.clone().oneshot(request))
                .await
                .expect("in time")
                .expect("answered");
        assert_eq!(response.status(), 200, "{path}");
    }
}
