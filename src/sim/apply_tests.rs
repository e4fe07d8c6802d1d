//! Unit tests of `apply.rs` (server-side apply).

use super::*;
use serde_json::json;

const T1: &str = "2025-01-01T00:00:00Z";
const T2: &str = "2025-01-01T00:01:00Z";
const T3: &str = "2025-01-01T00:02:00Z";

fn deployment(replicas: i64, image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ns", "labels": {"app": "pg"}},
        "spec": {
            "replicas": replicas,
            "template": {"spec": {"containers": [{"name": "pg", "image": image}]}}
        }
    })
}

fn entries(obj: &Value) -> &Vec<Value> {
    obj["metadata"]["managedFields"].as_array().unwrap()
}

fn entry<'a>(obj: &'a Value, manager: &str, operation: &str) -> Option<&'a Value> {
    obj["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .find(|e| e["manager"] == manager && e["operation"] == operation)
}

#[test]
fn apply_create_sets_managed_fields_shape() {
    let obj = server_side_apply(None, &deployment(1, "postgres:16"), "pgfleet", false, T1).unwrap();
    assert_eq!(obj["spec"]["replicas"], 1);
    assert_eq!(entries(&obj).len(), 1);
    assert_eq!(
        entries(&obj)[0],
        json!({
            "manager": "pgfleet",
            "operation": "Apply",
            "apiVersion": "apps/v1",
            "time": T1,
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {"f:labels": {"f:app": {}}},
                "f:spec": {
                    "f:replicas": {},
                    "f:template": {"f:spec": {"f:containers": {
                        "k:{\"name\":\"pg\"}": {".": {}, "f:image": {}, "f:name": {}}
                    }}}
                }
            }
        })
    );
}

#[test]
fn apply_ignores_server_metadata_and_nulls() {
    let mut applied = deployment(1, "x");
    applied["metadata"]["resourceVersion"] = json!("999");
    applied["metadata"]["creationTimestamp"] = Value::Null;
    applied["metadata"]["managedFields"] = json!([{"manager": "evil"}]);
    applied["spec"]["paused"] = Value::Null;
    let obj = server_side_apply(None, &applied, "m", false, T1).unwrap();
    assert!(obj["metadata"].get("resourceVersion").is_none());
    assert!(obj["metadata"].get("creationTimestamp").is_none());
    assert!(obj["spec"].get("paused").is_none());
    assert_eq!(entries(&obj).len(), 1);
    assert_eq!(entries(&obj)[0]["manager"], "m");
}

#[test]
fn reapply_with_field_dropped_removes_it() {
    let mut first = deployment(1, "postgres:16");
    first["metadata"]["labels"]["tier"] = json!("db");
    first["metadata"]["finalizers"] = json!(["a/x", "b/y"]);
    let obj = server_side_apply(None, &first, "m", false, T1).unwrap();
    assert_eq!(
        obj["metadata"]["managedFields"][0]["fieldsV1"]["f:metadata"]["f:finalizers"],
        json!({"v:\"a/x\"": {}, "v:\"b/y\"": {}})
    );

    let mut second = deployment(1, "postgres:16");
    second["metadata"]["finalizers"] = json!(["b/y"]);
    if let Value::Object(spec) = &mut second["spec"] {
        spec.remove("replicas");
    }
    let obj = server_side_apply(Some(&obj), &second, "m", false, T2).unwrap();
    assert_eq!(obj["metadata"]["labels"], json!({"app": "pg"}));
    assert_eq!(obj["metadata"]["finalizers"], json!(["b/y"]));
    assert!(obj["spec"].get("replicas").is_none(), "{obj}");
    let fields = &entries(&obj)[0]["fieldsV1"];
    assert!(fields["f:spec"].get("f:replicas").is_none());
    assert_eq!(entries(&obj)[0]["time"], T2);
}

