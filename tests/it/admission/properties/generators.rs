//! The generators: proptest strategies for the model's JobSets, their env, probes, unknown fields
//! and reviews.

use super::*;

/// Keys no Kubernetes type has, several needing JSON Pointer escapes.
pub(super) fn unknown_key() -> impl Strategy<Value = String> {
    select(vec![
        "futureField",
        "x-vendor.example/setting",
        "a/b",
        "~",
        "a~b",
        "~1",
        "~0/~1",
        "/",
        "ünïcödé",
        "$ref",
        "",
        "-",
    ])
    .prop_map(str::to_owned)
}

/// Any JSON value, small; keys drawn from names the decoder reads, and odd ones (serde_json's
/// raw-value token among them when `raw`).
pub(super) fn json_value(depth: u32, raw: bool) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e9f64..1e9).prop_map(Value::from),
        json_key(raw).prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(depth, 48, 5, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((json_key(raw), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Object keys for arbitrary JSON: mostly ones admission reads.
pub(super) fn json_key(raw: bool) -> impl Strategy<Value = String> {
    let mut read = vec![
        "apiVersion",
        "kind",
        "request",
        "uid",
        "operation",
        "group",
        "object",
        "oldObject",
        "metadata",
        "name",
        "annotations",
        "spec",
        "failurePolicy",
        "restartStrategy",
        "maxRestarts",
        "replicatedJobs",
        "template",
        "backoffLimit",
        "podReplacementPolicy",
        "completions",
        "parallelism",
        "initContainers",
        "containers",
        "restartPolicy",
        "restartPolicyRules",
        "action",
        "exitCodes",
        "operator",
        "values",
        "env",
        "value",
        "valueFrom",
        "startupProbe",
        "httpGet",
        "port",
        "path",
        "ports",
        "containerPort",
        "serviceAccountName",
        "serviceAccount",
        "automountServiceAccountToken",
        "shareProcessNamespace",
        "image",
        "volumes",
        "projected",
        "sources",
        "defaultMode",
        "jobset-inplace-agent-token",
        "InPlaceRestart",
        "JobSet",
        "jobset.x-k8s.io",
    ];
    if raw {
        read.push("$serde_json::private::RawValue");
    }
    prop_oneof![
        4 => select(read).prop_map(str::to_owned),
        1 => unknown_key(),
    ]
}

/// 0-2 unknown fields (most often none).
pub(super) fn unknown_fields() -> impl Strategy<Value = Map<String, Value>> {
    prop_oneof![
        2 => Just(Map::new()),
        1 => prop::collection::vec((unknown_key(), json_value(2, false)), 1..3)
            .prop_map(|kv| kv.into_iter().collect()),
    ]
}

/// Annotations beside ours, with `/` and `~` in their keys.
pub(super) fn annotations() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec(
        (
            select(vec![
                "example.com/team",
                "a~b/c",
                "x/y/z",
                "~",
                "alpha.jobset.sigs.k8s.io/exclusive-topology",
            ]),
            "[a-z0-9./~-]{0,10}",
        ),
        0..3,
    )
    .prop_map(|kv| {
        kv.into_iter()
            .map(|(k, v)| (k.to_owned(), json!(v)))
            .collect()
    })
}

/// What an agent container carries beside the fields the rules read.
pub(super) fn agent_args() -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("args".into(), json!(["agent"]));
    m
}

/// What an agent's env says about one setting.
#[derive(Clone, Debug)]
pub(super) enum Setting {
    Absent,
    /// The value the rest of the agent implies (its probe's port or path).
    Matching,
    Literal(&'static str),
    ConfigMap,
}

/// `Matching` only where the rest of the agent agrees with the default (`matching_ok`), and
/// `literals` (which may conflict) only when not `careful`.
pub(super) fn setting(
    literals: Vec<&'static str>,
    careful: bool,
    matching_ok: bool,
) -> impl Strategy<Value = Setting> {
    let bad = u32::from(!careful);
    prop_oneof![
        6 => Just(Setting::Absent),
        2 * u32::from(matching_ok || !careful) => Just(Setting::Matching),
        bad => select(literals).prop_map(Setting::Literal),
        1 => Just(Setting::ConfigMap),
    ]
}

/// The env of an agent: each variable of the contract present or not, good or bad, in any order,
/// between entries the rules never read.
#[derive(Clone, Debug)]
pub(super) struct AgentEnv {
    pub(super) downward: [bool; 3],
    pub(super) exit: Option<(bool, Setting)>,
    pub(super) protocol: Option<&'static str>,
    pub(super) port: Option<(bool, Setting)>,
    pub(super) path: Option<(bool, Setting)>,
    pub(super) others: Vec<EnvVar>,
}

pub(super) fn other_env() -> impl Strategy<Value = EnvVar> {
    (
        select(vec!["LOG_LEVEL", "DATA_DIR", "a.b-c", "NAMESPACE_X"]),
        "[ -~]{0,8}",
    )
        .prop_map(|(n, v)| EnvVar::literal(n, v))
}

/// The env of an agent (`careful`: nothing that conflicts with the rest of the agent).
pub(super) fn agent_env(sidecar: bool, careful: bool) -> BoxedStrategy<AgentEnv> {
    let downward = prop::array::uniform3(prop::bool::weighted(0.85));
    let exit = prop::option::weighted(
        0.4,
        (
            any::<bool>(),
            setting(vec!["42", "3", " 7 ", "1", "0", "256", "x"], careful, false),
        ),
    );
    let protocol = prop::option::weighted(
        if careful { 0.01 } else { 0.3 },
        select(vec!["epoch", "attempt", "Epoch"]),
    );
    let barrier = if sidecar { 0.35 } else { 0.05 };
    let port = prop::option::weighted(
        barrier,
        (
            any::<bool>(),
            setting(vec!["9999", "http", " 9000 ", "0"], careful, true),
        ),
    );
    let path = prop::option::weighted(
        barrier,
        (
            any::<bool>(),
            setting(vec!["/other", "/barrier-is-lifted"], careful, true),
        ),
    );
    (
        downward,
        exit,
        protocol,
        port,
        path,
        prop::collection::vec(other_env(), 0..3),
    )
        .prop_map(|(downward, exit, protocol, port, path, others)| AgentEnv {
            downward,
            exit,
            protocol,
            port,
            path,
            others,
        })
        .boxed()
}

impl AgentEnv {
    /// The entries, given what the agent's probe and rules imply for `Matching`.
    pub(super) fn entries(
        &self,
        probe: Option<&Probe>,
        ports: &[(Option<&'static str>, i64)],
    ) -> Vec<EnvVar> {
        let mut env = self.others.clone();
        for (on, name, path) in [
            (self.downward[0], "NAMESPACE", "metadata.namespace"),
            (self.downward[1], "POD_NAME", "metadata.name"),
            (
                self.downward[2],
                "JOBSET_NAME",
                "metadata.annotations['jobset.sigs.k8s.io/jobset-name']",
            ),
        ] {
            if on {
                env.push(EnvVar::field(name, path));
            }
        }
        let probe_port = probe.and_then(|p| match &p.port {
            Value::Number(n) => n.as_i64(),
            Value::String(name) => ports
                .iter()
                .find(|(n, _)| *n == Some(name.as_str()))
                .map(|(_, p)| *p),
            _ => None,
        });
        let probe_path = probe.map(|p| p.path.clone().unwrap_or_else(|| "/".to_owned()));
        for (choice, names, matching) in [
            (&self.exit, [EXIT, EXIT_ALIAS], Some("42".to_owned())),
            (
                &self.port,
                [PORT, PORT_ALIAS],
                probe_port.map(|p| p.to_string()),
            ),
            (&self.path, [PATH, PATH_ALIAS], probe_path),
        ] {
            let Some((alias, setting)) = choice else {
                continue;
            };
            let name = names[usize::from(*alias)];
            match setting {
                Setting::Absent => {}
                Setting::Matching => {
                    if let Some(v) = matching {
                        env.push(EnvVar::literal(name, v));
                    }
                }
                Setting::Literal(v) => env.push(EnvVar::literal(name, *v)),
                Setting::ConfigMap => env.push(EnvVar {
                    name: name.to_owned(),
                    value: EnvValue::ConfigMap,
                }),
            }
        }
        if let Some(p) = self.protocol {
            env.push(EnvVar::literal(PROTOCOL, p));
        }
        env
    }
}

pub(super) fn probe(
    careful: bool,
) -> BoxedStrategy<Option<(Probe, Vec<(Option<&'static str>, i64)>)>> {
    let bad = u32::from(!careful);
    let port = prop_oneof![
        6 => Just((json!(8080), vec![])),
        2 => Just((json!(9000), vec![])),
        1 => select(vec![8080i64, 9000]).prop_map(|p| (json!("barrier"), vec![(Some("barrier"), p), (None, 9100)])),
        bad => Just((json!("unknown-port"), vec![(Some("barrier"), 8080)])),
    ];
    let path = prop_oneof![
        6 => Just(Some(DEFAULT_PATH.to_owned())),
        1 => Just(Some("/ready".to_owned())),
        1 => Just(None),
    ];
    prop::option::weighted(
        if careful { 0.99 } else { 0.9 },
        (
            port,
            path,
            prop::option::of(Just(1i64)),
            prop::option::of(select(vec![60i64, 86_400])),
        )
            .prop_map(|((port, ports), path, period, threshold)| {
                (
                    Probe {
                        port,
                        path,
                        period,
                        threshold,
                    },
                    ports,
                )
            }),
    )
    .boxed()
}

/// An agent sidecar, mostly well formed, sometimes not (each defect breaks one admission rule).
pub(super) fn sidecar(careful: bool) -> BoxedStrategy<Container> {
    let bad = u32::from(!careful);
    let rules = prop_oneof![
        6 => Just(vec![rule(RAC, "NotIn", &[0])]),
        2 => Just(vec![rule(RESTART_POD, "NotIn", &[0])]),
        2 => select(vec![3i64, 42]).prop_map(|c| vec![rule(RAC, "In", &[c])]),
        1 => Just(vec![rule(RAC, "NotIn", &[0, 42])]),
        1 => Just(vec![rule(RESTART, "In", &[42]), rule(RAC, "NotIn", &[0])]),
        bad => Just(vec![]),
    ];
    (
        select(vec![AGENT_NAME, "agent", "in-place-restart-agent"]),
        prop_oneof![9 => Just(Some("Always")), bad => Just(None)],
        rules,
        probe(careful),
        agent_env(true, careful),
        any::<bool>(),
        unknown_fields(),
    )
        .prop_flat_map(|(name, restart_policy, rules, probe, env, empty, extra)| {
            let (probe, ports) = probe.map_or((None, vec![]), |(p, ports)| (Some(p), ports));
            let entries = env.entries(probe.as_ref(), &ports);
            let mut extra_fields = agent_args();
            extra_fields.extend(extra);
            (
                Just(entries).prop_shuffle(),
                Just((
                    name,
                    restart_policy,
                    rules,
                    probe,
                    ports,
                    empty,
                    extra_fields,
                )),
            )
                .prop_map(
                    |(env, (name, restart_policy, rules, probe, ports, empty, extra))| Container {
                        name: name.to_owned(),
                        restart_policy,
                        rules,
                        env,
                        empty_env_list: empty,
                        probe,
                        ports,
                        extra,
                    },
                )
        })
        .boxed()
}

/// A main-container agent (the worker runs under it: `WORKER_COMMAND`).
pub(super) fn main_agent(careful: bool) -> BoxedStrategy<Container> {
    let bad = u32::from(!careful);
    let rules = prop_oneof![
        6 => Just(vec![rule(RESTART, "NotIn", &[0])]),
        2 => Just(vec![rule(RAC, "NotIn", &[0])]),
        1 => Just(vec![rule(RESTART, "In", &[42])]),
        bad => Just(vec![]),
    ];
    (
        prop_oneof![9 => Just(Some("Never")), bad => Just(None)],
        rules,
        agent_env(false, careful),
        unknown_fields(),
    )
        .prop_flat_map(|(restart_policy, rules, env, extra)| {
            let mut entries = env.entries(None, &[]);
            entries.push(EnvVar::literal(WORKER_COMMAND, "python -m train"));
            (
                Just(entries).prop_shuffle(),
                Just((restart_policy, rules, extra)),
            )
                .prop_map(|(env, (restart_policy, rules, extra))| Container {
                    name: "trainer".to_owned(),
                    restart_policy,
                    rules,
                    env,
                    empty_env_list: false,
                    probe: None,
                    ports: vec![],
                    extra,
                })
        })
        .boxed()
}

/// A worker container (no agent): with or without an in-place restart rule.
pub(super) fn worker(careful: bool) -> BoxedStrategy<Container> {
    let rules = prop_oneof![
        3 => Just(vec![]),
        4 => Just(vec![rule(RAC, "NotIn", &[0])]),
        1 => Just(vec![rule(RESTART_POD, "NotIn", &[0])]),
        1 => Just(vec![rule(RESTART, "In", &[3]), rule(RAC, "NotIn", &[0])]),
    ];
    (
        rules,
        prop::bool::weighted(if careful { 0.999 } else { 0.9 }),
        prop::collection::vec(other_env(), 0..3),
        any::<bool>(),
        unknown_fields(),
        // Ports an injected agent's barrier must avoid (8080 is the default one, 9000 and 9001
        // the non-default config's), and one it cannot collide with.
        prop_oneof![
            6 => Just(vec![(None, 6000)]),
            1 => Just(vec![(None, 8080)]),
            1 => Just(vec![(Some("http"), 6000), (None, 9000)]),
            1 => Just(vec![(None, 9001), (Some("alt"), 18080)]),
        ],
    )
        .prop_map(|(rules, policy, env, empty, mut extra, ports)| {
            extra.insert("command".into(), json!(["python", "-m", "train"]));
            Container {
                name: String::new(),
                restart_policy: policy.then_some("Never"),
                rules,
                env,
                empty_env_list: empty,
                probe: None,
                ports,
                extra,
            }
        })
        .boxed()
}

/// An init container that is not an agent (a setup step, or a sidecar such as a log shipper).
pub(super) fn plain_init() -> BoxedStrategy<Container> {
    (
        select(vec!["setup", "log-shipper"]),
        prop::option::of(Just("Always")),
        unknown_fields(),
        prop_oneof![6 => Just(vec![]), 1 => Just(vec![(Some("metrics"), 8080)])],
    )
        .prop_map(|(name, restart_policy, mut extra, ports)| {
            extra.insert("command".into(), json!(["true"]));
            Container {
                name: name.to_owned(),
                restart_policy,
                rules: vec![],
                env: vec![],
                empty_env_list: false,
                probe: None,
                ports,
                extra,
            }
        })
        .boxed()
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Agents {
    None,
    Sidecar,
    Main,
    TwoSidecars,
    SidecarAndMain,
}

/// A pod's own `imagePullSecrets`, entries with fields the code does not model among them (the
/// non-default config adds `agent-registry`).
pub(super) fn pull_secrets() -> impl Strategy<Value = Option<Vec<Value>>> {
    prop_oneof![
        6 => Just(None),
        1 => Just(Some(vec![])),
        1 => Just(Some(vec![json!({"name": "team-registry"})])),
        1 => Just(Some(vec![
            json!({"name": "team-registry", "futureField": {"a/b": [1, "~"]}}),
            json!({"name": "agent-registry", "x-vendor.example/setting": true}),
        ])),
    ]
}

pub(super) fn pod(careful: bool) -> BoxedStrategy<Pod> {
    let bad = u32::from(!careful);
    let layout = prop_oneof![
        4 => Just(Agents::None),
        5 => Just(Agents::Sidecar),
        2 => Just(Agents::Main),
        bad => Just(Agents::TwoSidecars),
        bad => Just(Agents::SidecarAndMain),
    ];
    let metadata = prop::option::weighted(
        0.5,
        (
            prop::option::of((
                annotations(),
                prop::option::of(select(vec![env!("CARGO_PKG_VERSION"), "0.0.1"])),
            )),
            unknown_fields(),
        ),
    );
    (
        layout,
        prop::collection::vec(plain_init(), 0..3),
        any::<bool>(),
        prop::collection::vec(worker(careful), 1..4),
        (sidecar(careful), sidecar(careful), main_agent(careful)),
        (any::<Index>(), any::<Index>(), any::<Index>()),
        (prop::option::weighted(0.3, Just("trainer")), pull_secrets()),
        metadata,
        unknown_fields(),
    )
        .prop_map(
            |(
                layout,
                mut init,
                init_key,
                mut containers,
                agents,
                at,
                (sa, pull_secrets),
                metadata,
                extra,
            )| {
                for (i, c) in containers.iter_mut().enumerate() {
                    c.name = format!("w{i}");
                }
                let (side, side2, main) = agents;
                let mut put_init = |c: Container, at: Index| {
                    let i = at.index(init.len() + 1);
                    init.insert(i, c);
                };
                match layout {
                    Agents::None => {}
                    Agents::Sidecar => put_init(side, at.0),
                    Agents::TwoSidecars => {
                        put_init(side, at.0);
                        put_init(side2, at.1);
                    }
                    Agents::Main | Agents::SidecarAndMain => {
                        if let Agents::SidecarAndMain = layout {
                            put_init(side, at.0);
                        }
                        let i = at.2.index(containers.len() + 1);
                        containers.insert(i, main);
                    }
                }
                let metadata = metadata.map(|(annotations, extra)| {
                    let annotations = annotations.map(|(mut a, injected)| {
                        if let Some(v) = injected {
                            a.insert(INJECTED.into(), json!(v));
                        }
                        a
                    });
                    (annotations, extra)
                });
                Pod {
                    init: (init_key || !init.is_empty()).then_some(init),
                    containers,
                    service_account: sa,
                    pull_secrets,
                    metadata,
                    extra,
                }
            },
        )
        .boxed()
}

pub(super) fn job(careful: bool) -> BoxedStrategy<Job> {
    let bad = u32::from(!careful);
    let backoff = prop_oneof![
        3 => Just(None),
        6 => Just(Some(MAX_BACKOFF)),
        bad => select(vec![0i64, 6, MAX_BACKOFF - 1]).prop_map(Some),
    ];
    let policy = prop_oneof![
        3 => Just(None),
        6 => Just(Some("Failed")),
        bad => Just(Some("TerminatingOrFailed")),
    ];
    let sizes = (1i64..=16).prop_flat_map(move |n| {
        prop_oneof![
            8 => Just((Some(n), Some(n))),
            // Left to Kubernetes' defaults, which the mutation writes.
            1 => Just((None, None)),
            1 => Just((Some(1), None)),
            bad => Just((Some(n), Some(n + 1))),
            bad => Just((None, Some(n))),
            bad => Just((Some(n), None)),
        ]
    });
    (
        1i64..=4,
        backoff,
        policy,
        sizes,
        prop::bool::weighted(0.3),
        pod(careful),
        unknown_fields(),
        unknown_fields(),
    )
        .prop_map(
            |(
                replicas,
                backoff,
                policy,
                (completions, parallelism),
                pfp,
                pod,
                spec_extra,
                extra,
            )| {
                Job {
                    replicas,
                    backoff,
                    pod_replacement_policy: policy,
                    completions,
                    parallelism,
                    pod_failure_policy: pfp,
                    pod,
                    spec_extra,
                    extra,
                }
            },
        )
        .boxed()
}

/// A JobSet; half of them drawn `careful` (no explicit value conflicts with the admission rules), so
/// that both accepted and denied JobSets are common.
pub(super) fn model() -> BoxedStrategy<Model> {
    any::<bool>().prop_flat_map(model_of).boxed()
}

pub(super) fn model_of(careful: bool) -> BoxedStrategy<Model> {
    let strategy = prop_oneof![
        8 => Just(Some("InPlaceRestart")),
        1 => Just(Some("Recreate")),
        1 => Just(None),
    ];
    let inject = prop_oneof![
        6 => Just(None),
        1 => Just(Some("false")),
        1 => Just(Some("true")),
        1 => Just(Some("False")),
    ];
    (
        strategy,
        prop::option::of(0i64..=10),
        inject,
        annotations(),
        prop::collection::vec(job(careful), 1..=4),
        (unknown_fields(), unknown_fields(), unknown_fields()),
    )
        .prop_map(
            |(strategy, max_restarts, inject, annotations, jobs, (meta, spec, top))| Model {
                strategy,
                max_restarts,
                inject,
                annotations,
                jobs,
                meta_extra: meta,
                spec_extra: spec,
                extra: top,
            },
        )
        .boxed()
}

/// An AdmissionReview request around an object.
pub(super) fn review(
    uid: &str,
    operation: &str,
    (group, kind): (&str, &str),
    object: Option<&Value>,
    old: Option<&Value>,
    dry_run: Option<bool>,
) -> Value {
    let mut request = Map::new();
    request.insert("uid".into(), json!(uid));
    request.insert(
        "kind".into(),
        json!({"group": group, "version": "v1alpha2", "kind": kind}),
    );
    request.insert(
        "resource".into(),
        json!({"group": group, "version": "v1alpha2", "resource": "jobsets"}),
    );
    request.insert("name".into(), json!("prop"));
    request.insert("namespace".into(), json!("team-a"));
    request.insert("operation".into(), json!(operation));
    request.insert(
        "userInfo".into(),
        json!({"username": "alice@example.com", "groups": ["system:authenticated"]}),
    );
    request.insert("object".into(), object.cloned().unwrap_or(Value::Null));
    request.insert("oldObject".into(), old.cloned().unwrap_or(Value::Null));
    if let Some(d) = dry_run {
        request.insert("dryRun".into(), json!(d));
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

pub(super) fn uid() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        1 => "\\PC{1,16}",
    ]
}
