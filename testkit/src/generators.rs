//! Data generators shared by the property tests (`tests/it/admission/properties/`), the fuzz
//! targets (`fuzz/`) and the benches: the injection configs admission runs under, and a large
//! synthetic JobSet review.

use jobset_inplace::admission::InjectionConfig;
use jobset_inplace::admission::config::PortRange;
use jobset_inplace::protocol::Dialect;

/// How many configs [`injection_config`] tells apart.
pub const INJECTION_CONFIGS: usize = 3;

/// The injection configs admission is exercised under: the defaults of each dialect, and a
/// non-default one (barrier port, two fallback ports and path, restart exit code, an image pull
/// secret), so that the injected agent carries `BARRIER_PORT`/`BARRIER_PATH` and an exit code
/// other than the default, and its pod templates a pull secret. `which` is taken modulo
/// [`INJECTION_CONFIGS`].
pub fn injection_config(which: usize) -> InjectionConfig {
    match which % INJECTION_CONFIGS {
        0 => InjectionConfig::defaults(Dialect::Epoch),
        1 => InjectionConfig::defaults(Dialect::Attempt),
        _ => {
            let mut c = InjectionConfig::defaults(Dialect::Epoch);
            c.barrier_port = 9000;
            c.barrier_fallback_ports = PortRange {
                first: 9001,
                last: 9002,
            };
            c.image_pull_secrets = vec!["agent-registry".to_owned()];
            c.barrier_path = "/ready".to_owned();
            c.restart_exit_code = 3;
            c
        }
    }
}

/// A JobSet AdmissionReview request (CREATE) with `replicated_jobs` replicated jobs, each with a
/// rich pod template (`env_vars` env vars per container, volumes, affinity, tolerations).
pub fn jobset_review(uid: &str, replicated_jobs: usize, env_vars: usize) -> Vec<u8> {
    use serde_json::json;
    let rjobs: Vec<serde_json::Value> = (0..replicated_jobs)
        .map(|i| {
            let env: Vec<serde_json::Value> = (0..env_vars)
                .map(|e| json!({"name": format!("WORKER_SETTING_{i}_{e}"), "value": format!("value-{e}-of-a-reasonably-long-setting")}))
                .collect();
            json!({
                "name": format!("workers-{i}"),
                "replicas": 2,
                "template": {
                    "spec": {
                        "parallelism": 4,
                        "completions": 4,
                        "backoffLimit": 2147483647,
                        "podReplacementPolicy": "Failed",
                        "template": {
                            "metadata": {"labels": {"app": "trainer", "role": format!("workers-{i}")}},
                            "spec": {
                                "restartPolicy": "OnFailure",
                                "containers": [{
                                    "name": "trainer",
                                    "image": "registry.example.com/ml/trainer:v1.2.3",
                                    "command": ["python", "-m", "trainer", "--epochs", "100"],
                                    "env": env,
                                    "resources": {
                                        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"},
                                        "limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"}
                                    },
                                    "volumeMounts": [
                                        {"name": "data", "mountPath": "/data", "readOnly": true},
                                        {"name": "checkpoints", "mountPath": "/checkpoints"},
                                        {"name": "shm", "mountPath": "/dev/shm"}
                                    ],
                                    "ports": [{"containerPort": 29500, "name": "dist"}]
                                }],
                                "volumes": [
                                    {"name": "data", "persistentVolumeClaim": {"claimName": "dataset"}},
                                    {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "checkpoints"}},
                                    {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
                                ],
                                "affinity": {
                                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                                        {"key": "cloud.example.com/accelerator", "operator": "In", "values": ["h100", "a100"]},
                                        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a", "zone-b"]}
                                    ]}]}},
                                    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": {
                                        "labelSelector": {"matchLabels": {"app": "trainer"}},
                                        "topologyKey": "kubernetes.io/hostname"
                                    }}]}
                                },
                                "tolerations": [
                                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                    {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
                                ]
                            }
                        }
                    }
                }
            })
        })
        .collect();
    let jobset = json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "trainer", "namespace": "ml", "labels": {"team": "research"}},
        "spec": {
            "failurePolicy": {"maxRestarts": 10, "restartStrategy": "InPlaceRestart"},
            "replicatedJobs": rjobs
        }
    });
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "jobset.x-k8s.io", "version": "v1alpha2", "kind": "JobSet"},
            "resource": {"group": "jobset.x-k8s.io", "version": "v1alpha2", "resource": "jobsets"},
            "requestKind": {"group": "jobset.x-k8s.io", "version": "v1alpha2", "kind": "JobSet"},
            "requestResource": {"group": "jobset.x-k8s.io", "version": "v1alpha2", "resource": "jobsets"},
            "name": "trainer",
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": jobset,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    });
    serde_json::to_vec(&review).expect("serialize")
}
