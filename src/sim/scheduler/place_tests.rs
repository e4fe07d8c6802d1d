use super::*;
use serde_json::json;

fn node(name: &str, zone: &str) -> Value {
    json!({"metadata": {"name": name, "labels": {HOSTNAME: name, ZONE: zone}}, "spec": {}})
}

fn three_nodes() -> Vec<Value> {
    vec![node("n1", "a"), node("n2", "b"), node("n3", "c")]
}

fn pod(name: &str, spec: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": "db", "labels": {"app": "pg"}}, "spec": spec})
}

fn bound(mut p: Value, node: &str) -> Value {
    p["spec"]["nodeName"] = json!(node);
    p
}

fn anti(required: bool, key: &str) -> Value {
    let term = json!({"labelSelector": {"matchLabels": {"app": "pg"}}, "topologyKey": key});
    if required {
        json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}})
    } else {
        json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": term}]}}})
    }
}

/// Schedules `n` copies of `spec` one after another, as the loop does.
fn schedule_all(n: usize, spec: Value, nodes: &[Value]) -> Vec<Decision> {
    let mut placed = vec![];
    let mut out = vec![];
    for i in 0..n {
        let p = pod(&format!("p{i}"), spec.clone());
        let d = place(&p, nodes, &placed);
        if let Decision::Bind(n) = &d {
            placed.push(bound(p, n));
        }
        out.push(d);
    }
    out
}

fn nodes_of(ds: &[Decision]) -> Vec<String> {
    ds.iter()
        .filter_map(|d| match d {
            Decision::Bind(n) => Some(n.clone()),
            Decision::Unschedulable(_) => None,
        })
        .collect()
}

#[test]
fn preferred_anti_affinity_spreads_over_nodes() {
    let ds = schedule_all(3, anti(false, HOSTNAME), &three_nodes());
    let mut got = nodes_of(&ds);
    got.sort();
    assert_eq!(got, ["n1", "n2", "n3"]);
}

#[test]
fn preferred_anti_affinity_still_places_when_nodes_run_out() {
    let ds = schedule_all(4, anti(false, HOSTNAME), &three_nodes());
    assert_eq!(nodes_of(&ds).len(), 4);
}

#[test]
fn required_anti_affinity_with_too_few_nodes_leaves_one_unschedulable() {
    let nodes = vec![node("n1", "a"), node("n2", "b")];
    let ds = schedule_all(3, anti(true, HOSTNAME), &nodes);
    assert_eq!(nodes_of(&ds).len(), 2);
    assert_eq!(
        ds[2],
        Decision::Unschedulable(
            "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules. \
             preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
                .into()
        )
    );
}

#[test]
fn required_zone_anti_affinity_counts_zones_not_nodes() {
    let nodes = vec![node("n1", "a"), node("n2", "a"), node("n3", "b")];
    let ds = schedule_all(3, anti(true, ZONE), &nodes);
    assert_eq!(nodes_of(&ds).len(), 2);
    assert!(matches!(&ds[2], Decision::Unschedulable(_)));
}

#[test]
fn taints_keep_pods_off_unless_tolerated() {
    let mut nodes = three_nodes();
    for n in &mut nodes[..2] {
        n["spec"]["taints"] =
            json!([{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]);
    }
    let ds = schedule_all(2, json!({}), &nodes);
    assert_eq!(nodes_of(&ds), ["n3", "n3"]);
    nodes[2]["spec"]["unschedulable"] = json!(true);
    let d = place(&pod("x", json!({})), &nodes, &[] as &[Value]);
    assert_eq!(
        d,
        Decision::Unschedulable(
            "0/3 nodes are available: 1 node(s) were unschedulable, \
             2 node(s) had untolerated taint {dedicated: infra}. \
             preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
                .into()
        )
    );
    let tolerant = json!({"tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]});
    assert!(
        matches!(place(&pod("y", tolerant), &nodes, &[] as &[Value]), Decision::Bind(n) if n != "n3")
    );
}

#[test]
fn node_selector_and_required_node_affinity() {
    let nodes = three_nodes();
    let by_selector = json!({"nodeSelector": {ZONE: "b"}});
    assert_eq!(
        place(&pod("x", by_selector), &nodes, &[] as &[Value]),
        Decision::Bind("n2".into())
    );
    let by_affinity = json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": ZONE, "operator": "NotIn", "values": ["a", "b"]}]}]}}}});
    assert_eq!(
        place(&pod("y", by_affinity), &nodes, &[] as &[Value]),
        Decision::Bind("n3".into())
    );
    let nowhere = json!({"nodeSelector": {ZONE: "z"}});
    assert!(matches!(place(&pod("z", nowhere), &nodes, &[] as &[Value]),
        Decision::Unschedulable(m) if m.contains("3 node(s) didn't match Pod's node affinity/selector")));
}

#[test]
fn zone_spread_constraint_balances_zones() {
    let nodes = vec![
        node("n1", "a"),
        node("n2", "a"),
        node("n3", "b"),
        node("n4", "b"),
    ];
    let spec = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE,
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "pg"}}}]});
    let ds = schedule_all(4, spec, &nodes);
    let zone_of = |n: &str| if n == "n1" || n == "n2" { "a" } else { "b" };
    let placed = nodes_of(&ds);
    let in_a = placed.iter().filter(|n| zone_of(n) == "a").count();
    assert_eq!((placed.len(), in_a), (4, 2));
}

