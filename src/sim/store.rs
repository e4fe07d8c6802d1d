//! The object store of one emulated cluster: what etcd plus the watch cache are
//! to a kube-apiserver. Every write runs under one lock, gets the next
//! resourceVersion, is serialized once (lists and watches reuse those bytes),
//! lands in a bounded history (so watches can resume, and get `410 Gone` when
//! they ask for something older) and is broadcast to open watches.

use super::history::{self, History};
use super::resources::ResKey;
use super::stored::Prepared;
pub use super::stored::{StoredObject, str_at};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use tokio::sync::broadcast;

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
    /// Decide again under the write lock (see [`View::is_locked`]).
    Locked,
}

/// The outcome of a mutation: the object after it (for a delete, the last state).
pub struct Outcome {
    pub obj: Arc<StoredObject>,
    pub kind: Option<EventType>,
    /// The object the write replaced (none for a create or no write).
    pub prev: Option<Arc<StoredObject>>,
}

/// (namespace, name); cluster-scoped objects use "" as namespace.
pub type ObjName = (String, String);

pub struct Inner {
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

/// Read access to the store from inside [`Store::mutate_viewing`]: under
/// the write lock (a read through the store would deadlock), or outside it
/// in an optimistic attempt.
pub enum View<'a> {
    Locked(&'a Inner),
    Unlocked(&'a Store),
}

impl View<'_> {
    /// Whether what is read here is exactly the state the write commits
    /// to. A decision that rests on other objects (quota usage) must
    /// answer [`Change::Locked`] when it is not.
    pub fn is_locked(&self) -> bool {
        matches!(self, View::Locked(_))
    }
}

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
        match self {
            View::Locked(inner) => inner.list_in(key, ns),
            View::Unlocked(store) => store.read().list_in(key, ns),
        }
    }
}

impl Lister for Store {
    fn list_in(&self, key: &ResKey, ns: &str) -> Vec<Arc<StoredObject>> {
        self.read().list_in(key, ns)
    }
}

/// Optimistic attempts of a write before it runs under the lock.
pub const OPTIMISTIC_TRIES: usize = 8;

/// What a decided change leaves to do under the lock.
enum Step {
    /// Nothing to write: this is the outcome.
    Done(Option<Outcome>),
    Write(Prepared, EventType),
}

impl Step {
    /// Compares and serializes outside the lock; `None` for
    /// [`Change::Locked`].
    fn prepare(change: Change, current: Option<&Arc<StoredObject>>) -> Option<Step> {
        let keep = || {
            Step::Done(current.map(|obj| Outcome {
                obj: obj.clone(),
                kind: None,
                prev: None,
            }))
        };
        Some(match change {
            Change::Locked => return None,
            Change::Keep => keep(),
            Change::Delete => match current {
                None => Step::Done(None),
                Some(cur) => Step::Write(Prepared::new(cur.value()), EventType::Deleted),
            },
            Change::Put(v) => Step::put(v, current, false),
            Change::Changed(v) => Step::put(v, current, true),
        })
    }

