//! The agent sidecar as injected (docs/architecture.md, "Admission"): the one builder of its
//! container spec ([`agent_container`], serialized by the injection and by the tests alike), the
//! env entries the injection adds to an agent a user declared, and the projected volume of the
//! agent's service account token with its mount.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use super::config::InjectionConfig;
use super::pod;
use super::token::TOKEN_VOLUME_JSON;
pub use super::token::{TOKEN_EXPIRATION_SECONDS, TOKEN_MOUNT_PATH, TOKEN_VOLUME};
use crate::protocol::JOBSET_NAME_LABEL;
use crate::wire::agent_env;

/// Why a volume named [`TOKEN_VOLUME`] that is not the injected one is refused.
pub(crate) fn foreign_token_volume_message() -> String {
    format!(
        "is named {TOKEN_VOLUME}, the name of the volume that holds the agent's service account \
         token, but is not that volume: rename it (the name is kept for the token volume, so \
         that no other volume is ever mounted into the agent as its token)"
    )
}

/// The agent sidecar as injected, its barrier on `port`; `token`: it mounts the service account
/// token the pod does not automount ([`token_volume`]). The one builder of the spec: the
/// injection serializes it to JSON text (once per JobSet and port), the tests to a `Value`.
pub fn agent_container(config: &InjectionConfig, port: u16, token: bool) -> AgentContainer<'_> {
    AgentContainer::new(config, port, token)
}

/// The projected volume of the agent's token, CA bundle and namespace ([`TOKEN_VOLUME_JSON`]).
pub fn token_volume() -> Value {
    TOKEN_VOLUME_JSON.to_value()
}

/// The agent's mount of [`token_volume`].
pub fn token_mount() -> Value {
    json!({"name": TOKEN_VOLUME, "mountPath": TOKEN_MOUNT_PATH, "readOnly": true})
}

/// The injected agent sidecar as it is serialized (fields in this order).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentContainer<'a> {
    name: &'static str,
    image: &'a str,
    image_pull_policy: &'a str,
    args: [&'static str; 1],
    restart_policy: &'static str,
    restart_policy_rules: [RestartRuleSpec; 1],
    env: Vec<EnvSpec<'a>>,
    startup_probe: ProbeSpec<'a>,
    security_context: SecurityContextSpec,
    termination_message_policy: &'static str,
    #[serde(skip_serializing_if = "ResourcesSpec::is_empty")]
    resources: ResourcesSpec<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    volume_mounts: Option<[Value; 1]>,
}

