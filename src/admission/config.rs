//! The injection config: every configurable default of the mutation (image, its pull secrets,
//! exit code, barrier port, its fallbacks and path, probe timing, resources, service account,
//! protocol), from a YAML file (`--config`), overridden by flags and env.
//!
//! The file uses camelCase keys and rejects unknown ones, so a typo is a startup error naming the
//! key instead of a silently ignored setting:
//!
//! ```yaml
//! image: ghcr.io/jobset-inplace/jobset-inplace:0.1.0
//! imagePullPolicy: IfNotPresent
//! imagePullSecrets: [registry-credentials]   # or, as in a pod: [{name: registry-credentials}]
//! restartExitCode: 42
//! barrierPort: 8080
//! barrierFallbackPorts: 18080-18099
//! barrierPath: /barrier-is-lifted
//! probePeriodSeconds: 1
//! probeTimeoutSeconds: 300
//! probeFailureThreshold: 86400
//! serviceAccountName: jobset-inplace-agent
//! resources:
//!   requests: {cpu: 10m, memory: 32Mi}
//!   limits: {memory: 64Mi}
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::protocol::Dialect;
use crate::wire::agent_env;

/// The image injected when nothing else is configured.
pub const DEFAULT_IMAGE: &str = concat!(
    "ghcr.io/jobset-inplace/jobset-inplace:",
    env!("CARGO_PKG_VERSION")
);
/// The service account injected into pod templates that name none.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "jobset-inplace-agent";
/// The ports the injected agent's barrier falls back to, in order, when a container of its pod
/// template declares the barrier port: below Linux's ephemeral range (32768-60999), away from the
/// ports ML frameworks and their tooling commonly take (8000-8888, 6006, 29500, 6379).
pub const DEFAULT_BARRIER_FALLBACK_PORTS: PortRange = PortRange {
    first: 18080,
    last: 18099,
};

/// An inclusive range of ports (`first` <= `last`), or none at all (`PortRange::NONE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    /// No port: `first` > `last`.
    pub const NONE: PortRange = PortRange { first: 1, last: 0 };

    /// The ports of the range, in order.
    pub fn ports(self) -> std::ops::RangeInclusive<u16> {
        self.first..=self.last
    }

    pub fn is_empty(self) -> bool {
        self.first > self.last
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            Ok(())
        } else if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

impl std::str::FromStr for PortRange {
    type Err = String;

    /// `FIRST-LAST`, one port `PORT`, or empty (no port), each port in 1-65535.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(PortRange::NONE);
        }
        let port = |p: &str| {
            p.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("{p:?} is not a port in 1-65535"))
        };
        let (first, last) = match s.split_once('-') {
            Some((a, b)) => (port(a)?, port(b)?),
            None => {
                let p = port(s)?;
                (p, p)
            }
        };
        if first > last {
            return Err(format!("{s:?}: the first port is above the last"));
        }
        Ok(PortRange { first, last })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read injection config {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid injection config {path}: {reason}")]
    Parse { path: String, reason: String },
    #[error("invalid injection setting {key}: {reason}")]
    Invalid { key: String, reason: String },
}

