//! The epoch-status-fields component on the released CRD, the one-place image, cert-manager

use super::*;

fn released_crd_text() -> String {
    std::fs::read_to_string(fixtures::reference_dir().join("jobset.x-k8s.io_jobsets.yaml"))
        .expect("released CRD")
}

fn v1alpha2_status_schema(crd: &Value) -> jsonschema::Validator {
    let schema = crd["spec"]["versions"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == "v1alpha2"))
        .map(|v| v["schema"]["openAPIV3Schema"]["properties"]["status"].clone())
        .expect("v1alpha2 status schema");
    jsonschema::validator_for(&schema).expect("compiles")
}

#[test]
fn the_crd_component_gives_the_released_crd_the_epoch_fields() {
    use jobset_inplace::reconciler::crd::missing_status_fields;
    if !have_kubectl() {
        return;
    }
    // The recipe of deploy/README.md: the JobSet manifest, the overlay, the component.
    let kustomization = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
        resources:\n- jobset-manifests.yaml\n- {deploy}/overlays/epoch\n\
        components:\n- {deploy}/components/epoch-status-fields\n";
    let objects = render_kustomization(
        kustomization,
        &[("jobset-manifests.yaml", &released_crd_text())],
    );
    let crds: Vec<&Value> = objects
        .iter()
        .filter(|o| {
            o["kind"] == "CustomResourceDefinition"
                && o["metadata"]["name"] == jobset_inplace::reconciler::crd::CRD_NAME
        })
        .collect();
    assert_eq!(crds.len(), 1);
    let crd = crds[0];
    assert_eq!(check_object(crd), Vec::<String>::new(), "still a valid CRD");
    let released =
        fixtures::read_yaml(&fixtures::reference_dir().join("jobset.x-k8s.io_jobsets.yaml"));
    assert!(missing_status_fields(&released, Dialect::Epoch).is_err());
    assert_eq!(
        missing_status_fields(crd, Dialect::Epoch),
        Ok(()),
        "the reconciler starts"
    );
    assert_eq!(
        missing_status_fields(crd, Dialect::Attempt),
        Ok(()),
        "the released fields stay"
    );
    // Nothing else changes: the rest is the overlay as it renders alone.
    if let Some(alone) = overlay("epoch") {
        let not_jobsets = |o: &&Value| {
            o["kind"] != "CustomResourceDefinition"
                || o["metadata"]["name"] != jobset_inplace::reconciler::crd::CRD_NAME
        };
        let rest: Vec<&Value> = objects.iter().filter(not_jobsets).collect();
        assert_eq!(rest, alone.objects.iter().collect::<Vec<_>>());
    }

    // The status schema (the whole object's is checked by tests/it/admission/fixtures.rs).
    let schema = v1alpha2_status_schema(crd);
    let accepts = |status: Value| fixtures::schema_errors(&schema, &status);
    assert_eq!(accepts(json!({})), Vec::<String>::new());
    assert_eq!(
        accepts(json!({"deprecatedEpoch": 0, "syncedEpoch": 1, "restarts": 1})),
        Vec::<String>::new()
    );
    assert_eq!(
        accepts(json!({"deprecatedEpoch": 2147483646, "syncedEpoch": 2147483647})),
        Vec::<String>::new()
    );
    for bad in [
        json!({"deprecatedEpoch": -1}),
        json!({"syncedEpoch": -5}),
        json!({"syncedEpoch": "2"}),
        json!({"deprecatedEpoch": 1.5}),
    ] {
        assert!(!accepts(bad.clone()).is_empty(), "{bad} accepted");
    }
    // The released schema would not have had them (pruned by the API server, not rejected).
    let released_schema = &released["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        ["status"]["properties"];
    assert!(released_schema.get("syncedEpoch").is_none());

    // The patch stops the build rather than patch the wrong version.
    let mut moved = released.clone();
    moved["spec"]["versions"][0]["name"] = json!("v1alpha3");
    let moved = serde_json::to_string(&moved).expect("json");
    let dir = kustomization_dir();
    write_kustomization(
        dir.path(),
        kustomization,
        &[("jobset-manifests.yaml", &moved)],
    );
    let result = run_bounded(
        Command::new("kubectl").arg("kustomize").arg(dir.path()),
        RENDER_LIMIT,
    );
    assert!(
        result.is_err(),
        "a CRD whose first version is not v1alpha2 must not be patched"
    );
}

#[test]
fn the_epoch_overlay_alone_patches_no_crd() {
    let Some(r) = overlay("epoch") else { return };
    let names: Vec<&Value> = r
        .of_kind("CustomResourceDefinition")
        .into_iter()
        .map(|c| &c["metadata"]["name"])
        .collect();
    assert_eq!(
        names,
        [&json!(jobset_inplace::wire::epochs::CRD_NAME)],
        "only its own JobSetEpoch CRD; the JobSet CRD is not ours to ship"
    );
}

#[test]
fn one_images_entry_moves_every_image() {
    if !have_kubectl() {
        return;
    }
    for name in ["epoch", "cert-manager"] {
        let kustomization = format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n- {{deploy}}/overlays/{name}\n\
             images:\n- name: {IMAGE}\n  newName: registry.example.com/mirror/jobset-inplace\n  newTag: 9.9.9\n"
        );
        let r = Rendered {
            name: name.to_owned(),
            objects: render_kustomization(&kustomization, &[]),
        };
        let want = json!("registry.example.com/mirror/jobset-inplace:9.9.9");
        for (deployment, container) in [
            ("jobset-inplace-webhook", "webhook"),
            ("jobset-inplace-reconciler", "reconciler"),
        ] {
            assert_eq!(
                r.container(deployment, container)["image"],
                want,
                "{name} {deployment}"
            );
        }
        let webhook = r.container("jobset-inplace-webhook", "webhook");
        assert_eq!(
            env_value(webhook, "JOBSET_INPLACE_AGENT_IMAGE").map(|e| &e["value"]),
            Some(&want),
            "{name}: the injected agent follows"
        );
    }
}

