//! The injection config: every configurable default of the mutation (image, exit code, barrier
//! port and path, probe timing, resources, service account, protocol), from a YAML file
//! (`--config`), overridden by flags and env.
//!
//! The file uses camelCase keys and rejects unknown ones, so a typo is a startup error naming the
//! key instead of a silently ignored setting:
//!
//! ```yaml
//! image: ghcr.io/jobset-inplace/jobset-inplace:0.1.0
//! imagePullPolicy: IfNotPresent
//! restartExitCode: 42
//! barrierPort: 8080
//! barrierPath: /barrier-is-lifted
//! probePeriodSeconds: 1
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

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read injection config {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid injection config {path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_yaml::Error,
    },
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

    /// Exit code with which the agent asks for an in-place restart of its pod (1-255).
    #[arg(long, env = "JOBSET_INPLACE_RESTART_EXIT_CODE")]
    pub restart_exit_code: Option<u8>,

    /// Port of the agent's barrier endpoint (its startup probe).
    #[arg(long, env = "JOBSET_INPLACE_BARRIER_PORT")]
    pub barrier_port: Option<u16>,

    /// Path of the agent's barrier endpoint (its startup probe).
    #[arg(long, env = "JOBSET_INPLACE_BARRIER_PATH")]
    pub barrier_path: Option<String>,

    /// Seconds between two startup probes of the barrier.
    #[arg(long, env = "JOBSET_INPLACE_PROBE_PERIOD_SECONDS")]
    pub probe_period_seconds: Option<i32>,

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
    restart_exit_code: Option<i64>,
    barrier_port: Option<i64>,
    barrier_path: Option<String>,
    probe_period_seconds: Option<i64>,
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
    pub restart_exit_code: u8,
    pub barrier_port: u16,
    pub barrier_path: String,
    pub probe_period_seconds: i32,
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
            restart_exit_code: agent_env::DEFAULT_RESTART_EXIT_CODE,
            barrier_port: agent_env::DEFAULT_BARRIER_PORT,
            barrier_path: agent_env::DEFAULT_BARRIER_PATH.to_owned(),
            probe_period_seconds: 1,
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
        config.apply_args(args);
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
            serde_yaml::from_str(text).map_err(|source| ConfigError::Parse {
                path: path.display().to_string(),
                source,
            })?
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
        if let Some(v) = file.restart_exit_code {
            self.restart_exit_code = u8::try_from(v)
                .map_err(|_| invalid("restartExitCode", format!("{v} is not in 1-255")))?;
        }
        if let Some(v) = file.barrier_port {
            self.barrier_port = u16::try_from(v)
                .map_err(|_| invalid("barrierPort", format!("{v} is not in 1-65535")))?;
        }
        if let Some(v) = file.barrier_path {
            self.barrier_path = v;
        }
        if let Some(v) = file.probe_period_seconds {
            self.probe_period_seconds = i32::try_from(v)
                .map_err(|_| invalid("probePeriodSeconds", format!("{v} is out of range")))?;
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

    fn apply_args(&mut self, args: &InjectionArgs) {
        if let Some(v) = &args.agent_image {
            self.image.clone_from(v);
        }
        if let Some(v) = &args.agent_image_pull_policy {
            self.image_pull_policy.clone_from(v);
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
        if let Some(v) = args.probe_failure_threshold {
            self.probe_failure_threshold = v;
        }
        if let Some(v) = &args.agent_service_account {
            self.service_account.clone_from(v);
        }
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
        if !self.barrier_path.starts_with('/') {
            return invalid("--barrier-path / barrierPath", "must start with /");
        }
        if self.probe_period_seconds < 1 {
            return invalid(
                "--probe-period-seconds / probePeriodSeconds",
                "must be at least 1",
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
