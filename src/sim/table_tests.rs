//! Unit tests of `table.rs`.

use super::*;

fn now() -> DateTime<Utc> {
    parse_time("2024-05-10T12:00:00Z").unwrap()
}
fn names(cols: &[Column]) -> Vec<&str> {
    cols.iter().map(|c| c.name.as_str()).collect()
}
/// Cells of the single row `obj` yields under `cols`.
fn row(cols: &[Column], obj: &Value) -> Vec<Value> {
    let t = build_table(cols, std::slice::from_ref(obj), "None", json!({}), now());
    t["rows"][0]["cells"].as_array().unwrap().clone()
}
fn cells(plural: &str, obj: Value) -> Vec<Value> {
    row(&columns_for_builtin(plural), &obj)
}

#[test]
fn human_duration_matches_kube() {
    let cases = [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (5, "5s"),
        (119, "119s"),
        (120, "2m"),
        (200, "3m20s"),
        (900, "15m"),
        (10_799, "179m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 300, "3h5m"),
        (10 * 3600, "10h"),
        (2 * 86400, "2d"),
        (2 * 86400 + 5 * 3600, "2d5h"),
        (10 * 86400, "10d"),
        (730 * 86400, "2y"),
        (740 * 86400, "2y10d"),
        (9 * 365 * 86400, "9y"),
    ];
    for (secs, want) in cases {
        assert_eq!(human_duration(TimeDelta::seconds(secs)), want, "{secs}s");
    }
}

#[test]
fn builtin_column_sets() {
    // `*` marks priority-1 (`-o wide`) columns.
    let want: [(&str, &[&str]); 10] = [
        (
            "pods",
            &["Name", "Ready", "Status", "Restarts", "Age", "IP*", "Node*"],
        ),
        (
            "services",
            &[
                "Name",
                "Type",
                "Cluster-IP",
                "External-IP",
                "Port(s)",
                "Age",
                "Selector*",
            ],
        ),
        ("namespaces", &["Name", "Status", "Age"]),
        ("configmaps", &["Name", "Data", "Age"]),
        ("secrets", &["Name", "Type", "Data", "Age"]),
        (
            "persistentvolumeclaims",
            &[
                "Name",
                "Status",
                "Volume",
                "Capacity",
                "Access Modes",
                "Age",
                "StorageClass*",
            ],
        ),
        (
            "events",
            &["Last Seen", "Type", "Reason", "Object", "Message", "Name*"],
        ),
        ("leases", &["Name", "Holder", "Age"]),
        ("customresourcedefinitions", &["Name", "Created At"]),
        ("statefulsets", &["Name", "Age"]),
    ];
    for (plural, want) in want {
        let cols = columns_for_builtin(plural);
        let star = |c: &Column| format!("{}{}", c.name, if c.priority > 0 { "*" } else { "" });
        assert_eq!(cols.iter().map(star).collect::<Vec<_>>(), want, "{plural}");
        let name = cols.iter().find(|c| c.name == "Name").unwrap();
        assert_eq!(
            (name.type_.as_str(), name.format.as_str()),
            ("string", "name")
        );
    }
}

#[test]
fn crd_columns_and_cells() {
    let empty = columns_for_crd(&[]);
    assert_eq!(names(&empty), ["Name", "Age"]);
    assert_eq!(
        (&*empty[1].type_, &*empty[1].json_path),
        ("date", ".metadata.creationTimestamp")
    );
    let apc = [
        json!({"name": "Size", "type": "integer", "jsonPath": ".spec.size", "priority": 1, "description": "d"}),
        json!({"name": "Phase", "jsonPath": ".status.phase"}),
        json!({"name": "Sneaky", "type": "string", "jsonPath": "#age"}),
    ];
    let cols = columns_for_crd(&apc);
    assert_eq!(names(&cols), ["Name", "Size", "Phase", "Sneaky"]);
    assert_eq!(
        (cols[1].priority, &*cols[1].description, &*cols[2].type_),
        (1, "d", "string")
    );
    let obj = json!({"metadata": {"name": "c", "creationTimestamp": "2024-05-10T11:59:00Z"}, "spec": {"size": 3}});
    assert_eq!(
        row(&cols, &obj),
        [json!("c"), json!(3), Value::Null, Value::Null]
    );
    assert_eq!(row(&empty, &obj), [json!("c"), json!("60s")]);
}

#[test]
fn crd_cell_typing() {
    let obj = json!({"metadata": {"name": "c", "creationTimestamp": "2024-05-08T12:00:00Z"},
        "spec": {"n": 3, "f": 2.5, "b": true, "s": "x", "o": {"k": 1}, "bad": "yesterday", "nul": null}});
    let one = |ty: &str, path: &str| {
        row(
            &columns_for_crd(&[json!({"name": "C", "type": ty, "jsonPath": path})]),
            &obj,
        )[1]
        .clone()
    };
    let cases = [
        ("integer", ".spec.n", json!(3)),
        ("integer", ".spec.f", json!(2)),
        ("integer", ".spec.s", Value::Null),
        ("number", ".spec.n", json!(3.0)),
        ("boolean", ".spec.b", json!(true)),
        ("boolean", ".spec.s", Value::Null),
        ("string", ".spec.n", json!("3")),
        ("string", ".spec.o", json!("{\"k\":1}")),
        ("string", ".spec.nul", Value::Null),
        ("string", ".spec.missing", Value::Null),
        ("date", ".metadata.creationTimestamp", json!("2d")),
        ("date", ".spec.bad", json!("<invalid>")),
        ("weird", ".spec.s", Value::Null),
    ];
    for (ty, path, want) in cases {
        assert_eq!(one(ty, path), want, "{ty} {path}");
    }
}

#[test]
fn table_shape_and_include_object_modes() {
    let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cm", "namespace": "db", "creationTimestamp": "2024-05-10T11:59:55Z"},
        "data": {"a": "1", "b": "2"}, "binaryData": {"c": ""}});
    let (cols, one) = (
        columns_for_builtin("configmaps"),
        std::slice::from_ref(&obj),
    );
    let meta = json!({"resourceVersion": "42", "continue": "tok", "junk": 1});
    let t = build_table(&cols, one, "Metadata", meta, now());
    assert_eq!(
        (&t["kind"], &t["apiVersion"]),
        (&json!("Table"), &json!("meta.k8s.io/v1"))
    );
    assert_eq!(
        t["metadata"],
        json!({"resourceVersion": "42", "continue": "tok"})
    );
    assert_eq!(t["columnDefinitions"][0]["format"], "name");
    let data =
        json!({"name": "Data", "type": "integer", "format": "", "description": "", "priority": 0});
    assert_eq!(t["columnDefinitions"][1], data);
    assert_eq!(t["rows"][0]["cells"], json!(["cm", 3, "5s"]));
    let partial = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]});
    assert_eq!(t["rows"][0]["object"], partial);
    assert_eq!(
        build_table(&cols, one, "", Value::Null, now())["rows"][0]["object"],
        partial
    );
    let full = build_table(&cols, one, "Object", Value::Null, now());
    assert_eq!(
        (&full["rows"][0]["object"], &full["metadata"]),
        (&obj, &json!({}))
    );
    assert!(
        build_table(&cols, one, "None", json!({}), now())["rows"][0]
            .get("object")
            .is_none()
    );
    assert_eq!(
        build_table(&cols, &[], "Metadata", json!({}), now())["rows"],
        json!([])
    );
}

