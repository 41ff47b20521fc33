//! The agent's configuration, parsed from its environment by a pure function (the environment
//! and the namespace file are passed in), so every rule is unit-tested without touching the
//! process environment.

use std::time::{Duration, Instant};

use super::Error;
use crate::protocol::Dialect;
use crate::wire::agent_env;

/// Everything the agent needs to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    pub namespace: String,
    pub pod_name: String,
    pub jobset_name: String,
    /// The exit code that asks for an in-place restart of the pod (1-255).
    pub restart_exit_code: u8,
    pub dialect: Dialect,
    /// The barrier, an HTTP endpoint: the startup probe of the agent's sidecar container, which
    /// holds the worker containers back until it answers 200. (Main-container mode,
    /// `WORKER_COMMAND`, is not offered: [`from_env`] refuses it.)
    pub barrier_port: u16,
    pub barrier_path: String,
    /// How long the barrier holds a probe's request while it is up ([`agent_env::BARRIER_HOLD`]).
    pub barrier_hold: Duration,
    /// Timeout of each GET and PATCH, and of opening the watch.
    pub api_timeout: Duration,
    /// A watch that delivers nothing for this long is abandoned and resumed.
    pub watch_idle_timeout: Duration,
    /// The API server URL, when not the in-cluster one ([`agent_env::API_URL`]).
    pub api_url: Option<String>,
    /// When the process started: the origin of the timings in the logs.
    pub started: Instant,
}

impl AgentConfig {
    #[cfg(any(test, feature = "test-api"))]
    /// A sidecar-mode config with the defaults, for tests and in-process agents.
    pub fn sidecar(namespace: &str, pod_name: &str, jobset_name: &str, dialect: Dialect) -> Self {
        AgentConfig {
            namespace: namespace.to_owned(),
            pod_name: pod_name.to_owned(),
            jobset_name: jobset_name.to_owned(),
            restart_exit_code: agent_env::DEFAULT_RESTART_EXIT_CODE,
            dialect,
            barrier_port: agent_env::DEFAULT_BARRIER_PORT,
            barrier_path: agent_env::DEFAULT_BARRIER_PATH.to_owned(),
            barrier_hold: Duration::ZERO,
            api_timeout: agent_env::DEFAULT_API_TIMEOUT,
            watch_idle_timeout: agent_env::DEFAULT_WATCH_IDLE_TIMEOUT,
            api_url: None,
            started: Instant::now(),
        }
    }

    /// The barrier port and path.
    pub fn barrier(&self) -> (u16, &str) {
        (self.barrier_port, &self.barrier_path)
    }
}

