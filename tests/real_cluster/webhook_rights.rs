//! The self-signed webhook's own rights: its Secret and the caBundle, and nothing else

use super::*;

/// `webhook --self-signed` with the webhook's ServiceAccount token, the deployed RBAC and the
/// caBundle policy on a real API server: it creates its Secret, renews the serving certificate
/// and rotates the CA (lifetimes of seconds), setting the caBundle by JSON patch each time, and
/// the same token is refused anything else on the webhook configurations or other Secrets.
#[tokio::test]
async fn the_self_signed_webhook_renews_and_rotates_with_its_own_rights() {
    use jobset_inplace::certs::rotation;
    with_cluster(
        "the_self_signed_webhook_renews_and_rotates_with_its_own_rights",
        |cluster| async move {
            let installed = install(&cluster, "epoch").await;
            let system = "jobset-inplace-system";
            let secret_name = "jobset-inplace-webhook-tls";
            let secrets: Api<k8s_openapi::api::core::v1::Secret> =
                Api::namespaced(cluster.client.clone(), system);
            let _ = secrets.delete(secret_name, &DeleteParams::default()).await;
            let token = account_token(&cluster, system, "jobset-inplace-webhook").await;
            let webhook_client = token_client(&cluster, &token).await;

            // The deployed container's flags, with lifetimes of seconds.
            let deployment = installed
                .iter()
                .find(|o| {
                    o["kind"] == "Deployment" && o["metadata"]["name"] == "jobset-inplace-webhook"
                })
                .expect("the webhook Deployment");
            let mut argv = vec!["jobset-inplace".to_owned()];
            for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
                .as_array()
                .expect("args")
            {
                let a = a.as_str().expect("arg");
                // The deployed in-memory volume is this test's temporary directory.
                if !a.starts_with("--cert-dir") {
                    argv.push(a.to_owned());
                }
            }
            let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
            argv.extend(
                [
                    "--cert-dir",
                    &dir.path().display().to_string(),
                    "--cert-renew-interval",
                    "200ms",
                    "--serving-cert-validity",
                    "3s",
                    "--ca-validity",
                    "12s",
                    "--ca-overlap",
                    "1s",
                ]
                .map(str::to_owned),
            );
            let cli =
                <jobset_inplace::cli::Cli as clap::Parser>::try_parse_from(&argv).expect("flags");
            let jobset_inplace::cli::Command::Webhook(args) = cli.command else {
                panic!("webhook")
            };
            assert!(args.self_signed);
            let renewer = args.renewer(webhook_client.clone()).expect("lifetimes");

            let mut kinds = std::collections::BTreeSet::new();
            let deadline = Instant::now() + Duration::from_secs(60);
            while !kinds.contains("drop") {
                assert!(
                    Instant::now() < deadline,
                    "a whole rotation in time: {kinds:?}"
                );
                let report = renewer
                    .step()
                    .await
                    .unwrap_or_else(|e| panic!("with the webhook's own token: {e}"));
                for step in report.steps {
                    kinds.insert(step.kind());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            assert_eq!(
                kinds,
                ["new", "renew", "start", "switch", "drop"].into(),
                "every step, each a write the API server accepted"
            );

            // The caBundle is what the Secret trusts; nothing else of the configurations moved.
            let secret = secrets.get(secret_name).await.expect("secret");
            let trusted =
                rotation::trusted_bundle(&jobset_inplace::certs::cluster::material_of(&secret));
            for (kind, plural) in [
                (
                    "MutatingWebhookConfiguration",
                    "mutatingwebhookconfigurations",
                ),
                (
                    "ValidatingWebhookConfiguration",
                    "validatingwebhookconfigurations",
                ),
            ] {
                let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
                let api: Api<DynamicObject> = Api::all_with(
                    cluster.client.clone(),
                    &ApiResource::from_gvk_with_plural(&gvk, plural),
                );
                let live = serde_json::to_value(api.get(WEBHOOK_CONFIGURATION).await.expect("get"))
                    .expect("json");
                let rendered = installed
                    .iter()
                    .find(|o| o["kind"] == kind)
                    .expect("rendered");
                let hooks = live["webhooks"].as_array().expect("webhooks");
                assert_eq!(
                    hooks.len(),
                    rendered["webhooks"].as_array().expect("webhooks").len()
                );
                for (hook, want) in hooks
                    .iter()
                    .zip(rendered["webhooks"].as_array().expect("webhooks"))
                {
                    use base64::Engine as _;
                    let bundle = base64::engine::general_purpose::STANDARD
                        .decode(hook["clientConfig"]["caBundle"].as_str().expect("caBundle"))
                        .expect("base64");
                    assert_eq!(bundle, trusted, "{kind}: the Secret's CAs");
                    for field in [
                        "name",
                        "rules",
                        "failurePolicy",
                        "matchConditions",
                        "timeoutSeconds",
                    ] {
                        assert_eq!(hook[field], want[field], "{kind}: {field} as applied");
                    }
                    assert_eq!(
                        hook["clientConfig"]["service"]["name"],
                        want["clientConfig"]["service"]["name"]
                    );
                }
                // The same token may not change anything else, by any kind of patch.
                let as_webhook: Api<DynamicObject> = Api::all_with(
                    webhook_client.clone(),
                    &ApiResource::from_gvk_with_plural(&gvk, plural),
                );
                let loosen = Patch::Json::<()>(
                    serde_json::from_value(json!([
                        {"op": "replace", "path": "/webhooks/0/timeoutSeconds", "value": 1}
                    ]))
                    .expect("patch"),
                );
                let (code, _, message, _) = api_error(
                    as_webhook
                        .patch(WEBHOOK_CONFIGURATION, &PatchParams::default(), &loosen)
                        .await,
                )
                .expect("refused");
                assert!(code == 422 || code == 403, "{kind}: {code} {message}");
                assert!(message.contains("caBundle"), "{kind}: {message}");
                let (code, _, _, _) = api_error(
                    as_webhook
                        .delete(WEBHOOK_CONFIGURATION, &DeleteParams::default())
                        .await,
                )
                .expect("refused");
                assert!(code == 422 || code == 403, "{kind}: delete {code}");
            }
            // Issue 21 item 5: the Secret deleted while this replica serves its certificate. The
            // new CA, made and published with the webhook's own token (its policy lets it change
            // the caBundle only), keeps the old one trusted in both configurations, so what the
            // replica served a moment ago still verifies against what the API server trusts.
            let served = std::fs::read(dir.path().join("tls.crt")).expect("served");
            secrets
                .delete(secret_name, &DeleteParams::default())
                .await
                .expect("delete the Secret");
            let report = renewer
                .step()
                .await
                .unwrap_or_else(|e| panic!("with the webhook's own token: {e}"));
            assert_eq!(
                report.steps.first().map(rotation::Step::kind),
                Some("new"),
                "{report:?}"
            );
            let chain =
                jobset_inplace::certs::parse_certs(&served, std::path::Path::new("tls.crt"))
                    .expect("pem");
            for plural in [
                "mutatingwebhookconfigurations",
                "validatingwebhookconfigurations",
            ] {
                let config: Value = serde_json::from_str(
                    &kubectl(
                        Some(&cluster.kubeconfig),
                        &["get", plural, WEBHOOK_CONFIGURATION, "-o", "json"],
                    )
                    .await
                    .expect("get"),
                )
                .expect("json");
                for roots in jobset_inplace::certs::cluster::ca_bundles_of(&config) {
                    jobset_inplace::certs::verify_chain(
                        &roots,
                        &chain,
                        &renewer.target().names,
                        std::time::SystemTime::now(),
                    )
                    .unwrap_or_else(|e| panic!("{plural}: the served certificate: {e}"));
                }
            }

            // No other Secret, no listing.
            let as_webhook: Api<k8s_openapi::api::core::v1::Secret> =
                Api::namespaced(webhook_client.clone(), system);
            let (code, _, _, _) =
                api_error(as_webhook.get("some-other-secret").await).expect("refused");
            assert_eq!(code, 403);
            let (code, _, _, _) =
                api_error(as_webhook.list(&ListParams::default()).await).expect("refused");
            assert_eq!(code, 403);
            let elsewhere: Api<k8s_openapi::api::core::v1::Secret> =
                Api::namespaced(webhook_client.clone(), "default");
            let (code, _, _, _) = api_error(elsewhere.get(secret_name).await).expect("refused");
            assert_eq!(code, 403);

            // Issue 21: RBAC lets it create any Secret of its namespace; the Secret policy holds
            // it to its own, of type kubernetes.io/tls. A service-account-token Secret (which the
            // token controller would fill with the reconciler's token) is refused.
            let policy = "jobset-inplace-webhook-secret";
            let secret = |name: &str, type_: &str| -> k8s_openapi::api::core::v1::Secret {
                serde_json::from_value(json!({"metadata": {"name": name, "namespace": system,
                    "annotations": {"kubernetes.io/service-account.name": RECONCILER_ACCOUNT}},
                    "type": type_, "data": {"tls.crt": "", "tls.key": ""}}))
                .expect("secret")
            };
            let _leftovers = Leftovers {
                kubeconfig: cluster.kubeconfig.clone(),
                objects: vec![
                    (system.to_owned(), "secret", "stolen-token".to_owned()),
                    (system.to_owned(), "secret", "other-tls".to_owned()),
                ],
            };
            let token_secret = secret("stolen-token", "kubernetes.io/service-account-token");
            let dry = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            until_enforced(policy, || as_webhook.create(&dry, &token_secret)).await;
            for (what, object, said) in [
                (
                    "a service-account-token Secret",
                    token_secret.clone(),
                    "may write only its Secret",
                ),
                (
                    "a service-account-token Secret of its Secret's name",
                    secret(secret_name, "kubernetes.io/service-account-token"),
                    "of type kubernetes.io/tls",
                ),
                (
                    "a TLS Secret of another name",
                    secret("other-tls", "kubernetes.io/tls"),
                    "may write only its Secret",
                ),
            ] {
                let (code, _, message, _) =
                    api_error(as_webhook.create(&PostParams::default(), &object).await)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(code, 403, "{what}: {message}");
                assert!(
                    message.contains(&format!("ValidatingAdmissionPolicy '{policy}'"))
                        && message.contains(said),
                    "{what}: {message}"
                );
            }

            delete_webhook_configurations(&cluster).await;
        },
    )
    .await;
}
