//! Who holds the agent's token, and who is named as the agent (docs/security.md): the rules the
//! injection refuses a pod template by and validation denies it by, one function for both, so
//! that the webhook's two endpoints and `check` give the same answer.
//!
//! - a volume named as the agent's token volume is that volume ([`token_violations`]);
//! - no container but the agent mounts it;
//! - a pod that runs as the agent's service account has `automountServiceAccountToken: false`
//!   (the injection sets it when unset) and projects no other service account token;
//! - a pod that runs as the agent's service account does not share its process namespace (a
//!   worker would reach the agent's token through `/proc/<pid>/root`);
//! - no container but the agent carries the agent's name ([`name_violations`]): the injection
//!   would add a second container of that name, and the API server would refuse every pod;
//! - a container shaped as the agent runs the configured agent image ([`image_violations`]): a
//!   look-alike would be taken for the agent, given its token, and no agent injected.
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
    /// The configured agent image: in a pod that runs as the agent's account, a container of
    /// the agent's shape must run its repository ([`pod::runs_image`]).
    pub image: &'a str,
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

/// The container that may hold the agent's token: the pod's agent (none before the injection
/// adds it) and, in a pod that runs as the agent's account, only if it runs the configured
/// image ([`pod::real_agent`]).
fn token_holder<'a>(pod_spec: &'a PodSpec<'a>, account: Account<'_>) -> Option<Container<'a>> {
    let agent = if account.runs_as_agent {
        pod::real_agent(pod_spec, account.image)
    } else {
        pod::agent(pod_spec)
    };
    agent.map(|a| a.container)
}

/// In a pod that runs as the agent's service account, `c` (of the agent's shape) does not run
/// the configured agent image: a look-alike ([`token_violations`] denies it), not the agent.
pub(crate) fn is_look_alike(
    pod_spec: &PodSpec<'_>,
    c: &Container<'_>,
    account: Account<'_>,
) -> bool {
    account.runs_as_agent
        && pod::agents(pod_spec).any(|a| {
            a.mode == pod::AgentMode::Sidecar
                && a.container.list == c.list
                && a.container.index == c.index
                && !pod::runs_image(&a.container, account.image)
        })
}

/// Where the agent's token could reach another container than the agent, each naming its
/// field: a foreign volume of the token's name, a mount of it by another container; and in a
/// pod that runs as the agent's account, its automounting, another token projected, a shared
/// process namespace, a look-alike of the agent ([`image_violations`]).
pub(crate) fn token_violations(
    pod_prefix: &str,
    pod_spec: &PodSpec<'_>,
    account: Account<'_>,
) -> Vec<Violation> {
    let holder = token_holder(pod_spec, account);
    let agent = holder.as_ref();
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
    if let Some(shared) = pod_spec
        .share_process_namespace
        .as_ref()
        .filter(|v| **v != Value::Bool(false) && !v.is_null())
    {
        out.push(Violation {
            rule: Rule::ShareProcessNamespace,
            path: format!("{pod_prefix}.shareProcessNamespace"),
            message: clip(format!(
                "is {shared} while the pod runs as the agent's service account ({name}): in one \
                 process namespace a worker that runs as the agent's user, or as root, reaches \
                 the agent's files through /proc/<pid>/root, its token among them, which may \
                 patch pods; remove it, or name a service account of your own"
            )),
        });
    }
    out.extend(image_violations(pod_prefix, pod_spec, account.image));
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

/// Containers shaped as the agent sidecar ([`pod::is_sidecar_agent`]) that do not run the
/// configured agent image's repository (`image`, with any tag or digest: [`pod::runs_image`]),
/// each naming its `image` field: in a pod that runs as the agent's account (the only pods
/// [`token_violations`] asks about), they would be taken for the agent, and given its token.
fn image_violations(pod_prefix: &str, pod_spec: &PodSpec<'_>, image: &str) -> Vec<Violation> {
    pod::agents(pod_spec)
        .filter(|a| a.mode == pod::AgentMode::Sidecar && !pod::runs_image(&a.container, image))
        .map(|a| {
            let c = a.container;
            let runs = c
                .view
                .image
                .as_deref()
                .map_or_else(|| "not set".to_owned(), |i| format!("{i:?}"));
            Violation {
                rule: Rule::AgentImage,
                path: format!("{}.image", container_path(pod_prefix, &c)),
                message: clip(format!(
                    "is {runs}, not the jobset-inplace agent's image {} (the configured image \
                     {image:?}, any tag or digest), yet the container is shaped as the agent \
                     (an init container named {} or with a {} restart rule) in a pod that runs \
                     as the agent's service account: it would be taken for the agent and given \
                     its token. Run the agent's image here, rename it and drop its {} rule (the \
                     agent is then injected beside it), or name a service account of your own",
                    pod::image_repository(image),
                    agent_env::CONTAINER_NAME,
                    pod::RESTART_ALL_CONTAINERS,
                    pod::RESTART_ALL_CONTAINERS,
                )),
            }
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
mod tests;
