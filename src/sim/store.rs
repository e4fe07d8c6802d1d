//! The object store of one emulated cluster: what etcd plus the watch cache are
//! to a kube-apiserver. Every write runs under one lock, gets the next
//! resourceVersion, is serialized once (lists and watches reuse those bytes),
//! lands in a bounded history (so watches can resume, and get `410 Gone` when
//! they ask for something older) and is broadcast to open watches.

use super::history::{self, History};
use super::resources::ResKey;
use crate::json_ptr::Ptr;
use bytes::Bytes;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use tokio::sync::broadcast;

/// A stored object: its serialized form plus the few fields the store and
/// the watch fan-out read on every write (revision, identity, labels,
/// owners, the deletion mark).
///
/// Why bytes and not a parsed `serde_json::Value`: a `Value` costs about
/// sixteen times its JSON (a B-tree node per object, a heap string per key
/// and value), and an emulated fleet keeps hundreds of thousands of objects
/// and their recent versions. What reads an object whole parses it
/// ([`StoredObject::value`]) — a write parses the object it changes, a GET or
/// a plain watch sends the bytes as they are.
#[derive(Debug)]
pub struct StoredObject {
    pub json: Bytes,
    rv: u64,
    namespace: Box<str>,
    name: Box<str>,
    uid: Box<str>,
    /// Sorted by key.
    labels: Box<[(Box<str>, Box<str>)]>,
    owners: Box<[Box<str>]>,
    deleting: bool,
}

impl StoredObject {
    /// Serializes and indexes an object (the store's writes; a dry run's
    /// answer, which is never stored).
    pub fn new(value: &Value) -> Arc<Self> {
        let json = Bytes::from(serde_json::to_vec(value).unwrap_or_default());
        Arc::new(Self::indexed(value, json))
    }

    fn indexed(value: &Value, json: Bytes) -> Self {
        let text = |v: &Value| match v {
            Value::String(s) => s.as_str().into(),
            other => other.to_string().into_boxed_str(),
        };
        let labels = value
            .ptr("/metadata/labels")
            .and_then(Value::as_object)
            .map(|m| {
                let mut l: Vec<(Box<str>, Box<str>)> = m
                    .iter()
                    .map(|(k, v)| (k.as_str().into(), text(v)))
                    .collect();
                l.sort_unstable();
                l.into_boxed_slice()
            })
            .unwrap_or_default();
        StoredObject {
            json,
            rv: rv_of(value),
            namespace: str_at(value, "/metadata/namespace").into(),
            name: str_at(value, "/metadata/name").into(),
            uid: str_at(value, "/metadata/uid").into(),
            labels,
            owners: owner_uids(value).into_iter().map(Into::into).collect(),
            deleting: value.ptr("/metadata/deletionTimestamp").is_some(),
        }
    }

    /// A stored object again from its serialized form (a loaded snapshot,
    /// tests).
    pub fn parse(json: Bytes) -> Option<Arc<Self>> {
        let value: Value = serde_json::from_slice(&json).ok()?;
        Some(Arc::new(Self::indexed(&value, json)))
    }

    /// The object, parsed from its JSON. The store wrote that JSON itself,
    /// so it always parses; `Null` would mean a serializer bug.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }

    /// Only `metadata`, parsed (the rest of the JSON is skipped, not built):
    /// what metadata-only reads and watches send.
    pub fn metadata(&self) -> Value {
        #[derive(serde::Deserialize)]
        struct Head {
            #[serde(default)]
            metadata: Value,
        }
        serde_json::from_slice::<Head>(&self.json).map_or(Value::Null, |h| h.metadata)
    }

    pub fn rv(&self) -> u64 {
        self.rv
    }

    pub fn uid(&self) -> &str {
        &self.uid
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// One label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .binary_search_by(|(k, _)| k.as_ref().cmp(key))
            .ok()
            .map(|i| self.labels[i].1.as_ref())
    }

    /// The uids of its owner references.
    pub fn owner_uids(&self) -> impl Iterator<Item = &str> {
        self.owners.iter().map(AsRef::as_ref)
    }

    pub fn has_owners(&self) -> bool {
        !self.owners.is_empty()
    }

