//! Pure patch logic for the embedded API server, over untyped `serde_json::Value` objects.
//!
//! The simulator stores every object as JSON without Go types or OpenAPI schemas, so the
//! patch flavours kube-apiserver supports are reimplemented here against a small built-in
//! table of list merge keys. This module holds RFC 7386 merge patch, RFC 6902 JSON patch
//! (delegated to the `json_patch` crate), strategic merge patch, the error type and the
//! shared merge-key table; server-side apply and managedFields bookkeeping live in
//! `apply.rs` (a child module declared with `#[path]`) and are re-exported here.
//!
//! # Where this differs from kube-apiserver
//!
//! * **Merge keys come from a fixed table keyed by the list's field name**, not from the
//!   OpenAPI `x-kubernetes-patch-merge-key` / `x-kubernetes-list-map-keys` of the concrete
//!   type. The table (`declared_merge_key`) is applied to every kind, CRDs included, so
//!   e.g. a CRD list field called `conditions` is keyed by `type` even if its schema says
//!   `atomic`, and a Pod field not in the table is atomic even if kube merges it.
//! * **Single-key list maps only.** kube keys container ports by
//!   `containerPort`+`protocol` and Service ports by `port`+`protocol` for SSA; here
//!   `ports` is keyed by `containerPort` when any item has one, otherwise by `port`.
//!   FieldsV1 keys therefore look like `k:{"containerPort":5432}` instead of
//!   `k:{"containerPort":5432,"protocol":"TCP"}`.
//! * **Only `finalizers` is a set** (`listType: set` / patchStrategy merge for scalars).
//!   Every other list of scalars is atomic.
//! * **Strategic merge patch:** `$patch: delete` on a map removes the key from its parent
//!   (kube leaves an empty map `{}` behind); at the root it empties the object.
//!   `$setElementOrder` reorders only the items it names, keeping server-only items in
//!   their slots (kube interleaves slightly differently); new list items are appended.
//!   `$retainKeys` is honoured on any map, not only fields declaring the retainKeys
//!   strategy. Directive keys are recognised anywhere and never stored; other `$`-prefixed
//!   keys (such as `$ref` in CRD schemas) are ordinary data. `null` inside an atomic list
//!   item is stored as-is (kube would drop it when decoding into Go types).
//! * **No schema validation or defaulting** after patching; the caller validates. Nor is
//!   strategic merge patch refused for custom resources (kube answers 415); the caller
//!   should do that if it wants kube's behaviour.
//! * **Conflicts carry only paths.** kube's message names the other manager, its
//!   apiVersion and time (`conflict with "alice" using apps/v1: .spec.replicas`);
//!   [`PatchError::Conflict`] holds just `.spec.replicas`-style paths. As in kube, a
//!   manager's `Update` entry and its `Apply` entry are different owners, so an apply can
//!   conflict with an earlier create/PUT made under the same manager name.
//! * **Server-side apply / managedFields** (see the `apply` module): no version conversion
//!   (all field sets are taken to be in the object's current apiVersion); no
//!   `subresource` bookkeeping (existing `subresource` values on entries are preserved
//!   but new entries never get one); entries are keyed by (manager, operation) only
//!   (kube also splits Update entries by apiVersion); no cap on the number of Update managers; no
//!   last-applied-configuration (client-side apply) migration; `null` in an applied
//!   configuration means "omit" (so a previously applied field set to null is pruned);
//!   server-owned metadata (`managedFields`, `resourceVersion`, `uid`,
//!   `creationTimestamp`, `generation`, `selfLink`) in an applied configuration is
//!   ignored rather than rejected or used as a precondition; client-supplied
//!   `managedFields` on create/update are ignored (kube lets clients overwrite or clear
//!   them). Without typed zero values, a list or map that a write brings into existence
//!   is itself marked owned (`.: {}`) even where kube's typed empty object would already
//!   contain it; root `spec` and `status` are special-cased to match kube. Empty maps and
//!   lists left behind by pruning are removed (mimicking `omitempty`), except at the
//!   root level.

use crate::json_ptr::Ptr;
use serde_json::{Map, Value};
use std::fmt;

// Server-side apply lives in `apply.rs` next to this file but is a child module, so the
// parent only needs `mod patch;` and callers see one API under `patch::`.
#[path = "apply.rs"]
mod apply;
pub use apply::{record_update, server_side_apply};

