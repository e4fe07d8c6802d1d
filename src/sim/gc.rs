//! The garbage collector and namespace controller of an emulated cluster:
//! dependents of a deleted owner go too (background), an owner deleted in the
//! foreground waits for its dependents, an orphaning delete strips owner
//! references, and a terminating namespace is emptied before it disappears.
//! The PV controller, the resizer and the pvc-protection controller run in
//! the same task.
//!
//! Driven by the writes themselves, as kube's controllers are driven by
//! their informers: every committed write that can matter (a deletion, a
//! deletion mark, a new object with owners, a claim, a Pod write that binds,
//! changes the phase of or adds a Pod mounting a claim) is queued with
//! the object it wrote, and one pass handles just those objects and what
//! they point at. A full pass over the store ([`resync`]) runs only at start
//! (a loaded store); after that nothing sweeps: every write is offered here
//! as it commits, so nothing can be missed, and a claim whose file system
//! did not grow is retried on its own timer. Before, every claim write swept
//! the whole store (at 1,500 objects per cluster and thousands of claim
//! writes that was most of the emulator's CPU), and later a sweep still ran
//! once a minute. The offer and the full pass read the store's small index
//! (deletion mark, owners, name), not the objects.

use super::cluster::{Cluster, DeleteOpts, Sub, WriteOpts, finalizers};
use super::resources::{ResKey, ResourceType};
use super::store::{EventType, StoredObject, str_at};
use super::stored::{ALL, Pick};
use crate::json_ptr::Ptr;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// When a claim whose file system did not grow is tried again.
const RETRY: Duration = Duration::from_secs(5);

/// One committed write the controllers here have to look at.
pub struct Touched {
    pub key: ResKey,
    pub obj: Arc<StoredObject>,
    pub kind: EventType,
}

/// The writes queued since the last pass, and the wake-up for the task.
#[derive(Default)]
pub struct Queue {
    items: Mutex<Vec<Touched>>,
    /// Shared, so the task can wait without holding the cluster alive
    /// (a `notify_one` before the wait leaves a permit: nothing is missed).
    wake: Arc<tokio::sync::Notify>,
}

