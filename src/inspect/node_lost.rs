//! `doctor`'s `node-lost` check: which `--node-lost` mode the installed reconciler runs
//! (docs/operations.md, "Node loss"), read from its Deployment's args and env as the binary
//! resolves them ([`crate::reconciler::nodes::resolve_node_lost`]). `fenced` and `off` pass;
//! `force-after-grace` passes with a warning that a partitioned node's worker may run beside its
//! replacement; flags the binary would refuse fail.

use k8s_openapi::api::apps::v1::Deployment;

use super::finding::{Finding, Outcome};
use super::kueue::{RECONCILER_CONTAINER, RECONCILER_DEPLOYMENT};
use crate::reconciler::nodes::{NodeLost, NodeLostMode, resolve_node_lost};

pub const CHECK: &str = "node-lost";
const MODE_FLAG: &str = "--node-lost";
const MODE_ENV: &str = "JOBSET_INPLACE_NODE_LOST";
const GRACE_FLAG: &str = "--node-lost-grace";
const GRACE_ENV: &str = "JOBSET_INPLACE_NODE_LOST_GRACE";

/// The value of `flag` in `args` (`--flag=v` or `--flag v`; the last one wins, as clap takes it).
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let mut found = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if let Some(rest) = arg.strip_prefix(flag) {
            if let Some(v) = rest.strip_prefix('=') {
                found = Some(v.to_owned());
            } else if rest.is_empty() {
                found = it.next().cloned();
            }
        }
    }
    found
}

/// The mode the reconciler of `deployment` runs, and what was read; `Err`: flags it refuses.
pub fn installed_mode(deployment: Option<&Deployment>) -> Result<(NodeLost, String), String> {
    let Some(container) = deployment
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.iter().find(|c| c.name == RECONCILER_CONTAINER))
    else {
        return Ok((
            NodeLost::Fenced,
            format!("no Deployment {RECONCILER_DEPLOYMENT}: the binary's default"),
        ));
    };
    let args = container.args.clone().unwrap_or_default();
    let env = |name: &str| {
        container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
            .filter(|v| !v.trim().is_empty())
    };
    let mode_text = flag_value(&args, MODE_FLAG).or_else(|| env(MODE_ENV));
    let grace_text = flag_value(&args, GRACE_FLAG).or_else(|| env(GRACE_ENV));
    let mode = match mode_text.as_deref() {
        None => None,
        Some(t) => Some(
            <NodeLostMode as clap::ValueEnum>::from_str(t, false)
                .map_err(|_| format!("{MODE_FLAG} {t}: not fenced, force-after-grace or off"))?,
        ),
    };
    let grace = match grace_text.as_deref() {
        None => None,
        Some(t) => {
            Some(crate::settings::parse_duration(t).map_err(|e| format!("{GRACE_FLAG} {t}: {e}"))?)
        }
    };
    let read = match (&mode_text, &grace_text) {
        (None, None) => "no --node-lost nor --node-lost-grace: the default".to_owned(),
        (m, g) => [
            m.as_ref().map(|m| format!("{MODE_FLAG} {m}")),
            g.as_ref().map(|g| format!("{GRACE_FLAG} {g}")),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", "),
    };
    Ok((resolve_node_lost(mode, grace)?, read))
}

/// The finding for the reconciler's Deployment (`Err`: it could not be read).
pub fn check_node_lost(
    deployment: Result<Option<&Deployment>, String>,
    namespace: &str,
) -> Finding {
    let deployment = match deployment {
        Ok(d) => d,
        Err(e) => {
            return Finding::new(
                CHECK,
                Outcome::Warn,
                format!("cannot read Deployment {namespace}/{RECONCILER_DEPLOYMENT}: {e}"),
            );
        }
    };
    match installed_mode(deployment) {
        Err(e) => Finding::new(
            CHECK,
            Outcome::Fail,
            format!("the reconciler refuses its flags: {e}"),
        )
        .fix("set --node-lost fenced|force-after-grace|off, and --node-lost-grace only with force-after-grace (docs/operations.md, Node loss)"),
        Ok((mode @ NodeLost::ForceAfterGrace(_), read)) => Finding::new(
            CHECK,
            Outcome::Warn,
            format!("{} ({read})", mode.describe()),
        )
        .fix("the operator's choice; to never run two workers of one index at once, use --node-lost fenced and taint a down node node.kubernetes.io/out-of-service (docs/operations.md, Node loss)"),
        Ok((mode, read)) => Finding::new(CHECK, Outcome::Ok, format!("{} ({read})", mode.describe())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(args: &[&str], env: &[(&str, &str)]) -> Deployment {
        let env: Vec<_> = env
            .iter()
            .map(|(n, v)| json!({"name": n, "value": v}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": RECONCILER_DEPLOYMENT},
            "spec": {"selector": {}, "template": {"spec": {"containers": [{
                "name": "reconciler", "args": args, "env": env,
            }]}}},
        }))
        .expect("Deployment")
    }

    #[test]
    fn doctor_says_which_node_lost_mode_the_reconciler_runs() {
        let ns = "jobset-inplace-system";
        let check = |d: &Deployment| check_node_lost(Ok(Some(d)), ns);
        let f = check_node_lost(Ok(None), ns);
        assert_eq!(f.verdict, Outcome::Ok);
        assert!(f.detail.starts_with("fenced"), "{}", f.detail);
        let f = check(&deployment(&["reconciler", "--leader-elect=true"], &[]));
        assert_eq!(f.verdict, Outcome::Ok);
        assert!(f.detail.contains("the default"), "{}", f.detail);
        let f = check(&deployment(&["--node-lost=force-after-grace"], &[]));
        assert_eq!(f.verdict, Outcome::Warn);
        assert!(
            f.detail.starts_with("force-after-grace 30s"),
            "{}",
            f.detail
        );
        // The grace alone, as the real-node tests set it through the env: force-after-grace.
        let f = check(&deployment(&[], &[(GRACE_ENV, "2s")]));
        assert_eq!(f.verdict, Outcome::Warn);
        assert!(f.detail.starts_with("force-after-grace 2s"), "{}", f.detail);
        // The flag wins over the env, as clap takes them.
        let f = check(&deployment(
            &["--node-lost", "off"],
            &[(MODE_ENV, "fenced")],
        ));
        assert!(f.detail.starts_with("off"), "{}", f.detail);
        for bad in [
            deployment(&["--node-lost=sometimes"], &[]),
            deployment(&["--node-lost=fenced", "--node-lost-grace=5s"], &[]),
            deployment(&["--node-lost-grace=soon"], &[]),
        ] {
            assert_eq!(check(&bad).verdict, Outcome::Fail);
        }
        assert_eq!(
            check_node_lost(Err("forbidden".into()), ns).verdict,
            Outcome::Warn
        );
    }
}