#[test]
fn pod_cells() {
    let pod = json!({"metadata": {"name": "pg-0", "creationTimestamp": "2024-05-10T11:00:00Z"},
        "spec": {"containers": [{}, {}], "nodeName": "n1"},
        "status": {"phase": "Running", "podIP": "10.0.0.5", "containerStatuses": [
            {"ready": true, "restartCount": 2, "state": {"running": {}},
             "lastState": {"terminated": {"finishedAt": "2024-05-10T11:55:00Z"}}},
            {"ready": false, "restartCount": 1, "state": {"running": {}}}]}});
    let want = json!([
        "pg-0",
        "1/2",
        "Running",
        "3 (5m ago)",
        "60m",
        "10.0.0.5",
        "n1"
    ]);
    assert_eq!(cells("pods", pod.clone()), *want.as_array().unwrap());
    let mut crash = pod.clone();
    crash["status"]["containerStatuses"][1]["state"] =
        json!({"waiting": {"reason": "CrashLoopBackOff"}});
    assert_eq!(cells("pods", crash)[2], "CrashLoopBackOff");
    let mut gone = pod;
    gone["metadata"]["deletionTimestamp"] = json!("2024-05-10T11:59:00Z");
    assert_eq!(cells("pods", gone)[2], "Terminating");
    let bare = cells(
        "pods",
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{}]}}),
    );
    assert_eq!(
        bare,
        *json!(["p", "0/1", "Pending", "0", "<unknown>", null, null])
            .as_array()
            .unwrap()
    );
}

#[test]
fn service_cells() {
    let svc = |ty: &str, status: Value| {
        cells(
            "services",
            json!({"metadata": {"name": "s"}, "status": status,
            "spec": {"type": ty, "clusterIP": "10.96.0.10", "selector": {"role": "primary", "app": "pg"},
                     "ports": [{"port": 5432, "protocol": "TCP"}, {"port": 80, "nodePort": 30080}]}}),
        )
    };
    let c = svc("ClusterIP", json!({}));
    let want = ["ClusterIP", "10.96.0.10", "<none>", "5432/TCP,80:30080/TCP"].map(Value::from);
    assert_eq!(c[1..5], want);
    assert_eq!(c[6], "app=pg,role=primary");
    assert_eq!(svc("LoadBalancer", json!({}))[3], "<pending>");
    let lb = json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}, {"hostname": "lb.example"}]}});
    assert_eq!(svc("LoadBalancer", lb)[3], "1.2.3.4,lb.example");
    let ext = json!({"metadata": {"name": "e"}, "spec": {"type": "ExternalName", "externalName": "db.ex"}});
    let ext = cells("services", ext);
    assert_eq!(
        (&ext[3], &ext[4], &ext[6]),
        (&json!("db.ex"), &json!("<none>"), &json!("<none>"))
    );
}

