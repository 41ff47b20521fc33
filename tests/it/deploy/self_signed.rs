//! The self-signed webhook's rights narrowed to the caBundle; the NetworkPolicy
//! component.

use super::*;

#[test]
fn the_self_signed_webhook_may_change_only_the_ca_bundle() {
    for name in SELF_SIGNED {
        let Some(r) = overlay(name) else {
            return;
        };
        check_ca_bundle_policy(&r);
    }
}

/// Issue 21, item 9: RBAC cannot name the object of a create, so the self-signed webhook's Role
/// lets it create any Secret of its namespace; the Secret policy holds its Secret writes to the
/// one it is configured with (as its Role names it for get and update), of type
/// kubernetes.io/tls. A service-account-token Secret (a token of any account of the namespace,
/// filled in by the token controller), another name or an Opaque Secret are refused.
#[test]
fn the_self_signed_webhook_may_create_only_its_tls_secret() {
    for name in SELF_SIGNED {
        let Some(r) = overlay(name) else { return };
        let Sub::Webhook(args) =
            parse_args(r.container("jobset-inplace-webhook", "webhook")).command
        else {
            panic!("webhook")
        };
        let policy = r.get("ValidatingAdmissionPolicy", "jobset-inplace-webhook-secret");
        assert_eq!(check_object(policy), Vec::<String>::new(), "{name}");
        assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        let binding = r.get(
            "ValidatingAdmissionPolicyBinding",
            "jobset-inplace-webhook-secret",
        );
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        for op in ["CREATE", "UPDATE"] {
            assert!(policy_matches(policy, "", "secrets", op), "{name}: {op}");
        }
        // The name is the one the Role grants get and update on, and the flag's.
        let role = r.get("Role", "jobset-inplace-webhook");
        let named: Vec<String> = role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|rule| strings(&rule["resourceNames"]))
            .collect();
        assert_eq!(named, std::slice::from_ref(&args.secret), "{name}");
        let secret = |name: &str, type_: Option<&str>| {
            let mut s = json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "data": {"tls.crt": "", "tls.key": "", "ca.crt": "", "ca.key": ""}});
            if let Some(t) = type_ {
                s["type"] = json!(t);
            }
            s
        };
        let verdict = |user: &str, object: &Value| {
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            evaluate_matched(
                policy,
                &object_request(user, "CREATE", NAMESPACE, &name),
                object,
                &Value::Null,
            )
        };
        assert_eq!(
            verdict(
                WEBHOOK_USER,
                &secret(&args.secret, Some("kubernetes.io/tls"))
            ),
            PolicyResult::Allowed,
            "{name}"
        );
        let mut token = secret(
            "jobset-inplace-reconciler-token",
            Some("kubernetes.io/service-account-token"),
        );
        token["metadata"]["annotations"] =
            json!({"kubernetes.io/service-account.name": "jobset-inplace-reconciler"});
        token.as_object_mut().map(|o| o.remove("data"));
        let mut token_named_as_ours = token.clone();
        token_named_as_ours["metadata"]["name"] = json!(args.secret);
        for (what, object) in [
            ("a service-account token", token.clone()),
            (
                "a service-account token under its Secret's name",
                token_named_as_ours,
            ),
            (
                "an Opaque Secret of its name",
                secret(&args.secret, Some("Opaque")),
            ),
            (
                "a Secret of its name with no type",
                secret(&args.secret, None),
            ),
            (
                "a TLS Secret of another name",
                secret("other-tls", Some("kubernetes.io/tls")),
            ),
        ] {
            assert!(
                matches!(verdict(WEBHOOK_USER, &object), PolicyResult::Denied(_)),
                "{name}: {what}"
            );
        }
        // Only the webhook's account is held (an admin's `certs --secret` is not).
        for user in [
            "alice",
            "system:serviceaccount:team-a:jobset-inplace-webhook",
        ] {
            assert_eq!(
                verdict(user, &token),
                PolicyResult::NotMatched,
                "{name}: {user}"
            );
        }
    }
}