impl Queue {
    /// Queues a committed write if it is one the controllers here act on;
    /// `prev` is the object it replaced.
    pub fn offer(
        &self,
        key: &ResKey,
        obj: &Arc<StoredObject>,
        kind: EventType,
        prev: Option<&Arc<StoredObject>>,
    ) {
        let relevant = kind == EventType::Deleted
            || obj.is_deleting()
            || (kind == EventType::Added && obj.has_owners())
            || is_core(key, "persistentvolumeclaims")
            || (is_core(key, "pods") && claims_may_care(obj, prev));
        if !relevant {
            return;
        }
        self.items
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Touched {
                key: key.clone(),
                obj: obj.clone(),
                kind,
            });
        self.wake.notify_one();
    }

    fn take(&self) -> Vec<Touched> {
        std::mem::take(&mut *self.items.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Runs until the cluster is dropped: a full pass first, then the queued
/// writes as they come.
pub async fn run(cluster: std::sync::Weak<Cluster>) {
    let mut started = false;
    let mut retry: BTreeSet<(String, String)> = BTreeSet::new();
    let mut retry_at = Instant::now();
    loop {
        let Some(c) = cluster.upgrade() else { return };
        if !started {
            // What is queued now is seen by the full pass too.
            drop(c.gc.take());
            retry = resync(&c);
            started = true;
        } else {
            let due = !retry.is_empty() && retry_at <= Instant::now();
            let again = if due {
                std::mem::take(&mut retry)
            } else {
                BTreeSet::new()
            };
            retry.extend(handle(&c, c.gc.take(), again));
        }
        if !retry.is_empty() && retry_at <= Instant::now() {
            retry_at = Instant::now() + RETRY;
        }
        let wake = c.gc.wake.clone();
        let left = (!retry.is_empty()).then(|| retry_at.saturating_duration_since(Instant::now()));
        drop(c);
        match left {
            Some(left) => {
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep(left) => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// Whether a Pod write can change what the claim controllers decide for
/// the claims it mounts: they read only its node binding, its phase and its
/// deletion (`storage::reconcile_claim`, `pvc_protection::pod_uses`). Most
/// Pod writes are its kubelet's status updates, which change none of these;
/// each used to list every Pod of the namespace for each claim.
fn claims_may_care(obj: &StoredObject, prev: Option<&Arc<StoredObject>>) -> bool {
    obj.claims().next().is_some() && prev.is_none_or(|p| p.pod_state() != obj.pod_state())
}

fn is_core(k: &ResKey, plural: &str) -> bool {
    k.group.is_empty() && k.plural == plural
}

type Name = (ResKey, String, String);

/// One pass over the queued writes (and the claims to try again); returns
/// the claims to try again later.
fn handle(
    c: &Arc<Cluster>,
    batch: Vec<Touched>,
    mut claims: BTreeSet<(String, String)>,
) -> BTreeSet<(String, String)> {
    let mut seen: HashSet<Name> = HashSet::new();
    let mut deleted_uids: HashSet<String> = HashSet::new();
    // Objects to finalize again: owners waiting in the foreground for a
    // dependent that went, namespaces emptying.
    let mut recheck: BTreeSet<Name> = BTreeSet::new();
    let mut kinds_gone = false;
    for t in &batch {
        let ns = t.obj.namespace();
        if is_core(&t.key, "pods") {
            claims.extend(t.obj.claims().map(|cl| (ns.to_string(), cl.to_string())));
        } else if is_core(&t.key, "persistentvolumeclaims") {
            claims.insert((ns.to_string(), t.obj.name().to_string()));
        }
        if t.kind == EventType::Deleted {
            if !deleted_uids.insert(t.obj.uid().to_string()) {
                continue;
            }
            for dep in c.store.dependents_of(t.obj.uid()) {
                delete_if_orphaned(c, &dep);
            }
            for owner in owner_names(c, ns, &t.obj.value()) {
                recheck.insert(owner);
            }
            if !ns.is_empty() {
                recheck.insert((core("namespaces"), String::new(), ns.to_string()));
            }
            kinds_gone |= t.key.group == "apiextensions.k8s.io"
                && t.key.plural == "customresourcedefinitions";
            continue;
        }
        let id = (t.key.clone(), ns.to_string(), t.obj.name().to_string());
        if !seen.insert(id.clone()) {
            continue;
        }
        let Some(cur) = c.store.get(&id.0, &id.1, &id.2) else {
            continue;
        };
        if cur.is_deleting() {
            recheck.insert(id);
        } else if t.kind == EventType::Added && cur.uid() == t.obj.uid() {
            // Created after its owners were already gone.
            delete_if_orphaned(c, &id);
        }
    }
    for id in &recheck {
        if let Some(cur) = c.store.get(&id.0, &id.1, &id.2)
            && cur.is_deleting()
            && let Some(rt) = c.type_of(&id.0)
        {
            finalize(c, &rt, &cur.value());
        }
    }
    if kinds_gone {
        purge_unserved_kinds(c);
    }
    claims
        .into_iter()
        .filter(|(ns, name)| !claim(c, ns, name))
        .collect()
}

fn core(plural: &str) -> ResKey {
    ResKey {
        group: String::new(),
        plural: plural.into(),
    }
}

/// The PV controller, resizer, kubelet and pvc-protection for one claim;
/// false: try again later (its file system did not grow).
fn claim(c: &Arc<Cluster>, ns: &str, name: &str) -> bool {
    let key = core("persistentvolumeclaims");
    let (Some(cur), Some(rt)) = (c.store.get(&key, ns, name), c.type_of(&key)) else {
        return true;
    };
    let (pods, _) = c.store.list(&core("pods"), Some(ns), None);
    let v = cur.value();
    let done = super::storage::reconcile_claim(c, &rt, &v, &pods);
    super::pvc_protection::reconcile_claim(c, &rt, &v, &pods);
    done
}

/// The named owners of `v` (in `ns`, or cluster-scoped) that exist with the
/// referenced uid.
fn owner_names(c: &Cluster, ns: &str, v: &Value) -> Vec<Name> {
    let Some(refs) = v.ptr("/metadata/ownerReferences").and_then(Value::as_array) else {
        return vec![];
    };
    refs.iter()
        .filter_map(|r| {
            live_owner(c, ns, r).map(|(k, ons)| (k, ons, str_at(r, "/name").to_string()))
        })
        .collect()
}

/// The owner an owner reference names, if it exists with that uid: its
/// kind and the namespace it lives in.
fn live_owner(c: &Cluster, ns: &str, r: &Value) -> Option<(ResKey, String)> {
    let api_version = str_at(r, "/apiVersion");
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    let kind = str_at(r, "/kind");
    let (key, namespaced) = c
        .registry()
        .all()
        .find(|t| t.group == group && t.kind == kind)
        .map(|t| (t.key(), t.namespaced))?;
    let ons = if namespaced { ns } else { "" };
    let o = c.store.get(&key, ons, str_at(r, "/name"))?;
    (o.uid() == str_at(r, "/uid")).then(|| (key, ons.to_string()))
}

/// Background deletion: a dependent whose owners are all gone goes too.
fn delete_if_orphaned(c: &Cluster, id: &Name) {
    let Some(cur) = c.store.get(&id.0, &id.1, &id.2) else {
        return;
    };
    if !cur.has_owners() || cur.is_deleting() {
        return;
    }
    // Only the owner references are parsed.
    let refs = cur.pick(Pick(&[("metadata", Pick(&[("ownerReferences", ALL)]))]));
    if !owner_names(c, &id.1, &refs).is_empty() {
        return;
    }
    if let Some(rt) = c.type_of(&id.0) {
        let _ = c.delete(&rt, &id.1, &id.2, &DeleteOpts::default());
    }
}

/// An object marked for deletion: its dependents orphaned or deleted first
/// (foreground); a namespace emptied.
fn finalize(c: &Arc<Cluster>, rt: &ResourceType, v: &Value) {
    let ns = str_at(v, "/metadata/namespace");
    let name = str_at(v, "/metadata/name");
    let uid = str_at(v, "/metadata/uid");
    let fins = finalizers(v);
    let deps = c.store.dependents_of(uid);
    if fins.iter().any(|f| f == "orphan") {
        for (dk, dns, dname) in &deps {
            strip_owner(c, dk, dns, dname, uid);
        }
        c.remove_finalizer(rt, ns, name, "orphan");
    } else if fins.iter().any(|f| f == "foregroundDeletion") {
        if deps.is_empty() {
            c.remove_finalizer(rt, ns, name, "foregroundDeletion");
        } else {
            delete_all(c, &deps);
        }
    }
    // Background: an owner that only waits for other finalizers still
    // exists, and kube's collector keeps its dependents until it is gone
    // (the Deleted event then takes them).
    if rt.group.is_empty() && rt.plural == "namespaces" && fins.iter().any(|f| f == "kubernetes") {
        empty_namespace(c, name);
    }
}

/// Deletes what is left in a terminating namespace; the namespace's own
/// finalizer goes once nothing is.
fn empty_namespace(c: &Cluster, name: &str) {
    let mut left = 0;
    for k in c.store.kinds() {
        let (items, _) = c.store.list(&k, Some(name), None);
        left += items.len();
        if let Some(krt) = c.type_of(&k)
            && krt.namespaced
        {
            for it in items {
                if !it.is_deleting() {
                    let _ = c.delete(&krt, name, it.name(), &DeleteOpts::default());
                }
            }
        }
    }
    if left == 0
        && let Some(rt) = c.type_of(&core("namespaces"))
    {
        c.remove_finalizer(&rt, "", name, "kubernetes");
    }
}

/// The full pass: every object marked for deletion or with owners, every
/// claim, and the objects of kinds no longer served; returns the claims to
/// try again later.
pub fn resync(c: &Arc<Cluster>) -> BTreeSet<(String, String)> {
    let (_, all) = c.store.dump();
    let mut claims = BTreeSet::new();
    for (key, o) in &all {
        if is_core(key, "persistentvolumeclaims") {
            claims.insert((o.namespace().to_string(), o.name().to_string()));
        }
        if o.is_deleting() {
            if let Some(rt) = c.type_of(key) {
                finalize(c, &rt, &o.value());
            }
        } else if o.has_owners() {
            delete_if_orphaned(c, &(key.clone(), o.namespace().into(), o.name().into()));
        }
    }
    drop(all);
    purge_unserved_kinds(c);
    claims
        .into_iter()
        .filter(|(ns, name)| !claim(c, ns, name))
        .collect()
}

/// Objects of a deleted CRD go with it.
fn purge_unserved_kinds(c: &Cluster) {
    for k in c.store.kinds() {
        if c.type_of(&k).is_none() {
            let (items, _) = c.store.list(&k, None, None);
            for it in items {
                let _ = c.store.mutate::<()>(&k, it.namespace(), it.name(), |_| {
                    Ok(super::store::Change::Delete)
                });
            }
        }
    }
}

fn delete_all(c: &Cluster, deps: &[Name]) {
    for (dk, dns, dname) in deps {
        if let Some(rt) = c.type_of(dk)
            && let Some(cur) = c.store.get(dk, dns, dname)
            && !cur.is_deleting()
        {
            let _ = c.delete(&rt, dns, dname, &DeleteOpts::default());
        }
    }
}

fn strip_owner(c: &Cluster, key: &ResKey, ns: &str, name: &str, uid: &str) {
    let Some(rt) = c.type_of(key) else { return };
    let opts = WriteOpts {
        field_manager: "kube-controller-manager".into(),
        ..Default::default()
    };
    let _ = c.write(&rt, ns, name, Sub::Main, &opts, false, |cur| {
        let mut v = cur.cloned().unwrap_or_default();
        let refs: Vec<Value> = v
            .ptr("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter(|r| r.get("uid").and_then(Value::as_str) != Some(uid))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        v["metadata"]["ownerReferences"] = json!(refs);
        Ok(v)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: &str, phase: &str, claim: bool) -> Arc<StoredObject> {
        let volumes = match claim {
            true => json!([{"name": "data", "persistentVolumeClaim": {"claimName": "db-1"}}]),
            false => json!([]),
        };
        StoredObject::new(&json!({"kind": "Pod",
            "metadata": {"name": "p", "namespace": "n", "uid": "u"},
            "spec": {"nodeName": node, "volumes": volumes}, "status": {"phase": phase}}))
    }

    #[test]
    fn a_pod_write_reaches_the_claim_controllers_only_when_they_could_decide_otherwise() {
        let (pending, bound) = (pod("", "Pending", true), pod("n1", "Pending", true));
        let running = pod("n1", "Running", true);
        // New, bound, running, finished: each changes what a claim reads.
        assert!(claims_may_care(&pending, None));
        assert!(claims_may_care(&bound, Some(&pending)));
        assert!(claims_may_care(&running, Some(&bound)));
        assert!(claims_may_care(
            &pod("n1", "Succeeded", true),
            Some(&running)
        ));
        // Another status update of a running pod, a pod without claims: no.
        assert!(!claims_may_care(&running, Some(&running)));
        assert!(!claims_may_care(&pod("n1", "Running", false), None));
    }
}
