//! `doctor`'s `kueue-wait-for-pods-ready` check: does Kueue's `waitForPodsReady` leave a group
//! restart the time it may take?
//!
//! Kueue v0.17 (its `pkg/controller/jobframework` and `pkg/controller/core/workload_controller.go`)
//! counts a JobSet ready while every Job of it is; once ready, a JobSet whose pods go unready (a
//! group restart) gets `PodsReady=False`, reason `WaitForRecovery`, and is evicted
//! (`PodsReadyTimeout`) and requeued `recoveryTimeout` after that transition. `recoveryTimeout`
//! unset is `timeout` (its defaulting); `0s` turns the recovery check off. A group restart may keep
//! pods unready for two windows of the group-restart timeout before the reconciler's own fallback
//! recreates the JobSet (docs/protocol.md), so `recoveryTimeout` must exceed twice that.
//!
//! The configuration is read where Kueue's release deploys it: ConfigMap
//! `kueue-system/kueue-manager-config`, key `controller_manager_config.yaml` (its
//! `config/components/manager` with the `kueue-` name prefix); the group-restart timeout from the
//! reconciler's Deployment (`--group-restart-timeout` or its env), else the binary's default.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use serde_json::Value;

use super::finding::{Finding, Outcome};
use crate::deadline::{DEFAULT_TIMEOUT, display_duration, parse_timeout};

pub const CHECK: &str = "kueue-wait-for-pods-ready";
/// Kueue's release: `config/default` (namespace `kueue-system`, prefix `kueue-`) over
/// `config/components/manager` (configMapGenerator `manager-config`).
pub const CONFIG_MAP: &str = "kueue-manager-config";
pub const CONFIG_KEY: &str = "controller_manager_config.yaml";
/// The reconciler's Deployment in the system namespace and its container.
pub const RECONCILER_DEPLOYMENT: &str = "jobset-inplace-reconciler";
pub const RECONCILER_CONTAINER: &str = "reconciler";
const TIMEOUT_FLAG: &str = "--group-restart-timeout";
const TIMEOUT_ENV: &str = "JOBSET_INPLACE_GROUP_RESTART_TIMEOUT";
/// Kueue v1beta1's default `timeout` when `enable: true` leaves it unset.
const V1BETA1_DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Kueue's `waitForPodsReady` as Kueue applies its defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodsReady {
    Off,
    On {
        timeout: Duration,
        /// `None`: `0s`, the recovery check off.
        recovery: Option<Duration>,
        /// Whether `recoveryTimeout` was written (else it is `timeout`).
        recovery_set: bool,
    },
}

/// A Go duration as Kueue's `metav1.Duration` takes it, in the grammar every duration of this
/// product uses (`5m`, `1h30m`, `90s`, `0s`).
fn go_duration(value: &Value, field: &str) -> Result<Duration, String> {
    let text = value
        .as_str()
        .ok_or_else(|| format!("waitForPodsReady.{field} is not a duration: {value}"))?;
    crate::settings::parse_duration(text).map_err(|e| format!("waitForPodsReady.{field}: {e}"))
}

/// Reads `waitForPodsReady` from Kueue's Configuration (`config.kueue.x-k8s.io/v1beta2`: on when
/// present; `v1beta1`: on with `enable: true`).
pub fn pods_ready(config_yaml: &str) -> Result<PodsReady, String> {
    let config: Value = crate::settings::from_yaml(config_yaml)
        .map_err(|e| format!("not a Kueue Configuration: {e}"))?;
    let w = &config["waitForPodsReady"];
    if w.is_null() {
        return Ok(PodsReady::Off);
    }
    if !w.is_object() {
        return Err(format!("waitForPodsReady is not a map: {w}"));
    }
    let v1beta1 = config["apiVersion"].as_str() == Some("config.kueue.x-k8s.io/v1beta1");
    if v1beta1 && w["enable"].as_bool() != Some(true) {
        return Ok(PodsReady::Off);
    }
    let timeout = match (&w["timeout"], v1beta1) {
        (Value::Null, true) => V1BETA1_DEFAULT_TIMEOUT,
        (Value::Null, false) => {
            return Err("waitForPodsReady.timeout is not set (Kueue refuses to start)".to_owned());
        }
        (t, _) => go_duration(t, "timeout")?,
    };
    let (recovery, recovery_set) = match &w["recoveryTimeout"] {
        Value::Null => (timeout, false),
        r => (go_duration(r, "recoveryTimeout")?, true),
    };
    Ok(PodsReady::On {
        timeout,
        recovery: (!recovery.is_zero()).then_some(recovery),
        recovery_set,
    })
}

