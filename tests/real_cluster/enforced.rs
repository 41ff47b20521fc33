//! Issue 21, items 7 and 8: what the real API server enforces

use super::*;

/// Issue 21, item 7: the JobSetEpoch CRD's CEL rule, on the real API server, refuses a write that
/// moves an epoch back or removes one (a deposed reconciler leader's late write, forced apply
/// included), from any account (here an admin); it lets the epochs grow, and a JobSet created
/// again under the same name (another `jobSetUID`) start over.
#[tokio::test]
async fn the_jobsetepoch_crd_refuses_to_move_an_epoch_back() {
    with_cluster(
        "the_jobsetepoch_crd_refuses_to_move_an_epoch_back",
        |cluster| async move {
            install(&cluster, "epoch").await;
            let ns = TestNamespace::create(&cluster, "rc-epochs").await;
            let api = dynamic::<JobSetEpoch>(&cluster.client, &ns.name);
            let apply = |uid: &str, epochs: Value| {
                let body = json!({
                    "apiVersion": "jobset-inplace.dev/v1alpha1", "kind": "JobSetEpoch",
                    "metadata": {"name": "js", "namespace": ns.name},
                    "jobSetUID": uid, "epochs": epochs,
                });
                let api = api.clone();
                async move {
                    let params = PatchParams::apply("jobset-inplace-reconciler").force();
                    api.patch("js", &params, &Patch::Apply(&body)).await
                }
            };
            // The CRD may be established a moment after it is applied.
            eventually("the first publication", Duration::from_secs(30), || async {
                apply("u", json!({"deprecated": 3, "synced": 4}))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
            .await;
            for (epochs, what) in [
                (json!({"deprecated": 2, "synced": 4}), "deprecated back"),
                (json!({"deprecated": 3, "synced": 3}), "synced back"),
                (json!({"synced": 4}), "deprecated removed"),
            ] {
                let status = status_error(apply("u", epochs).await);
                assert_eq!(status.code, 422, "{what}: {status:?}");
                assert!(status.message.contains("only grow"), "{what}: {}", status.message);
            }
            let written = apply("u", json!({"deprecated": 3, "synced": 5}))
                .await
                .expect("synced grows");
            assert_eq!(written.data["epochs"]["synced"], 5);
            // jobSetUID removed (an apply without it drops the field this manager owns).
            let body = json!({
                "apiVersion": "jobset-inplace.dev/v1alpha1", "kind": "JobSetEpoch",
                "metadata": {"name": "js", "namespace": ns.name},
                "epochs": {"deprecated": 9, "synced": 9},
            });
            let params = PatchParams::apply("jobset-inplace-reconciler").force();
            let status = status_error(api.patch("js", &params, &Patch::Apply(&body)).await);
            assert_eq!(status.code, 422, "jobSetUID removed: {status:?}");
            let restarted = apply("v", json!({"synced": 1}))
                .await
                .expect("another JobSet of that name starts over");
            assert_eq!(restarted.data["epochs"], json!({"synced": 1}));
            eprintln!("JobSetEpoch: moves back and removals refused (422), growth and a new jobSetUID accepted");

            // A reconciler that rolls out before the CRD is updated still publishes: the CRD of
            // the earlier version (no rule, no jobSetUID) refuses the field, which is then left out.
            let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
                Api::all(cluster.client.clone());
            let text = std::fs::read_to_string(manifest_dir().join("deploy/base/jobsetepoch-crd.yaml"))
                .expect("the CRD");
            let mut old: Value = serde_saphyr::from_str(&text).expect("yaml");
            let schema = &mut old["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
            schema.as_object_mut().map(|o| o.remove("x-kubernetes-validations"));
            schema["properties"].as_object_mut().map(|o| o.remove("jobSetUID"));
            let apply_crd = |crd: Value| {
                let crds = crds.clone();
                async move {
                    crds.patch(
                        "jobsetepochs.jobset-inplace.dev",
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(&crd),
                    )
                    .await
                    .expect("the CRD applied");
                }
            };
            apply_crd(old).await;
            let typed: Api<JobSetEpoch> = Api::namespaced(cluster.client.clone(), &ns.name);
            let published = jobset_inplace::reconciler::publish::Published::default();
            let key = jobset_inplace::reconciler::key::Key::new(ns.name.clone(), "old");
            let content = jobset_inplace::wire::epochs::Epochs {
                synced: Some(1),
                ..Default::default()
            };
            eventually("a publication against the earlier CRD", Duration::from_secs(30), || async {
                jobset_inplace::reconciler::publish::apply(&typed, &published, &key, "w", &content)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await;
            let current: Value = serde_saphyr::from_str(&text).expect("yaml");
            apply_crd(current).await;
        },
    )
    .await;
}

/// Issue 21, item 8: on the real API server a RoleBinding's `roleRef` cannot change (422). The
/// reconciler's provisioning replaces a binding it applied for another role (its labels, its
/// field manager owning `roleRef`), and leaves a user's binding of that name as it is (refused,
/// not deleted).
#[tokio::test]
async fn provisioning_replaces_only_its_own_binding_when_the_role_changes() {
    use jobset_inplace::reconciler::provision::{self, ProvisionSettings};
    use k8s_openapi::api::rbac::v1::RoleBinding;
    with_cluster(
        "provisioning_replaces_only_its_own_binding_when_the_role_changes",
        |cluster| async move {
            install(&cluster, "epoch").await;
            let ours = TestNamespace::create(&cluster, "rc-ours").await;
            let users = TestNamespace::create(&cluster, "rc-users").await;
            let settings = ProvisionSettings::default();
            let subjects = std::collections::BTreeSet::from([AGENT_SERVICE_ACCOUNT.to_owned()]);
            // Ours, applied by an earlier version for the role `view`.
            let mut old = provision::role_binding(&ours.name, &subjects, &settings);
            old["roleRef"]["name"] = json!("view");
            let bindings: Api<RoleBinding> = Api::namespaced(cluster.client.clone(), &ours.name);
            bindings
                .patch(
                    provision::ROLE_BINDING,
                    &PatchParams::apply(provision::FIELD_MANAGER),
                    &Patch::Apply(&old),
                )
                .await
                .expect("our earlier binding");
            provision::apply(&cluster.client, &ours.name, &subjects, &settings)
                .await
                .expect("replaced");
            let now = bindings
                .get(provision::ROLE_BINDING)
                .await
                .expect("binding");
            assert_eq!(now.role_ref.name, settings.cluster_role);
            // A user's binding of that name, created (not applied) for `edit`.
            let mut theirs = provision::role_binding(&users.name, &subjects, &settings);
            theirs["roleRef"]["name"] = json!("edit");
            theirs["metadata"]["labels"] = json!({"team": "u"});
            let user_bindings: Api<RoleBinding> =
                Api::namespaced(cluster.client.clone(), &users.name);
            let created = user_bindings
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(theirs).expect("binding"),
                )
                .await
                .expect("the user's binding");
            let refused = provision::apply(&cluster.client, &users.name, &subjects, &settings)
                .await
                .expect_err("a user's binding is not taken over");
            eprintln!("a user's binding: {refused}");
            let kept = user_bindings
                .get(provision::ROLE_BINDING)
                .await
                .expect("still there");
            assert_eq!(kept.role_ref.name, "edit");
            assert_eq!(kept.metadata.uid, created.metadata.uid, "never deleted");
        },
    )
    .await;
}
