//! Who holds the agent's token, and who is named as the agent (docs/security.md): the rules the
//! injection refuses a pod template by and validation denies it by, one function for both, so
//! that the webhook's two endpoints and `check` give the same answer.
//!
//! - a volume named as the agent's token volume is that volume ([`token_violations`]);
//! - no container but the agent mounts it;
//! - a pod that runs as the agent's service account has `automountServiceAccountToken: false`
//!   (the injection sets it when unset) and projects no other service account token;
//! - no container but the agent carries the agent's name ([`name_violations`]): the injection
//!   would add a second container of that name, and the API server would refuse every pod.
//!
//! And one warning: under the `epoch` dialect, a container named as JobSet's own agent
//! ([`foreign_agent_warnings`]).

use serde_json::Value;

use super::Violation;
use super::pod::{self, Container};
use super::rule::Rule;
use super::sidecar::{TOKEN_VOLUME, foreign_token_volume_message};
use super::view::PodSpec;
use super::warnings::clip;
use crate::protocol::Dialect;
use crate::wire::agent_env;

/// How the rules see the pod template's service account.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Account<'a> {
    /// The pod runs (or, once injected, will run) as the agent's service account.
    pub runs_as_agent: bool,
    /// `automountServiceAccountToken` unset is fixed by the caller (the injection sets `false`).
    pub unset_is_fixed: bool,
    /// The agent's service account's name.
    pub name: &'a str,
}

/// The pod spec names `account` (`serviceAccountName`, or the deprecated `serviceAccount`).
pub(crate) fn names_account(pod_spec: &PodSpec<'_>, account: &str) -> bool {
    [&pod_spec.service_account_name, &pod_spec.service_account]
        .into_iter()
        .any(|s| s.as_deref() == Some(account))
}

/// `spec...template.spec.containers[1]`
fn container_path(pod_prefix: &str, c: &Container<'_>) -> String {
    format!("{pod_prefix}.{}[{}]", c.list.key(), c.index)
}

fn is_agent(c: &Container<'_>, agent: Option<&Container<'_>>) -> bool {
    agent.is_some_and(|a| a.list == c.list && a.index == c.index)
}

/// Where the agent's token could reach another container than the agent (`agent`: the pod's
/// agent, none before the injection adds it), each naming its field.
pub(crate) fn token_violations(
    pod_prefix: &str,
    pod_spec: &PodSpec<'_>,
    agent: Option<&Container<'_>>,
    account: Account<'_>,
) -> Vec<Violation> {
    let mut out: Vec<Violation> = pod_spec
        .volumes
        .as_ref()
        .into_iter()
        .flat_map(|v| v.foreign_token_volumes())
        .map(|j| Violation {
            rule: Rule::TokenVolume,
            path: format!("{pod_prefix}.volumes[{j}]"),
            message: foreign_token_volume_message(),
        })
        .collect();
    for c in pod::all_containers(pod_spec).filter(|c| !is_agent(c, agent)) {
        let mounts = c.view.volume_mounts.as_ref().map_or(&[][..], |m| &m.0[..]);
        for (j, _) in mounts
            .iter()
            .enumerate()
            .filter(|(_, m)| m.name.as_deref() == Some(TOKEN_VOLUME))
        {
            out.push(Violation {
                rule: Rule::TokenVolume,
                path: format!("{}.volumeMounts[{j}]", container_path(pod_prefix, &c)),
                message: format!(
                    "mounts {TOKEN_VOLUME}, the agent's service account token, which may patch \
                     pods: only the agent mounts it"
                ),
            });
        }
    }
    if !account.runs_as_agent {
        return out;
    }
    let name = account.name;
    let automount = pod_spec.automount_token.as_ref();
    if automount != Some(&Value::Bool(false)) && !(automount.is_none() && account.unset_is_fixed) {
        let is = automount.map_or_else(|| "unset".to_owned(), |v| format!("is {v}"));
        out.push(Violation {
            rule: Rule::AgentToken,
            path: format!("{pod_prefix}.automountServiceAccountToken"),
            message: clip(format!(
                "{is} while the pod runs as the agent's service account ({name}): every \
                 container would hold the agent's token, which may patch pods; set it to false \
                 (the agent's token is then mounted into the agent only), or name a service \
                 account of your own"
            )),
        });
    }
    for j in pod_spec
        .volumes
        .iter()
        .flat_map(|v| v.other_token_projections())
    {
        out.push(Violation {
            rule: Rule::TokenVolume,
            path: format!("{pod_prefix}.volumes[{j}]"),
            message: clip(format!(
                "projects a service account token in a pod that runs as the agent's service \
                 account ({name}): it would be the agent's token, which may patch pods; the \
                 agent's token comes only from {TOKEN_VOLUME}. Project tokens in pods that run \
                 as a service account of your own"
            )),
        });
    }
    out
}

