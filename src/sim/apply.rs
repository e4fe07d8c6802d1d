//! Server-side apply and `metadata.managedFields` bookkeeping for the embedded API server.
//!
//! This follows structured-merge-diff (the library behind kube-apiserver's field manager)
//! closely, but without schemas: list semantics come from the merge-key table in the
//! parent `patch` module. Field sets are tries keyed by FieldsV1 path elements
//! (`f:name`, `k:{"name":"pg"}`, `v:"value"`, `i:0`); a node is a *member* when the path
//! itself is owned (serialised as `.` or as an empty leaf `{}`).
//!
//! Apply, as in kube: the applied configuration's field set replaces the applier's
//! previous Apply set; fields in the previous set but in nobody's set any more are pruned
//! from the merged object; fields whose value changes (or appear) and that another
//! manager owns are conflicts unless forced, in which case the other manager loses them.
//! Update (any non-apply write): every changed or added field becomes owned by the
//! writer and is taken from everyone else; removed fields are dropped from every set.
//! Deviations from kube-apiserver are listed in the parent `patch` module documentation.

use super::{ListKind, PatchError, declared_merge_key, list_kind};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};

#[path = "apply_field_set.rs"]
mod field_set;
#[path = "apply_managers.rs"]
mod managers;
#[path = "apply_merge.rs"]
mod merge;
use field_set::FieldSet;
use managers::{
    ManagerEntry, api_version_of, parse_managers, without_managed_fields, write_managers,
};
use merge::{remove_path, ssa_merge, strip_nulls};

/// A path as a sequence of FieldsV1 path elements.
type Path = Vec<String>;

const APPLY: &str = "Apply";
const UPDATE: &str = "Update";

/// Metadata that the server owns. kube's field manager strips exactly these paths from
/// every set (non-recursively), so nobody owns or conflicts on identity/bookkeeping.
const STRIPPED_PATHS: &[&[&str]] = &[
    &["f:apiVersion"],
    &["f:kind"],
    &["f:metadata"],
    &["f:metadata", "f:name"],
    &["f:metadata", "f:namespace"],
    &["f:metadata", "f:creationTimestamp"],
    &["f:metadata", "f:selfLink"],
    &["f:metadata", "f:uid"],
    &["f:metadata", "f:clusterName"],
    &["f:metadata", "f:generation"],
    &["f:metadata", "f:managedFields"],
    &["f:metadata", "f:resourceVersion"],
];

/// Server-owned metadata ignored in an applied configuration, so an apply can never
/// rewrite the object's identity or bookkeeping (the caller handles preconditions).
const SERVER_METADATA: &[&str] = &[
    "managedFields",
    "resourceVersion",
    "uid",
    "creationTimestamp",
    "generation",
    "selfLink",
];

/// kube's human-readable path: `.spec.containers[name="pg"].image`, `[="x"]` for sets.
fn display_path(path: &[String]) -> String {
    let mut out = String::new();
    for element in path {
        if let Some(name) = element.strip_prefix("f:") {
            out.push('.');
            out.push_str(name);
        } else if let Some(key) = element.strip_prefix("k:") {
            let fields = serde_json::from_str::<Map<String, Value>>(key).unwrap_or_default();
            let parts: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(value) = element.strip_prefix("v:") {
            out.push_str(&format!("[={value}]"));
        } else if let Some(index) = element.strip_prefix("i:") {
            out.push_str(&format!("[{index}]"));
        } else {
            out.push_str(element);
        }
    }
    out
}

/// The FieldsV1 path element of a list item, or `None` for an item of a keyed list that
/// lacks the key (such items are not tracked).
fn item_element(kind: ListKind, item: &Value) -> Option<String> {
    match kind {
        ListKind::Atomic => None,
        ListKind::Set => Some(format!("v:{item}")),
        ListKind::Keyed(key) => item.get(key).map(|kv| {
            let mut m = Map::new();
            m.insert(key.to_string(), kv.clone());
            format!("k:{}", Value::Object(m))
        }),
    }
}

/// Shape of a node as seen by the walkers: a leaf (scalar, atomic list, or mismatched
/// types) or a container whose children are tracked individually.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Leaf,
    Map,
    List(ListKind),
}