impl<'a> AgentContainer<'a> {
    /// The agent with its barrier on `port`: its env and its startup probe say the same port.
    fn new(config: &'a InjectionConfig, port: u16, token: bool) -> Self {
        let mut env = vec![
            field_env(agent_env::NAMESPACE, "metadata.namespace"),
            field_env(agent_env::POD_NAME, "metadata.name"),
            field_env(
                agent_env::JOBSET_NAME,
                format!("metadata.annotations['{JOBSET_NAME_LABEL}']"),
            ),
            literal_env(
                agent_env::RESTART_EXIT_CODE,
                config.restart_exit_code.to_string(),
            ),
            literal_env(agent_env::PROTOCOL, config.protocol.as_str()),
        ];
        if port != agent_env::DEFAULT_BARRIER_PORT {
            env.push(literal_env(agent_env::BARRIER_PORT, port.to_string()));
        }
        if config.barrier_path != agent_env::DEFAULT_BARRIER_PATH {
            env.push(literal_env(
                agent_env::BARRIER_PATH,
                config.barrier_path.as_str(),
            ));
        }
        if let Some(hold) = barrier_hold_env(i64::from(config.probe_timeout_seconds)) {
            env.push(hold);
        }
        AgentContainer {
            name: agent_env::CONTAINER_NAME,
            image: &config.image,
            image_pull_policy: &config.image_pull_policy,
            args: ["agent"],
            restart_policy: "Always",
            restart_policy_rules: [RestartRuleSpec {
                action: pod::RESTART_ALL_CONTAINERS,
                exit_codes: ExitCodesSpec {
                    operator: "NotIn",
                    values: [0],
                },
            }],
            env,
            startup_probe: ProbeSpec {
                http_get: HttpGetSpec {
                    path: &config.barrier_path,
                    port,
                },
                period_seconds: config.probe_period_seconds,
                timeout_seconds: config.probe_timeout_seconds,
                failure_threshold: config.probe_failure_threshold,
            },
            security_context: SecurityContextSpec {
                run_as_non_root: true,
                read_only_root_filesystem: true,
                allow_privilege_escalation: false,
                capabilities: CapabilitiesSpec { drop: ["ALL"] },
                seccomp_profile: SeccompProfileSpec {
                    r#type: "RuntimeDefault",
                },
            },
            termination_message_policy: "FallbackToLogsOnError",
            resources: ResourcesSpec {
                requests: &config.resources.requests,
                limits: &config.resources.limits,
            },
            volume_mounts: token.then(|| [token_mount()]),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RestartRuleSpec {
    action: &'static str,
    exit_codes: ExitCodesSpec,
}

#[derive(Serialize)]
struct ExitCodesSpec {
    operator: &'static str,
    values: [u8; 1],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ProbeSpec<'a> {
    http_get: HttpGetSpec<'a>,
    period_seconds: i32,
    timeout_seconds: i32,
    failure_threshold: i32,
}

#[derive(Serialize)]
struct HttpGetSpec<'a> {
    path: &'a str,
    port: u16,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SecurityContextSpec {
    run_as_non_root: bool,
    read_only_root_filesystem: bool,
    allow_privilege_escalation: bool,
    capabilities: CapabilitiesSpec,
    seccomp_profile: SeccompProfileSpec,
}

#[derive(Serialize)]
struct CapabilitiesSpec {
    drop: [&'static str; 1],
}

#[derive(Serialize)]
struct SeccompProfileSpec {
    r#type: &'static str,
}

/// `resources`, each map only when it is not empty (sorted keys: `BTreeMap`).
#[derive(Serialize)]
struct ResourcesSpec<'a> {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    requests: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    limits: &'a BTreeMap<String, String>,
}

impl ResourcesSpec<'_> {
    fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.limits.is_empty()
    }
}

/// An env entry: from the downward API, or a literal.
#[derive(Serialize)]
#[serde(untagged)]
pub(crate) enum EnvSpec<'a> {
    Field {
        name: &'static str,
        #[serde(rename = "valueFrom")]
        value_from: ValueFromSpec,
    },
    Literal {
        name: &'static str,
        value: Cow<'a, str>,
    },
}

#[derive(Serialize)]
pub(crate) struct ValueFromSpec {
    #[serde(rename = "fieldRef")]
    field_ref: FieldRefSpec,
}

#[derive(Serialize)]
pub(crate) struct FieldRefSpec {
    #[serde(rename = "fieldPath")]
    field_path: Cow<'static, str>,
}

pub(crate) fn field_env(
    name: &'static str,
    field_path: impl Into<Cow<'static, str>>,
) -> EnvSpec<'static> {
    EnvSpec::Field {
        name,
        value_from: ValueFromSpec {
            field_ref: FieldRefSpec {
                field_path: field_path.into(),
            },
        },
    }
}

/// `BARRIER_HOLD` for a startup probe whose `timeoutSeconds` is `timeout_seconds`
/// ([`agent_env::barrier_hold_for_probe_timeout`]); none where the hold would be zero.
pub(crate) fn barrier_hold_env(timeout_seconds: i64) -> Option<EnvSpec<'static>> {
    let hold = agent_env::barrier_hold_for_probe_timeout(timeout_seconds);
    (!hold.is_zero()).then(|| literal_env(agent_env::BARRIER_HOLD, format!("{}s", hold.as_secs())))
}

pub(crate) fn literal_env<'a>(name: &'static str, value: impl Into<Cow<'a, str>>) -> EnvSpec<'a> {
    EnvSpec::Literal {
        name,
        value: value.into(),
    }
}