/// Parses the agent's environment.
///
/// `env` looks a variable up (an empty value counts as unset, as in the released agent);
/// `namespace_file` reads the service account's namespace file, called only when `NAMESPACE` is
/// unset. Every error names the variable.
pub fn from_env(
    env: impl Fn(&str) -> Option<String>,
    namespace_file: impl FnOnce() -> std::io::Result<String>,
    dialect: Dialect,
) -> Result<AgentConfig, Error> {
    let started = Instant::now();
    let get = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    // The first of a variable and its alias that is set, with the name it was found under.
    let either = |name: &'static str, alias: &'static str| {
        get(name)
            .map(|v| (name, v))
            .or_else(|| get(alias).map(|v| (alias, v)))
    };
    let required = |name: &'static str| get(name).ok_or(Error::Missing { name });
    // An old pod spec of main-container mode: fail loudly, before anything else, rather than run
    // a lone agent that never starts the worker.
    if get(agent_env::WORKER_COMMAND).is_some() {
        return Err(Error::MainContainerMode {
            name: agent_env::WORKER_COMMAND,
        });
    }

    let namespace = match get(agent_env::NAMESPACE) {
        Some(ns) => ns.trim().to_owned(),
        None => {
            let text = namespace_file().map_err(|source| Error::Namespace {
                path: agent_env::SERVICE_ACCOUNT_NAMESPACE_FILE,
                source,
            })?;
            let ns = text.trim();
            if ns.is_empty() {
                return Err(Error::EmptyNamespace {
                    path: agent_env::SERVICE_ACCOUNT_NAMESPACE_FILE,
                });
            }
            ns.to_owned()
        }
    };
    let pod_name = required(agent_env::POD_NAME)?.trim().to_owned();
    let jobset_name = required(agent_env::JOBSET_NAME)?.trim().to_owned();

    let restart_exit_code = match either(
        agent_env::RESTART_EXIT_CODE,
        agent_env::RESTART_EXIT_CODE_ALIAS,
    ) {
        None => agent_env::DEFAULT_RESTART_EXIT_CODE,
        Some((name, v)) => match v.trim().parse::<u8>() {
            Ok(code) if code > 0 => code,
            _ => return Err(invalid(name, &v, "expected an exit code in 1-255")),
        },
    };

    let barrier_port = match either(agent_env::BARRIER_PORT, agent_env::BARRIER_PORT_ALIAS) {
        None => agent_env::DEFAULT_BARRIER_PORT,
        Some((name, v)) => match v.trim().parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(invalid(name, &v, "expected a port in 1-65535")),
        },
    };
    let barrier_path = match either(agent_env::BARRIER_PATH, agent_env::BARRIER_PATH_ALIAS) {
        None => agent_env::DEFAULT_BARRIER_PATH.to_owned(),
        Some((name, v)) => {
            let v = v.trim();
            if !v.starts_with('/') || v.contains(char::is_whitespace) {
                return Err(invalid(name, v, "expected a URL path starting with /"));
            }
            v.to_owned()
        }
    };
    let barrier_hold = match get(agent_env::BARRIER_HOLD) {
        None => Duration::ZERO,
        Some(v) => match duration(agent_env::BARRIER_HOLD, &v)? {
            d if d > agent_env::MAX_BARRIER_HOLD => {
                return Err(invalid(
                    agent_env::BARRIER_HOLD,
                    &v,
                    "must be at most 1h (and shorter than the startup probe's timeoutSeconds)",
                ));
            }
            d => d,
        },
    };
    let api_timeout = match get(agent_env::API_TIMEOUT) {
        None => agent_env::DEFAULT_API_TIMEOUT,
        Some(v) => match duration(agent_env::API_TIMEOUT, &v)? {
            d if d.is_zero() => return Err(invalid(agent_env::API_TIMEOUT, &v, "must not be 0")),
            d => d,
        },
    };
    let watch_idle_timeout = match get(agent_env::WATCH_IDLE_TIMEOUT) {
        None => agent_env::DEFAULT_WATCH_IDLE_TIMEOUT,
        Some(v) => match duration(agent_env::WATCH_IDLE_TIMEOUT, &v)? {
            d if d.is_zero() => {
                return Err(invalid(agent_env::WATCH_IDLE_TIMEOUT, &v, "must not be 0"));
            }
            d => d,
        },
    };
    let api_url = match get(agent_env::API_URL) {
        None => None,
        Some(v) => {
            let v = v.trim();
            let ok = v.parse::<hyper::Uri>().is_ok_and(|u| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some()
            });
            if !ok {
                return Err(invalid(
                    agent_env::API_URL,
                    v,
                    "expected a URL like http://127.0.0.1:6443",
                ));
            }
            Some(v.trim_end_matches('/').to_owned())
        }
    };

    Ok(AgentConfig {
        namespace,
        pod_name,
        jobset_name,
        restart_exit_code,
        dialect,
        barrier_port,
        barrier_path,
        api_timeout,
        watch_idle_timeout,
        barrier_hold,
        api_url,
        started,
    })
}

fn invalid(name: &'static str, value: &str, reason: &str) -> Error {
    Error::Invalid {
        name,
        value: value.chars().take(80).collect(),
        reason: reason.to_owned(),
    }
}