fn check_ca_bundle_policy(r: &Rendered) {
    let policy = r.get(
        "ValidatingAdmissionPolicy",
        "jobset-inplace-webhook-ca-bundle",
    );
    assert_eq!(check_object(policy), Vec::<String>::new());
    let binding = r.get(
        "ValidatingAdmissionPolicyBinding",
        "jobset-inplace-webhook-ca-bundle",
    );
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    let rules = &policy["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(
        strings(&rules["resources"]),
        [
            "mutatingwebhookconfigurations",
            "validatingwebhookconfigurations"
        ]
    );
    let webhook = "system:serviceaccount:jobset-inplace-system:jobset-inplace-webhook";
    let request = |user: &str, operation: &str| json!({"operation": operation, "userInfo": {"username": user}});
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let config = r.get(kind, "jobset-inplace");
        let with_ca = |ca: &str| {
            let mut c = config.clone();
            for w in c["webhooks"].as_array_mut().expect("webhooks") {
                w["clientConfig"]["caBundle"] = json!(ca);
            }
            c
        };
        let old = with_ca("b2xk");
        let verdict = |user: &str, operation: &str, new: &Value| {
            evaluate_matched(policy, &request(user, operation), new, &old)
        };
        // Allowed: setting the caBundle, first time or renewed; nothing at all.
        let mut first = old.clone();
        for w in first["webhooks"].as_array_mut().expect("webhooks") {
            w["clientConfig"]
                .as_object_mut()
                .map(|c| c.remove("caBundle"));
        }
        assert_eq!(
            evaluate_matched(policy, &request(webhook, "UPDATE"), &old, &first),
            PolicyResult::Allowed,
            "{kind}: first caBundle"
        );
        assert_eq!(
            verdict(webhook, "UPDATE", &with_ca("bmV3")),
            PolicyResult::Allowed,
            "{kind}"
        );
        assert_eq!(
            verdict(webhook, "UPDATE", &old),
            PolicyResult::Allowed,
            "{kind}"
        );
        // Denied: anything else a stolen token could try.
        type Edit = Box<dyn Fn(&mut Value)>;
        let edits: Vec<(&str, Edit)> = vec![
            (
                "a URL instead of the service",
                Box::new(|c| {
                    c["webhooks"][0]["clientConfig"]["url"] = json!("https://evil.example/");
                }),
            ),
            (
                "another service",
                Box::new(|c| {
                    c["webhooks"][0]["clientConfig"]["service"]["name"] = json!("evil");
                }),
            ),
            (
                "another path",
                Box::new(|c| {
                    c["webhooks"][0]["clientConfig"]["service"]["path"] = json!("/allow-all");
                }),
            ),
            (
                "failurePolicy changed",
                Box::new(|c| {
                    let flipped = if c["webhooks"][0]["failurePolicy"] == "Ignore" {
                        "Fail"
                    } else {
                        "Ignore"
                    };
                    c["webhooks"][0]["failurePolicy"] = json!(flipped);
                }),
            ),
            (
                "no rules",
                Box::new(|c| c["webhooks"][0]["rules"] = json!([])),
            ),
            (
                "a namespaceSelector",
                Box::new(|c| {
                    c["webhooks"][0]["namespaceSelector"] = json!({"matchLabels": {"none": "x"}});
                }),
            ),
            (
                "an objectSelector",
                Box::new(|c| {
                    c["webhooks"][0]["objectSelector"] = json!({"matchLabels": {"none": "x"}});
                }),
            ),
            (
                "a match condition",
                Box::new(|c| {
                    c["webhooks"][0]["matchConditions"] =
                        json!([{"name": "never", "expression": "false"}]);
                }),
            ),
            (
                "a shorter timeout",
                Box::new(|c| c["webhooks"][0]["timeoutSeconds"] = json!(1)),
            ),
            (
                "a webhook removed",
                Box::new(|c| {
                    if let Some(w) = c["webhooks"].as_array_mut() {
                        w.truncate(0);
                    }
                }),
            ),
            (
                "a webhook renamed",
                Box::new(|c| c["webhooks"][0]["name"] = json!("x.example")),
            ),
            (
                "a label",
                Box::new(|c| c["metadata"]["labels"]["x"] = json!("y")),
            ),
            (
                "an annotation",
                Box::new(|c| c["metadata"]["annotations"] = json!({"x": "y"})),
            ),
        ];
        for (what, edit) in &edits {
            let mut new = with_ca("bmV3");
            edit(&mut new);
            assert!(
                matches!(verdict(webhook, "UPDATE", &new), PolicyResult::Denied(_)),
                "{kind}: {what} must be denied"
            );
        }
        assert!(
            matches!(verdict(webhook, "DELETE", &old), PolicyResult::Denied(_)),
            "{kind}: delete"
        );
        // Other users are not this policy's business.
        let mut other = with_ca("bmV3");
        other["webhooks"][0]["timeoutSeconds"] = json!(1);
        assert_eq!(
            verdict(
                "system:serviceaccount:jobset-inplace-system:other",
                "UPDATE",
                &other
            ),
            PolicyResult::NotMatched,
            "{kind}"
        );
    }
}

