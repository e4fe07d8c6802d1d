//! One Event, two groups: kube-apiserver stores an Event once (as the core
//! type) and serves it as `v1` Event and as `events.k8s.io/v1` Event. The
//! two shapes differ only in top-level field names, so conversion is a
//! rename of top-level keys plus the zero values kube's JSON encoder writes
//! for non-pointer fields (`source: {}`, `firstTimestamp: null`, ...), which
//! kubectl's `--sort-by` and `describe` rely on.
//!
//! The field-label tables follow kube's `pkg/apis/core/v1` and
//! `pkg/apis/events/v1` conversions: the core group selects on
//! `involvedObject.*`, `reason`, `reportingComponent`, `source`, `type`; the
//! events group on `regarding.*`, `reason`, `reportingController`, `type`
//! (translated to the core labels, since the stored object is the core one).

use serde_json::{Map, Value, json};

/// (events.k8s.io/v1 name, core/v1 name) of the fields whose names differ.
const RENAMES: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
    ("reportingController", "reportingComponent"),
];

/// The `metadata.*` labels every kind supports.
const META_LABELS: &[&str] = &["metadata.name", "metadata.namespace"];

/// The `involvedObject.*` / `regarding.*` reference fields that are selectable.
const REF_FIELDS: &[&str] = &[
    "kind",
    "namespace",
    "name",
    "uid",
    "apiVersion",
    "resourceVersion",
    "fieldPath",
];

/// The apiVersion of Events served by the events group.
pub const EVENTS_API_VERSION: &str = "events.k8s.io/v1";

fn rename_keys(v: &Value, from_events: bool) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, x) in v.as_object().into_iter().flatten() {
        let renamed = RENAMES.iter().find_map(|(ev, core)| {
            if from_events {
                (k == ev).then_some(*core)
            } else {
                (k == core).then_some(*ev)
            }
        });
        out.insert(renamed.unwrap_or(k).to_string(), x.clone());
    }
    out
}

/// An `events.k8s.io/v1` Event (a request body or a stored legacy object) in
/// the core shape the store keeps.
pub fn to_core(v: &Value) -> Value {
    let mut out = rename_keys(v, true);
    out.insert("apiVersion".into(), json!("v1"));
    if out.contains_key("kind") || v.get("metadata").is_some() {
        out.insert("kind".into(), json!("Event"));
    }
    Value::Object(out)
}

/// A stored (core) Event as the events group serves it.
pub fn to_events(v: &Value) -> Value {
    if v.get("apiVersion").and_then(Value::as_str) == Some(EVENTS_API_VERSION) {
        return v.clone();
    }
    let mut out = rename_keys(v, false);
    out.insert("apiVersion".into(), json!(EVENTS_API_VERSION));
    out.insert("kind".into(), json!("Event"));
    for k in [
        "eventTime",
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
    ] {
        out.entry(k).or_insert(Value::Null);
    }
    for k in ["regarding", "deprecatedSource"] {
        out.entry(k).or_insert_with(|| json!({}));
    }
    Value::Object(out)
}

/// A stored Event as the core group serves it: old stores may hold the
/// events-group shape, and kube's encoder writes the zero values of the
/// non-pointer fields.
pub fn core_view(v: &Value) -> Value {
    let mut out = match v.get("apiVersion").and_then(Value::as_str) {
        Some(EVENTS_API_VERSION) => to_core(v),
        _ => v.clone(),
    };
    if let Some(m) = out.as_object_mut() {
        for k in ["eventTime", "firstTimestamp", "lastTimestamp"] {
            m.entry(k).or_insert(Value::Null);
        }
        for k in ["involvedObject", "source"] {
            m.entry(k).or_insert_with(|| json!({}));
        }
        for k in ["reportingComponent", "reportingInstance"] {
            m.entry(k).or_insert_with(|| json!(""));
        }
    }
    out
}

/// A JSON patch written against the events shape, aimed at the core shape
/// (each op's `path` and `from` get their first segment renamed).
pub fn json_patch_to_core(p: &Value) -> Value {
    let rename_path = |s: &str| -> String {
        let rest = s.strip_prefix('/').unwrap_or(s);
        let (first, tail) = match rest.split_once('/') {
            Some((f, t)) => (f, Some(t)),
            None => (rest, None),
        };
        let first = RENAMES
            .iter()
            .find_map(|(ev, core)| (*ev == first).then_some(*core))
            .unwrap_or(first);
        match tail {
            Some(t) => format!("/{first}/{t}"),
            None => format!("/{first}"),
        }
    };
    let ops = p.as_array().into_iter().flatten().map(|op| {
        let mut op = op.clone();
        for k in ["path", "from"] {
            if let Some(s) = op.get(k).and_then(Value::as_str) {
                op[k] = json!(rename_path(s));
            }
        }
        op
    });
    Value::Array(ops.collect())
}

/// The stored-object path a field label of the core group selects on, or
/// kube's error for a label it does not support.
pub fn core_field_path(label: &str) -> Result<String, String> {
    if META_LABELS.contains(&label) || ["reason", "reportingComponent", "type"].contains(&label) {
        return Ok(label.to_string());
    }
    if label == "source" {
        return Ok("source.component".into());
    }
    match label.strip_prefix("involvedObject.") {
        Some(f) if REF_FIELDS.contains(&f) => Ok(label.to_string()),
        _ => Err(format!("field label not supported: {label}")),
    }
}

/// The core label an events-group field label stands for.
pub fn events_label_to_core(label: &str) -> Result<String, String> {
    if META_LABELS.contains(&label) || ["reason", "type"].contains(&label) {
        return Ok(label.to_string());
    }
    if label == "reportingController" {
        return Ok("reportingComponent".into());
    }
    match label.strip_prefix("regarding.") {
        Some(f) if REF_FIELDS.contains(&f) => Ok(format!("involvedObject.{f}")),
        _ => Err(format!("field label not supported: {label}")),
    }
}

/// Rewrites the labels of a field selector with `map` (values and escapes
/// are kept; labels never contain `,` or `=`).
pub fn rewrite_field_selector(
    sel: &str,
    map: impl Fn(&str) -> Result<String, String>,
) -> Result<String, String> {
    let mut terms = vec![];
    let mut start = 0;
    let mut slash = false;
    let mut pieces = vec![];
    for (i, c) in sel.char_indices() {
        match c {
            _ if slash => slash = false,
            '\\' => slash = true,
            ',' => {
                pieces.push(&sel[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    pieces.push(&sel[start..]);
    for t in pieces {
        let Some(i) = t.find(['=', '!']) else {
            terms.push(t.to_string());
            continue;
        };
        let label = t[..i].trim();
        if label.is_empty() {
            terms.push(t.to_string());
            continue;
        }
        terms.push(format!("{}{}", map(label)?, &t[i..]));
    }
    Ok(terms.join(","))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "events_tests.rs"]
mod tests;
