//! The agent's token volume as a value (docs/architecture.md, "Admission"): its name, mount path,
//! lifetime and its JSON, which the injection adds (`sidecar.rs`) and the views compare a pod's
//! volume of that name with (`view.rs`). A room of its own so that neither imports the other.

use super::lenient::Fixed;

/// The volume that holds the agent's service account token, CA and namespace when the webhook
/// chose the account: what the kubelet would mount into every container, mounted into the agent
/// only (the pod gets `automountServiceAccountToken: false`).
pub const TOKEN_VOLUME: &str = "jobset-inplace-agent-token";
/// Where Kubernetes mounts a service account token, and where in-cluster clients read it.
pub const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The token's lifetime as the kubelet's own projected token (3607 s; the kubelet renews it).
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;

/// The projected volume of the agent's token, CA bundle and namespace, as JSON: what the
/// injection adds, and what a pod template's volume named [`TOKEN_VOLUME`] must be exactly (any
/// other volume of that name is denied, so that the agent is never given it as its token).
pub(crate) const TOKEN_VOLUME_JSON: Fixed = Fixed::Obj(&[
    ("name", Fixed::Str(TOKEN_VOLUME)),
    (
        "projected",
        Fixed::Obj(&[
            ("defaultMode", Fixed::Int(420)),
            (
                "sources",
                Fixed::Arr(&[
                    Fixed::Obj(&[(
                        "serviceAccountToken",
                        Fixed::Obj(&[
                            ("expirationSeconds", Fixed::Int(TOKEN_EXPIRATION_SECONDS)),
                            ("path", Fixed::Str("token")),
                        ]),
                    )]),
                    Fixed::Obj(&[(
                        "configMap",
                        Fixed::Obj(&[
                            ("name", Fixed::Str("kube-root-ca.crt")),
                            (
                                "items",
                                Fixed::Arr(&[Fixed::Obj(&[
                                    ("key", Fixed::Str("ca.crt")),
                                    ("path", Fixed::Str("ca.crt")),
                                ])]),
                            ),
                        ]),
                    )]),
                    Fixed::Obj(&[(
                        "downwardAPI",
                        Fixed::Obj(&[(
                            "items",
                            Fixed::Arr(&[Fixed::Obj(&[
                                ("path", Fixed::Str("namespace")),
                                (
                                    "fieldRef",
                                    Fixed::Obj(&[
                                        ("apiVersion", Fixed::Str("v1")),
                                        ("fieldPath", Fixed::Str("metadata.namespace")),
                                    ]),
                                ),
                            ])]),
                        )]),
                    )]),
                ]),
            ),
        ]),
    ),
]);
