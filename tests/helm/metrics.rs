//! `/metrics` over HTTPS behind the API server's review by default (values `metrics.secure`),
//! plain HTTP on the health port as an explicit choice: what each renders.

use super::*;

fn container(objects: &[Value], deployment: &str) -> Value {
    object(objects, "Deployment", deployment)["spec"]["template"]["spec"]["containers"][0].clone()
}

fn port_names(container: &Value) -> Vec<String> {
    container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| p["name"].as_str().expect("a port name").to_owned())
        .collect()
}

fn args(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("an arg").to_owned())
        .collect()
}

#[test]
fn secure_metrics_render_https_and_plain_is_a_choice() {
    let Some(helm) = helm() else { return };
    let monitors = "metrics.serviceMonitor.enabled=true";
    let policies = "networkPolicy.enabled=true";

    // The default: HTTPS on `metrics` (8082), reviews allowed, a reader role for scrapers.
    let secure = template(&helm, &[monitors, policies]);
    for name in ["jobset-inplace-webhook", "jobset-inplace-reconciler"] {
        let c = container(&secure, name);
        let ports = port_names(&c);
        assert!(
            ports.ends_with(&["health".to_owned(), "metrics".to_owned()]),
            "{name}: {ports:?}"
        );
        assert_eq!(c["ports"][ports.len() - 1]["containerPort"], 8082, "{name}");
        assert!(
            !args(&c).iter().any(|a| a.starts_with("--metrics-secure")),
            "{name}: the binary's default"
        );
        let service = object(&secure, "Service", &format!("{name}-metrics"));
        assert_eq!(
            service["spec"]["ports"][0],
            json!({"name": "metrics", "port": 8082, "targetPort": "metrics", "protocol": "TCP"}),
            "{name}"
        );
        let endpoint = &object(&secure, "ServiceMonitor", name)["spec"]["endpoints"][0];
        assert_eq!(endpoint["scheme"], "https", "{name}");
        assert_eq!(
            endpoint["bearerTokenFile"], "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "{name}"
        );
        assert_eq!(endpoint["tlsConfig"]["insecureSkipVerify"], true, "{name}");
        let policy = object(&secure, "NetworkPolicy", name);
        let monitoring = policy["spec"]["ingress"]
            .as_array()
            .expect("ingress")
            .last()
            .expect("the monitoring rule")
            .clone();
        assert_eq!(monitoring["ports"][0]["port"], "metrics", "{name}");
    }
    // The webhook reviews tokens: its token is mounted in every certificate variant.
    for certificates in ["self-signed", "cert-manager"] {
        let objects = template(&helm, &[&format!("certificates={certificates}")]);
        let pod =
            &object(&objects, "Deployment", "jobset-inplace-webhook")["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], true, "{certificates}");
    }
    let auth = object(&secure, "ClusterRole", "jobset-inplace-metrics-auth");
    assert_eq!(
        auth["rules"],
        json!([
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}
        ])
    );
    let binding = object(&secure, "ClusterRoleBinding", "jobset-inplace-metrics-auth");
    assert_eq!(
        binding["subjects"],
        json!([
            {"kind": "ServiceAccount", "name": "jobset-inplace-webhook", "namespace": NAMESPACE},
            {"kind": "ServiceAccount", "name": "jobset-inplace-reconciler", "namespace": NAMESPACE}
        ])
    );
    assert_eq!(
        object(&secure, "ClusterRole", "jobset-inplace-metrics-reader")["rules"],
        json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );

    // The explicit choice: plain HTTP on the health port, no reviews, no roles.
    let plain = template(&helm, &[monitors, policies, "metrics.secure=false"]);
    for name in ["jobset-inplace-webhook", "jobset-inplace-reconciler"] {
        let c = container(&plain, name);
        let ports = port_names(&c);
        assert!(ports.ends_with(&["health".to_owned()]), "{name}: {ports:?}");
        assert!(
            args(&c).contains(&"--metrics-secure=false".to_owned()),
            "{name}"
        );
        let service = object(&plain, "Service", &format!("{name}-metrics"));
        assert_eq!(
            service["spec"]["ports"][0]["targetPort"], "health",
            "{name}"
        );
        assert_eq!(service["spec"]["ports"][0]["port"], 8081, "{name}");
        let endpoint = &object(&plain, "ServiceMonitor", name)["spec"]["endpoints"][0];
        assert_eq!(endpoint["scheme"], "http", "{name}");
        assert!(endpoint.get("bearerTokenFile").is_none(), "{name}");
    }
    assert!(
        !plain.iter().any(|o| o["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("jobset-inplace-metrics-"))),
        "no metrics roles"
    );
    let mounted = template(
        &helm,
        &["metrics.secure=false", "certificates=cert-manager"],
    );
    let pod = &object(&mounted, "Deployment", "jobset-inplace-webhook")["spec"]["template"]["spec"];
    assert_eq!(
        pod["automountServiceAccountToken"], false,
        "cert-manager, plain: no token"
    );
    let e = try_template(&helm, &["metrics.secure=maybe"]).expect_err("a string");
    assert!(e.contains("/metrics/secure"), "{e}");
}