fn shape(field: &str, values: &[&Value]) -> Shape {
    if values.iter().all(|v| v.is_object()) {
        return Shape::Map;
    }
    let lists: Vec<&[Value]> = values
        .iter()
        .filter_map(|v| v.as_array().map(Vec::as_slice))
        .collect();
    if lists.len() != values.len() {
        return Shape::Leaf;
    }
    match list_kind(field, &lists) {
        ListKind::Atomic => Shape::Leaf,
        kind => Shape::List(kind),
    }
}

/// Children of a container as (path element, value, field name for list-kind lookups).
/// Duplicate elements keep the first occurrence.
fn children<'a>(shape: Shape, v: &'a Value) -> Vec<(String, &'a Value, &'a str)> {
    let mut out: Vec<(String, &'a Value, &'a str)> = Vec::new();
    match (shape, v) {
        (Shape::Map, Value::Object(m)) => {
            for (k, child) in m {
                out.push((format!("f:{k}"), child, k.as_str()));
            }
        }
        (Shape::List(kind), Value::Array(items)) => {
            let mut seen = HashSet::new();
            for item in items {
                if let Some(element) = item_element(kind, item)
                    && seen.insert(element.clone())
                {
                    out.push((element, item, ""));
                }
            }
        }
        _ => {}
    }
    out
}

/// Differences between two objects, as structured-merge-diff's `Comparison`.
#[derive(Debug, Default)]
struct Comparison {
    added: FieldSet,
    modified: FieldSet,
    removed: FieldSet,
}

fn compare(lhs: &Value, rhs: &Value) -> Comparison {
    let mut cmp = Comparison::default();
    compare_rec("", Some(lhs), Some(rhs), &mut Vec::new(), &mut cmp);
    let stripped = FieldSet::stripped();
    cmp.added.subtract(&stripped);
    cmp.modified.subtract(&stripped);
    cmp.removed.subtract(&stripped);
    cmp
}

/// `metadata.managedFields`: the record of ownership, never a field anyone
/// owns, so comparisons skip it (instead of copying objects without it).
fn bookkeeping(path: &Path, element: &str) -> bool {
    element == "f:managedFields" && path.len() == 1 && path[0] == "f:metadata"
}

fn compare_rec(
    field: &str,
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    path: &mut Path,
    cmp: &mut Comparison,
) {
    // An equal subtree has nothing added, changed or removed in it. Most
    // writes change a few fields of a large object (a Pod's status, a
    // binding): without this, every write walked both objects whole,
    // building a path element per field — a sixth of the emulator's CPU
    // in a fleet's cold start (issue 16). Equality stops at the first
    // difference and allocates nothing.
    if let (Some(l), Some(r)) = (lhs, rhs)
        && l == r
    {
        return;
    }
    let present: Vec<&Value> = lhs.into_iter().chain(rhs).collect();
    let node_shape = shape(field, &present);
    if node_shape == Shape::Leaf {
        match (lhs, rhs) {
            (None, Some(_)) => cmp.added.insert(path),
            (Some(_), None) => cmp.removed.insert(path),
            (Some(l), Some(r)) if l != r => cmp.modified.insert(path),
            _ => {}
        }
        return;
    }
    let lc = lhs.map(|v| children(node_shape, v)).unwrap_or_default();
    let rc = rhs.map(|v| children(node_shape, v)).unwrap_or_default();
    let rc_index: HashMap<&str, usize> = rc
        .iter()
        .enumerate()
        .map(|(i, c)| (c.0.as_str(), i))
        .collect();
    let lc_keys: HashSet<&str> = lc.iter().map(|c| c.0.as_str()).collect();
    for (element, lv, child_field) in &lc {
        if bookkeeping(path, element) {
            continue;
        }
        let rv = rc_index
            .get(element.as_str())
            .and_then(|&i| rc.get(i))
            .map(|c| c.1);
        path.push(element.clone());
        compare_rec(child_field, Some(lv), rv, path, cmp);
        path.pop();
    }
    for (element, rv, child_field) in &rc {
        if !lc_keys.contains(element.as_str()) && !bookkeeping(path, element) {
            path.push(element.clone());
            compare_rec(child_field, None, Some(rv), path, cmp);
            path.pop();
        }
    }
    // Typed kube objects always contain root `spec`/`status` structs, so they never
    // appear as added or removed there; mirror that.
    let root_struct = path.len() == 1
        && path
            .first()
            .is_some_and(|e| e == "f:spec" || e == "f:status");
    if !path.is_empty() && !root_struct {
        if lhs.is_none() {
            cmp.added.insert(path);
        } else if rhs.is_none() {
            cmp.removed.insert(path);
        }
    }
}