    /// `metadata.deletionTimestamp` is set.
    pub fn is_deleting(&self) -> bool {
        self.deleting
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it. `prev` lets a selector-filtered watch turn a
/// change that moves an object out of its selection into a DELETED.
#[derive(Debug)]
pub struct WatchEvent {
    pub rv: u64,
    pub key: ResKey,
    pub namespace: String,
    pub kind: EventType,
    pub obj: Arc<StoredObject>,
    pub prev: Option<Arc<StoredObject>>,
}

/// What a mutation closure decides.
pub enum Change {
    Put(Value),
    /// [`Change::Put`] of an object the caller already found different
    /// from the current one ([`same_content`]), so the store does not parse
    /// the current object again to compare.
    Changed(Value),
    Delete,
    /// Leave the object as it is (the result is the current object).
    Keep,
}

/// The outcome of a mutation: the object after it (for a delete, the last state).
pub struct Outcome {
    pub obj: Arc<StoredObject>,
    pub kind: Option<EventType>,
}

/// (namespace, name); cluster-scoped objects use "" as namespace.
pub type ObjName = (String, String);

struct Inner {
    rv: u64,
    objects: HashMap<ResKey, BTreeMap<ObjName, Arc<StoredObject>>>,
    history: History,
    /// owner uid -> dependents, for garbage collection.
    dependents: HashMap<String, HashSet<(ResKey, String, String)>>,
    dirty: bool,
}

/// Objects of one kind in one namespace: the store outside a write, or a
/// [`View`] inside one.
pub trait Lister {
    fn list_in(&self, key: &ResKey, ns: &str) -> Vec<Arc<StoredObject>>;
}

/// Read access to the store from inside [`Store::mutate_viewing`] (the
/// write lock is held, so a read through the store would deadlock).
pub struct View<'a>(&'a Inner);

impl Inner {
    fn list_in(&self, key: &ResKey, ns: &str) -> Vec<Arc<StoredObject>> {
        let Some(map) = self.objects.get(key) else {
            return vec![];
        };
        map.range::<ObjName, _>((ns.to_string(), String::new())..)
            .take_while(|((n, _), _)| n == ns)
            .map(|(_, o)| o.clone())
            .collect()
    }
}

impl Lister for View<'_> {
    fn list_in(&self, key: &ResKey, ns: &str) -> Vec<Arc<StoredObject>> {
        self.0.list_in(key, ns)
    }
}

impl Lister for Store {
    fn list_in(&self, key: &ResKey, ns: &str) -> Vec<Arc<StoredObject>> {
        self.read().list_in(key, ns)
    }
}

/// Slots of the live channel (see `Store::new`).
const LIVE: usize = 1024;

pub struct Store {
    inner: RwLock<Inner>,
    tx: broadcast::Sender<Arc<WatchEvent>>,
}

/// A watch asked for a resourceVersion older than the history holds.
#[derive(Debug)]
pub struct Gone {
    pub oldest: u64,
}

