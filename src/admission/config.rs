//! The injection config: every configurable default of the mutation (image, exit code, barrier
//! port and path, probe threshold, resources, service account, protocol), from a YAML file
//! (`--config`), overridden by flags and env.
//!
//! STUB: fields and loading are being built.

use crate::protocol::Dialect;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read injection config {path}: {reason}")]
    Read { path: String, reason: String },
}

/// Flags (and env) that override the injection config file. Flattened into every subcommand
/// that admits JobSets (`webhook`, `inject`, `check`, `review`).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct InjectionArgs {
    /// YAML injection config file.
    #[arg(long = "config", env = "JOBSET_INPLACE_CONFIG")]
    pub config: Option<std::path::PathBuf>,
}

/// The resolved injection config.
#[derive(Clone, Debug, PartialEq)]
pub struct InjectionConfig {
    pub protocol: Dialect,
}

impl InjectionConfig {
    /// The built-in defaults for a dialect.
    pub fn defaults(protocol: Dialect) -> Self {
        InjectionConfig { protocol }
    }

    /// File, then flags and env, over the defaults.
    pub fn load(_args: &InjectionArgs, protocol: Dialect) -> Result<Self, ConfigError> {
        Ok(Self::defaults(protocol))
    }
}
