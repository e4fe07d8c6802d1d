//! The field set of server-side apply (`apply.rs`): which paths a manager
//! owns, as structured-merge-diff's `fieldpath.Set` keeps them.

use super::{Path, STRIPPED_PATHS};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Trie of owned paths, mirroring structured-merge-diff's `fieldpath.Set`. Invariant:
/// no child is empty (every operation prunes), so `is_empty` is O(1).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct FieldSet {
    pub(super) member: bool,
    pub(super) children: BTreeMap<String, FieldSet>,
}

impl FieldSet {
    pub(super) fn is_empty(&self) -> bool {
        !self.member && self.children.is_empty()
    }

    pub(super) fn insert(&mut self, path: &[String]) {
        match path.split_first() {
            None => self.member = true,
            Some((head, rest)) => self.children.entry(head.clone()).or_default().insert(rest),
        }
    }

    pub(super) fn contains(&self, path: &[String]) -> bool {
        match path.split_first() {
            None => self.member,
            Some((head, rest)) => self.children.get(head).is_some_and(|c| c.contains(rest)),
        }
    }

    /// Whether the path or anything below it is owned.
    pub(super) fn owns_at_or_below(&self, path: &[String]) -> bool {
        match path.split_first() {
            None => !self.is_empty(),
            Some((head, rest)) => self
                .children
                .get(head)
                .is_some_and(|c| c.owns_at_or_below(rest)),
        }
    }

    pub(super) fn union_with(&mut self, other: &FieldSet) {
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
    pub(super) fn subtract(&mut self, other: &FieldSet) {
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

    pub(super) fn intersection(&self, other: &FieldSet) -> FieldSet {
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

    pub(super) fn members(&self) -> Vec<Path> {
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

    pub(super) fn stripped() -> FieldSet {
        let mut set = FieldSet::default();
        for path in STRIPPED_PATHS {
            let path: Path = path.iter().map(|s| (*s).to_string()).collect();
            set.insert(&path);
        }
        set
    }

    /// FieldsV1 JSON. A member with children gets a `.` entry; a member leaf is `{}`.
    pub(super) fn to_fields_v1(&self) -> Value {
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
    pub(super) fn from_fields_v1(v: &Value) -> FieldSet {
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