/// Containers other than the pod's agents that carry the agent's name, each naming its field.
pub(crate) fn name_violations(pod_prefix: &str, pod_spec: &PodSpec<'_>) -> Vec<Violation> {
    pod::all_containers(pod_spec)
        .filter(|c| c.name() == agent_env::CONTAINER_NAME)
        .filter(|c| !pod::is_sidecar_agent(c) && !pod::is_main_container_agent(c))
        .map(|c| Violation {
            rule: Rule::AgentName,
            path: format!("{}.name", container_path(pod_prefix, &c)),
            message: format!(
                "is {}, the name of the jobset-inplace agent sidecar: the injected agent and this \
                 container would share it, and every pod would be refused; rename it",
                agent_env::CONTAINER_NAME
            ),
        })
        .collect()
}

/// JobSet's own in-place restart agent's container name (JobSet v0.11's released agent).
pub(crate) const JOBSET_AGENT_CONTAINER: &str = "in-place-restart-agent";

/// Under the `epoch` dialect, a warning per container named as JobSet's own agent. If it runs
/// JobSet's agent image, that agent reads JobSet's `attempt` fields only, which no one moves
/// under `epoch`: its barrier never lifts after a group restart. The name does not say which
/// image runs (the shape is the agent's either way, and the jobset-inplace agent may run under
/// it), so the webhook admits it with this warning; `check --strict` fails on it.
pub(crate) fn foreign_agent_warnings(
    pod_prefix: &str,
    pod_spec: &PodSpec<'_>,
    dialect: Dialect,
) -> Vec<String> {
    if dialect != Dialect::Epoch {
        return Vec::new();
    }
    pod::all_containers(pod_spec)
        .filter(|c| c.name() == JOBSET_AGENT_CONTAINER)
        .map(|c| {
            format!(
                "{}.name: {JOBSET_AGENT_CONTAINER} is JobSet's own agent's name: if it runs \
                 JobSet's agent image, that agent speaks the attempt dialect only and, as this \
                 cluster runs epoch, its group restarts never complete; run the jobset-inplace \
                 agent image, remove it (the webhook injects the agent), or install the \
                 jobset-native variant",
                container_path(pod_prefix, &c)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::admission::config::InjectionConfig;
    use crate::admission::sidecar::{token_mount, token_volume};
    use crate::admission::{Mutation, mutate, validate};
    use crate::protocol::Dialect;
    use crate::wire::agent_env;

    const C: &str = "spec.replicatedJobs[0].template.spec.template.spec";

    fn config() -> InjectionConfig {
        InjectionConfig::defaults(Dialect::Epoch)
    }

    fn jobset(pod_spec: Value) -> Value {
        json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js"},
            "spec": {
                "failurePolicy": {"maxRestarts": 3, "restartStrategy": "InPlaceRestart"},
                "replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {
                    "completions": 2, "parallelism": 2,
                    "template": {"spec": pod_spec}
                }}}]
            }
        })
    }

    fn worker(extra: Value) -> Value {
        let mut w = json!({"name": "w", "image": "train"});
        if let (Some(w), Some(extra)) = (w.as_object_mut(), extra.as_object()) {
            w.extend(extra.clone());
        }
        w
    }

    /// The fields the injection refuses, or none when it patches.
    fn refused(m: &Mutation) -> Vec<String> {
        m.violations.iter().map(|v| v.path.clone()).collect()
    }

    /// What the webhook does: mutate, then validate what it made. The paths refused (by either).
    fn admit(js: &Value) -> (Vec<String>, Value) {
        let m = mutate(js, &config());
        if !m.violations.is_empty() {
            return (refused(&m), js.clone());
        }
        let mut out = js.clone();
        json_patch::patch(&mut out, &m.patch).expect("the patch applies");
        let v = validate(&out, &config());
        (v.violations.iter().map(|v| v.path.clone()).collect(), out)
    }

    fn pod(js: &Value) -> &Value {
        &js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    }

    /// Issue 34 item 1: a template that names the agent's account (either field) with
    /// `automountServiceAccountToken` unset handed the token to every container (the injection
    /// left a named account alone). Now the webhook sets it to `false` and mounts the token into
    /// the agent only; validation denies such a pod that did not get it; `true` is refused.
    #[test]
    fn a_template_naming_the_agent_account_gets_the_token_in_the_agent_only() {
        let sa = config().service_account;
        for field in ["serviceAccountName", "serviceAccount"] {
            let js = jobset(json!({field: sa, "containers": [worker(json!({}))]}));
            let (refused, out) = admit(&js);
            assert!(refused.is_empty(), "{field}: {refused:?}");
            let p = pod(&out);
            assert_eq!(p["automountServiceAccountToken"], false, "{field}");
            assert_eq!(p["volumes"], json!([token_volume()]), "{field}");
            assert_eq!(
                p["initContainers"][0]["volumeMounts"],
                json!([token_mount()])
            );
            assert!(p["containers"][0].get("volumeMounts").is_none(), "{field}");

            // Not injected (opted out, or the webhook not there): denied, naming the field.
            let v = validate(&js, &config());
            assert!(
                v.violations
                    .iter()
                    .any(|v| v.path == format!("{C}.automountServiceAccountToken")),
                "{field}: {v:?}"
            );
            let js = jobset(json!({field: sa, "automountServiceAccountToken": true,
                                   "containers": [worker(json!({}))]}));
            assert_eq!(
                admit(&js).0,
                vec![format!("{C}.automountServiceAccountToken")],
                "{field}"
            );
        }
    }

    /// Issue 34 item 2: a worker that mounts the agent's token volume (the one the webhook is
    /// about to add, or, in a copied injected template, the one it added) is denied, naming the
    /// mount, whatever account the pod runs as.
    #[test]
    fn only_the_agent_mounts_the_agent_s_token() {
        let sa = config().service_account;
        let mount = json!({"volumeMounts": [{"name": "data", "mountPath": "/d"}, token_mount()]});
        let mounted = format!("{C}.containers[0].volumeMounts[1]");
        // To be injected.
        let js = jobset(json!({"containers": [worker(mount.clone())]}));
        assert_eq!(admit(&js).0, vec![mounted.clone()]);
        // Injected, then copied with one more mount.
        let (refused, injected) = admit(&jobset(json!({"containers": [worker(json!({}))]})));
        assert!(refused.is_empty(), "{refused:?}");
        let mut copied = injected.clone();
        copied["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
            [0]["volumeMounts"] = mount["volumeMounts"].clone();
        assert_eq!(admit(&copied).0, vec![mounted.clone()]);
        let v = validate(&copied, &config());
        assert_eq!(
            v.violations.iter().map(|v| &v.path).collect::<Vec<_>>(),
            vec![&mounted]
        );
        // An account of its own: the volume is still the agent's name; its mount is denied.
        let js = jobset(json!({"serviceAccountName": "mine", "containers": [worker(mount)]}));
        assert_eq!(admit(&js).0, vec![mounted]);
        // The agent's own mount is its token.
        let (refused, _) = admit(&jobset(json!({"serviceAccountName": sa,
            "automountServiceAccountToken": false, "containers": [worker(json!({}))]})));
        assert!(refused.is_empty(), "{refused:?}");
    }

    /// Issue 34 item 2: a projected service account token of the template's own, in a pod that
    /// runs as the agent's account (chosen by the webhook, or named), would be the agent's token;
    /// denied naming the volume. In a pod that runs as an account of its own it is its own token.
    #[test]
    fn no_other_token_is_projected_in_a_pod_running_as_the_agent() {
        let sa = config().service_account;
        let own = json!({"name": "my-token", "projected": {"sources": [
            {"configMap": {"name": "c"}},
            {"serviceAccountToken": {"path": "token", "audience": "vault"}}]}});
        let config_only =
            json!({"name": "cfg", "projected": {"sources": [{"configMap": {"name": "c"}}]}});
        let w = worker(json!({"volumeMounts": [{"name": "my-token", "mountPath": "/t"}]}));
        for account in [
            json!({}),
            json!({"serviceAccountName": sa}),
            json!({"serviceAccount": sa}),
        ] {
            let mut spec = json!({"volumes": [config_only, own], "containers": [w]});
            if let (Some(s), Some(a)) = (spec.as_object_mut(), account.as_object()) {
                s.extend(a.clone());
            }
            assert_eq!(
                admit(&jobset(spec)).0,
                vec![format!("{C}.volumes[1]")],
                "{account}"
            );
        }
        let js = jobset(
            json!({"serviceAccountName": "mine", "volumes": [config_only, own],
                               "containers": [w]}),
        );
        assert!(admit(&js).0.is_empty());
        // The same read from the request's bytes: the webhook's own path.
        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"group": "jobset.x-k8s.io", "version": "v1alpha2",
            "kind": "JobSet"}, "operation": "CREATE",
            "object": jobset(json!({"volumes": [config_only, own], "containers": [w]}))}});
        let body = serde_json::to_vec(&review).expect("json");
        let reply = crate::admission::review(crate::admission::Endpoint::Mutate, &body, &config());
        let answer: Value = serde_json::from_slice(&reply.body).expect("json");
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        assert_eq!(
            answer["response"]["status"]["details"]["causes"][0]["field"],
            format!("{C}.volumes[1]")
        );
    }

    /// Issue 34 item 5: a container named like the agent (a regular one: an init container of
    /// that name is the agent) beside the agent is denied naming its name; the webhook would have
    /// added an init container of the same name, and the API server refused every pod.
    #[test]
    fn a_container_named_like_the_agent_is_denied() {
        let named = json!({"name": agent_env::CONTAINER_NAME, "image": "sidecar"});
        let js = jobset(json!({"containers": [worker(json!({})), named]}));
        assert_eq!(admit(&js).0, vec![format!("{C}.containers[1].name")]);
        // Injected before, then a container of that name added.
        let (refused, mut injected) = admit(&jobset(json!({"containers": [worker(json!({}))]})));
        assert!(refused.is_empty(), "{refused:?}");
        if let Some(c) = injected
            .pointer_mut("/spec/replicatedJobs/0/template/spec/template/spec/containers")
            .and_then(Value::as_array_mut)
        {
            c.push(named);
        }
        let v = validate(&injected, &config());
        assert_eq!(
            v.violations
                .iter()
                .map(|v| v.path.as_str())
                .collect::<Vec<_>>(),
            vec![format!("{C}.containers[1].name")]
        );
        // The agent itself keeps its name.
        assert!(
            admit(&jobset(json!({"containers": [worker(json!({}))]})))
                .0
                .is_empty()
        );
    }
}