/// The group-restart timeout in force (`None`: off) and where it comes from, as the reconciler's
/// Deployment starts it: the flag, else its env, else the binary's default.
pub fn group_restart_timeout(
    deployment: Option<&Deployment>,
    namespace: &str,
) -> (Result<Option<Duration>, String>, String) {
    let default = || {
        (
            Ok(Some(DEFAULT_TIMEOUT)),
            format!(
                "the reconciler's default {}",
                display_duration(DEFAULT_TIMEOUT)
            ),
        )
    };
    let Some(container) = deployment
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.iter().find(|c| c.name == RECONCILER_CONTAINER))
    else {
        let (timeout, _) = default();
        return (
            timeout,
            format!(
                "the reconciler's default {} (no Deployment {namespace}/{RECONCILER_DEPLOYMENT})",
                display_duration(DEFAULT_TIMEOUT)
            ),
        );
    };
    let mut args = container.args.iter().flatten();
    let mut from_flag = None;
    while let Some(arg) = args.next() {
        if let Some(v) = arg.strip_prefix(TIMEOUT_FLAG) {
            if let Some(v) = v.strip_prefix('=') {
                from_flag = Some(v.to_owned());
            } else if v.is_empty() {
                from_flag = args.next().cloned();
            }
        }
    }
    let from_env = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == TIMEOUT_ENV)
        .and_then(|e| e.value.clone())
        .filter(|v| !v.trim().is_empty());
    let (text, source) = match (from_flag, from_env) {
        (Some(v), _) => (
            v,
            format!("{TIMEOUT_FLAG} of {namespace}/{RECONCILER_DEPLOYMENT}"),
        ),
        (None, Some(v)) => (
            v,
            format!("{TIMEOUT_ENV} of {namespace}/{RECONCILER_DEPLOYMENT}"),
        ),
        (None, None) => return default(),
    };
    (
        parse_timeout(&text).map_err(|e| e.to_string()),
        format!("{text} ({source})"),
    )
}

/// Where the configuration was read, for the report.
fn source(namespace: &str) -> String {
    format!("ConfigMap {namespace}/{CONFIG_MAP} ({CONFIG_KEY})")
}