#[test]
fn other_builtin_cells() {
    let ts = "2024-05-10T10:00:00Z";
    let ns =
        json!({"metadata": {"name": "db", "creationTimestamp": ts}, "status": {"phase": "Active"}});
    assert_eq!(
        cells("namespaces", ns),
        [json!("db"), json!("Active"), json!("120m")]
    );
    let sec = cells(
        "secrets",
        json!({"metadata": {"name": "s"}, "type": "Opaque", "data": {"a": ""}}),
    );
    assert_eq!(sec[1..3], [json!("Opaque"), json!(1)]);
    let pvc = json!({"metadata": {"name": "data-pg-0"}, "spec": {"volumeName": "pv-1"},
        "status": {"phase": "Bound", "capacity": {"storage": "1Gi"},
                   "accessModes": ["ReadWriteMany", "ReadWriteOnce"]}});
    let pvc = cells("persistentvolumeclaims", pvc);
    assert_eq!(
        pvc[1..5],
        [
            json!("Bound"),
            json!("pv-1"),
            json!("1Gi"),
            json!("RWO,RWX")
        ]
    );
    let pending = json!({"metadata": {"name": "p", "deletionTimestamp": ts}});
    let pending = cells("persistentvolumeclaims", pending);
    assert_eq!(
        pending[1..5],
        [json!("Terminating"), Value::Null, json!(""), json!("")]
    );
    let ev = json!({"metadata": {"name": "pg-0.17"}, "type": "Warning", "reason": "BackOff",
        "message": "m", "involvedObject": {"kind": "Pod", "name": "pg-0"},
        "lastTimestamp": "2024-05-10T11:59:30Z"});
    let want = ["30s", "Warning", "BackOff", "pod/pg-0", "m", "pg-0.17"].map(Value::from);
    assert_eq!(cells("events", ev), want);
    let series = json!({"regarding": {"kind": "Pod", "name": "x"}, "eventTime": ts,
        "series": {"lastObservedTime": "2024-05-10T11:59:50.000000Z"}});
    assert_eq!(
        cells("events", series)[..4],
        [json!("10s"), Value::Null, Value::Null, json!("pod/x")]
    );
    let lease = cells(
        "leases",
        json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "op-1"}}),
    );
    assert_eq!(lease[1], "op-1");
    let crd =
        json!({"metadata": {"name": "x.io", "creationTimestamp": "2024-05-10T10:00:00+02:00"}});
    assert_eq!(
        cells("customresourcedefinitions", crd),
        [json!("x.io"), json!("2024-05-10T08:00:00Z")]
    );
}

#[test]
fn json_path_subset() {
    let o = json!({"spec": {"clusterSize": 3}, "metadata": {"labels": {"app.kubernetes.io/name": "pg"}},
        "status": {"phase": "Ready", "instances": [{"name": "a", "n": 1}, {"name": "b", "n": 2}],
            "conditions": [{"type": "Progressing", "status": "False"},
                           {"type": "Ready", "status": "True", "x": {"y": 1}}]}});
    let cases = [
        (".spec.clusterSize", json!(3)),
        ("{.status.phase}", json!("Ready")),
        ("$.status.phase", json!("Ready")),
        ("status.phase", json!("Ready")),
        (".status.instances[0].name", json!("a")),
        (".status.instances[-1].name", json!("b")),
        (
            r#".status.conditions[?(@.type=="Ready")].status"#,
            json!("True"),
        ),
        (
            ".status.conditions[?(@.type=='Progressing')].status",
            json!("False"),
        ),
        (
            r#".status.conditions[?(@.type!="Ready")].type"#,
            json!("Progressing"),
        ),
        (".status.conditions[?(@.x.y==1)].type", json!("Ready")),
        (".status.conditions[?(@.x)].type", json!("Ready")),
        (".status.instances[?(@.n==2.0)].name", json!("b")),
        (".metadata.labels['app.kubernetes.io/name']", json!("pg")),
        (
            r#".metadata["labels"]["app.kubernetes.io/name"]"#,
            json!("pg"),
        ),
        ("{}", o.clone()),
    ];
    for (path, want) in cases {
        assert_eq!(json_path(&o, path), Some(want), "{path}");
    }
    assert_eq!(
        json_path_all(&o, ".status.instances[*].name"),
        [json!("a"), json!("b")]
    );
    assert_eq!(
        json_path_all(&o, ".status.instances.*.n"),
        [json!(1), json!(2)]
    );
    let nones = [
        ".status.instances[5].name",
        r#".status.conditions[?(@.type=="Nope")].status"#,
        "..spec",
        ".spec.",
        ".status.instances[0",
        ".status.instances[x]",
        "[?(foo)]",
        ".a[1:2]",
    ];
    for none in nones {
        assert_eq!(json_path(&o, none), None, "{none}");
    }
}