/// The field set an applied configuration claims: leaves, atomic lists and list items;
/// maps themselves are not members. Rejects keyed-list items without their key and
/// duplicate keys, as kube does for associative lists.
fn applied_field_set(
    field: &str,
    v: &Value,
    path: &mut Path,
    set: &mut FieldSet,
) -> Result<(), PatchError> {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                path.push(format!("f:{k}"));
                applied_field_set(k, child, path, set)?;
                path.pop();
            }
        }
        Value::Array(items) => {
            let kind = list_kind(field, &[items.as_slice()]);
            if kind == ListKind::Atomic {
                set.insert(path);
                return Ok(());
            }
            let mut seen = HashSet::new();
            for item in items {
                let Some(element) = item_element(kind, item) else {
                    let key = declared_merge_key(field, &[items.as_slice()]).unwrap_or("?");
                    return Err(PatchError::Invalid(format!(
                        "{}: associative list item {item} is missing key field \"{key}\"",
                        display_path(path)
                    )));
                };
                if !seen.insert(element.clone()) {
                    path.push(element);
                    let msg = format!(
                        "{}: duplicate entries in associative list",
                        display_path(path)
                    );
                    return Err(PatchError::Invalid(msg));
                }
                path.push(element);
                set.insert(path);
                applied_field_set("", item, path, set)?;
                path.pop();
            }
        }
        _ => set.insert(path),
    }
    Ok(())
}