/// Flags (and env) that override the injection config file. Flattened into every subcommand
/// that admits JobSets (`webhook`, `inject`, `check`, `review`).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct InjectionArgs {
    /// YAML injection config file (camelCase keys; flags and env override it).
    #[arg(long = "config", env = "JOBSET_INPLACE_CONFIG")]
    pub config: Option<PathBuf>,

    /// Image of the injected agent sidecar.
    #[arg(long, env = "JOBSET_INPLACE_AGENT_IMAGE")]
    pub agent_image: Option<String>,

    /// imagePullPolicy of the injected agent (Always, IfNotPresent, Never).
    #[arg(long, env = "JOBSET_INPLACE_AGENT_IMAGE_PULL_POLICY")]
    pub agent_image_pull_policy: Option<String>,

    /// A Secret to pull the agent's image with, added to the imagePullSecrets of every pod
    /// template that runs the injected agent (repeat the flag for several; the env takes a
    /// comma-separated list).
    #[arg(
        long = "agent-image-pull-secret",
        env = "JOBSET_INPLACE_AGENT_IMAGE_PULL_SECRETS",
        value_delimiter = ','
    )]
    pub agent_image_pull_secrets: Vec<String>,

    /// Exit code with which the agent asks for an in-place restart of its pod (1-255).
    #[arg(long, env = "JOBSET_INPLACE_RESTART_EXIT_CODE")]
    pub restart_exit_code: Option<u8>,

    /// Port of the agent's barrier endpoint (its startup probe).
    #[arg(long, env = "JOBSET_INPLACE_BARRIER_PORT")]
    pub barrier_port: Option<u16>,

    /// Ports the injected agent's barrier falls back to, first free one first, when a container
    /// of its pod template declares --barrier-port (FIRST-LAST, one port, or "" for none).
    #[arg(long, env = "JOBSET_INPLACE_BARRIER_FALLBACK_PORTS")]
    pub barrier_fallback_ports: Option<String>,

    /// Path of the agent's barrier endpoint (its startup probe).
    #[arg(long, env = "JOBSET_INPLACE_BARRIER_PATH")]
    pub barrier_path: Option<String>,

    /// Seconds between two startup probes of the barrier.
    #[arg(long, env = "JOBSET_INPLACE_PROBE_PERIOD_SECONDS")]
    pub probe_period_seconds: Option<i32>,

    /// The startup probe's timeoutSeconds: the agent holds a probe this long less a thirtieth
    /// (BARRIER_HOLD) while the barrier is up, and answers the moment it lifts.
    #[arg(long, env = "JOBSET_INPLACE_PROBE_TIMEOUT_SECONDS")]
    pub probe_timeout_seconds: Option<i32>,

    /// Startup probe failures tolerated before the kubelet gives up on the barrier.
    #[arg(long, env = "JOBSET_INPLACE_PROBE_FAILURE_THRESHOLD")]
    pub probe_failure_threshold: Option<i32>,

    /// Service account set on pod templates that name none.
    #[arg(long, env = "JOBSET_INPLACE_AGENT_SERVICE_ACCOUNT")]
    pub agent_service_account: Option<String>,
}

/// Resource requests and limits of the agent container (quantity strings, passed through).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    #[serde(default)]
    pub requests: BTreeMap<String, String>,
    #[serde(default)]
    pub limits: BTreeMap<String, String>,
}

/// The injection config file as written (every key optional).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ConfigFile {
    image: Option<String>,
    image_pull_policy: Option<String>,
    /// Each entry a Secret name or, as a pod writes it, `{name: <Secret name>}`.
    image_pull_secrets: Option<Vec<serde_json::Value>>,
    restart_exit_code: Option<i64>,
    barrier_port: Option<i64>,
    /// A string (`18080-18099`) or one port as a number.
    barrier_fallback_ports: Option<serde_json::Value>,
    barrier_path: Option<String>,
    probe_period_seconds: Option<i64>,
    probe_timeout_seconds: Option<i64>,
    probe_failure_threshold: Option<i64>,
    service_account_name: Option<String>,
    resources: Option<Resources>,
    protocol: Option<String>,
}

/// The resolved injection config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectionConfig {
    pub protocol: Dialect,
    pub image: String,
    pub image_pull_policy: String,
    /// Secrets added to `imagePullSecrets` of every pod template that runs the injected agent.
    pub image_pull_secrets: Vec<String>,
    pub restart_exit_code: u8,
    /// The injected agent's barrier port, unless a container of its pod template declares it.
    pub barrier_port: u16,
    /// Where the injected agent's barrier goes then: the first port of these that no container
    /// of the pod template declares.
    pub barrier_fallback_ports: PortRange,
    pub barrier_path: String,
    pub probe_period_seconds: i32,
    /// The startup probe's `timeoutSeconds`; the agent's `BARRIER_HOLD` derives from it
    /// ([`agent_env::barrier_hold_for_probe_timeout`]).
    pub probe_timeout_seconds: i32,
    pub probe_failure_threshold: i32,
    pub service_account: String,
    pub resources: Resources,
}