#[test]
fn the_network_policy_component_admits_only_the_api_server_and_monitoring() {
    if !have_kubectl() {
        return;
    }
    let kustomization = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
        resources:\n- {deploy}/overlays/epoch\n\
        components:\n- {deploy}/components/network-policy\n";
    let objects = render_kustomization(kustomization, &[]);
    let r = Rendered {
        name: "epoch + network-policy".to_owned(),
        objects,
    };
    let policies = r.of_kind("NetworkPolicy");
    assert_eq!(policies.len(), 2);
    for policy in &policies {
        assert_eq!(check_object(policy), Vec::<String>::new());
        assert_eq!(policy["metadata"]["namespace"], NAMESPACE);
        assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
        // It selects a Deployment's pods, and names ports those pods have.
        let selector = &policy["spec"]["podSelector"]["matchLabels"];
        let deployment = r
            .of_kind("Deployment")
            .into_iter()
            .find(|d| {
                selector
                    .as_object()
                    .into_iter()
                    .flatten()
                    .all(|(k, v)| d["spec"]["template"]["metadata"]["labels"][k] == *v)
            })
            .expect("a Deployment it selects");
        let ports: Vec<String> = deployment["spec"]["template"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["name"].as_str().map(str::to_owned))
            .collect();
        for rule in policy["spec"]["ingress"].as_array().expect("ingress") {
            let from = &rule["from"];
            let allowed: Vec<String> = rule["ports"]
                .as_array()
                .expect("ports")
                .iter()
                .map(|p| p["port"].as_str().expect("a named port").to_owned())
                .collect();
            for port in &allowed {
                assert!(ports.contains(port), "{port} is a container port");
            }
            if allowed == ["https"] {
                // The API server only: an address block, never every pod or namespace.
                assert!(from[0].get("ipBlock").is_some(), "{rule}");
                assert_eq!(from.as_array().map(Vec::len), Some(1));
            } else {
                // The HTTPS metrics port (secure metrics), not the health port.
                assert_eq!(allowed, ["metrics"], "{rule}");
                assert_eq!(
                    from,
                    &json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}])
                );
            }
        }
    }
    let webhook = r.get("NetworkPolicy", "jobset-inplace-webhook");
    assert_eq!(webhook["spec"]["ingress"].as_array().map(Vec::len), Some(2));
    let reconciler = r.get("NetworkPolicy", "jobset-inplace-reconciler");
    assert_eq!(
        reconciler["spec"]["ingress"].as_array().map(Vec::len),
        Some(1)
    );
}