/// Errors from applying a patch. Kept free of `thiserror` so this file compiles
/// standalone in a scratch crate; the API layer maps `Invalid` to 422/400 and `Conflict`
/// to 409 with one `FieldManagerConflict` cause per path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchError {
    /// The patch document is malformed or cannot be applied to the target.
    Invalid(String),
    /// Server-side apply conflicts: field paths in kube notation (for example
    /// `.spec.replicas` or `.spec.containers[name="pg"].image`) that another manager owns
    /// and whose value the apply would change. Sorted and deduplicated.
    Conflict(Vec<String>),
}

impl fmt::Display for PatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PatchError::Invalid(msg) => f.write_str(msg),
            PatchError::Conflict(paths) => {
                let noun = if paths.len() == 1 {
                    "conflict"
                } else {
                    "conflicts"
                };
                write!(
                    f,
                    "Apply failed with {} {noun}: {}",
                    paths.len(),
                    paths.join(", ")
                )
            }
        }
    }
}

impl std::error::Error for PatchError {}

/// How a list merges in strategic merge patch and server-side apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListKind {
    /// Replaced wholesale; owned as a single leaf.
    Atomic,
    /// List of scalars merged as a set (`v:` path elements).
    Set,
    /// List of objects merged by the named key field (`k:` path elements).
    Keyed(&'static str),
}

/// The merge key our built-in table declares for a list field, if any. `lists` are all
/// the instances of the list involved in the operation (live, patch, applied); they are
/// only consulted to disambiguate `ports` between container ports and Service ports.
pub(crate) fn declared_merge_key(field: &str, lists: &[&[Value]]) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        "hostAliases" => Some("ip"),
        "ports" => {
            let container = lists
                .iter()
                .flat_map(|l| l.iter())
                .any(|item| item.get("containerPort").is_some());
            Some(if container { "containerPort" } else { "port" })
        }
        _ => None,
    }
}

/// Whether a list field of scalars is a set (merged and deduplicated rather than replaced).
pub(crate) fn is_set_field(field: &str) -> bool {
    field == "finalizers"
}

pub(crate) fn is_scalar(v: &Value) -> bool {
    !v.is_object() && !v.is_array()
}

/// Decides how a list merges. A keyed list needs every item to be an object; items that
/// lack the key are tolerated here (they are invisible to ownership tracking and never
/// match), and apply rejects them in the applied configuration.
pub(crate) fn list_kind(field: &str, lists: &[&[Value]]) -> ListKind {
    let mut items = lists.iter().flat_map(|l| l.iter());
    if is_set_field(field) && items.clone().all(is_scalar) {
        return ListKind::Set;
    }
    match declared_merge_key(field, lists) {
        Some(key) if items.all(Value::is_object) => ListKind::Keyed(key),
        _ => ListKind::Atomic,
    }
}

/// RFC 7386 JSON merge patch (`application/merge-patch+json`). Objects merge recursively,
/// `null` deletes, and anything else (including arrays) replaces. Cannot fail.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target_map) = target else {
        return;
    };
    for (key, value) in patch_map {
        if value.is_null() {
            target_map.remove(key);
        } else {
            merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// RFC 6902 JSON patch (`application/json-patch+json`). All-or-nothing: the operations
/// run on a copy so a failing `test` (or bad path) leaves `target` untouched, and the
/// error names the failing operation's index, op and path.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let mut ops: ::json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| PatchError::Invalid(format!("invalid JSON patch document: {e}")))?;
    // kube-apiserver (evanphx/json-patch) treats `test` of a missing path
    // against null as a success; kube-runtime's finalizer helper relies on it.
    ops.0.retain(|op| match op {
        ::json_patch::PatchOperation::Test(t) => {
            !(t.value.is_null() && target.ptr(t.path.as_str()).is_none())
        }
        _ => true,
    });
    let mut work = target.clone();
    // patch_unsafe on a copy instead of `patch`: same atomicity, and no undo path that
    // could panic.
    ::json_patch::patch_unsafe(&mut work, &ops).map_err(|e| {
        let op = ops.0.get(e.operation).map_or("unknown", json_patch_op_name);
        PatchError::Invalid(format!(
            "JSON patch operation {} ({op} \"{}\") failed: {}",
            e.operation, e.path, e.kind
        ))
    })?;
    *target = work;
    Ok(())
}

fn json_patch_op_name(op: &::json_patch::PatchOperation) -> &'static str {
    use ::json_patch::PatchOperation as Op;
    match op {
        Op::Add(_) => "add",
        Op::Remove(_) => "remove",
        Op::Replace(_) => "replace",
        Op::Move(_) => "move",
        Op::Copy(_) => "copy",
        Op::Test(_) => "test",
    }
}

const PATCH_DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";

