//! Server-side printing: the `meta.k8s.io/v1` `Table` kube-apiserver returns when a client
//! (kubectl `get`) sends `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`.
//!
//! kubectl renders whatever columns the server sends (upper-casing the names and hiding
//! `priority > 0` unless `-o wide`), so fidelity here is what makes `kubectl get` look real.
//! Column names therefore use kube's own casing ("Name", "Cluster-IP", "Last Seen").

use crate::json_ptr::Ptr;
pub use crate::jsonpath::{json_path, json_path_all};
use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use serde_json::{Map, Value, json};

/// One printer column, as in a CRD's additionalPrinterColumns.
///
/// `json_path` is evaluated per object, except that built-in columns whose cell needs logic
/// (pod READY, service PORT(S), …) carry an internal `#marker` instead. A CRD path starting
/// with `#` (invalid JSONPath anyway) is rewritten to `#`, which yields null cells.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    /// `string` | `integer` | `number` | `boolean` | `date`.
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

const API: &str = "meta.k8s.io/v1";
const NAME_DESC: &str = "Name must be unique within a namespace. More info: \
    https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const CREATED_DESC: &str =
    "CreationTimestamp is a timestamp representing the server time when this object was created.";

fn col(name: &str, type_: &str, json_path: &str, priority: i64) -> Column {
    let (name, type_, json_path) = (name.into(), type_.into(), json_path.into());
    Column {
        name,
        type_,
        format: String::new(),
        description: String::new(),
        priority,
        json_path,
    }
}
fn s(name: &str, json_path: &str) -> Column {
    col(name, "string", json_path, 0)
}
fn name_col(priority: i64) -> Column {
    let c = col("Name", "string", ".metadata.name", priority);
    Column {
        format: "name".into(),
        description: NAME_DESC.into(),
        ..c
    }
}
fn created(name: &str, type_: &str, json_path: &str) -> Column {
    Column {
        description: CREATED_DESC.into(),
        ..col(name, type_, json_path, 0)
    }
}

/// Columns for built-in kinds by resource plural, mirroring kube's `printers.go` (names as kube
/// spells them, a few `-o wide` extras at priority 1). Name is first everywhere except events,
/// where kube puts it last at priority 1; unknown plurals get Name + Age.
pub fn columns_for_builtin(plural: &str) -> Vec<Column> {
    let age = || created("Age", "string", "#age");
    let rest = match plural {
        "pods" => vec![
            s("Ready", "#pod-ready"),
            s("Status", "#pod-status"),
            s("Restarts", "#pod-restarts"),
            age(),
            col("IP", "string", ".status.podIP", 1),
            col("Node", "string", ".spec.nodeName", 1),
        ],
        "services" => vec![
            s("Type", ".spec.type"),
            s("Cluster-IP", ".spec.clusterIP"),
            s("External-IP", "#svc-external-ip"),
            s("Port(s)", "#svc-ports"),
            age(),
            col("Selector", "string", "#svc-selector", 1),
        ],
        "namespaces" => vec![s("Status", ".status.phase"), age()],
        "configmaps" => vec![col("Data", "integer", "#data-count", 0), age()],
        "secrets" => vec![
            s("Type", ".type"),
            col("Data", "integer", "#data-count", 0),
            age(),
        ],
        "persistentvolumeclaims" => vec![
            s("Status", "#pvc-status"),
            s("Volume", ".spec.volumeName"),
            s("Capacity", "#pvc-capacity"),
            s("Access Modes", "#pvc-access-modes"),
            age(),
            col("StorageClass", "string", ".spec.storageClassName", 1),
        ],
        "events" => {
            let (last, obj) = (
                s("Last Seen", "#event-last-seen"),
                s("Object", "#event-object"),
            );
            let (ty, reason, msg) = (
                s("Type", ".type"),
                s("Reason", ".reason"),
                s("Message", ".message"),
            );
            return vec![last, ty, reason, obj, msg, name_col(1)];
        }
        "leases" => vec![s("Holder", ".spec.holderIdentity"), age()],
        "storageclasses" => {
            let name = Column {
                json_path: "#sc-name".into(),
                ..name_col(0)
            };
            return vec![
                name,
                s("Provisioner", ".provisioner"),
                s("ReclaimPolicy", ".reclaimPolicy"),
                s("VolumeBindingMode", ".volumeBindingMode"),
                s("AllowVolumeExpansion", "#sc-expansion"),
                age(),
            ];
        }
        "nodes" => vec![
            s("Status", "#node-status"),
            s("Roles", "#node-roles"),
            age(),
            s("Version", ".status.nodeInfo.kubeletVersion"),
            col("Internal-IP", "string", "#node-internal-ip", 1),
            col("External-IP", "string", "#node-external-ip", 1),
            col("OS-Image", "string", ".status.nodeInfo.osImage", 1),
            col(
                "Kernel-Version",
                "string",
                ".status.nodeInfo.kernelVersion",
                1,
            ),
            col(
                "Container-Runtime",
                "string",
                ".status.nodeInfo.containerRuntimeVersion",
                1,
            ),
        ],
        // kube's default table convertor: an absolute RFC3339 time ("CREATED AT").
        "customresourcedefinitions" => vec![created("Created At", "date", "#created-at")],
        _ => vec![age()],
    };
    std::iter::once(name_col(0)).chain(rest).collect()
}