#[test]
fn reapply_dropping_a_container_removes_it() {
    let mut two = deployment(1, "postgres:16");
    two["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "exporter", "image": "exp:1"}));
    let obj = server_side_apply(None, &two, "m", false, T1).unwrap();
    let obj = server_side_apply(Some(&obj), &deployment(1, "postgres:16"), "m", false, T2).unwrap();
    assert_eq!(
        obj["spec"]["template"]["spec"]["containers"],
        json!([{"name": "pg", "image": "postgres:16"}])
    );
}

#[test]
fn two_managers_conflict_lists_paths() {
    let obj = server_side_apply(None, &deployment(1, "postgres:16"), "alice", false, T1).unwrap();
    let err =
        server_side_apply(Some(&obj), &deployment(3, "postgres:17"), "bob", false, T2).unwrap_err();
    assert_eq!(
        err,
        PatchError::Conflict(vec![
            ".spec.replicas".to_string(),
            ".spec.template.spec.containers[name=\"pg\"].image".to_string(),
        ])
    );
    assert!(err.to_string().starts_with("Apply failed with 2 conflicts"));
}

#[test]
fn same_value_is_shared_not_a_conflict_and_survives_one_owner_dropping_it() {
    let obj = server_side_apply(None, &deployment(1, "postgres:16"), "alice", false, T1).unwrap();
    let obj =
        server_side_apply(Some(&obj), &deployment(1, "postgres:16"), "bob", false, T2).unwrap();
    assert_eq!(entries(&obj).len(), 2);
    let mut minimal = deployment(1, "postgres:16");
    minimal["spec"] = json!({});
    let obj = server_side_apply(Some(&obj), &minimal, "alice", false, T3).unwrap();
    assert_eq!(obj["spec"]["replicas"], 1);
    assert_eq!(
        obj["spec"]["template"]["spec"]["containers"][0]["image"],
        "postgres:16"
    );
}

#[test]
fn force_moves_ownership() {
    let obj = server_side_apply(None, &deployment(1, "postgres:16"), "alice", false, T1).unwrap();
    let obj =
        server_side_apply(Some(&obj), &deployment(3, "postgres:16"), "bob", true, T2).unwrap();
    assert_eq!(obj["spec"]["replicas"], 3);
    let alice = entry(&obj, "alice", "Apply").unwrap();
    assert!(
        alice["fieldsV1"]["f:spec"].get("f:replicas").is_none(),
        "{alice}"
    );
    assert!(
        alice["fieldsV1"]["f:metadata"]["f:labels"]
            .get("f:app")
            .is_some()
    );
    let bob = entry(&obj, "bob", "Apply").unwrap();
    assert_eq!(bob["fieldsV1"]["f:spec"]["f:replicas"], json!({}));
    // alice can now drop replicas without deleting bob's value, and re-applying her
    // old value conflicts with bob.
    let err = server_side_apply(
        Some(&obj),
        &deployment(1, "postgres:16"),
        "alice",
        false,
        T3,
    )
    .unwrap_err();
    assert_eq!(
        err,
        PatchError::Conflict(vec![".spec.replicas".to_string()])
    );
}

#[test]
fn field_also_set_by_update_manager_is_kept_when_applier_drops_it() {
    // An Update manager creates the object (owning everything it wrote), then an
    // applier applies the same values: no conflict, shared ownership.
    let mut created = deployment(1, "postgres:16");
    record_update(None, &mut created, "kubectl-create", T1);
    let mut applied = deployment(1, "postgres:16");
    applied["metadata"]["annotations"] = json!({"note": "mine"});
    let obj = server_side_apply(Some(&created), &applied, "alice", false, T2).unwrap();
    assert_eq!(entries(&obj).len(), 2);
    let creator = entry(&obj, "kubectl-create", "Update").unwrap();
    assert_eq!(
        creator["fieldsV1"]["f:metadata"]["f:labels"],
        json!({".": {}, "f:app": {}})
    );

    // Alice drops the label (co-owned: kept) and the annotation (hers alone: pruned).
    let mut dropped = deployment(1, "postgres:16");
    dropped["metadata"] = json!({"name": "d", "namespace": "ns"});
    let obj = server_side_apply(Some(&obj), &dropped, "alice", false, T3).unwrap();
    assert_eq!(obj["metadata"]["labels"], json!({"app": "pg"}));
    assert!(obj["metadata"].get("annotations").is_none(), "{obj}");
    let alice = entry(&obj, "alice", "Apply").unwrap();
    assert!(alice["fieldsV1"].get("f:metadata").is_none(), "{alice}");
    let creator = entry(&obj, "kubectl-create", "Update").unwrap();
    assert_eq!(
        creator["fieldsV1"]["f:metadata"]["f:labels"],
        json!({".": {}, "f:app": {}})
    );
    assert_eq!(creator["time"], T1);
}

#[test]
fn update_entry_of_same_manager_name_still_conflicts_like_kube() {
    let mut created = deployment(1, "postgres:16");
    record_update(None, &mut created, "pgfleet", T1);
    let err = server_side_apply(
        Some(&created),
        &deployment(2, "postgres:16"),
        "pgfleet",
        false,
        T2,
    )
    .unwrap_err();
    assert_eq!(
        err,
        PatchError::Conflict(vec![".spec.replicas".to_string()])
    );
    let obj = server_side_apply(
        Some(&created),
        &deployment(2, "postgres:16"),
        "pgfleet",
        true,
        T2,
    )
    .unwrap();
    assert_eq!(obj["spec"]["replicas"], 2);
    assert_eq!(entries(&obj).len(), 2);
}

#[test]
fn update_takes_changed_fields_from_applier() {
    let obj = server_side_apply(None, &deployment(1, "postgres:16"), "alice", false, T1).unwrap();
    let mut scaled = obj.clone();
    scaled["spec"]["replicas"] = json!(5);
    record_update(Some(&obj), &mut scaled, "hpa", T2);
    let alice = entry(&scaled, "alice", "Apply").unwrap();
    assert!(alice["fieldsV1"]["f:spec"].get("f:replicas").is_none());
    assert_eq!(alice["time"], T1);
    let hpa = entry(&scaled, "hpa", "Update").unwrap();
    assert_eq!(hpa["fieldsV1"], json!({"f:spec": {"f:replicas": {}}}));
    assert_eq!(hpa["apiVersion"], "apps/v1");
    // Apply entries sort before Update entries.
    assert_eq!(entries(&scaled)[0]["operation"], "Apply");
    // Re-applying replicas=1 now conflicts with the Update manager.
    let err = server_side_apply(
        Some(&scaled),
        &deployment(1, "postgres:16"),
        "alice",
        false,
        T3,
    )
    .unwrap_err();
    assert_eq!(
        err,
        PatchError::Conflict(vec![".spec.replicas".to_string()])
    );
}

#[test]
fn record_update_on_create_marks_new_maps_and_items() {
    let mut obj = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "1",
                     "creationTimestamp": "2025-01-01T00:00:00Z", "labels": {"a": "b"}},
        "data": {"k": "v"},
        "spec": {"env": [{"name": "X", "value": "1"}]}
    });
    record_update(None, &mut obj, "kubectl-create", T1);
    assert_eq!(
        entries(&obj)[0],
        json!({
            "manager": "kubectl-create",
            "operation": "Update",
            "apiVersion": "v1",
            "time": T1,
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:data": {".": {}, "f:k": {}},
                "f:metadata": {"f:labels": {".": {}, "f:a": {}}},
                "f:spec": {"f:env": {".": {}, "k:{\"name\":\"X\"}": {".": {}, "f:name": {}, "f:value": {}}}}
            }
        })
    );
}