/// Server-side apply (`application/apply-patch+yaml`, already parsed to JSON). `live` is
/// the current object, or `None` on create. Returns the new object with
/// `metadata.managedFields` updated; `Err(Conflict)` lists the paths other managers own
/// whose value this apply would change, unless `force` (then they lose ownership).
/// `now` (RFC 3339) stamps the applier's entry when the object changed or is new to it.
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    now: &str,
) -> Result<Value, PatchError> {
    let mut config = strip_nulls(applied);
    let Value::Object(config_map) = &mut config else {
        return Err(PatchError::Invalid(
            "apply configuration must be a JSON object".into(),
        ));
    };
    if let Some(Value::Object(meta)) = config_map.get_mut("metadata") {
        for key in SERVER_METADATA {
            meta.remove(*key);
        }
    }
    let mut managers = live.map(parse_managers).unwrap_or_default();
    let live_obj = live.map_or_else(|| Value::Object(Map::new()), without_managed_fields);

    let mut new_set = FieldSet::default();
    applied_field_set("", &config, &mut Vec::new(), &mut new_set)?;
    new_set.subtract(&FieldSet::stripped());

    let mut merged = ssa_merge("", &live_obj, &config);
    let api_version = api_version_of(&merged);

    let last_set = match managers.iter_mut().find(|e| e.is(manager, APPLY)) {
        Some(entry) => Some(std::mem::replace(&mut entry.set, new_set)),
        None => {
            managers.push(ManagerEntry {
                manager: manager.to_string(),
                operation: APPLY.to_string(),
                api_version: api_version.clone(),
                time: None,
                set: new_set,
                extra: Map::new(),
            });
            None
        }
    };

    // Prune what this manager applied last time, dropped now, and nobody else owns.
    // Named fields (f:) with owned descendants stay, as with EnsureNamedFieldsAreMembers.
    if let Some(last) = last_set {
        let mut owned = FieldSet::default();
        for entry in &managers {
            owned.union_with(&entry.set);
        }
        for path in last.members() {
            let named = path.last().is_some_and(|e| e.starts_with("f:"));
            if owned.contains(&path) || (named && owned.owns_at_or_below(&path)) {
                continue;
            }
            remove_path(&mut merged, &path, 0);
        }
    }

    // What changed matters only for other managers' fields (conflicts, and
    // what they lose). With none — every create, and every object only
    // this manager writes — the walk over both objects finds nothing to
    // use (server-side apply's share of the emulator's CPU in a cold start
    // of 100 × 100 PostgresClusters fell from 10.6 to 7.4 %).
    let others = managers.iter().any(|e| !e.is(manager, APPLY));
    let cmp = if others {
        compare(&live_obj, &merged)
    } else {
        Comparison::default()
    };
    let mut changed = cmp.added.clone();
    changed.union_with(&cmp.modified);
    let mut conflicts: Vec<String> = managers
        .iter()
        .filter(|e| !e.is(manager, APPLY))
        .flat_map(|e| e.set.intersection(&changed).members())
        .map(|p| display_path(&p))
        .collect();
    if !conflicts.is_empty() && !force {
        conflicts.sort();
        conflicts.dedup();
        return Err(PatchError::Conflict(conflicts));
    }
    let object_changed = live.is_none() || live_obj != merged;
    for entry in &mut managers {
        if entry.is(manager, APPLY) {
            entry.api_version = api_version.clone();
            if object_changed || entry.time.is_none() {
                entry.time = Some(Value::String(now.to_string()));
            }
        } else {
            entry.set.subtract(&changed);
            entry.set.subtract(&cmp.removed);
        }
    }
    write_managers(&mut merged, managers);
    Ok(merged)
}

/// Records a non-apply write (create/PUT/patch) by `manager`: fields added or changed
/// between `old` and `new` become owned by `manager` (operation `Update`) and are taken
/// from every other manager; removed fields leave every set. Ownership is read from
/// `old`'s managedFields (whatever the client put in `new` is replaced). The entry's time
/// only moves when this write changed something, as in kube.
pub fn record_update(old: Option<&Value>, new: &mut Value, manager: &str, now: &str) {
    if !new.is_object() {
        return;
    }
    let mut managers = old.map(parse_managers).unwrap_or_default();
    // Compared in place: `compare` never looks into managedFields.
    let empty = Value::Object(Map::new());
    let cmp = compare(old.unwrap_or(&empty), new);
    let mut changed = cmp.added;
    changed.union_with(&cmp.modified);
    for entry in &mut managers {
        entry.set.subtract(&changed);
        entry.set.subtract(&cmp.removed);
    }
    if !changed.is_empty() {
        let api_version = api_version_of(new);
        let time = Some(Value::String(now.to_string()));
        match managers.iter_mut().find(|e| e.is(manager, UPDATE)) {
            Some(entry) => {
                entry.set.union_with(&changed);
                entry.api_version = api_version;
                entry.time = time;
            }
            None => managers.push(ManagerEntry {
                manager: manager.to_string(),
                operation: UPDATE.to_string(),
                api_version,
                time,
                set: changed,
                extra: Map::new(),
            }),
        }
    }
    write_managers(new, managers);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "apply_tests.rs"]
mod tests;