/// CRD columns: Name + additionalPrinterColumns, or Name + Age when there are none (kube's
/// `serveDefaultColumnsIfEmpty`; it does not append Age to a non-empty list).
pub fn columns_for_crd(additional_printer_columns: &[Value]) -> Vec<Column> {
    let mut cols = vec![name_col(0)];
    if additional_printer_columns.is_empty() {
        cols.push(created("Age", "date", ".metadata.creationTimestamp"));
    }
    for v in additional_printer_columns {
        let s = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (ty, path) = (s("type"), s("jsonPath"));
        cols.push(Column {
            type_: if ty.is_empty() { "string".into() } else { ty },
            format: s("format"),
            description: s("description"),
            json_path: if path.starts_with('#') {
                "#".into()
            } else {
                path
            },
            ..col(
                &s("name"),
                "",
                "",
                v.get("priority").and_then(Value::as_i64).unwrap_or(0),
            )
        });
    }
    cols
}

/// Builds the Table. `include_object`: "None" omits each row's `object`, "Object" embeds the
/// full object, anything else (kubectl's default "Metadata") a PartialObjectMetadata, which
/// kubectl needs for `-A` (NAMESPACE column) and `--show-labels`. Only ListMeta fields of
/// `list_meta` are copied.
pub fn build_table(
    columns: &[Column],
    objects: &[Value],
    include_object: &str,
    list_meta: Value,
    now: DateTime<Utc>,
) -> Value {
    let def = |c: &Column| {
        let (name, format, desc, prio) = (&c.name, &c.format, &c.description, c.priority);
        json!({"name": name, "type": c.type_, "format": format, "description": desc, "priority": prio})
    };
    let row = |o: &Value| {
        let mut row = Map::new();
        row.insert(
            "cells".into(),
            columns.iter().map(|c| cell(c, o, now)).collect(),
        );
        let meta = o.get("metadata").cloned().unwrap_or_else(|| json!({}));
        let partial =
            || json!({"kind": "PartialObjectMetadata", "apiVersion": API, "metadata": meta});
        let object = match include_object {
            "None" => None,
            "Object" => Some(o.clone()),
            _ => Some(partial()),
        };
        row.extend(object.map(|obj| ("object".to_owned(), obj)));
        Value::Object(row)
    };
    let keep = [
        "resourceVersion",
        "continue",
        "remainingItemCount",
        "selfLink",
    ];
    let pick = |&k: &&str| Some((k.to_owned(), list_meta.get(k)?.clone()));
    let meta: Map<_, _> = keep.iter().filter_map(pick).collect();
    let defs: Vec<_> = columns.iter().map(def).collect();
    let rows: Vec<_> = objects.iter().map(row).collect();
    let (kind, api) = ("Table", API);
    json!({"kind": kind, "apiVersion": api, "metadata": meta, "columnDefinitions": defs, "rows": rows})
}