impl InjectionConfig {
    /// The built-in defaults for a dialect.
    pub fn defaults(protocol: Dialect) -> Self {
        InjectionConfig {
            protocol,
            image: DEFAULT_IMAGE.to_owned(),
            image_pull_policy: "IfNotPresent".to_owned(),
            image_pull_secrets: Vec::new(),
            restart_exit_code: agent_env::DEFAULT_RESTART_EXIT_CODE,
            barrier_port: agent_env::DEFAULT_BARRIER_PORT,
            barrier_fallback_ports: DEFAULT_BARRIER_FALLBACK_PORTS,
            barrier_path: agent_env::DEFAULT_BARRIER_PATH.to_owned(),
            probe_period_seconds: 1,
            // Five minutes: the agent holds each probe up to 290 s while the barrier is up and
            // answers when it lifts, so a pod that waits less than that (a group restart of
            // thousands of pods waits for the slowest) fails no probe and gets no Warning event,
            // and its workers start the moment the barrier lifts.
            probe_timeout_seconds: 300,
            // A day of one-second probes: a group restart waits for the slowest pod to be
            // rescheduled, and the kubelet must not give up on the barrier before that.
            probe_failure_threshold: 86_400,
            service_account: DEFAULT_SERVICE_ACCOUNT.to_owned(),
            resources: Resources {
                requests: BTreeMap::from([
                    ("cpu".to_owned(), "10m".to_owned()),
                    ("memory".to_owned(), "32Mi".to_owned()),
                ]),
                limits: BTreeMap::from([
                    ("cpu".to_owned(), "500m".to_owned()),
                    ("memory".to_owned(), "64Mi".to_owned()),
                ]),
            },
        }
    }

