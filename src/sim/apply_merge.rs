//! Merging an applied configuration into the live object and removing the
//! fields nobody owns any more (`apply.rs`), as structured-merge-diff does.

use super::{ListKind, item_element, list_kind};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};

/// Structured merge of an applied configuration (`rhs`) into the live object (`lhs`).
pub(super) fn ssa_merge(field: &str, lhs: &Value, rhs: &Value) -> Value {
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
pub(super) fn merge_list(kind: ListKind, l: &[Value], r: &[Value]) -> Vec<Value> {
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
pub(super) enum Loc {
    Key(String),
    Index(usize),
}

pub(super) fn locate(v: &Value, element: &str) -> Option<Loc> {
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

pub(super) fn child_mut<'a>(v: &'a mut Value, loc: &Loc) -> Option<&'a mut Value> {
    match (v, loc) {
        (Value::Object(m), Loc::Key(k)) => m.get_mut(k),
        (Value::Array(items), Loc::Index(i)) => items.get_mut(*i),
        _ => None,
    }
}

pub(super) fn remove_at(v: &mut Value, loc: &Loc) {
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

pub(super) fn is_empty_container(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// Removes `path` from `v`, then removes containers it leaves empty below the root level
/// (kube's typed objects drop those via `omitempty`; root `spec`/`metadata` stay).
pub(super) fn remove_path(v: &mut Value, path: &[String], depth: usize) -> bool {
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
pub(super) fn strip_nulls(v: &Value) -> Value {
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