impl Store {
    pub fn new(history_cap: usize) -> Self {
        // Each slot keeps its event alive until overwritten. A watcher that
        // falls further behind is closed and resumes from the history.
        // 1,024: the in-process runtimes resync from
        // the current state when they lag, which cannot replay a pod deleted
        // and recreated under the same name in between; at 256 a loaded
        // machine lagged them (a rolling update waited forever on a
        // replacement Pod the virtual kubelet never started).
        let (tx, _) = broadcast::channel(LIVE);
        Store {
            inner: RwLock::new(Inner {
                rv: 1,
                objects: HashMap::new(),
                history: History::new(history_cap, history::COMPACTION_WINDOW),
                dependents: HashMap::new(),
                dirty: false,
            }),
            tx,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn current_rv(&self) -> u64 {
        self.read().rv
    }

    pub fn get(&self, key: &ResKey, ns: &str, name: &str) -> Option<Arc<StoredObject>> {
        self.read()
            .objects
            .get(key)?
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Objects of one kind (optionally one namespace) in name order, starting
    /// after `after`, with the revision they were read at.
    pub fn list(
        &self,
        key: &ResKey,
        ns: Option<&str>,
        after: Option<&ObjName>,
    ) -> (Vec<Arc<StoredObject>>, u64) {
        let inner = self.read();
        let Some(map) = inner.objects.get(key) else {
            return (vec![], inner.rv);
        };
        let items: Vec<_> = match (ns, after) {
            (_, Some(a)) => map
                .range::<ObjName, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded))
                .filter(|((n, _), _)| ns.is_none_or(|want| want == n))
                .map(|(_, o)| o.clone())
                .collect(),
            (Some(want), None) => map
                .range::<ObjName, _>((want.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == want)
                .map(|(_, o)| o.clone())
                .collect(),
            (None, None) => map.values().cloned().collect(),
        };
        (items, inner.rv)
    }

    /// Every stored kind with its objects (GC, persistence, namespace cleanup).
    pub fn kinds(&self) -> Vec<ResKey> {
        self.read().objects.keys().cloned().collect()
    }

    /// Dependents recorded for an owner uid.
    pub fn dependents_of(&self, uid: &str) -> Vec<(ResKey, String, String)> {
        self.read()
            .dependents
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Runs `f` on the current object under the write lock and commits what it
    /// decides. The closure sees the revision the write will get, so it can
    /// stamp it (e.g. into `metadata.resourceVersion`, which the store sets anyway).
    pub fn mutate<E>(
        &self,
        key: &ResKey,
        ns: &str,
        name: &str,
        f: impl FnOnce(Option<&Arc<StoredObject>>) -> Result<Change, E>,
    ) -> Result<Option<Outcome>, E> {
        self.mutate_viewing(key, ns, name, |cur, _| f(cur))
    }

    /// [`Store::mutate`] whose closure also reads other objects under the
    /// same write lock: admission that depends on what else exists (quota
    /// usage) decides on exactly the state the write commits to, so two
    /// concurrent creates cannot both take the last slot.
    pub fn mutate_viewing<E>(
        &self,
        key: &ResKey,
        ns: &str,
        name: &str,
        f: impl FnOnce(Option<&Arc<StoredObject>>, &View<'_>) -> Result<Change, E>,
    ) -> Result<Option<Outcome>, E> {
        let mut inner = self.write();
        let id = (ns.to_string(), name.to_string());
        let current = inner.objects.get(key).and_then(|m| m.get(&id)).cloned();
        let change = f(current.as_ref(), &View(&inner))?;
        let compared = matches!(change, Change::Changed(_));
        let (obj, kind) = match change {
            Change::Keep => return Ok(current.map(|obj| Outcome { obj, kind: None })),
            Change::Delete => {
                let Some(cur) = current.clone() else {
                    return Ok(None);
                };
                inner.rv += 1;
                let mut v = cur.value();
                set_rv(&mut v, inner.rv);
                let obj = StoredObject::new(&v);
                if let Some(m) = inner.objects.get_mut(key) {
                    m.remove(&id);
                }
                (obj, EventType::Deleted)
            }
            Change::Put(mut v) | Change::Changed(mut v) => {
                if !compared
                    && let Some(cur) = &current
                    && same_content(&cur.value(), &v)
                {
                    return Ok(Some(Outcome {
                        obj: cur.clone(),
                        kind: None,
                    }));
                }
                inner.rv += 1;
                set_rv(&mut v, inner.rv);
                let obj = StoredObject::new(&v);
                inner
                    .objects
                    .entry(key.clone())
                    .or_default()
                    .insert(id.clone(), obj.clone());
                let kind = if current.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                (obj, kind)
            }
        };
        let entry = (key.clone(), ns.to_string(), name.to_string());
        if let Some(prev) = &current {
            for uid in prev.owner_uids() {
                if let Some(s) = inner.dependents.get_mut(uid) {
                    s.remove(&entry);
                    if s.is_empty() {
                        inner.dependents.remove(uid);
                    }
                }
            }
        }
        if kind != EventType::Deleted {
            for uid in obj.owner_uids() {
                inner
                    .dependents
                    .entry(uid.to_string())
                    .or_default()
                    .insert(entry.clone());
            }
        }
        let ev = Arc::new(WatchEvent {
            rv: inner.rv,
            key: key.clone(),
            namespace: ns.to_string(),
            kind,
            obj: obj.clone(),
            prev: current,
        });
        inner.history.push(ev.clone());
        inner.dirty = true;
        // No receivers is fine: nobody watches yet.
        let _ = self.tx.send(ev);
        Ok(Some(Outcome {
            obj,
            kind: Some(kind),
        }))
    }

    /// Events after `rv` from history plus a live receiver, taken atomically so
    /// nothing falls between them.
    #[allow(clippy::type_complexity)]
    pub fn watch_from(
        &self,
        rv: u64,
    ) -> Result<(Vec<Arc<WatchEvent>>, broadcast::Receiver<Arc<WatchEvent>>), Gone> {
        let inner = self.read();
        let backlog = inner.history.since(rv)?;
        Ok((backlog, self.tx.subscribe()))
    }

    /// A live receiver plus the revision it starts after.
    pub fn subscribe(&self) -> (u64, broadcast::Receiver<Arc<WatchEvent>>) {
        let inner = self.read();
        (inner.rv, self.tx.subscribe())
    }

    /// Watches (and continue tokens) from revisions below this get `410 Gone`.
    pub fn compacted_rv(&self) -> u64 {
        self.read().history.compacted_rv()
    }

    /// Forgets all history (tests use this to provoke `410 Gone`).
    pub fn compact(&self) {
        let mut inner = self.write();
        let rv = inner.rv;
        inner.history.compact_to(rv);
    }

    /// Takes the dirty flag; persistence writes a snapshot only when set.
    pub fn take_dirty(&self) -> bool {
        std::mem::take(&mut self.write().dirty)
    }

    /// Every object with its kind, and the current revision.
    pub fn dump(&self) -> (u64, Vec<(ResKey, Arc<StoredObject>)>) {
        let inner = self.read();
        let mut out = vec![];
        for (k, m) in &inner.objects {
            for o in m.values() {
                out.push((k.clone(), o.clone()));
            }
        }
        (inner.rv, out)
    }

    /// Loads a snapshot into an empty store.
    pub fn load(&self, rv: u64, objects: Vec<(ResKey, Value)>) {
        let mut inner = self.write();
        inner.rv = rv.max(inner.rv);
        let rv = inner.rv;
        inner.history.compact_to(rv);
        for (k, v) in objects {
            let ns = str_at(&v, "/metadata/namespace").to_string();
            let name = str_at(&v, "/metadata/name").to_string();
            for uid in owner_uids(&v) {
                inner.dependents.entry(uid).or_default().insert((
                    k.clone(),
                    ns.clone(),
                    name.clone(),
                ));
            }
            inner
                .objects
                .entry(k)
                .or_default()
                .insert((ns, name), StoredObject::new(&v));
        }
    }
}

fn set_rv(v: &mut Value, rv: u64) {
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

fn rv_of(v: &Value) -> u64 {
    v.ptr("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

pub fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.ptr(ptr).and_then(Value::as_str).unwrap_or_default()
}

fn owner_uids(v: &Value) -> Vec<String> {
    v.ptr("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Equal apart from resourceVersion and managedFields timestamps: a write that
/// changes nothing does not bump the revision or wake watchers, as in kube.
pub fn same_content(a: &Value, b: &Value) -> bool {
    // Compared in place (copying both objects was a twentieth of the
    // emulator's CPU): every key but metadata equal, then metadata's keys
    // but resourceVersion, then managedFields entry by entry without `time`.
    fn equal_except(
        x: &Value,
        y: &Value,
        skip: &[&str],
        then: impl Fn(&str, &Value, &Value) -> bool,
    ) -> bool {
        let (Some(x), Some(y)) = (x.as_object(), y.as_object()) else {
            return x == y;
        };
        let kept = |m: &serde_json::Map<String, Value>| {
            m.keys().filter(|k| !skip.contains(&k.as_str())).count()
        };
        kept(x) == kept(y)
            && x.iter()
                .filter(|(k, _)| !skip.contains(&k.as_str()))
                .all(|(k, v)| y.get(k).is_some_and(|w| then(k, v, w)))
    }
    let managed = |l: &Value, r: &Value| match (l.as_array(), r.as_array()) {
        (Some(l), Some(r)) => {
            l.len() == r.len()
                && l.iter()
                    .zip(r)
                    .all(|(e, f)| equal_except(e, f, &["time"], |_, v, w| v == w))
        }
        _ => l == r,
    };
    let metadata = |m: &Value, n: &Value| {
        equal_except(m, n, &["resourceVersion"], |k, v, w| {
            if k == "managedFields" {
                managed(v, w)
            } else {
                v == w
            }
        })
    };
    equal_except(a, b, &[], |k, v, w| {
        if k == "metadata" {
            metadata(v, w)
        } else {
            v == w
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> ResKey {
        ResKey {
            group: String::new(),
            plural: "configmaps".into(),
        }
    }

    fn put(s: &Store, name: &str, data: &str) -> Option<Outcome> {
        s.mutate::<()>(&key(), "default", name, |_| {
            Ok(Change::Put(
                json!({"metadata": {"name": name, "namespace": "default"}, "data": {"k": data}}),
            ))
        })
        .unwrap()
    }

    #[test]
    fn revisions_history_and_gone() {
        let s = Store::new(2);
        let a = put(&s, "a", "1").unwrap();
        assert_eq!(a.kind, Some(EventType::Added));
        assert_eq!(a.obj.rv(), 2);
        // identical write is a no-op
        assert_eq!(put(&s, "a", "1").unwrap().kind, None);
        assert_eq!(s.current_rv(), 2);
        put(&s, "b", "1");
        put(&s, "a", "2");
        let (backlog, _) = s.watch_from(2).unwrap();
        assert_eq!(backlog.iter().map(|e| e.rv).collect::<Vec<_>>(), vec![3, 4]);
        assert!(s.watch_from(1).is_err());
        let (items, rv) = s.list(&key(), Some("default"), None);
        assert_eq!(items.len(), 2);
        assert_eq!(rv, 4);
        let (after, _) = s.list(&key(), None, Some(&("default".into(), "a".into())));
        assert_eq!(after.len(), 1);
    }
}