/// kube's `duration.HumanDuration`: at most two units, "<invalid>" when the timestamp is more
/// than a second in the future (up to 1s of clock skew reads as "0s").
pub fn human_duration(d: TimeDelta) -> String {
    let secs = d.num_milliseconds() / 1000;
    if secs < -1 {
        return "<invalid>".into();
    }
    let secs = secs.max(0);
    let (mins, hours) = (secs / 60, secs / 3600);
    let (days, years) = (hours / 24, hours / 24 / 365);
    let two = |a: i64, au: &str, b: i64, bu: &str| match b {
        0 => format!("{a}{au}"),
        _ => format!("{a}{au}{b}{bu}"),
    };
    match () {
        _ if secs < 120 => format!("{secs}s"),
        _ if mins < 10 => two(mins, "m", secs % 60, "s"),
        _ if mins < 180 => format!("{mins}m"),
        _ if hours < 8 => two(hours, "h", mins % 60, "m"),
        _ if hours < 48 => format!("{hours}h"),
        _ if hours < 24 * 8 => two(days, "d", hours % 24, "h"),
        _ if hours < 24 * 365 * 2 => format!("{days}d"),
        _ if hours < 24 * 365 * 8 => two(years, "y", days % 365, "d"),
        _ => format!("{years}y"),
    }
}

fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// Age of an RFC3339 timestamp; kube prints "<unknown>" for a zero/absent time.
fn age(ts: Option<&str>, now: DateTime<Utc>) -> Value {
    ts.and_then(parse_time)
        .map_or_else(|| "<unknown>".into(), |t| human_duration(now - t).into())
}

fn cell(c: &Column, obj: &Value, now: DateTime<Utc>) -> Value {
    if let Some(marker) = c.json_path.strip_prefix('#') {
        return builtin_cell(marker, obj, now);
    }
    // Typing as in the apiextensions tableconvertor (`cellForJSONValue`); date → age string.
    match (c.type_.as_str(), json_path(obj, &c.json_path)) {
        (_, None | Some(Value::Null)) => Value::Null,
        ("string", Some(v @ Value::String(_))) | ("boolean", Some(v @ Value::Bool(_))) => v,
        ("string", Some(v)) => v.to_string().into(),
        ("integer", Some(Value::Number(n))) => n.as_i64().or(n.as_f64().map(|f| f as i64)).into(),
        ("number", Some(Value::Number(n))) => n.as_f64().into(),
        ("date", Some(Value::String(ts))) => {
            parse_time(&ts).map_or_else(|| "<invalid>".into(), |t| human_duration(now - t).into())
        }
        _ => Value::Null,
    }
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.ptr(ptr).and_then(Value::as_str).filter(|s| !s.is_empty())
}
fn arr<'a>(v: &'a Value, ptr: &str) -> &'a [Value] {
    v.ptr(ptr)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}
fn obj_len(v: &Value, ptr: &str) -> usize {
    v.ptr(ptr).and_then(Value::as_object).map_or(0, Map::len)
}
fn join_or(items: Vec<String>, empty: &str) -> Value {
    if items.is_empty() {
        empty.into()
    } else {
        items.join(",").into()
    }
}

