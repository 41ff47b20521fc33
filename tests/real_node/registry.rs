//! The installed product from the test kit's registry

use super::*;

/// With `up DIR --node --registry --install [helm:]VARIANT` (node.env `INSTALL_SOURCE=registry`):
/// the release went through the test kit's registry as a user's does. `scripts/dist.sh --push`
/// pushed dist/'s image index and chart; the install named the registry's image (Helm: the chart
/// by `oci://`); `up` found the image on no node before. Here: every container of the webhook and
/// reconciler pods runs `REGISTRY/jobset-inplace/jobset-inplace:VERSION` with the imageID
/// `...@<dist/jobset-inplace-VERSION-oci.digest>`, and the kubelet says it pulled it
/// (`Pulled`: "Successfully pulled image"), not that it was present. Runs on a gateless node too.
/// SKIPPED when the product came from an archive import.
#[tokio::test]
async fn the_installed_product_runs_the_image_pulled_from_the_registry_dist_pushed_it_to() {
    const TEST: &str =
        "the_installed_product_runs_the_image_pulled_from_the_registry_dist_pushed_it_to";
    let Some(node) = node(TEST).await else {
        return;
    };
    if node.env.get("INSTALL_SOURCE").map(String::as_str) != Some("registry") {
        eprintln!(
            "\n!! SKIPPED {TEST}: the product was not installed from the registry (up DIR --node --registry --install VARIANT)\n"
        );
        return;
    }
    run_on(TEST, node, LIMIT, |node| async move {
        let registry = node
            .env
            .get("REGISTRY")
            .filter(|r| !r.is_empty())
            .cloned()
            .expect("node.env REGISTRY (up --registry)");
        let version = env!("CARGO_PKG_VERSION");
        let digest_file = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("dist")
            .join(format!("jobset-inplace-{version}-oci.digest"));
        let digest = std::fs::read_to_string(&digest_file)
            .unwrap_or_else(|e| panic!("{}: {e} (scripts/dist.sh writes it)", digest_file.display()))
            .trim()
            .to_owned();
        assert!(
            digest.starts_with("sha256:") && digest.len() == 71,
            "{}: {digest:?} is no sha256 digest",
            digest_file.display()
        );
        let repository = format!("{registry}/jobset-inplace/jobset-inplace");
        let image = format!("{repository}:{version}");
        assert_eq!(
            node.env.get("PRODUCT_IMAGE"),
            Some(&image),
            "node.env PRODUCT_IMAGE"
        );
        let image_id = format!("{repository}@{digest}");
        let pods: Api<Pod> = Api::namespaced(node.client.clone(), "jobset-inplace-system");
        let mut seen = 0;
        for component in ["jobset-inplace-webhook", "jobset-inplace-reconciler"] {
            let list = pods
                .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={component}")))
                .await
                .unwrap_or_else(|e| panic!("the {component} pods: {e}"));
            assert!(!list.items.is_empty(), "no {component} pod");
            for pod in &list.items {
                let problems = registry_image_problems(pod, &image, &image_id);
                assert!(problems.is_empty(), "{}", problems.join("\n"));
                seen += 1;
            }
        }
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(node.client.clone(), "jobset-inplace-system");
        let pulled: Vec<String> = events
            .list(&ListParams::default().fields("reason=Pulled"))
            .await
            .expect("the namespace's Pulled events")
            .items
            .into_iter()
            .filter_map(|e| e.message)
            .filter(|m| m.contains(&format!("\"{image}\"")))
            .collect();
        assert!(
            pulled
                .iter()
                .any(|m| m.starts_with("Successfully pulled image")),
            "no kubelet event says it pulled {image}: {pulled:?}"
        );
        println!(
            "{seen} pods run {image} as {image_id} (dist/'s digest), pulled from the registry: {:?}",
            pulled.first()
        );
    })
    .await;
}
