use super::*;

#[test]
fn events_shape_round_trips_through_the_core_shape() {
    let ev = json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "orders.1", "namespace": "shop"},
        "regarding": {"kind": "PostgresCluster", "name": "orders"},
        "note": "failover to orders-1", "reason": "Failover", "action": "Failover",
        "reportingController": "pgfleet", "reportingInstance": "pgfleet-0",
        "eventTime": "2026-01-01T00:00:00.000000Z", "type": "Warning",
        "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"},
        "deprecatedCount": 3, "deprecatedSource": {"component": "x"},
    });
    let core = core_view(&to_core(&ev));
    assert_eq!(core["apiVersion"], "v1");
    assert_eq!(core["involvedObject"]["name"], "orders");
    assert_eq!(core["message"], "failover to orders-1");
    assert_eq!(core["reportingComponent"], "pgfleet");
    assert_eq!(core["reportingInstance"], "pgfleet-0");
    assert_eq!(core["count"], 3);
    assert_eq!(core["source"]["component"], "x");
    assert_eq!(core["series"]["count"], 2);
    assert_eq!(core["lastTimestamp"], Value::Null);
    assert!(core.get("regarding").is_none() && core.get("note").is_none());
    let back = to_events(&core);
    for k in [
        "regarding",
        "note",
        "reportingController",
        "series",
        "eventTime",
        "action",
    ] {
        assert_eq!(back[k], ev[k], "{k}");
    }
    assert_eq!(back["apiVersion"], "events.k8s.io/v1");
}

#[test]
fn core_events_get_the_events_zero_values() {
    let core = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "a"},
        "involvedObject": {"kind": "Pod", "name": "p"}, "message": "m", "count": 1,
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:05Z",
        "source": {"component": "kubectl", "host": "h"}});
    let ev = to_events(&core);
    assert_eq!(ev["deprecatedLastTimestamp"], "2026-01-01T00:00:05Z");
    assert_eq!(ev["deprecatedSource"]["host"], "h");
    assert_eq!(ev["deprecatedCount"], 1);
    assert_eq!(ev["eventTime"], Value::Null);
    assert_eq!(ev["note"], "m");
}

#[test]
fn field_labels_follow_kubes_tables() {
    assert_eq!(core_field_path("source").unwrap(), "source.component");
    assert_eq!(
        core_field_path("involvedObject.uid").unwrap(),
        "involvedObject.uid"
    );
    assert_eq!(
        core_field_path("message").unwrap_err(),
        "field label not supported: message"
    );
    assert_eq!(
        events_label_to_core("regarding.name").unwrap(),
        "involvedObject.name"
    );
    assert_eq!(
        events_label_to_core("reportingController").unwrap(),
        "reportingComponent"
    );
    assert!(events_label_to_core("involvedObject.name").is_err());
    let sel = rewrite_field_selector(
        "regarding.name=a\\,b,type!=Normal,reason==X",
        events_label_to_core,
    )
    .unwrap();
    assert_eq!(sel, "involvedObject.name=a\\,b,type!=Normal,reason==X");
}

#[test]
fn json_patches_are_aimed_at_the_core_fields() {
    let p = json!([{"op": "replace", "path": "/note", "value": "x"},
        {"op": "copy", "from": "/regarding/name", "path": "/series/count"}]);
    let c = json_patch_to_core(&p);
    assert_eq!(c[0]["path"], "/message");
    assert_eq!(c[1]["from"], "/involvedObject/name");
    assert_eq!(c[1]["path"], "/series/count");
}