#[test]
fn record_update_noop_keeps_time_and_removed_fields_leave_sets() {
    let mut obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v", "j": "w"}});
    record_update(None, &mut obj, "a", T1);
    let mut same = obj.clone();
    record_update(Some(&obj), &mut same, "a", T2);
    assert_eq!(entries(&same)[0]["time"], T1);

    let mut removed = same.clone();
    if let Value::Object(data) = &mut removed["data"] {
        data.remove("k");
    }
    record_update(Some(&same), &mut removed, "b", T2);
    assert_eq!(entries(&removed).len(), 1);
    assert_eq!(
        entries(&removed)[0]["fieldsV1"],
        json!({"f:data": {".": {}, "f:j": {}}})
    );

    let mut emptied = removed.clone();
    emptied["data"] = json!({});
    emptied.as_object_mut().unwrap().remove("data");
    record_update(Some(&removed), &mut emptied, "b", T3);
    assert!(
        emptied["metadata"].get("managedFields").is_none(),
        "{emptied}"
    );
}

#[test]
fn apply_rejects_keyed_items_without_key_and_duplicates() {
    let mut bad = deployment(1, "x");
    bad["spec"]["template"]["spec"]["containers"] = json!([{"image": "nameless"}]);
    let err = server_side_apply(None, &bad, "m", false, T1).unwrap_err();
    assert!(
        err.to_string().contains("missing key field \"name\""),
        "{err}"
    );
    bad["spec"]["template"]["spec"]["containers"] = json!([{"name": "a"}, {"name": "a"}]);
    let err = server_side_apply(None, &bad, "m", false, T1).unwrap_err();
    assert!(err.to_string().contains("duplicate"), "{err}");
    assert!(server_side_apply(None, &json!([1]), "m", false, T1).is_err());
}

