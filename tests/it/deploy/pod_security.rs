//! Pod Security Standards, `restricted`

use super::*;

#[test]
fn every_container_runs_under_the_restricted_profile() {
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let ns = r.get("Namespace", NAMESPACE);
        assert_eq!(
            ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted",
            "{name}"
        );
        let deployments = r.of_kind("Deployment");
        assert_eq!(deployments.len(), 2, "{name}");
        for d in deployments {
            let dname = d["metadata"]["name"].as_str().unwrap_or_default();
            let pod = &d["spec"]["template"]["spec"];
            for host in ["hostNetwork", "hostPID", "hostIPC"] {
                assert_ne!(pod[host], true, "{name} {dname}: {host}");
            }
            for v in pod["volumes"].as_array().into_iter().flatten() {
                let kinds: Vec<&String> = v
                    .as_object()
                    .into_iter()
                    .flat_map(|o| o.keys())
                    .filter(|k| *k != "name")
                    .collect();
                assert!(
                    kinds.iter().all(|k| [
                        "configMap",
                        "secret",
                        "emptyDir",
                        "projected",
                        "downwardAPI"
                    ]
                    .contains(&k.as_str())),
                    "{name} {dname}: volume {kinds:?}"
                );
            }
            let containers = ["initContainers", "containers", "ephemeralContainers"]
                .iter()
                .flat_map(|k| pod[*k].as_array().into_iter().flatten());
            for c in containers {
                let what = format!("{name} {dname}/{}", c["name"]);
                let sc = &c["securityContext"];
                let effective = |field: &str| -> Value {
                    if sc[field].is_null() {
                        pod["securityContext"][field].clone()
                    } else {
                        sc[field].clone()
                    }
                };
                assert_eq!(effective("runAsNonRoot"), true, "{what}");
                assert_eq!(
                    effective("runAsUser"),
                    65532,
                    "{what}: numeric non-root user"
                );
                assert_eq!(
                    effective("seccompProfile")["type"],
                    "RuntimeDefault",
                    "{what}"
                );
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}");
                assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{what}");
                assert!(sc["capabilities"]["add"].is_null(), "{what}");
                assert_ne!(sc["privileged"], true, "{what}");
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}");
                for p in c["ports"].as_array().into_iter().flatten() {
                    assert!(p["hostPort"].is_null(), "{what}: hostPort");
                }
                for (kind, resource) in [
                    ("requests", "cpu"),
                    ("requests", "memory"),
                    ("limits", "cpu"),
                    ("limits", "memory"),
                ] {
                    assert!(
                        c["resources"][kind][resource].is_string(),
                        "{what}: {kind}.{resource}"
                    );
                }
                assert!(
                    c["image"].as_str().is_some_and(|i| i.starts_with(IMAGE)),
                    "{what}"
                );
            }
        }
    }
}