/// Only the directives kubectl actually emits are special; other `$` keys are data.
fn is_directive(key: &str) -> bool {
    key == PATCH_DIRECTIVE
        || key == RETAIN_KEYS
        || key.starts_with(SET_ELEMENT_ORDER)
        || key.starts_with(DELETE_FROM_PRIMITIVE_LIST)
}

/// What the parent should do with a map after a strategic merge into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MapOutcome {
    Keep,
    /// The patch said `$patch: delete` for this map.
    Delete,
}

/// Strategic merge patch (`application/strategic-merge-patch+json`) as kubectl sends it
/// for built-in kinds: maps merge, `null` deletes, lists named in the merge-key table merge
/// by key, `finalizers` merges as a set, all other lists are replaced. Directives
/// (`$patch`, `$retainKeys`, `$setElementOrder/…`, `$deleteFromPrimitiveList/…`) are
/// honoured and never stored. All-or-nothing: works on a copy.
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Value::Object(patch_map) = patch else {
        return Err(PatchError::Invalid(
            "strategic merge patch must be a JSON object".to_string(),
        ));
    };
    let mut work = match target {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    if smp_map(&mut work, patch_map)? == MapOutcome::Delete {
        work.clear();
    }
    *target = Value::Object(work);
    Ok(())
}

fn smp_map(
    orig: &mut Map<String, Value>,
    patch: &Map<String, Value>,
) -> Result<MapOutcome, PatchError> {
    if let Some(directive) = patch.get(PATCH_DIRECTIVE) {
        match directive.as_str() {
            Some("replace") => {
                // Replace = merge the rest of the patch into nothing, which also drops
                // nulls and processes nested directives.
                let mut fresh = Map::new();
                let rest: Map<String, Value> = patch
                    .iter()
                    .filter(|(k, _)| k.as_str() != PATCH_DIRECTIVE)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                smp_map(&mut fresh, &rest)?;
                *orig = fresh;
                return Ok(MapOutcome::Keep);
            }
            Some("delete") => return Ok(MapOutcome::Delete),
            Some("merge") => {}
            _ => {
                return Err(PatchError::Invalid(format!(
                    "unknown strategic merge patch directive $patch: {directive}"
                )));
            }
        }
    }
    if let Some(retain) = patch.get(RETAIN_KEYS) {
        let Value::Array(keys) = retain else {
            return Err(PatchError::Invalid(format!(
                "$retainKeys must be a list, got {retain}"
            )));
        };
        orig.retain(|k, _| keys.iter().any(|key| key.as_str() == Some(k.as_str())));
    }
    for (key, values) in patch {
        let Some(field) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) else {
            continue;
        };
        let Value::Array(values) = values else {
            return Err(PatchError::Invalid(format!(
                "{key} must be a list, got {values}"
            )));
        };
        if let Some(Value::Array(items)) = orig.get_mut(field) {
            items.retain(|item| !values.contains(item));
        }
    }
    for (key, patch_value) in patch {
        if is_directive(key) {
            continue;
        }
        if patch_value.is_null() {
            orig.remove(key);
            continue;
        }
        match (orig.get_mut(key), patch_value) {
            (Some(Value::Object(om)), Value::Object(pm)) => {
                if smp_map(om, pm)? == MapOutcome::Delete {
                    orig.remove(key);
                }
            }
            (Some(Value::Array(oa)), Value::Array(pa)) => smp_list(key, oa, pa)?,
            _ => match smp_fresh(key, patch_value)? {
                Some(v) => {
                    orig.insert(key.clone(), v);
                }
                None => {
                    orig.remove(key);
                }
            },
        }
    }
    for (key, order) in patch {
        let Some(field) = key.strip_prefix(SET_ELEMENT_ORDER) else {
            continue;
        };
        let Value::Array(order) = order else {
            return Err(PatchError::Invalid(format!(
                "{key} must be a list, got {order}"
            )));
        };
        if let Some(Value::Array(items)) = orig.get_mut(field) {
            apply_element_order(field, items, order);
        }
    }
    Ok(MapOutcome::Keep)
}

/// A patch value landing where the original has nothing (or a different type): merge it
/// into emptiness so nulls vanish and directives are processed. `None` = store nothing.
fn smp_fresh(field: &str, patch_value: &Value) -> Result<Option<Value>, PatchError> {
    match patch_value {
        Value::Object(pm) => {
            let mut m = Map::new();
            Ok(match smp_map(&mut m, pm)? {
                MapOutcome::Keep => Some(Value::Object(m)),
                MapOutcome::Delete => None,
            })
        }
        Value::Array(pa) => {
            let mut items = Vec::new();
            smp_list(field, &mut items, pa)?;
            Ok(Some(Value::Array(items)))
        }
        Value::Null => Ok(None),
        scalar => Ok(Some(scalar.clone())),
    }
}

