//! `doctor`'s `kubelet-version` check: kubelets known to leave a pod's crashed containers
//! unrestarted after a kubelet restart when a sidecar with a startup probe runs (the injected
//! agent is such a sidecar). kubernetes/kubernetes PR 137146, cherry-picked to release-1.35 as PR
//! 137885: "Fixed a 1.35 regression where, after a kubelet restart, regular containers in a pod
//! with a sidecar (initContainer with restartPolicy: Always) and a startupProbe failed to restart
//! after crashing" (`CHANGELOG-1.35.md`, 1.35.4). So v1.35.0 to v1.35.3 carry it (their
//! pre-releases too); 1.36.0, branched after the fix merged, does not.

use k8s_openapi::api::core::v1::Node;

use super::finding::{Finding, Outcome};

pub const CHECK: &str = "kubelet-version";
/// How many node names a finding spells out.
const NODES_NAMED: usize = 8;

/// `(major, minor, patch)` of a kubelet version as nodes report it (`v1.35.2`,
/// `v1.35.2-eks-abc`, `v1.35.0-rc.1`, `v1.35.3+k3s1`); `None` if it does not read so.
pub fn parse(version: &str) -> Option<(u32, u32, u32)> {
    let v = version.trim().strip_prefix('v').unwrap_or(version.trim());
    let core = v.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((major, minor, patch))
}

/// A kubelet of this version leaves crashed containers unrestarted after its own restart
/// (module docs).
pub fn carries_the_sidecar_restart_regression(version: &str) -> bool {
    matches!(parse(version), Some((1, 35, patch)) if patch < 4)
}

/// The finding for `nodes` (their `status.nodeInfo.kubeletVersion`).
pub fn check_kubelet_versions(nodes: &[Node]) -> Finding {
    let affected: Vec<String> = nodes
        .iter()
        .filter_map(|n| {
            let version = n
                .status
                .as_ref()?
                .node_info
                .as_ref()?
                .kubelet_version
                .clone();
            carries_the_sidecar_restart_regression(&version).then(|| {
                format!(
                    "{} ({version})",
                    n.metadata.name.as_deref().unwrap_or("<unnamed>")
                )
            })
        })
        .collect();
    if affected.is_empty() {
        return Finding::new(
            CHECK,
            Outcome::Ok,
            format!(
                "no node's kubelet is one of v1.35.0-v1.35.3 ({} node(s) read)",
                nodes.len()
            ),
        );
    }
    let mut named = affected
        .iter()
        .take(NODES_NAMED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if affected.len() > NODES_NAMED {
        named.push_str(&format!(" and {} more", affected.len() - NODES_NAMED));
    }
    Finding::new(
        CHECK,
        Outcome::Warn,
        format!(
            "{} of {} node(s) run a kubelet v1.35.0-v1.35.3: {named}; after a restart of that \
             kubelet, a worker that exits in a pod whose sidecar has a startup probe (the \
             injected agent has one) is not restarted, so the group restart does not complete \
             (kubernetes PR 137146, fixed in v1.35.4)",
            affected.len(),
            nodes.len()
        ),
    )
    .fix("upgrade those nodes' kubelets to v1.35.4 or later; until then, after restarting such a kubelet, drain its node")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, version: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"nodeInfo": {
                "kubeletVersion": version, "architecture": "", "bootID": "",
                "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "",
                "machineID": "", "operatingSystem": "", "osImage": "", "systemUUID": ""
            }}
        }))
        .expect("Node")
    }

    #[test]
    fn kubelets_v1_35_0_to_v1_35_3_carry_the_regression() {
        for v in [
            "v1.35.0",
            "v1.35.3",
            "v1.35.0-rc.1",
            "v1.35.2-eks-1a2b3c",
            "v1.35.3+k3s1",
            "1.35.1",
        ] {
            assert!(carries_the_sidecar_restart_regression(v), "{v}");
        }
        for v in [
            "v1.35.4",
            "v1.35.10",
            "v1.36.0",
            "v1.34.9",
            "v2.35.0",
            "v1.35",
            "",
            "latest",
            "v1.35.x",
            "v1.35.3.1",
        ] {
            assert!(!carries_the_sidecar_restart_regression(v), "{v}");
        }
        assert_eq!(parse("v1.35.2-eks-1"), Some((1, 35, 2)));
    }

    #[test]
    fn doctor_warns_naming_the_nodes_with_an_affected_kubelet() {
        let ok = check_kubelet_versions(&[node("a", "v1.35.4"), node("b", "v1.36.1")]);
        assert_eq!(ok.verdict, Outcome::Ok, "{}", ok.detail);
        assert_eq!(check_kubelet_versions(&[]).verdict, Outcome::Ok);
        let warn = check_kubelet_versions(&[node("a", "v1.35.4"), node("b", "v1.35.2")]);
        assert_eq!(warn.verdict, Outcome::Warn);
        assert!(
            warn.detail.starts_with("1 of 2 node(s)") && warn.detail.contains("b (v1.35.2)"),
            "{}",
            warn.detail
        );
        assert!(!warn.detail.contains("a (v1.35.4)"));
        let many: Vec<Node> = (0..10).map(|i| node(&format!("n{i}"), "v1.35.0")).collect();
        let warn = check_kubelet_versions(&many);
        assert!(warn.detail.contains("and 2 more"), "{}", warn.detail);
    }
}