/// API Priority and Fairness (`deploy/base/flowcontrol.yaml`): the reconciler's account, as its
/// Deployment runs it, goes to `leader-election` for its Lease and to `workload-high` for the
/// rest, before the built-in `service-accounts` schema (9000) that would otherwise catch it with
/// every agent; the agents get a level and a schema of their own, whose rules the reconciler keeps.
#[test]
fn flow_schemas_name_the_reconciler_as_it_runs() {
    for name in OVERLAYS {
        let Some(r) = overlay(name) else { return };
        let reconciler = r.get("Deployment", "jobset-inplace-reconciler");
        let reconciler_account = reconciler["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .expect("the reconciler's account");
        let subject = |fs: &Value| fs["spec"]["rules"][0]["subjects"].clone();
        let lease = r.get("FlowSchema", "jobset-inplace-reconciler-leader-election");
        let rest = r.get("FlowSchema", "jobset-inplace-reconciler");
        for fs in [lease, rest] {
            assert_eq!(
                subject(fs),
                json!([{"kind": "ServiceAccount",
                        "serviceAccount": {"name": reconciler_account, "namespace": NAMESPACE}}]),
                "{name}"
            );
        }
        assert_eq!(
            lease["spec"]["priorityLevelConfiguration"]["name"],
            "leader-election"
        );
        assert_eq!(
            lease["spec"]["rules"][0]["resourceRules"],
            json!([{"verbs": ["get", "create", "update", "patch"],
                    "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                    "namespaces": ["*"]}]),
            "{name}: only the Lease"
        );
        assert_eq!(
            rest["spec"]["priorityLevelConfiguration"]["name"],
            "workload-high"
        );
        let precedence = |fs: &Value| fs["spec"]["matchingPrecedence"].as_i64().expect("set");
        assert!(
            precedence(lease) < precedence(rest),
            "{name}: the Lease rule first"
        );
        assert_eq!(r.of_kind("FlowSchema").len(), 3, "{name}");
        for fs in r.of_kind("FlowSchema") {
            assert!(precedence(fs) < 9000, "{name}: {fs}");
        }
        // The agents' schema: their own level, per-user flows, and no rules (the reconciler,
        // told its name, applies them: src/reconciler/flow_schema.rs).
        let agents = r.get("FlowSchema", "jobset-inplace-agents");
        assert_eq!(
            agents["spec"]["priorityLevelConfiguration"]["name"],
            "jobset-inplace-agents"
        );
        assert_eq!(agents["spec"]["distinguisherMethod"]["type"], "ByUser");
        assert!(agents["spec"].get("rules").is_none(), "{name}: {agents}");
        assert!(precedence(lease) < precedence(agents) && precedence(rest) < precedence(agents));
        let level = r.get("PriorityLevelConfiguration", "jobset-inplace-agents");
        let queuing = &level["spec"]["limited"]["limitResponse"]["queuing"];
        let (hand, length) = (
            queuing["handSize"].as_i64().expect("handSize"),
            queuing["queueLengthLimit"]
                .as_i64()
                .expect("queueLengthLimit"),
        );
        assert!(
            hand * length >= 10_000,
            "{name}: one namespace's agents may queue a 5,000-pod restart's 2 requests per pod"
        );
        let args = reconciler["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
        assert!(
            args.contains("--agent-flow-schema=jobset-inplace-agents"),
            "{name}: {args}"
        );
    }
}

/// Issue 21, item 7: the JobSetEpoch CRD's CEL rule (evaluated with the `cel` crate; the real API
/// server in `tests/real_cluster/`) refuses any move back of a published epoch, a removed one,
/// and a removed `jobSetUID`, whoever writes (a deposed reconciler leader's late write included);
/// it lets the epochs grow, a JobSet created again under the same name (another UID) start over,
/// and an object an earlier version wrote (no `jobSetUID`) be written.
#[test]
fn the_jobsetepoch_crd_refuses_to_move_an_epoch_back() {
    let text =
        std::fs::read_to_string(deploy_dir().join("base/jobsetepoch-crd.yaml")).expect("the CRD");
    let crd: Value = serde_saphyr::from_str(&text).expect("yaml");
    let rules =
        &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"];
    let rules = rules.as_array().expect("the CRD has CEL rules at its root");
    let allowed = |old: &Value, new: &Value| {
        rules.iter().all(|r| {
            let rule = r["rule"].as_str().expect("rule");
            cel_bool(rule, &[("self", new), ("oldSelf", old)], &HashMap::new())
        })
    };
    let obj = |uid: Option<&str>, d: Option<i64>, s: Option<i64>| {
        let mut o = json!({"apiVersion": "jobset-inplace.dev/v1alpha1", "kind": "JobSetEpoch",
                           "metadata": {"name": "js"}, "epochs": {"bypass": false}});
        if let Some(uid) = uid {
            o["jobSetUID"] = json!(uid);
        }
        if let Some(d) = d {
            o["epochs"]["deprecated"] = json!(d);
        }
        if let Some(s) = s {
            o["epochs"]["synced"] = json!(s);
        }
        o
    };
    let old = obj(Some("u"), Some(3), Some(4));
    for (new, want, what) in [
        (obj(Some("u"), Some(3), Some(4)), true, "unchanged"),
        (obj(Some("u"), Some(4), Some(4)), true, "deprecated grows"),
        (obj(Some("u"), Some(3), Some(5)), true, "synced grows"),
        (obj(Some("u"), Some(2), Some(4)), false, "deprecated back"),
        (obj(Some("u"), Some(3), Some(3)), false, "synced back"),
        (obj(Some("u"), None, Some(4)), false, "deprecated removed"),
        (obj(Some("u"), Some(3), None), false, "synced removed"),
        (obj(None, Some(0), Some(0)), false, "jobSetUID removed"),
        (
            obj(Some("v"), None, None),
            true,
            "another JobSet of that name starts over",
        ),
    ] {
        assert_eq!(allowed(&old, &new), want, "{what}");
    }
    let mut no_epochs = obj(Some("u"), None, None);
    no_epochs.as_object_mut().map(|o| o.remove("epochs"));
    assert!(!allowed(&old, &no_epochs), "epochs removed");
    assert!(
        allowed(&no_epochs, &obj(Some("u"), None, Some(1))),
        "first epochs"
    );
    assert!(
        allowed(
            &obj(None, Some(7), Some(8)),
            &obj(Some("u"), Some(1), Some(1))
        ),
        "an object an earlier version wrote"
    );
    assert!(allowed(
        &obj(Some("u"), None, None),
        &obj(Some("u"), Some(0), None)
    ));
}