    /// A write of `v`, unless it changes nothing (`compared`: the caller
    /// already found it different).
    fn put(v: Value, current: Option<&Arc<StoredObject>>, compared: bool) -> Step {
        if !compared
            && let Some(cur) = current
            && same_content(&cur.value(), &v)
        {
            return Step::Done(Some(Outcome {
                obj: cur.clone(),
                kind: None,
                prev: None,
            }));
        }
        let kind = if current.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        Step::Write(Prepared::new(v), kind)
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

    /// Runs `f` on the current object and commits what it decides (see
    /// [`Store::mutate_viewing`]).
    pub fn mutate<E>(
        &self,
        key: &ResKey,
        ns: &str,
        name: &str,
        mut f: impl FnMut(Option<&Arc<StoredObject>>) -> Result<Change, E>,
    ) -> Result<Option<Outcome>, E> {
        self.mutate_viewing(key, ns, name, |cur, _| f(cur))
    }

    /// Runs `f` on the current object and commits what it decides, as
    /// kube-apiserver's `GuaranteedUpdate` over etcd does: `f` (decoding,
    /// patching, validation, admission) and the serialization run outside
    /// the lock; the commit checks that the object is still the one `f`
    /// saw and otherwise runs `f` again on the new one. After
    /// [`OPTIMISTIC_TRIES`] lost races, or when `f` answers
    /// [`Change::Locked`] (its decision rests on other objects, like quota
    /// usage, so that two concurrent creates cannot both take the last
    /// slot), `f` runs under the write lock with a [`View`] of exactly the
    /// state the write commits to.
    pub fn mutate_viewing<E>(
        &self,
        key: &ResKey,
        ns: &str,
        name: &str,
        mut f: impl FnMut(Option<&Arc<StoredObject>>, &View<'_>) -> Result<Change, E>,
    ) -> Result<Option<Outcome>, E> {
        let id = (ns.to_string(), name.to_string());
        for _ in 0..OPTIMISTIC_TRIES {
            let current = self.get(key, ns, name);
            let change = f(current.as_ref(), &View::Unlocked(self))?;
            let step = match Step::prepare(change, current.as_ref()) {
                None => break,
                // Nothing to write: the answer is the object as read, a
                // linearizable read without the write lock.
                Some(Step::Done(out)) => return Ok(out),
                Some(step) => step,
            };
            let mut inner = self.write();
            let now = inner.objects.get(key).and_then(|m| m.get(&id));
            let unchanged = match (now, &current) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            };
            if unchanged {
                return Ok(self.commit(&mut inner, key, id, current, step));
            }
        }
        let mut inner = self.write();
        let current = inner.objects.get(key).and_then(|m| m.get(&id)).cloned();
        let change = f(current.as_ref(), &View::Locked(&inner))?;
        match Step::prepare(change, current.as_ref()) {
            Some(step) => Ok(self.commit(&mut inner, key, id, current, step)),
            // Asked for the lock while holding it: treated as no change.
            None => Ok(current.map(|obj| Outcome {
                obj,
                kind: None,
                prev: None,
            })),
        }
    }

    /// Applies a prepared step under the write lock: the revision, the
    /// object map, the dependents index, the history and the broadcast.
    fn commit(
        &self,
        inner: &mut Inner,
        key: &ResKey,
        id: ObjName,
        current: Option<Arc<StoredObject>>,
        step: Step,
    ) -> Option<Outcome> {
        let (prepared, kind) = match step {
            Step::Done(out) => return out,
            Step::Write(p, kind) => (p, kind),
        };
        inner.rv += 1;
        let obj = prepared.commit(inner.rv);
        if kind == EventType::Deleted {
            if let Some(m) = inner.objects.get_mut(key) {
                m.remove(&id);
            }
        } else {
            inner
                .objects
                .entry(key.clone())
                .or_default()
                .insert(id.clone(), obj.clone());
        }
        let entry = (key.clone(), id.0, id.1);
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
            kind,
            obj: obj.clone(),
            prev: current.clone(),
        });
        inner.history.push(ev.clone());
        inner.dirty = true;
        // No receivers is fine: nobody watches yet.
        let _ = self.tx.send(ev);
        Some(Outcome {
            obj,
            kind: Some(kind),
            prev: current,
        })
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
            let o = StoredObject::new(&v);
            let (ns, name) = (o.namespace().to_string(), o.name().to_string());
            for uid in o.owner_uids() {
                inner
                    .dependents
                    .entry(uid.to_string())
                    .or_default()
                    .insert((k.clone(), ns.clone(), name.clone()));
            }
            inner.objects.entry(k).or_default().insert((ns, name), o);
        }
    }
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

    #[test]
    fn concurrent_writes_of_one_object_lose_no_update() {
        let s = Arc::new(Store::new(10_000));
        put(&s, "a", "0");
        let writers: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        s.mutate::<()>(&key(), "default", "a", |cur| {
                            let mut v = cur.unwrap().value();
                            let n: u64 = v["data"]["k"].as_str().unwrap().parse().unwrap();
                            v["data"]["k"] = json!((n + 1).to_string());
                            Ok(Change::Put(v))
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let a = s.get(&key(), "default", "a").unwrap();
        assert_eq!(a.value()["data"]["k"], "800");
        assert_eq!(a.rv(), 2 + 800);
        assert_eq!(a.value()["metadata"]["resourceVersion"], "802");
    }
}