/// Computed cells for built-in kinds, following kube's `printers.go`.
fn builtin_cell(marker: &str, o: &Value, now: DateTime<Utc>) -> Value {
    let statuses = arr(o, "/status/containerStatuses");
    let deleting = o
        .ptr("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null());
    let bound = str_at(o, "/spec/volumeName").is_some();
    let strs = |v: &Value, ptr: &str| {
        arr(v, ptr)
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    match marker {
        "age" => age(str_at(o, "/metadata/creationTimestamp"), now),
        "created-at" => str_at(o, "/metadata/creationTimestamp")
            .and_then(parse_time)
            .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
            .into(),
        m if m.starts_with("node-") => crate::nodes::printer_cell(m, o).into(),
        "pod-ready" => {
            let ready = statuses.iter().filter(|s| s["ready"] == true).count();
            let total = arr(o, "/spec/containers").len().max(statuses.len());
            format!("{ready}/{total}").into()
        }
        "pod-status" | "pvc-status" if deleting => "Terminating".into(),
        "pod-status" => {
            // Apiserver defaulting sets Pending on create; container reasons (CrashLoopBackOff,
            // Completed, …) override the phase, the first container winning as in kube.
            let phase = str_at(o, "/status/reason").or(str_at(o, "/status/phase"));
            let waiting = statuses.iter().find_map(|cs| {
                str_at(cs, "/state/waiting/reason").or(str_at(cs, "/state/terminated/reason"))
            });
            waiting.or(phase).unwrap_or("Pending").into()
        }
        "pod-restarts" => {
            let restarts: i64 = statuses
                .iter()
                .filter_map(|s| s["restartCount"].as_i64())
                .sum();
            let finished = |s| str_at(s, "/lastState/terminated/finishedAt").and_then(parse_time);
            match statuses.iter().filter_map(finished).max() {
                Some(t) if restarts != 0 => format!("{restarts} ({} ago)", human_duration(now - t)),
                _ => restarts.to_string(),
            }
            .into()
        }
        "svc-external-ip" => {
            let mut ips = strs(o, "/spec/externalIPs");
            match str_at(o, "/spec/type").unwrap_or("ClusterIP") {
                "ClusterIP" | "NodePort" => join_or(ips, "<none>"),
                "LoadBalancer" => {
                    let ingress = arr(o, "/status/loadBalancer/ingress").iter();
                    let addr = |i| {
                        str_at(i, "/ip")
                            .or(str_at(i, "/hostname"))
                            .map(String::from)
                    };
                    ips.extend(ingress.filter_map(addr));
                    join_or(ips, "<pending>")
                }
                "ExternalName" => str_at(o, "/spec/externalName").into(),
                _ => "<unknown>".into(),
            }
        }
        "svc-ports" => {
            let port = |p: &Value| {
                let (port, proto) = (&p["port"], str_at(p, "/protocol").unwrap_or("TCP"));
                match p["nodePort"].as_i64().filter(|n| *n != 0) {
                    Some(node_port) => format!("{port}:{node_port}/{proto}"),
                    None => format!("{port}/{proto}"),
                }
            };
            join_or(arr(o, "/spec/ports").iter().map(port).collect(), "<none>")
        }
        "svc-selector" => {
            // serde_json maps iterate in key order, matching kube's sorted `FormatLabels`.
            let sel = o
                .ptr("/spec/selector")
                .and_then(Value::as_object)
                .into_iter()
                .flatten();
            let pairs = sel.map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()));
            join_or(pairs.collect(), "<none>")
        }
        // kube marks the default class after its name.
        "sc-name" => match str_at(
            o,
            "/metadata/annotations/storageclass.kubernetes.io~1is-default-class",
        ) {
            Some("true") => format!(
                "{} (default)",
                str_at(o, "/metadata/name").unwrap_or_default()
            ),
            _ => str_at(o, "/metadata/name").unwrap_or_default().to_string(),
        }
        .into(),
        "sc-expansion" => o["allowVolumeExpansion"]
            .as_bool()
            .unwrap_or(false)
            .to_string()
            .into(),
        "data-count" => (obj_len(o, "/data") + obj_len(o, "/binaryData")).into(),
        "pvc-status" => str_at(o, "/status/phase").unwrap_or("Pending").into(),
        // kube shows capacity and access modes only once the claim is bound to a volume.
        "pvc-capacity" | "pvc-access-modes" if !bound => "".into(),
        "pvc-capacity" => str_at(o, "/status/capacity/storage")
            .unwrap_or_default()
            .into(),
        "pvc-access-modes" => {
            let modes = strs(o, "/status/accessModes");
            let all = [
                ("ReadWriteOnce", "RWO"),
                ("ReadOnlyMany", "ROX"),
                ("ReadWriteMany", "RWX"),
                ("ReadWriteOncePod", "RWOP"),
            ];
            let present = all.iter().filter(|(m, _)| modes.iter().any(|x| x == m));
            present
                .map(|(_, short)| *short)
                .collect::<Vec<_>>()
                .join(",")
                .into()
        }
        "event-last-seen" => {
            let paths = ["/series/lastObservedTime", "/lastTimestamp", "/eventTime"];
            age(paths.iter().find_map(|p| str_at(o, p)), now)
        }
        "event-object" => {
            let r = o
                .get("involvedObject")
                .or(o.get("regarding"))
                .unwrap_or(&Value::Null);
            let kind = str_at(r, "/kind").unwrap_or_default().to_lowercase();
            format!("{kind}/{}", str_at(r, "/name").unwrap_or_default()).into()
        }
        _ => Value::Null,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "table_tests.rs"]
mod tests;