#[test]
fn spread_constraint_refuses_skew_and_missing_label() {
    let mut nodes = vec![node("n1", "a"), node("n2", "b")];
    let spec = json!({"nodeSelector": {ZONE: "a"}, "topologySpreadConstraints": [{"maxSkew": 1,
        "topologyKey": HOSTNAME, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "pg"}}}]});
    // Only n1 is eligible: the spread counts nodes the pod may go to, so it stacks there.
    assert_eq!(nodes_of(&schedule_all(2, spec, &nodes)), ["n1", "n1"]);
    nodes[0]["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove(HOSTNAME);
    let spec = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": HOSTNAME,
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "pg"}}}]});
    let others = [bound(pod("o", json!({})), "n2")];
    // n1 lacks the key; n2 is the only domain, so its skew is fine.
    assert_eq!(
        place(&pod("x", spec.clone()), &nodes, &others),
        Decision::Bind("n2".into())
    );
    nodes[1]["spec"]["unschedulable"] = json!(true);
    let d = place(&pod("x", spec), &nodes, &others);
    assert!(
        matches!(&d, Decision::Unschedulable(m) if m.contains(
        "1 node(s) didn't match pod topology spread constraints (missing required label)")),
        "{d:?}"
    );
}

#[test]
fn required_pod_affinity_follows_its_peer_and_lets_the_first_go_anywhere() {
    let nodes = three_nodes();
    let spec = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "pg"}}, "topologyKey": ZONE}]}}});
    let ds = schedule_all(3, spec, &nodes);
    let placed = nodes_of(&ds);
    assert_eq!(placed.len(), 3);
    assert!(placed.iter().all(|n| n == &placed[0]), "{placed:?}");
}

#[test]
fn existing_pods_required_anti_affinity_is_symmetric() {
    let nodes = vec![node("n1", "a"), node("n2", "b")];
    let loner = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "pg"}}, "topologyKey": HOSTNAME}]}}});
    let mut l = pod("loner", loner);
    l["metadata"]["labels"] = json!({"app": "other"});
    let placed = vec![bound(l, "n1")];
    assert_eq!(
        place(&pod("x", json!({})), &nodes, &placed),
        Decision::Bind("n2".into())
    );
}

#[test]
fn default_spreading_keeps_a_controllers_pods_apart() {
    let mut placed = vec![];
    let nodes = three_nodes();
    for i in 0..3 {
        let mut p = pod(&format!("p{i}"), json!({}));
        p["metadata"]["ownerReferences"] = json!([{"uid": "rs-1"}]);
        let Decision::Bind(n) = place(&p, &nodes, &placed) else {
            panic!("unschedulable")
        };
        placed.push(bound(p, &n));
    }
    let mut got: Vec<_> = placed
        .iter()
        .map(|p| str_at(p, "/spec/nodeName").to_string())
        .collect();
    got.sort();
    assert_eq!(got, ["n1", "n2", "n3"]);
}

#[test]
fn no_nodes_at_all() {
    assert_eq!(
        place(&pod("x", json!({})), &[] as &[Value], &[] as &[Value]),
        Decision::Unschedulable("no nodes available to schedule pods".into())
    );
}