fn duration(name: &'static str, value: &str) -> Result<Duration, Error> {
    crate::settings::parse_duration(value).map_err(|reason| Error::Invalid {
        name,
        value: value.chars().take(80).collect(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<AgentConfig, Error> {
        parse_with_file(vars, Ok("ns-from-file\n".to_owned()))
    }

    fn parse_with_file(
        vars: &[(&str, &str)],
        file: std::io::Result<String>,
    ) -> Result<AgentConfig, Error> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        from_env(|n| map.get(n).cloned(), || file, Dialect::Attempt)
    }

    const BASE: [(&str, &str); 2] = [("POD_NAME", "p-0"), ("JOBSET_NAME", "js")];

    fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        BASE.iter().chain(extra).copied().collect()
    }

    fn message(r: Result<AgentConfig, Error>) -> String {
        match r {
            Ok(c) => panic!("accepted: {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn defaults() {
        let c = parse(&with(&[("NAMESPACE", "team-a")])).expect("parses");
        assert_eq!(c.namespace, "team-a");
        assert_eq!(c.pod_name, "p-0");
        assert_eq!(c.jobset_name, "js");
        assert_eq!(c.restart_exit_code, 42);
        assert_eq!(c.dialect, Dialect::Attempt);
        assert_eq!(c.barrier(), (8080, "/barrier-is-lifted"));
        assert_eq!(c.api_timeout, Duration::from_secs(10));
        assert_eq!(c.api_url, None);
    }

    #[test]
    fn namespace_falls_back_to_the_service_account_file() {
        let c = parse(&with(&[])).expect("parses");
        assert_eq!(c.namespace, "ns-from-file");
        let c = parse(&with(&[("NAMESPACE", "")])).expect("empty is unset");
        assert_eq!(c.namespace, "ns-from-file");
        let e = message(parse_with_file(
            &with(&[]),
            Err(std::io::Error::new(std::io::ErrorKind::NotFound, "gone")),
        ));
        assert!(
            e.contains("NAMESPACE") && e.contains("serviceaccount/namespace"),
            "{e}"
        );
        let e = message(parse_with_file(&with(&[]), Ok(" \n".into())));
        assert!(e.contains("empty"), "{e}");
    }

    #[test]
    fn required_variables_are_named() {
        let e = message(parse(&[("JOBSET_NAME", "js")]));
        assert_eq!(e, "POD_NAME is not set");
        let e = message(parse(&[("POD_NAME", "p"), ("JOBSET_NAME", "  ")]));
        assert_eq!(e, "JOBSET_NAME is not set");
    }

    #[test]
    fn exit_code_and_alias() {
        let c = parse(&with(&[("RESTART_POD_IN_PLACE_EXIT_CODE", "7")])).expect("parses");
        assert_eq!(c.restart_exit_code, 7);
        let c = parse(&with(&[("IN_PLACE_RESTART_EXIT_CODE", "9")])).expect("parses");
        assert_eq!(c.restart_exit_code, 9);
        let c = parse(&with(&[
            ("RESTART_POD_IN_PLACE_EXIT_CODE", "7"),
            ("IN_PLACE_RESTART_EXIT_CODE", "9"),
        ]))
        .expect("parses");
        assert_eq!(c.restart_exit_code, 7, "our name wins");
        for bad in ["0", "256", "-1", "x", "4 2"] {
            let e = message(parse(&with(&[("RESTART_POD_IN_PLACE_EXIT_CODE", bad)])));
            assert!(e.starts_with("RESTART_POD_IN_PLACE_EXIT_CODE="), "{e}");
            assert!(e.contains("1-255"), "{e}");
        }
        let e = message(parse(&with(&[("IN_PLACE_RESTART_EXIT_CODE", "0")])));
        assert!(e.starts_with("IN_PLACE_RESTART_EXIT_CODE="), "{e}");
    }

    #[test]
    fn barrier_port_path_and_aliases() {
        let c = parse(&with(&[
            ("BARRIER_PORT", "9000"),
            ("STARTUP_PROBE_PATH", "/up"),
        ]))
        .expect("parses");
        assert_eq!(c.barrier(), (9000, "/up"));
        let c = parse(&with(&[
            ("STARTUP_PROBE_PORT", "81"),
            ("BARRIER_PORT", "82"),
        ]))
        .expect("parses");
        assert_eq!(c.barrier(), (82, "/barrier-is-lifted"));
        for bad in ["0", "65536", "http"] {
            let e = message(parse(&with(&[("STARTUP_PROBE_PORT", bad)])));
            assert!(e.starts_with("STARTUP_PROBE_PORT="), "{e}");
        }
        let e = message(parse(&with(&[("BARRIER_PATH", "up")])));
        assert!(
            e.starts_with("BARRIER_PATH=") && e.contains("starting with /"),
            "{e}"
        );
    }

    /// An old pod spec of main-container mode (`WORKER_COMMAND`, with or without the rest of
    /// what it used) is a configuration error naming why, not a lone agent.
    #[test]
    fn main_container_mode_is_refused() {
        for extra in [
            &[("WORKER_COMMAND", "exec train")][..],
            &[
                ("WORKER_COMMAND", "w"),
                ("AGENT_WORKER_GRACE_PERIOD", "500ms"),
            ],
            &[("WORKER_COMMAND", "w"), ("SHELL", "/bin/bash")],
        ] {
            let e = message(parse(&with(extra)));
            assert!(e.starts_with("WORKER_COMMAND is set"), "{e}");
            assert!(
                e.contains("main-container mode") && e.contains("CrashLoopBackOff"),
                "{e}"
            );
            assert!(!e.contains('\n'), "{e}");
        }
        // Before anything else it lacks.
        let e = message(parse(&[("WORKER_COMMAND", "w")]));
        assert!(e.starts_with("WORKER_COMMAND is set"), "{e}");
        // Empty counts as unset, as for every variable.
        assert!(parse(&with(&[("WORKER_COMMAND", " ")])).is_ok());
    }

    #[test]
    fn tuning_variables() {
        let c = parse(&with(&[
            ("AGENT_API_TIMEOUT", "2s"),
            ("AGENT_API_URL", "http://127.0.0.1:1234/"),
        ]))
        .expect("parses");
        assert_eq!(c.api_timeout, Duration::from_secs(2));
        assert_eq!(c.api_url.as_deref(), Some("http://127.0.0.1:1234"));
        let e = message(parse(&with(&[("AGENT_API_TIMEOUT", "0")])));
        assert!(e.starts_with("AGENT_API_TIMEOUT="), "{e}");
        assert_eq!(c.watch_idle_timeout, Duration::from_secs(90));
        let c = parse(&with(&[("AGENT_WATCH_IDLE_TIMEOUT", "2m")])).expect("parses");
        assert_eq!(c.watch_idle_timeout, Duration::from_secs(120));
        for bad in ["0", "soon"] {
            let e = message(parse(&with(&[("AGENT_WATCH_IDLE_TIMEOUT", bad)])));
            assert!(e.starts_with("AGENT_WATCH_IDLE_TIMEOUT="), "{e}");
        }
        for bad in ["127.0.0.1:1234", "ftp://x", "http://"] {
            let e = message(parse(&with(&[("AGENT_API_URL", bad)])));
            assert!(e.starts_with("AGENT_API_URL="), "{e}");
        }
    }

    #[test]
    fn barrier_hold() {
        assert_eq!(
            parse(&with(&[])).expect("parses").barrier_hold,
            Duration::ZERO
        );
        let c = parse(&with(&[("BARRIER_HOLD", "290s")])).expect("parses");
        assert_eq!(c.barrier_hold, Duration::from_secs(290));
        let c = parse(&with(&[("BARRIER_HOLD", "0s")])).expect("parses");
        assert_eq!(c.barrier_hold, Duration::ZERO);
        for bad in ["2h", "soon", "-1s"] {
            let e = message(parse(&with(&[("BARRIER_HOLD", bad)])));
            assert!(e.starts_with("BARRIER_HOLD="), "{e}");
        }
    }

    #[test]
    fn errors_are_one_line() {
        let e = message(parse(&with(&[("BARRIER_PORT", "8080\n8081")])));
        assert!(!e.contains('\n'), "{e}");
    }
}