    /// The ports the injected agent's barrier may take, in the order it takes them: the barrier
    /// port, then the fallbacks (without the barrier port again).
    pub fn barrier_ports(&self) -> impl Iterator<Item = u16> + '_ {
        std::iter::once(self.barrier_port).chain(
            self.barrier_fallback_ports
                .ports()
                .filter(move |p| *p != self.barrier_port),
        )
    }

    /// [`Self::barrier_ports`] as said in messages: `8080, then 18080-18099`.
    pub fn barrier_ports_text(&self) -> String {
        if self.barrier_fallback_ports.is_empty() {
            self.barrier_port.to_string()
        } else {
            format!(
                "{}, then {}",
                self.barrier_port, self.barrier_fallback_ports
            )
        }
    }

    /// File, then flags and env, over the defaults. `protocol` is the global `--protocol` (or
    /// `JOBSET_INPLACE_PROTOCOL`) when given: it overrides the file's `protocol` key.
    pub fn load(args: &InjectionArgs, protocol: Option<Dialect>) -> Result<Self, ConfigError> {
        let mut config = Self::defaults(protocol.unwrap_or_default());
        if let Some(path) = &args.config {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.display().to_string(),
                source,
            })?;
            config.apply_file(path, &text)?;
        }
        config.apply_args(args)?;
        if let Some(protocol) = protocol {
            config.protocol = protocol;
        }
        config.check()?;
        Ok(config)
    }

    /// Parses a config file's text over `self`.
    pub fn apply_file(&mut self, path: &Path, text: &str) -> Result<(), ConfigError> {
        let file: ConfigFile = if text.trim().is_empty() {
            ConfigFile::default()
        } else {
            // YAML to a value, then to the file's fields naming the one that does not fit
            // (serde-saphyr's typed errors give a line and column, not the key).
            let parse = |reason: String| ConfigError::Parse {
                path: path.display().to_string(),
                reason,
            };
            let value: serde_json::Value =
                crate::settings::from_yaml(text).map_err(|e| parse(e.to_string()))?;
            serde_path_to_error::deserialize(value).map_err(|e| parse(e.to_string()))?
        };
        let invalid = |key: &str, reason: String| ConfigError::Invalid {
            key: format!("{key} (in {})", path.display()),
            reason,
        };
        if let Some(v) = file.image {
            self.image = v;
        }
        if let Some(v) = file.image_pull_policy {
            self.image_pull_policy = v;
        }
        if let Some(v) = file.image_pull_secrets {
            self.image_pull_secrets = v
                .iter()
                .map(pull_secret_name)
                .collect::<Result<_, _>>()
                .map_err(|reason| invalid("imagePullSecrets", reason))?;
        }
        if let Some(v) = file.restart_exit_code {
            self.restart_exit_code = u8::try_from(v)
                .map_err(|_| invalid("restartExitCode", format!("{v} is not in 1-255")))?;
        }
        if let Some(v) = file.barrier_port {
            self.barrier_port = u16::try_from(v)
                .map_err(|_| invalid("barrierPort", format!("{v} is not in 1-65535")))?;
        }
        if let Some(v) = file.barrier_fallback_ports {
            let text = match &v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                _ => String::from("?"),
            };
            self.barrier_fallback_ports = text.parse().map_err(|e: String| {
                invalid(
                    "barrierFallbackPorts",
                    format!("{e} (FIRST-LAST, one port, or \"\" for none)"),
                )
            })?;
        }
        if let Some(v) = file.barrier_path {
            self.barrier_path = v;
        }
        if let Some(v) = file.probe_period_seconds {
            self.probe_period_seconds = i32::try_from(v)
                .map_err(|_| invalid("probePeriodSeconds", format!("{v} is out of range")))?;
        }
        if let Some(v) = file.probe_timeout_seconds {
            self.probe_timeout_seconds = i32::try_from(v)
                .map_err(|_| invalid("probeTimeoutSeconds", format!("{v} is out of range")))?;
        }
        if let Some(v) = file.probe_failure_threshold {
            self.probe_failure_threshold = i32::try_from(v)
                .map_err(|_| invalid("probeFailureThreshold", format!("{v} is out of range")))?;
        }
        if let Some(v) = file.service_account_name {
            self.service_account = v;
        }
        if let Some(v) = file.resources {
            self.resources = v;
        }
        if let Some(v) = file.protocol {
            self.protocol = v
                .parse()
                .map_err(|e: crate::protocol::UnknownDialect| invalid("protocol", e.to_string()))?;
        }
        Ok(())
    }

    fn apply_args(&mut self, args: &InjectionArgs) -> Result<(), ConfigError> {
        if let Some(v) = &args.agent_image {
            self.image.clone_from(v);
        }
        if let Some(v) = &args.agent_image_pull_policy {
            self.image_pull_policy.clone_from(v);
        }
        if !args.agent_image_pull_secrets.is_empty() {
            self.image_pull_secrets = args
                .agent_image_pull_secrets
                .iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect();
        }
        if let Some(v) = &args.barrier_fallback_ports {
            self.barrier_fallback_ports = v.parse().map_err(|reason| ConfigError::Invalid {
                key: "--barrier-fallback-ports".to_owned(),
                reason,
            })?;
        }
        if let Some(v) = args.restart_exit_code {
            self.restart_exit_code = v;
        }
        if let Some(v) = args.barrier_port {
            self.barrier_port = v;
        }
        if let Some(v) = &args.barrier_path {
            self.barrier_path.clone_from(v);
        }
        if let Some(v) = args.probe_period_seconds {
            self.probe_period_seconds = v;
        }
        if let Some(v) = args.probe_timeout_seconds {
            self.probe_timeout_seconds = v;
        }
        if let Some(v) = args.probe_failure_threshold {
            self.probe_failure_threshold = v;
        }
        if let Some(v) = &args.agent_service_account {
            self.service_account.clone_from(v);
        }
        Ok(())
    }

    /// Checks the resolved values, naming the flag of the first bad one.
    pub fn check(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: &str| {
            Err(ConfigError::Invalid {
                key: key.to_owned(),
                reason: reason.to_owned(),
            })
        };
        if self.image.trim().is_empty() {
            return invalid("--agent-image / image", "must not be empty");
        }
        if !matches!(
            self.image_pull_policy.as_str(),
            "Always" | "IfNotPresent" | "Never"
        ) {
            return invalid(
                "--agent-image-pull-policy / imagePullPolicy",
                "must be Always, IfNotPresent or Never",
            );
        }
        if self.restart_exit_code == 0 {
            return invalid(
                "--restart-exit-code / restartExitCode",
                "must be in 1-255 (0 would restart the agent alone)",
            );
        }
        if self.barrier_port == 0 {
            return invalid("--barrier-port / barrierPort", "must be in 1-65535");
        }
        if !self.barrier_fallback_ports.is_empty() && self.barrier_fallback_ports.first == 0 {
            return invalid(
                "--barrier-fallback-ports / barrierFallbackPorts",
                "ports must be in 1-65535",
            );
        }
        for name in &self.image_pull_secrets {
            if !is_dns_subdomain(name) {
                return Err(ConfigError::Invalid {
                    key: "--agent-image-pull-secret / imagePullSecrets".to_owned(),
                    reason: format!("{name:?} is not a Secret name (a DNS subdomain name)"),
                });
            }
        }
        if !self.barrier_path.starts_with('/') {
            return invalid("--barrier-path / barrierPath", "must start with /");
        }
        if self.probe_period_seconds < 1 {
            return invalid(
                "--probe-period-seconds / probePeriodSeconds",
                "must be at least 1",
            );
        }
        if !(1..=3601).contains(&self.probe_timeout_seconds) {
            return invalid(
                "--probe-timeout-seconds / probeTimeoutSeconds",
                "must be 1-3601 (the agent holds a probe at most an hour)",
            );
        }
        if self.probe_failure_threshold < 1 {
            return invalid(
                "--probe-failure-threshold / probeFailureThreshold",
                "must be at least 1",
            );
        }
        if !is_dns_subdomain(&self.service_account) {
            return invalid(
                "--agent-service-account / serviceAccountName",
                "must be a DNS subdomain name",
            );
        }
        for (kind, map) in [
            ("requests", &self.resources.requests),
            ("limits", &self.resources.limits),
        ] {
            for (name, quantity) in map {
                if name.is_empty() || quantity.trim().is_empty() {
                    return Err(ConfigError::Invalid {
                        key: format!("resources.{kind}.{name}"),
                        reason: "needs a resource name and a quantity".to_owned(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The `protocol` key of `--config`'s file, when the file names one: then it, not the cluster's
/// JobSet CRD, decides the dialect (`--protocol auto`). An unreadable file names none
/// ([`InjectionConfig::load`] reports it).
pub fn file_protocol(args: &InjectionArgs) -> Option<(Dialect, String)> {
    let path = args.config.as_ref()?;
    let text = std::fs::read_to_string(path).ok()?;
    let file: ConfigFile = crate::settings::from_yaml(&text).ok()?;
    let dialect = file.protocol?.parse().ok()?;
    Some((
        dialect,
        format!("protocol: {dialect} in {}", path.display()),
    ))
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// One `imagePullSecrets` entry of the config file: a bare Secret name, or the Kubernetes shape
/// `{name: <Secret name>}` (a `LocalObjectReference`, as charts and pods write it).
fn pull_secret_name(entry: &serde_json::Value) -> Result<String, String> {
    use serde_json::Value;
    match entry {
        Value::String(name) => Ok(name.clone()),
        Value::Object(map) if map.len() == 1 => match map.get("name") {
            Some(Value::String(name)) => Ok(name.clone()),
            _ => Err("an entry {name: ...} needs a string name".to_owned()),
        },
        _ => Err("each entry is a Secret name or {name: <Secret name>}".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_file(text: &str) -> Result<InjectionConfig, ConfigError> {
        let mut c = InjectionConfig::defaults(Dialect::Epoch);
        c.apply_file(Path::new("cfg.yaml"), text)?;
        c.check()?;
        Ok(c)
    }

    #[test]
    fn defaults_are_valid() {
        for d in Dialect::ALL {
            assert_eq!(InjectionConfig::defaults(d).check().ok(), Some(()));
        }
    }

    #[test]
    fn file_sets_every_key() {
        let c = from_file(
            "image: img:1\nimagePullPolicy: Always\nrestartExitCode: 7\nbarrierPort: 9000\n\
             barrierPath: /ready\nprobePeriodSeconds: 2\nprobeFailureThreshold: 10\n\
             serviceAccountName: sa\nprotocol: attempt\nresources:\n  requests: {cpu: 1m}\n",
        )
        .expect("valid");
        assert_eq!(c.image, "img:1");
        assert_eq!(c.image_pull_policy, "Always");
        assert_eq!(c.restart_exit_code, 7);
        assert_eq!(c.barrier_port, 9000);
        assert_eq!(c.barrier_path, "/ready");
        assert_eq!(c.probe_period_seconds, 2);
        assert_eq!(c.probe_failure_threshold, 10);
        assert_eq!(c.service_account, "sa");
        assert_eq!(c.protocol, Dialect::Attempt);
        assert!(c.resources.limits.is_empty());
    }

    #[test]
    fn barrier_fallbacks_and_pull_secrets_from_the_file() {
        let c = from_file("barrierFallbackPorts: 9000-9002\nimagePullSecrets: [a, b.c]\n")
            .expect("valid");
        assert_eq!(
            c.barrier_fallback_ports,
            PortRange {
                first: 9000,
                last: 9002
            }
        );
        assert_eq!(c.image_pull_secrets, ["a", "b.c"]);
        // Issue 23: the Kubernetes shape users copy from charts, alone or mixed with names.
        let shaped = from_file("imagePullSecrets: [{name: regcred}, b.c]\n").expect("valid");
        assert_eq!(shaped.image_pull_secrets, ["regcred", "b.c"]);
        let shaped = from_file("imagePullSecrets:\n- name: regcred\n").expect("valid");
        assert_eq!(shaped.image_pull_secrets, ["regcred"]);
        assert_eq!(
            c.barrier_ports().collect::<Vec<_>>(),
            [8080, 9000, 9001, 9002]
        );
        assert_eq!(c.barrier_ports_text(), "8080, then 9000-9002");
        // One port, as a number; none; the barrier port inside the range is tried once.
        let c = from_file("barrierFallbackPorts: 9000\n").expect("valid");
        assert_eq!(c.barrier_ports().collect::<Vec<_>>(), [8080, 9000]);
        let c = from_file("barrierFallbackPorts: ''\n").expect("valid");
        assert_eq!(c.barrier_ports().collect::<Vec<_>>(), [8080]);
        assert_eq!(c.barrier_ports_text(), "8080");
        let c = from_file("barrierPort: 9001\nbarrierFallbackPorts: 9000-9002\n").expect("valid");
        assert_eq!(c.barrier_ports().collect::<Vec<_>>(), [9001, 9000, 9002]);
        // The defaults: 8080, then 18080-18099.
        let d = InjectionConfig::defaults(Dialect::Epoch);
        assert_eq!(d.barrier_ports().count(), 21);
        assert_eq!(d.barrier_ports().nth(1), Some(18080));
        assert!(d.image_pull_secrets.is_empty());
    }

    #[test]
    fn port_ranges_parse_or_say_why_not() {
        assert_eq!("1-2".parse(), Ok(PortRange { first: 1, last: 2 }));
        assert_eq!(" 7 ".parse(), Ok(PortRange { first: 7, last: 7 }));
        assert_eq!("".parse(), Ok(PortRange::NONE));
        assert!(PortRange::NONE.ports().next().is_none());
        for bad in ["0-5", "5-4", "1-70000", "a-b", "-", "1-2-3"] {
            assert!(bad.parse::<PortRange>().is_err(), "{bad}");
        }
        assert_eq!(PortRange { first: 1, last: 2 }.to_string(), "1-2");
    }

    #[test]
    fn unknown_key_is_named() {
        let err = from_file("imagee: x\n").expect_err("rejected").to_string();
        assert!(err.contains("imagee"), "{err}");
        assert!(err.contains("cfg.yaml"), "{err}");
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key) in [
            ("restartExitCode: 300\n", "restartExitCode"),
            ("restartExitCode: 0\n", "restartExitCode"),
            ("barrierPort: 70000\n", "barrierPort"),
            ("barrierPath: nope\n", "barrierPath"),
            ("probeFailureThreshold: 0\n", "probeFailureThreshold"),
            ("serviceAccountName: Bad_Name\n", "serviceAccountName"),
            ("protocol: v2\n", "protocol"),
            ("imagePullPolicy: Sometimes\n", "imagePullPolicy"),
            ("restartExitCode: many\n", "restartExitCode"),
            ("barrierFallbackPorts: 9-8\n", "barrierFallbackPorts"),
            ("barrierFallbackPorts: [1]\n", "barrierFallbackPorts"),
            ("imagePullSecrets: [Bad_Name]\n", "imagePullSecrets"),
            ("imagePullSecrets: a\n", "imagePullSecrets"),
            ("imagePullSecrets: [{name: Bad_Name}]\n", "imagePullSecrets"),
            ("imagePullSecrets: [{secret: a}]\n", "imagePullSecrets"),
            (
                "imagePullSecrets: [{name: a, other: b}]\n",
                "imagePullSecrets",
            ),
            ("imagePullSecrets: [{name: 3}]\n", "imagePullSecrets"),
            ("imagePullSecrets: [[a]]\n", "imagePullSecrets"),
        ] {
            let err = from_file(text).expect_err(text).to_string();
            assert!(err.contains(key), "{text}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "image: from-file\nbarrierPort: 9000\n").expect("write");
        let args = InjectionArgs {
            config: Some(path),
            agent_image: Some("from-flag".into()),
            ..InjectionArgs::default()
        };
        let c = InjectionConfig::load(&args, None).expect("loads");
        assert_eq!(c.image, "from-flag");
        assert_eq!(c.barrier_port, 9000);
        let flags = InjectionArgs {
            agent_image_pull_secrets: vec!["one".into(), "two".into()],
            barrier_fallback_ports: Some("7000-7001".into()),
            ..args.clone()
        };
        let c = InjectionConfig::load(&flags, None).expect("loads");
        assert_eq!(c.image_pull_secrets, ["one", "two"]);
        assert_eq!(
            c.barrier_fallback_ports,
            PortRange {
                first: 7000,
                last: 7001
            }
        );
        let bad = InjectionArgs {
            barrier_fallback_ports: Some("x".into()),
            ..args.clone()
        };
        let err = InjectionConfig::load(&bad, None)
            .expect_err("bad")
            .to_string();
        assert!(err.contains("--barrier-fallback-ports"), "{err}");
        std::fs::write(args.config.as_ref().expect("set"), "protocol: attempt\n").expect("write");
        let c = InjectionConfig::load(&args, None).expect("loads");
        assert_eq!(c.protocol, Dialect::Attempt, "the file sets the protocol");
        let c = InjectionConfig::load(&args, Some(Dialect::Epoch)).expect("loads");
        assert_eq!(c.protocol, Dialect::Epoch, "the flag overrides the file");
    }

    #[test]
    fn missing_file_is_a_clear_error() {
        let args = InjectionArgs {
            config: Some("/nonexistent/c.yaml".into()),
            ..InjectionArgs::default()
        };
        let err = InjectionConfig::load(&args, None)
            .expect_err("missing")
            .to_string();
        assert!(err.contains("/nonexistent/c.yaml"), "{err}");
    }
}
