//! The barrier's NetworkPolicy, an opt-in value of the chart (issue 46 item 1)

use super::*;

/// The closed TCP ports of one rendered policy and those it leaves open, checked port by port.
fn check_barrier_policy(policy: &Value, closed: &[(i64, i64)], cidrs: &[&str], what: &str) {
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]), "{what}");
    assert_eq!(
        policy["spec"]["podSelector"],
        json!({"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}),
        "{what}"
    );
    let mut open: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    let mut from_nodes = Vec::new();
    let mut barrier_rules = 0;
    for rule in policy["spec"]["ingress"].as_array().expect("ingress") {
        let ports: Vec<(String, i64, i64)> = rule["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .map(|p| {
                let start = p["port"].as_i64().expect("port");
                let end = p["endPort"].as_i64().unwrap_or(start);
                (
                    p["protocol"].as_str().unwrap_or("TCP").to_owned(),
                    start,
                    end,
                )
            })
            .collect();
        match rule.get("from") {
            Some(from) => {
                barrier_rules += 1;
                let blocks: Vec<&str> = from
                    .as_array()
                    .expect("from")
                    .iter()
                    .map(|f| {
                        assert_eq!(f.as_object().map(|o| o.len()), Some(1), "{what}: {f}");
                        f["ipBlock"]["cidr"].as_str().expect("an ipBlock")
                    })
                    .collect();
                assert_eq!(blocks, cidrs, "{what}");
                from_nodes = ports;
            }
            None => {
                for (protocol, start, end) in ports {
                    open.entry(protocol).or_default().push((start, end));
                }
            }
        }
    }
    assert_eq!(barrier_rules, 1, "{what}");
    let covers =
        |ranges: &[(i64, i64)], port: i64| ranges.iter().any(|(a, b)| (*a..=*b).contains(&port));
    let nodes_tcp: Vec<(i64, i64)> = from_nodes
        .iter()
        .map(|(p, a, b)| {
            assert_eq!(p, "TCP", "{what}");
            (*a, *b)
        })
        .collect();
    let empty = Vec::new();
    for port in 1..=65535 {
        let barrier = covers(closed, port);
        assert_eq!(
            covers(&nodes_tcp, port),
            barrier,
            "{what}: TCP {port} from the nodes"
        );
        assert_eq!(
            covers(open.get("TCP").unwrap_or(&empty), port),
            !barrier,
            "{what}: TCP {port} from anywhere"
        );
        for protocol in ["UDP", "SCTP"] {
            assert!(
                covers(open.get(protocol).unwrap_or(&empty), port),
                "{what}: {protocol} {port}"
            );
        }
    }
}

/// Off by default; on, one NetworkPolicy per listed namespace admits the barrier port and its
/// fallback ports from the nodes' CIDRs only and every other port from anywhere, whether the
/// barrier port is below, inside or above the fallback range.
#[test]
fn the_barrier_network_policy_admits_only_the_nodes_to_the_barrier_ports() {
    let Some(helm) = helm() else { return };
    let policies = |objects: &[Value]| -> Vec<Value> {
        objects
            .iter()
            .filter(|o| {
                o["kind"] == "NetworkPolicy"
                    && o["metadata"]["name"] == "jobset-inplace-barrier-from-nodes"
            })
            .cloned()
            .collect()
    };
    assert!(policies(&template(&helm, &[])).is_empty(), "opt-in");
    for (port, closed) in [
        ("8080", vec![(8080, 8080), (18080, 18099)]),
        ("18090", vec![(18080, 18099)]),
        ("30000", vec![(18080, 18099), (30000, 30000)]),
        ("1", vec![(1, 1), (18080, 18099)]),
    ] {
        let set = format!("injection.barrierPort={port}");
        let objects = template(
            &helm,
            &[
                "barrierNetworkPolicy.enabled=true",
                "barrierNetworkPolicy.namespaces={team-a,team-b}",
                "barrierNetworkPolicy.nodeCIDRs={10.0.0.0/16,fd00::/64}",
                &set,
            ],
        );
        let found = policies(&objects);
        let namespaces: Vec<&str> = found
            .iter()
            .map(|p| p["metadata"]["namespace"].as_str().expect("namespace"))
            .collect();
        assert_eq!(namespaces, ["team-a", "team-b"], "barrierPort {port}");
        for policy in &found {
            check_barrier_policy(
                policy,
                &closed,
                &["10.0.0.0/16", "fd00::/64"],
                &format!("barrierPort {port}"),
            );
        }
    }
}
