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
use crate::json_ptr::Ptr;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};

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

/// Trie of owned paths, mirroring structured-merge-diff's `fieldpath.Set`. Invariant:
/// no child is empty (every operation prunes), so `is_empty` is O(1).
#[derive(Debug, Clone, Default, PartialEq)]
struct FieldSet {
    member: bool,
    children: BTreeMap<String, FieldSet>,
}

impl FieldSet {
    fn is_empty(&self) -> bool {
        !self.member && self.children.is_empty()
    }

    fn insert(&mut self, path: &[String]) {
        match path.split_first() {
            None => self.member = true,
            Some((head, rest)) => self.children.entry(head.clone()).or_default().insert(rest),
        }
    }

    fn contains(&self, path: &[String]) -> bool {
        match path.split_first() {
            None => self.member,
            Some((head, rest)) => self.children.get(head).is_some_and(|c| c.contains(rest)),
        }
    }

    /// Whether the path or anything below it is owned.
    fn owns_at_or_below(&self, path: &[String]) -> bool {
        match path.split_first() {
            None => !self.is_empty(),
            Some((head, rest)) => self
                .children
                .get(head)
                .is_some_and(|c| c.owns_at_or_below(rest)),
        }
    }

    fn union_with(&mut self, other: &FieldSet) {
        self.member |= other.member;
        for (key, child) in &other.children {
            self.children
                .entry(key.clone())
                .or_default()
                .union_with(child);
        }
    }

    /// Removes the members of `other` (exact paths, not their subtrees), like
    /// `Set.Difference` in structured-merge-diff.
    fn subtract(&mut self, other: &FieldSet) {
        if other.member {
            self.member = false;
        }
        for (key, other_child) in &other.children {
            if let Some(child) = self.children.get_mut(key) {
                child.subtract(other_child);
                if child.is_empty() {
                    self.children.remove(key);
                }
            }
        }
    }

    fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet {
            member: self.member && other.member,
            children: BTreeMap::new(),
        };
        for (key, child) in &self.children {
            if let Some(other_child) = other.children.get(key) {
                let both = child.intersection(other_child);
                if !both.is_empty() {
                    out.children.insert(key.clone(), both);
                }
            }
        }
        out
    }

    fn members(&self) -> Vec<Path> {
        fn walk(set: &FieldSet, path: &mut Path, out: &mut Vec<Path>) {
            if set.member {
                out.push(path.clone());
            }
            for (key, child) in &set.children {
                path.push(key.clone());
                walk(child, path, out);
                path.pop();
            }
        }
        let mut out = Vec::new();
        walk(self, &mut Vec::new(), &mut out);
        out
    }

    fn stripped() -> FieldSet {
        let mut set = FieldSet::default();
        for path in STRIPPED_PATHS {
            let path: Path = path.iter().map(|s| (*s).to_string()).collect();
            set.insert(&path);
        }
        set
    }

    /// FieldsV1 JSON. A member with children gets a `.` entry; a member leaf is `{}`.
    fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        if self.member && !self.children.is_empty() {
            m.insert(".".to_string(), Value::Object(Map::new()));
        }
        for (key, child) in &self.children {
            m.insert(key.clone(), child.to_fields_v1());
        }
        Value::Object(m)
    }

    /// Parses FieldsV1; malformed parts are ignored rather than failing the write, since
    /// managedFields are advisory and may have been hand-edited.
    fn from_fields_v1(v: &Value) -> FieldSet {
        let mut set = FieldSet::default();
        let Value::Object(m) = v else { return set };
        for (key, child) in m {
            if key == "." {
                continue;
            }
            let mut parsed = FieldSet::from_fields_v1(child);
            let child_map = child.as_object();
            if child_map.is_some_and(|c| c.is_empty() || c.contains_key(".")) {
                parsed.member = true;
            }
            if !parsed.is_empty() {
                set.children.insert(key.clone(), parsed);
            }
        }
        set
    }
}

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