fn item_directive(item: &Value) -> Option<&Value> {
    item.as_object().and_then(|m| m.get(PATCH_DIRECTIVE))
}

fn smp_list(field: &str, orig: &mut Vec<Value>, patch: &[Value]) -> Result<(), PatchError> {
    // A `{"$patch": "replace"}` element anywhere replaces the list with the other elements.
    if patch
        .iter()
        .any(|item| item_directive(item).and_then(Value::as_str) == Some("replace"))
    {
        let mut out = Vec::new();
        for item in patch.iter().filter(|i| item_directive(i).is_none()) {
            if let Some(v) = smp_fresh("", item)? {
                out.push(v);
            }
        }
        *orig = out;
        return Ok(());
    }
    if patch.iter().all(is_scalar) {
        if is_set_field(field) && orig.iter().all(is_scalar) {
            for item in patch {
                if !orig.contains(item) {
                    orig.push(item.clone());
                }
            }
            dedup_in_place(orig);
        } else {
            *orig = patch.to_vec();
        }
        return Ok(());
    }
    let key = match declared_merge_key(field, &[orig.as_slice(), patch]) {
        Some(key) if patch.iter().all(Value::is_object) => key,
        _ => {
            // Atomic: replace, but never let directive keys into storage.
            *orig = patch
                .iter()
                .filter(|i| item_directive(i).is_none())
                .map(strip_directives)
                .collect();
            return Ok(());
        }
    };
    for item in patch {
        let Value::Object(pm) = item else { continue };
        let key_value = pm.get(key);
        match pm.get(PATCH_DIRECTIVE).map(|d| d.as_str()) {
            None | Some(Some("merge")) => {}
            Some(Some("delete")) => {
                let key_value = key_value.ok_or_else(|| missing_key(field, key, item))?;
                orig.retain(|o| o.get(key) != Some(key_value));
                continue;
            }
            Some(_) => {
                return Err(PatchError::Invalid(format!(
                    "unknown strategic merge patch directive in {field} item {item}"
                )));
            }
        }
        let key_value = key_value.ok_or_else(|| missing_key(field, key, item))?;
        match orig.iter().position(|o| o.get(key) == Some(key_value)) {
            Some(idx) => {
                let outcome = match orig.get_mut(idx) {
                    Some(Value::Object(om)) => smp_map(om, pm)?,
                    _ => MapOutcome::Keep,
                };
                if outcome == MapOutcome::Delete {
                    orig.remove(idx);
                }
            }
            None => {
                if let Some(v) = smp_fresh("", item)? {
                    orig.push(v);
                }
            }
        }
    }
    Ok(())
}

fn missing_key(field: &str, key: &str, item: &Value) -> PatchError {
    PatchError::Invalid(format!(
        "{field}: list item {item} does not contain declared merge key \"{key}\""
    ))
}

fn dedup_in_place(items: &mut Vec<Value>) {
    let mut seen: Vec<Value> = Vec::with_capacity(items.len());
    items.retain(|item| {
        if seen.contains(item) {
            false
        } else {
            seen.push(item.clone());
            true
        }
    });
}

/// Copy of `v` with every directive key removed at any depth.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !is_directive(k))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

/// `$setElementOrder/<field>`: the items named in `order` are rearranged into that order
/// within the slots they already occupy; items the order does not mention stay put.
fn apply_element_order(field: &str, items: &mut [Value], order: &[Value]) {
    let key = declared_merge_key(field, &[&*items, order]);
    let position = |item: &Value| {
        order.iter().position(|o| match (o, key) {
            (Value::Object(om), Some(key)) => {
                om.get(key).is_some_and(|kv| item.get(key) == Some(kv))
            }
            _ => o == item,
        })
    };
    let positions: Vec<Option<usize>> = items.iter().map(position).collect();
    let mut ordered: Vec<(usize, Value)> = items
        .iter()
        .zip(&positions)
        .filter_map(|(item, pos)| pos.map(|p| (p, item.clone())))
        .collect();
    ordered.sort_by_key(|(p, _)| *p);
    let mut ordered = ordered.into_iter().map(|(_, v)| v);
    for (slot, pos) in items.iter_mut().zip(&positions) {
        if pos.is_some()
            && let Some(v) = ordered.next()
        {
            *slot = v;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "patch_tests.rs"]
mod tests;