/// The finding. `config`: `None` where there is no such ConfigMap (no Kueue, or one installed
/// otherwise), else its configuration's text or why it could not be read.
pub fn check_pods_ready(
    config: Option<Result<String, String>>,
    namespace: &str,
    restart: (Result<Option<Duration>, String>, String),
) -> Finding {
    let source = source(namespace);
    let Some(text) = config else {
        return Finding::new(
            CHECK,
            Outcome::Ok,
            format!("no {source}: no Kueue installed as its release installs it; nothing to check"),
        );
    };
    let fix_by_hand = "set waitForPodsReady.recoveryTimeout above twice the group-restart \
                       timeout plus the pods' start, or \"0s\" (docs/operations.md, Kueue)";
    let settings = match text.and_then(|t| pods_ready(&t)) {
        Ok(s) => s,
        Err(e) => {
            return Finding::new(CHECK, Outcome::Warn, format!("cannot read {source}: {e}"))
                .fix(fix_by_hand);
        }
    };
    let (timeout, restart_from) = restart;
    let restart = match timeout {
        Ok(t) => t,
        Err(e) => {
            return Finding::new(
                CHECK,
                Outcome::Warn,
                format!("cannot read the group-restart timeout {restart_from}: {e}"),
            )
            .fix(fix_by_hand);
        }
    };
    let (recovery, recovery_set, kueue_timeout) = match settings {
        PodsReady::Off => {
            return Finding::new(
                CHECK,
                Outcome::Ok,
                format!(
                    "waitForPodsReady off ({source}): Kueue evicts no workload for unready pods"
                ),
            );
        }
        PodsReady::On {
            recovery: None,
            timeout,
            ..
        } => {
            return Finding::new(
                CHECK,
                Outcome::Ok,
                format!(
                    "waitForPodsReady on (timeout {}), recoveryTimeout 0s ({source}): Kueue does \
                     not evict a running workload whose pods go unready; group restarts are \
                     bounded by the group-restart deadline alone",
                    display_duration(timeout)
                ),
            );
        }
        PodsReady::On {
            recovery: Some(r),
            recovery_set,
            timeout,
        } => (r, recovery_set, timeout),
    };
    let written = if recovery_set {
        format!("recoveryTimeout {}", display_duration(recovery))
    } else {
        format!(
            "recoveryTimeout unset, so Kueue's timeout {}",
            display_duration(kueue_timeout)
        )
    };
    let Some(restart) = restart else {
        return Finding::new(
            CHECK,
            Outcome::Ok,
            format!(
                "waitForPodsReady on, {written} ({source}); the group-restart deadline is off \
                 ({restart_from}): Kueue's eviction is the only bound on a group restart"
            ),
        );
    };
    let needed = restart.saturating_mul(2);
    if recovery > needed {
        Finding::new(
            CHECK,
            Outcome::Ok,
            format!(
                "waitForPodsReady on, {written} ({source}): more than twice the group-restart \
                 timeout {restart_from}; a JobSet with a longer \
                 jobset-inplace.dev/group-restart-timeout needs more"
            ),
        )
    } else {
        Finding::new(
            CHECK,
            Outcome::Warn,
            format!(
                "waitForPodsReady on, {written} ({source}), is not more than twice the \
                 group-restart timeout {restart_from} ({}): a group restart keeps the pods \
                 unready up to that long before the reconciler's own fallback, so Kueue evicts \
                 the workload (PodsReadyTimeout) and requeues it, a full recreation",
                display_duration(needed)
            ),
        )
        .fix(format!(
            "set waitForPodsReady.recoveryTimeout in {source} above {} plus the pods' start \
             (e.g. {}) and restart Kueue, or \"0s\" to leave group restarts to the deadline",
            display_duration(needed),
            display_duration(needed.saturating_add(Duration::from_secs(60)))
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MIN: Duration = Duration::from_secs(60);

    fn config(wait: &str) -> String {
        format!(
            "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n\
             namespace: kueue-system\n{wait}\nintegrations:\n  frameworks:\n  - jobset.x-k8s.io/jobset\n"
        )
    }

    fn default_restart() -> (Result<Option<Duration>, String>, String) {
        (Ok(Some(2 * MIN)), "the reconciler's default 2m".to_owned())
    }

    fn check(wait: &str) -> Finding {
        check_pods_ready(Some(Ok(config(wait))), "kueue-system", default_restart())
    }

    #[test]
    fn kueue_defaults_are_applied() {
        assert_eq!(pods_ready(&config("")), Ok(PodsReady::Off));
        assert_eq!(
            pods_ready(&config("waitForPodsReady:\n  timeout: 10m")),
            Ok(PodsReady::On {
                timeout: 10 * MIN,
                recovery: Some(10 * MIN),
                recovery_set: false
            })
        );
        assert_eq!(
            pods_ready(&config(
                "waitForPodsReady:\n  timeout: 10m\n  recoveryTimeout: 1h30m"
            )),
            Ok(PodsReady::On {
                timeout: 10 * MIN,
                recovery: Some(90 * MIN),
                recovery_set: true
            })
        );
        assert_eq!(
            pods_ready(&config(
                "waitForPodsReady:\n  timeout: 10m\n  recoveryTimeout: 0s"
            )),
            Ok(PodsReady::On {
                timeout: 10 * MIN,
                recovery: None,
                recovery_set: true
            })
        );
        // v1beta1: on only with enable: true; timeout defaults to 5m.
        let v1 = |w: &str| format!("apiVersion: config.kueue.x-k8s.io/v1beta1\n{w}");
        assert_eq!(
            pods_ready(&v1("waitForPodsReady:\n  timeout: 10m")),
            Ok(PodsReady::Off)
        );
        assert_eq!(
            pods_ready(&v1("waitForPodsReady:\n  enable: true")),
            Ok(PodsReady::On {
                timeout: 5 * MIN,
                recovery: Some(5 * MIN),
                recovery_set: false
            })
        );
        for broken in [
            "waitForPodsReady: 5m",
            "waitForPodsReady:\n  recoveryTimeout: 5m",
            "waitForPodsReady:\n  timeout: soon",
            "waitForPodsReady:\n  timeout: 10m\n  recoveryTimeout: 3",
            "waitForPodsReady: [",
        ] {
            assert!(pods_ready(&config(broken)).is_err(), "{broken}");
        }
    }

    #[test]
    fn warns_where_kueue_evicts_before_the_deadlines_fallback() {
        // Twice the 2m default is 4m: shorter or equal warns, with what to set.
        for wait in [
            "waitForPodsReady:\n  timeout: 10m\n  recoveryTimeout: 20s",
            "waitForPodsReady:\n  timeout: 10m\n  recoveryTimeout: 4m",
            "waitForPodsReady:\n  timeout: 3m",
        ] {
            let f = check(wait);
            assert_eq!(f.verdict, Outcome::Warn, "{wait}: {}", f.render());
            assert!(f.detail.contains("PodsReadyTimeout"), "{}", f.render());
            let fix = f.fix.clone().unwrap_or_default();
            assert!(fix.contains("above 4m"), "{}", f.render());
            assert!(fix.contains("kueue-system/kueue-manager-config"), "{fix}");
        }
        let unset = check("waitForPodsReady:\n  timeout: 3m");
        assert!(
            unset
                .detail
                .contains("recoveryTimeout unset, so Kueue's timeout 3m"),
            "{}",
            unset.render()
        );
        // A longer group-restart timeout needs more.
        let f = check_pods_ready(
            Some(Ok(config(
                "waitForPodsReady:\n  timeout: 10m\n  recoveryTimeout: 5m",
            ))),
            "kueue-system",
            (Ok(Some(5 * MIN)), "5m (--group-restart-timeout)".to_owned()),
        );
        assert_eq!(f.verdict, Outcome::Warn, "{}", f.render());
    }

    #[test]
    fn passes_where_kueue_leaves_a_group_restart_its_time() {
        for wait in [
            "",
            "waitForPodsReady:\n  timeout: 10m\n  recoveryTimeout: 5m",
            "waitForPodsReady:\n  timeout: 10m",
            "waitForPodsReady:\n  timeout: 10m\n  recoveryTimeout: 0s",
        ] {
            let f = check(wait);
            assert_eq!(f.verdict, Outcome::Ok, "{wait}: {}", f.render());
            assert_eq!(f.fix, None);
        }
        // No Kueue: a pass that says so.
        let none = check_pods_ready(None, "kueue-system", default_restart());
        assert_eq!(none.verdict, Outcome::Ok);
        assert!(
            none.detail
                .contains("no ConfigMap kueue-system/kueue-manager-config")
        );
        // The deadline off: Kueue is the only bound, nothing to conflict with.
        let off = check_pods_ready(
            Some(Ok(config("waitForPodsReady:\n  timeout: 1m"))),
            "kueue-system",
            (Ok(None), "0 (--group-restart-timeout)".to_owned()),
        );
        assert_eq!(off.verdict, Outcome::Ok, "{}", off.render());
    }

    #[test]
    fn what_cannot_be_read_is_a_warning() {
        let f = check_pods_ready(
            Some(Err("forbidden".to_owned())),
            "kueue-system",
            default_restart(),
        );
        assert_eq!(f.verdict, Outcome::Warn);
        assert!(f.detail.contains("forbidden"));
        let f = check_pods_ready(
            Some(Ok(config("waitForPodsReady:\n  timeout: 10m"))),
            "kueue-system",
            (Err("\"soon\" is not".to_owned()), "soon (env)".to_owned()),
        );
        assert_eq!(f.verdict, Outcome::Warn, "{}", f.render());
    }

    fn deployment(args: &[&str], env: Option<&str>) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": RECONCILER_DEPLOYMENT},
            "spec": {"selector": {}, "template": {"spec": {"containers": [{
                "name": "reconciler", "args": args,
                "env": env.map(|v| vec![json!({"name": TIMEOUT_ENV, "value": v})]).unwrap_or_default(),
            }]}}},
        }))
        .expect("Deployment")
    }

    #[test]
    fn the_group_restart_timeout_as_the_deployment_starts_the_reconciler() {
        let ns = "jobset-inplace-system";
        let (t, from) = group_restart_timeout(None, ns);
        assert_eq!(t, Ok(Some(2 * MIN)));
        assert!(from.contains("no Deployment"), "{from}");
        let (t, _) = group_restart_timeout(Some(&deployment(&["--leader-elect=true"], None)), ns);
        assert_eq!(t, Ok(Some(2 * MIN)));
        let d = deployment(&["--group-restart-timeout=5m"], Some("1m"));
        let (t, from) = group_restart_timeout(Some(&d), ns);
        assert_eq!(t, Ok(Some(5 * MIN)));
        assert!(from.contains("--group-restart-timeout"), "{from}");
        let d = deployment(&["--group-restart-timeout", "90s"], None);
        assert_eq!(
            group_restart_timeout(Some(&d), ns).0,
            Ok(Some(Duration::from_secs(90)))
        );
        let d = deployment(&[], Some("1m"));
        assert_eq!(group_restart_timeout(Some(&d), ns).0, Ok(Some(MIN)));
        let d = deployment(&["--group-restart-timeout=0"], None);
        assert_eq!(group_restart_timeout(Some(&d), ns).0, Ok(None));
        let d = deployment(&["--group-restart-timeout=soon"], None);
        assert!(group_restart_timeout(Some(&d), ns).0.is_err());
    }
}
