use super::*;
use crate::controller::build;
use crate::crd::Role;

fn cluster(spec: Value) -> PostgresCluster {
    let mut s = json!({"clusterSize": 3, "version": "15"});
    for (k, v) in spec.as_object().into_iter().flatten() {
        s[k] = v.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
        "metadata": {"name": "pg", "namespace": "db", "uid": "u-1"},
        "spec": s,
    }))
    .unwrap()
}

fn pod(pg: &PostgresCluster) -> Value {
    let o = Owner::of(pg, 0).unwrap();
    serde_json::to_value(build::pod(&o, pg, 1, Role::Replica, "clone", &[])).unwrap()
}

fn hash(pg: &PostgresCluster) -> String {
    pod(pg)["metadata"]["annotations"][build::ANN_HASH]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn default_is_preferred_hostname_anti_affinity_within_the_shard() {
    let p = pod(&cluster(json!({})));
    let terms = &p["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(terms[0]["weight"], 100);
    let t = &terms[0]["podAffinityTerm"];
    assert_eq!(t["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(
        t["labelSelector"]["matchLabels"],
        json!({"pgfleet.io/cluster": "pg", "pgfleet.io/kind": "instance", "pgfleet.io/shard": "0"})
    );
    assert!(p["spec"].get("nodeSelector").is_none());
}

#[test]
fn required_zone_anti_affinity_with_selector_tolerations_and_priority() {
    let pg = cluster(json!({
        "affinity": {"podAntiAffinityType": "required", "topologyKey": "topology.kubernetes.io/zone",
            "nodeSelector": {"disk": "ssd"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}],
            "additionalPodAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10,
                "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}}]}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone"}],
        "priorityClassName": "databases",
    }));
    let p = pod(&pg);
    let s = &p["spec"];
    let req = &s["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(req[0]["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(s["nodeSelector"], json!({"disk": "ssd"}));
    assert_eq!(s["tolerations"][0]["value"], "db");
    assert_eq!(s["priorityClassName"], "databases");
    assert_eq!(
        s["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"],
        10
    );
    // The spread counts this cluster's instances unless told otherwise.
    assert_eq!(
        s["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]["pgfleet.io/cluster"],
        "pg"
    );
    assert_eq!(
        s["topologySpreadConstraints"][0]["whenUnsatisfiable"],
        "DoNotSchedule"
    );
}

#[test]
fn disabling_anti_affinity_leaves_no_affinity() {
    let p = pod(&cluster(
        json!({"affinity": {"enablePodAntiAffinity": false}}),
    ));
    assert!(p["spec"].get("affinity").is_none());
}

#[test]
fn unstated_placement_keeps_the_pod_hash_stated_placement_changes_it() {
    // The hash of a cluster without placement fields is what it was before
    // placement existed: image and resources only (no restart at upgrade).
    let plain = cluster(json!({}));
    let basis = json!({"spec": build::image(&plain), "res": {}});
    assert_eq!(hash(&plain), build::content_hash(&basis));
    let stated = cluster(json!({"affinity": {"podAntiAffinityType": "required"}}));
    assert_ne!(hash(&plain), hash(&stated));
    let priority = cluster(json!({"priorityClassName": "high"}));
    assert_ne!(hash(&plain), hash(&priority));
}

#[test]
fn pooler_prefers_distinct_nodes_and_follows_the_selector() {
    let pg = cluster(json!({"affinity": {"nodeSelector": {"disk": "ssd"}}}));
    let o = Owner::of(&pg, 0).unwrap();
    let mut typed = crate::controller::pooler::pod(&o, 1);
    pooler(typed.spec.as_mut().unwrap(), &o, &pg);
    let p = serde_json::to_value(typed).unwrap();
    let t = &p["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [0];
    assert_eq!(
        t["podAffinityTerm"]["labelSelector"]["matchLabels"]["pgfleet.io/kind"],
        "pooler"
    );
    assert_eq!(p["spec"]["nodeSelector"], json!({"disk": "ssd"}));
}

fn problems(spec: Value) -> Vec<String> {
    let mut errs = vec![];
    validate(&cluster(spec).spec, &mut errs);
    errs
}

#[test]
fn invalid_placement_is_refused_naming_the_field() {
    let errs = problems(json!({
        "affinity": {"topologyKey": "not a key!", "nodeSelector": {"disk": "s s d"},
            "tolerations": [{"operator": "Equal", "value": "x"},
                            {"key": "k", "operator": "Exists", "value": "v", "tolerationSeconds": 5}],
            "additionalPodAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "namespaces": ["Bad_NS"],
                 "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}]}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "/zone"}],
        "priorityClassName": "Not_Valid",
    }));
    for field in [
        "spec.affinity.topologyKey:",
        "spec.affinity.nodeSelector[disk]:",
        "spec.affinity.tolerations[0].operator:",
        "spec.affinity.tolerations[1].value:",
        "spec.affinity.tolerations[1].tolerationSeconds:",
        "spec.affinity.additionalPodAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaces[0]:",
        "spec.affinity.additionalPodAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].values:",
        "spec.topologySpreadConstraints[0].topologyKey:",
        "spec.priorityClassName:",
    ] {
        assert!(
            errs.iter().any(|e| e.starts_with(field)),
            "{field} missing in {errs:#?}"
        );
    }
}

#[test]
fn valid_placement_passes() {
    let errs = problems(json!({
        "affinity": {"topologyKey": "topology.kubernetes.io/zone", "nodeSelector": {"node-role.kubernetes.io/db": ""},
            "tolerations": [{"operator": "Exists"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}],
        "priorityClassName": "system-cluster-critical",
    }));
    assert!(errs.is_empty(), "{errs:#?}");
    assert!(is_label_key("example.com/a_b.c-d"));
    assert!(!is_label_key("example.com/"));
    assert!(!is_label_key(&"a".repeat(64)));
}