#[test]
fn cert_manager_issues_the_secret_the_webhook_mounts() {
    use jobset_inplace::certs;
    let Some(r) = overlay("cert-manager") else {
        return;
    };
    let pod = &r.deployment("jobset-inplace-webhook")["spec"]["template"]["spec"];
    let tls_secret = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|v| v["secret"]["secretName"].as_str())
        .expect("a Secret volume");
    let serving = r.get("Certificate", "jobset-inplace-webhook");
    assert_eq!(serving["spec"]["secretName"], tls_secret);
    let service = r.get("Service", "jobset-inplace-webhook")["metadata"]["name"]
        .as_str()
        .expect("service");
    let names = certs::service_names(service, NAMESPACE);
    let dns = strings(&serving["spec"]["dnsNames"]);
    assert!(
        dns.contains(&format!("{service}.{NAMESPACE}.svc")),
        "{dns:?}: the name the API server dials"
    );
    assert!(dns.iter().all(|d| names.contains(d)), "{dns:?}");
    assert_ne!(serving["spec"]["isCA"], true);
    // serving <- CA issuer <- CA certificate <- self-signed issuer
    let ca_issuer = r.get(
        "Issuer",
        serving["spec"]["issuerRef"]["name"]
            .as_str()
            .expect("issuer"),
    );
    assert_eq!(serving["spec"]["issuerRef"]["kind"], "Issuer");
    let ca_secret = &ca_issuer["spec"]["ca"]["secretName"];
    let ca = r
        .of_kind("Certificate")
        .into_iter()
        .find(|c| c["spec"]["secretName"] == *ca_secret)
        .expect("the CA certificate");
    assert_eq!(ca["spec"]["isCA"], true);
    let root = r.get(
        "Issuer",
        ca["spec"]["issuerRef"]["name"].as_str().expect("issuer"),
    );
    assert!(root["spec"]["selfSigned"].is_object());
    // Both webhook configurations get the CA of the serving certificate.
    let from = format!(
        "{NAMESPACE}/{}",
        serving["metadata"]["name"].as_str().unwrap_or_default()
    );
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        assert_eq!(
            r.get(kind, "jobset-inplace")["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            json!(from)
        );
    }
}
