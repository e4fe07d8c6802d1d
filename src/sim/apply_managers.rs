//! `metadata.managedFields` read and written (`apply.rs`): one entry per
//! manager and operation, in kube's order.

use super::FieldSet;
use crate::json_ptr::Ptr;
use serde_json::{Map, Value};

/// One managedFields entry; unknown keys (e.g. `subresource`) are carried through.
#[derive(Debug, Clone)]
pub(super) struct ManagerEntry {
    pub(super) manager: String,
    pub(super) operation: String,
    pub(super) api_version: String,
    pub(super) time: Option<Value>,
    pub(super) set: FieldSet,
    pub(super) extra: Map<String, Value>,
}

impl ManagerEntry {
    pub(super) fn is(&self, manager: &str, operation: &str) -> bool {
        self.manager == manager && self.operation == operation
    }

    pub(super) fn to_json(&self) -> Value {
        let mut m = self.extra.clone();
        m.insert("manager".into(), Value::String(self.manager.clone()));
        m.insert("operation".into(), Value::String(self.operation.clone()));
        m.insert("apiVersion".into(), Value::String(self.api_version.clone()));
        if let Some(time) = &self.time {
            m.insert("time".into(), time.clone());
        }
        m.insert("fieldsType".into(), Value::String("FieldsV1".into()));
        m.insert("fieldsV1".into(), self.set.to_fields_v1());
        Value::Object(m)
    }
}

pub(super) fn parse_managers(obj: &Value) -> Vec<ManagerEntry> {
    let Some(entries) = obj.ptr("/metadata/managedFields").and_then(Value::as_array) else {
        return Vec::new();
    };
    let text = |m: &Map<String, Value>, k: &str| {
        m.get(k).and_then(Value::as_str).unwrap_or("").to_string()
    };
    entries
        .iter()
        .filter_map(Value::as_object)
        .map(|m| ManagerEntry {
            manager: text(m, "manager"),
            operation: text(m, "operation"),
            api_version: text(m, "apiVersion"),
            time: m.get("time").cloned(),
            set: m
                .get("fieldsV1")
                .map(FieldSet::from_fields_v1)
                .unwrap_or_default(),
            extra: m
                .iter()
                .filter(|(k, _)| {
                    !matches!(
                        k.as_str(),
                        "manager" | "operation" | "apiVersion" | "time" | "fieldsType" | "fieldsV1"
                    )
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        })
        .collect()
}

/// Writes the entries in kube's order (Apply before Update, then by time, manager,
/// apiVersion), dropping empty ones; removes `managedFields` entirely when none remain.
pub(super) fn write_managers(obj: &mut Value, mut entries: Vec<ManagerEntry>) {
    entries.retain(|e| !e.set.is_empty());
    entries.sort_by(|a, b| {
        let time = |e: &ManagerEntry| {
            e.time
                .as_ref()
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        (&a.operation, time(a), &a.manager, &a.api_version).cmp(&(
            &b.operation,
            time(b),
            &b.manager,
            &b.api_version,
        ))
    });
    let Value::Object(root) = obj else { return };
    if entries.is_empty() {
        if let Some(Value::Object(meta)) = root.get_mut("metadata") {
            meta.remove("managedFields");
        }
        return;
    }
    let meta = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(meta) = meta {
        let list = entries.iter().map(ManagerEntry::to_json).collect();
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

pub(super) fn without_managed_fields(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(Value::Object(meta)) = v.get_mut("metadata") {
        meta.remove("managedFields");
    }
    v
}

pub(super) fn api_version_of(v: &Value) -> String {
    v.get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}
