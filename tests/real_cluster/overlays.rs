//! The overlays on a real API server

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_overlay_is_accepted_and_its_policies_type_check() {
    with_cluster("every_overlay_is_accepted_and_its_policies_type_check", |cluster| async move {
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(cluster.client.clone());
        let names = overlays();
        assert!(names.len() >= 3, "overlays: {names:?}");
        for overlay in &names {
            let rendered = render_install(overlay).await;
            let skipped: Vec<String> = rendered
                .iter()
                .filter(|o| is_cert_manager(o))
                .map(|o| {
                    format!(
                        "{}/{}",
                        o["kind"].as_str().unwrap_or("?"),
                        o["metadata"]["name"].as_str().unwrap_or("?")
                    )
                })
                .collect();
            if !skipped.is_empty() {
                eprintln!(
                    "{overlay}: NOT applied (cert-manager's CRDs are not installed here): {skipped:?}"
                );
            }
            let objects = install(&cluster, overlay).await;
            eprintln!("{overlay}: {} objects applied server-side", objects.len());

            // The API server type-checks each policy against the schemas of what it matches and
            // records the result in its status (the status controller of
            // kube-controller-manager): no warnings.
            let vaps: Vec<String> = objects
                .iter()
                .filter(|o| o["kind"] == "ValidatingAdmissionPolicy")
                .map(|o| o["metadata"]["name"].as_str().expect("name").to_owned())
                .collect();
            assert!(!vaps.is_empty(), "{overlay}: a ValidatingAdmissionPolicy");
            for name in &vaps {
                let policy = eventually(
                    &format!("{overlay}: policy {name} type-checked"),
                    Duration::from_secs(90),
                    || async {
                        let p = policies.get(name).await.map_err(|e| e.to_string())?;
                        let generation = p.metadata.generation;
                        let status = p.status.clone().ok_or("no status yet")?;
                        if status.observed_generation == generation && status.type_checking.is_some() {
                            Ok(p)
                        } else {
                            Err(format!("status {status:?} at generation {generation:?}"))
                        }
                    },
                )
                .await;
                let status = policy.status.expect("status");
                let warnings = status
                    .type_checking
                    .and_then(|t| t.expression_warnings)
                    .unwrap_or_default();
                assert!(
                    warnings.is_empty(),
                    "{overlay}: policy {name}: type-check warnings: {warnings:#?}"
                );
                let conditions = status.conditions.unwrap_or_default();
                assert!(
                    conditions.iter().all(|c| c.status != "False"),
                    "{overlay}: policy {name}: {conditions:?}"
                );
            }
        }
        // Leave no webhook configuration pointing at a Service without endpoints.
        delete_webhook_configurations(&cluster).await;
    })
    .await;
}
