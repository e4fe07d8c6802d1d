//! Unit tests of `patch.rs`.

use super::*;
use serde_json::json;

#[test]
fn merge_patch_rfc7386_appendix_a() {
    let cases = [
        (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
        (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
        (json!({"a":"b"}), json!({"a":null}), json!({})),
        (
            json!({"a":"b","b":"c"}),
            json!({"a":null}),
            json!({"b":"c"}),
        ),
        (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
        (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
        (
            json!({"a":{"b":"c"}}),
            json!({"a":{"b":"d","c":null}}),
            json!({"a":{"b":"d"}}),
        ),
        (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
        (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
        (json!({"a":"b"}), json!(["c"]), json!(["c"])),
        (json!({"a":"foo"}), json!(null), json!(null)),
        (json!({"a":"foo"}), json!("bar"), json!("bar")),
        (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
        (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
        (
            json!({}),
            json!({"a":{"bb":{"ccc":null}}}),
            json!({"a":{"bb":{}}}),
        ),
    ];
    for (target, patch, expected) in cases {
        let mut doc = target.clone();
        merge_patch(&mut doc, &patch);
        assert_eq!(doc, expected, "target {target} patch {patch}");
    }
}

#[test]
fn merge_patch_rfc7386_section3_example() {
    let mut doc = json!({
        "title": "Goodbye!",
        "author": {"givenName": "John", "familyName": "Doe"},
        "tags": ["example", "sample"],
        "content": "This will be unchanged"
    });
    let patch = json!({
        "title": "Hello!",
        "phoneNumber": "+01-123-456-7890",
        "author": {"familyName": null},
        "tags": ["example"]
    });
    merge_patch(&mut doc, &patch);
    assert_eq!(
        doc,
        json!({
            "title": "Hello!",
            "author": {"givenName": "John"},
            "tags": ["example"],
            "content": "This will be unchanged",
            "phoneNumber": "+01-123-456-7890"
        })
    );
}

#[test]
fn json_patch_add_remove_replace() {
    let mut doc =
        json!({"metadata": {"labels": {"a": "1"}}, "spec": {"replicas": 1, "xs": [1, 2]}});
    json_patch(
        &mut doc,
        &json!([
            {"op": "add", "path": "/metadata/labels/b", "value": "2"},
            {"op": "remove", "path": "/metadata/labels/a"},
            {"op": "replace", "path": "/spec/replicas", "value": 3},
            {"op": "add", "path": "/spec/xs/-", "value": 3},
            {"op": "test", "path": "/spec/replicas", "value": 3}
        ]),
    )
    .unwrap();
    assert_eq!(
        doc,
        json!({"metadata": {"labels": {"b": "2"}}, "spec": {"replicas": 3, "xs": [1, 2, 3]}})
    );
}

#[test]
fn json_patch_test_failure_is_atomic_and_named() {
    let original = json!({"spec": {"replicas": 1}});
    let mut doc = original.clone();
    let err = json_patch(
        &mut doc,
        &json!([
            {"op": "replace", "path": "/spec/replicas", "value": 5},
            {"op": "test", "path": "/spec/replicas", "value": 1}
        ]),
    )
    .unwrap_err();
    let PatchError::Invalid(msg) = &err else {
        panic!("{err:?}")
    };
    assert!(
        msg.contains("test") && msg.contains("/spec/replicas") && msg.contains(" 1 "),
        "{msg}"
    );
    assert_eq!(doc, original);
}

#[test]
fn json_patch_bad_path_and_bad_document() {
    let mut doc = json!({"a": 1});
    let err = json_patch(&mut doc, &json!([{"op": "remove", "path": "/nope"}])).unwrap_err();
    assert!(err.to_string().contains("remove \"/nope\""), "{err}");
    let err = json_patch(&mut doc, &json!({"op": "remove"})).unwrap_err();
    assert!(err.to_string().contains("invalid JSON patch"), "{err}");
    let err = json_patch(&mut doc, &json!([{"op": "frobnicate", "path": "/a"}])).unwrap_err();
    assert!(matches!(err, PatchError::Invalid(_)));
    assert_eq!(doc, json!({"a": 1}));
}

fn pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "labels": {"app": "pg", "tier": "db"},
            "finalizers": ["a.example/x"]
        },
        "spec": {
            "containers": [
                {"name": "pg", "image": "postgres:16", "env": [{"name": "A", "value": "1"}],
                 "ports": [{"containerPort": 5432, "name": "pg"}]},
                {"name": "sidecar", "image": "busybox"}
            ],
            "tolerations": [{"key": "k", "operator": "Exists"}]
        }
    })
}

fn containers(p: &Value) -> &Vec<Value> {
    p["spec"]["containers"].as_array().unwrap()
}

#[test]
fn smp_changes_one_container_image_by_name() {
    let mut p = pod();
    strategic_merge_patch(
        &mut p,
        &json!({"spec": {"containers": [{"name": "sidecar", "image": "busybox:2"}]}}),
    )
    .unwrap();
    let cs = containers(&p);
    assert_eq!(cs.len(), 2);
    assert_eq!(cs[0]["image"], "postgres:16");
    assert_eq!(cs[1]["image"], "busybox:2");
}

#[test]
fn smp_adds_env_var_and_merges_existing() {
    let mut p = pod();
    strategic_merge_patch(
        &mut p,
        &json!({"spec": {"containers": [{"name": "pg", "env": [
            {"name": "B", "value": "2"}, {"name": "A", "value": "one"}
        ]}]}}),
    )
    .unwrap();
    assert_eq!(
        containers(&p)[0]["env"],
        json!([{"name": "A", "value": "one"}, {"name": "B", "value": "2"}])
    );
    assert_eq!(containers(&p)[0]["image"], "postgres:16");
}

#[test]
fn smp_deletes_container_with_patch_delete() {
    let mut p = pod();
    strategic_merge_patch(
        &mut p,
        &json!({"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}]}}),
    )
    .unwrap();
    let cs = containers(&p);
    assert_eq!(cs.len(), 1);
    assert_eq!(cs[0]["name"], "pg");
}

#[test]
fn smp_set_element_order_is_respected_and_stripped() {
    let mut p = pod();
    strategic_merge_patch(
        &mut p,
        &json!({"spec": {
            "$setElementOrder/containers": [{"name": "sidecar"}, {"name": "pg"}],
            "containers": [{"name": "pg", "image": "postgres:17"}]
        }}),
    )
    .unwrap();
    let cs = containers(&p);
    assert_eq!(cs[0]["name"], "sidecar");
    assert_eq!(cs[1]["image"], "postgres:17");
    assert!(!p.to_string().contains('$'), "{p}");
}

#[test]
fn smp_null_deletes_label() {
    let mut p = pod();
    strategic_merge_patch(
        &mut p,
        &json!({"metadata": {"labels": {"tier": null, "new": "x"}}}),
    )
    .unwrap();
    assert_eq!(p["metadata"]["labels"], json!({"app": "pg", "new": "x"}));
}

#[test]
fn smp_finalizers_merge_as_set() {
    let mut p = pod();
    strategic_merge_patch(
        &mut p,
        &json!({"metadata": {"finalizers": ["b.example/y", "a.example/x"]}}),
    )
    .unwrap();
    assert_eq!(
        p["metadata"]["finalizers"],
        json!(["a.example/x", "b.example/y"])
    );
    strategic_merge_patch(
        &mut p,
        &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a.example/x"]}}),
    )
    .unwrap();
    assert_eq!(p["metadata"]["finalizers"], json!(["b.example/y"]));
    assert!(!p.to_string().contains('$'));
}

#[test]
fn smp_atomic_lists_are_replaced() {
    let mut p = pod();
    strategic_merge_patch(
        &mut p,
        &json!({"spec": {"tolerations": [{"key": "other", "operator": "Exists"}],
                         "containers": [{"name": "pg", "args": ["-c", "x"]}]}}),
    )
    .unwrap();
    assert_eq!(
        p["spec"]["tolerations"],
        json!([{"key": "other", "operator": "Exists"}])
    );
    strategic_merge_patch(
        &mut p,
        &json!({"spec": {"containers": [{"name": "pg", "args": ["-v"]}]}}),
    )
    .unwrap();
    assert_eq!(containers(&p)[0]["args"], json!(["-v"]));
}

#[test]
fn smp_ports_keyed_by_container_port_and_service_port() {
    let mut p = pod();
    strategic_merge_patch(
        &mut p,
        &json!({"spec": {"containers": [{"name": "pg", "ports": [{"containerPort": 9187, "name": "metrics"}]}]}}),
    )
    .unwrap();
    assert_eq!(containers(&p)[0]["ports"].as_array().unwrap().len(), 2);

    let mut svc = json!({"spec": {"ports": [{"port": 5432, "targetPort": 5432}, {"port": 80}]}});
    strategic_merge_patch(
        &mut svc,
        &json!({"spec": {"ports": [{"port": 5432, "targetPort": 6432}]}}),
    )
    .unwrap();
    assert_eq!(
        svc["spec"]["ports"],
        json!([{"port": 5432, "targetPort": 6432}, {"port": 80}])
    );
}

#[test]
fn smp_replace_and_delete_directives_on_maps_and_lists() {
    let mut p = pod();
    strategic_merge_patch(
        &mut p,
        &json!({"metadata": {"labels": {"$patch": "replace", "only": "this", "gone": null}}}),
    )
    .unwrap();
    assert_eq!(p["metadata"]["labels"], json!({"only": "this"}));

    strategic_merge_patch(
        &mut p,
        &json!({"metadata": {"labels": {"$patch": "delete"}}}),
    )
    .unwrap();
    assert!(p["metadata"].get("labels").is_none());

    strategic_merge_patch(
        &mut p,
        &json!({"spec": {"containers": [{"name": "solo", "image": "x"}, {"$patch": "replace"}]}}),
    )
    .unwrap();
    assert_eq!(
        p["spec"]["containers"],
        json!([{"name": "solo", "image": "x"}])
    );
    assert!(!p.to_string().contains('$'));
}

#[test]
fn smp_retain_keys() {
    let mut v =
        json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}});
    strategic_merge_patch(
        &mut v,
        &json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
    )
    .unwrap();
    assert_eq!(v, json!({"spec": {"strategy": {"type": "Recreate"}}}));
}

#[test]
fn smp_new_subtrees_are_cleaned_of_directives_and_nulls() {
    let mut v = json!({"metadata": {"name": "x"}});
    strategic_merge_patch(
        &mut v,
        &json!({"spec": {
            "containers": [{"name": "a", "env": [{"name": "E", "value": "1"}, {"name": "F", "$patch": "delete"}],
                            "$setElementOrder/env": [{"name": "E"}]}],
            "nodeSelector": {"x": null, "y": "1"}
        }}),
    )
    .unwrap();
    assert_eq!(
        v["spec"],
        json!({"containers": [{"name": "a", "env": [{"name": "E", "value": "1"}]}], "nodeSelector": {"y": "1"}})
    );
}

#[test]
fn smp_errors_are_atomic() {
    let original = pod();
    let mut p = original.clone();
    let err = strategic_merge_patch(
        &mut p,
        &json!({"metadata": {"labels": {"x": "y"}}, "spec": {"containers": [{"image": "nameless"}]}}),
    )
    .unwrap_err();
    assert!(err.to_string().contains("merge key \"name\""), "{err}");
    assert_eq!(p, original);
    assert!(strategic_merge_patch(&mut p, &json!({"spec": {"$patch": "bogus"}})).is_err());
    assert!(strategic_merge_patch(&mut p, &json!([1])).is_err());
}

#[test]
fn conflict_display_lists_paths() {
    let e = PatchError::Conflict(vec![".spec.replicas".into()]);
    assert_eq!(
        e.to_string(),
        "Apply failed with 1 conflict: .spec.replicas"
    );
}