/// Structured merge of an applied configuration (`rhs`) into the live object (`lhs`).
fn ssa_merge(field: &str, lhs: &Value, rhs: &Value) -> Value {
    match (lhs, rhs) {
        (Value::Object(l), Value::Object(r)) => {
            let mut out = l.clone();
            for (k, rv) in r {
                let merged = match l.get(k) {
                    Some(lv) => ssa_merge(k, lv, rv),
                    None => rv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(l), Value::Array(r)) => match list_kind(field, &[l.as_slice(), r.as_slice()])
        {
            ListKind::Atomic => rhs.clone(),
            kind => Value::Array(merge_list(kind, l, r)),
        },
        _ => rhs.clone(),
    }
}

/// Associative/set list merge with structured-merge-diff's ordering: shared and new items
/// follow the applied order, live-only items keep their relative position.
fn merge_list(kind: ListKind, l: &[Value], r: &[Value]) -> Vec<Value> {
    let lk: Vec<Option<String>> = l.iter().map(|i| item_element(kind, i)).collect();
    let rk: Vec<Option<String>> = r.iter().map(|i| item_element(kind, i)).collect();
    let mut l_index: HashMap<&str, usize> = HashMap::new();
    for (i, k) in lk.iter().enumerate() {
        if let Some(k) = k {
            l_index.entry(k.as_str()).or_insert(i);
        }
    }
    let r_keys: HashSet<&str> = rk.iter().flatten().map(String::as_str).collect();
    let shared: Vec<&str> = rk
        .iter()
        .flatten()
        .map(String::as_str)
        .filter(|k| l_index.contains_key(k))
        .collect();
    let mut next_shared = 0usize;
    let mut merged: HashSet<&str> = HashSet::new();
    let merge_item = |lv: &Value, rv: &Value| match kind {
        ListKind::Keyed(_) => ssa_merge("", lv, rv),
        _ => rv.clone(),
    };
    let mut out = Vec::with_capacity(l.len().max(r.len()));
    let (mut li, mut ri) = (0usize, 0usize);
    while li < l.len() || ri < r.len() {
        let lkey = lk.get(li).and_then(|k| k.as_deref());
        let rkey = rk.get(ri).and_then(|k| k.as_deref());
        if let (Some(lv), Some(rv)) = (l.get(li), r.get(ri)) {
            if let (Some(a), Some(b)) = (lkey, rkey)
                && a == b
            {
                out.push(merge_item(lv, rv));
                merged.insert(a);
                if shared.get(next_shared) == Some(&a) {
                    next_shared += 1;
                }
                li += 1;
                ri += 1;
                continue;
            }
            // A shared item that the applied order places later: emit it when the
            // applied side gets there.
            if let Some(a) = lkey
                && r_keys.contains(a)
                && shared.get(next_shared).is_some_and(|s| *s != a)
            {
                li += 1;
                continue;
            }
        }
        if let Some(lv) = l.get(li) {
            match lkey {
                Some(a) if merged.contains(a) => {
                    li += 1;
                    continue;
                }
                Some(a) if r_keys.contains(a) => {}
                // Live-only (or unkeyed) item: keep it in place.
                _ => {
                    out.push(lv.clone());
                    li += 1;
                    continue;
                }
            }
        }
        if let Some(rv) = r.get(ri) {
            match rkey {
                Some(b) => {
                    merged.insert(b);
                    out.push(match l_index.get(b).and_then(|&i| l.get(i)) {
                        Some(lv) => merge_item(lv, rv),
                        None => rv.clone(),
                    });
                    if shared.get(next_shared) == Some(&b) {
                        next_shared += 1;
                    }
                }
                None => out.push(rv.clone()),
            }
            ri += 1;
            continue;
        }
        // Unreachable in practice (a shared live item is always merged before the applied
        // side runs out); advance so the loop cannot spin.
        li += 1;
    }
    out
}

/// Where a path element points inside a container.
enum Loc {
    Key(String),
    Index(usize),
}

fn locate(v: &Value, element: &str) -> Option<Loc> {
    if let Some(name) = element.strip_prefix("f:") {
        return v
            .as_object()?
            .contains_key(name)
            .then(|| Loc::Key(name.to_string()));
    }
    let items = v.as_array()?;
    if let Some(key) = element.strip_prefix("k:") {
        let fields: Map<String, Value> = serde_json::from_str(key).ok()?;
        return items
            .iter()
            .position(|item| fields.iter().all(|(k, kv)| item.get(k) == Some(kv)))
            .map(Loc::Index);
    }
    if let Some(value) = element.strip_prefix("v:") {
        let value: Value = serde_json::from_str(value).ok()?;
        return items.iter().position(|item| *item == value).map(Loc::Index);
    }
    let index: usize = element.strip_prefix("i:")?.parse().ok()?;
    (index < items.len()).then_some(Loc::Index(index))
}

fn child_mut<'a>(v: &'a mut Value, loc: &Loc) -> Option<&'a mut Value> {
    match (v, loc) {
        (Value::Object(m), Loc::Key(k)) => m.get_mut(k),
        (Value::Array(items), Loc::Index(i)) => items.get_mut(*i),
        _ => None,
    }
}

fn remove_at(v: &mut Value, loc: &Loc) {
    match (v, loc) {
        (Value::Object(m), Loc::Key(k)) => {
            m.remove(k);
        }
        (Value::Array(items), Loc::Index(i)) if *i < items.len() => {
            items.remove(*i);
        }
        _ => {}
    }
}

fn is_empty_container(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// Removes `path` from `v`, then removes containers it leaves empty below the root level
/// (kube's typed objects drop those via `omitempty`; root `spec`/`metadata` stay).
fn remove_path(v: &mut Value, path: &[String], depth: usize) -> bool {
    let Some((head, rest)) = path.split_first() else {
        return false;
    };
    let Some(loc) = locate(v, head) else {
        return false;
    };
    if rest.is_empty() {
        remove_at(v, &loc);
        return true;
    }
    let Some(child) = child_mut(v, &loc) else {
        return false;
    };
    let removed = remove_path(child, rest, depth + 1);
    if removed && depth >= 1 && is_empty_container(child) {
        remove_at(v, &loc);
    }
    removed
}

/// Copy with `null` map values dropped everywhere: in an apply, null means "not mine".
fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

/// One managedFields entry; unknown keys (e.g. `subresource`) are carried through.
#[derive(Debug, Clone)]
struct ManagerEntry {
    manager: String,
    operation: String,
    api_version: String,
    time: Option<Value>,
    set: FieldSet,
    extra: Map<String, Value>,
}

impl ManagerEntry {
    fn is(&self, manager: &str, operation: &str) -> bool {
        self.manager == manager && self.operation == operation
    }

    fn to_json(&self) -> Value {
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

fn parse_managers(obj: &Value) -> Vec<ManagerEntry> {
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
fn write_managers(obj: &mut Value, mut entries: Vec<ManagerEntry>) {
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

fn without_managed_fields(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(Value::Object(meta)) = v.get_mut("metadata") {
        meta.remove("managedFields");
    }
    v
}

fn api_version_of(v: &Value) -> String {
    v.get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
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

    let cmp = compare(&live_obj, &merged);
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