#[test]
fn apply_merges_lists_by_key_keeping_other_items_and_fields() {
    let live = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [
            {"name": "a", "image": "a:1", "resources": {"limits": {"cpu": "1"}}},
            {"name": "b", "image": "b:1"}
        ], "tolerations": [{"key": "x"}]}
    });
    let applied = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "c:1"}, {"name": "a", "image": "a:2"}],
                 "tolerations": [{"key": "y"}]}
    });
    let obj = server_side_apply(Some(&live), &applied, "m", false, T1).unwrap();
    assert_eq!(
        obj["spec"]["containers"],
        json!([
            {"name": "c", "image": "c:1"},
            {"name": "a", "image": "a:2", "resources": {"limits": {"cpu": "1"}}},
            {"name": "b", "image": "b:1"}
        ])
    );
    assert_eq!(obj["spec"]["tolerations"], json!([{"key": "y"}]));
    assert_eq!(
        entries(&obj)[0]["fieldsV1"]["f:spec"]["f:tolerations"],
        json!({}),
        "atomic lists are leaves"
    );
}

#[test]
fn noop_reapply_changes_nothing() {
    let obj = server_side_apply(None, &deployment(1, "x"), "m", false, T1).unwrap();
    let again = server_side_apply(Some(&obj), &deployment(1, "x"), "m", false, T2).unwrap();
    assert_eq!(again, obj);
}

#[test]
fn fields_v1_roundtrip_and_display() {
    let v = json!({"f:a": {".": {}, "f:b": {}}, "f:c": {"k:{\"name\":\"x\"}": {}}, "f:d": {"v:\"q\"": {}}});
    let set = FieldSet::from_fields_v1(&v);
    assert_eq!(set.to_fields_v1(), v);
    // A lone "." is the same member as an empty leaf.
    let dotted = json!({"f:c": {"k:{\"name\":\"x\"}": {".": {}}}});
    assert_eq!(
        FieldSet::from_fields_v1(&dotted).to_fields_v1(),
        json!({"f:c": {"k:{\"name\":\"x\"}": {}}})
    );
    let shown: Vec<String> = set.members().iter().map(|p| display_path(p)).collect();
    assert_eq!(shown, vec![".a", ".a.b", ".c[name=\"x\"]", ".d[=\"q\"]"]);
}
