//! The garbage collector and namespace controller of an emulated cluster:
//! dependents of a deleted owner go too (background), an owner deleted in the
//! foreground waits for its dependents, an orphaning delete strips owner
//! references, and a terminating namespace is emptied before it disappears.

use super::cluster::{Cluster, DeleteOpts, Sub, WriteOpts, finalizers};
use super::resources::ResKey;
use super::store::str_at;
use crate::json_ptr::Ptr;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// Runs until the cluster is dropped; wakes on deletions (every write that
/// deletes or marks for deletion notifies it) and otherwise every 5 s, as a
/// safety net for dependents created after their owner was already gone.
pub async fn run(cluster: std::sync::Weak<Cluster>) {
    loop {
        let Some(c) = cluster.upgrade() else { return };
        sweep(&c);
        let wake = c.gc_wake.notified();
        tokio::select! {
            _ = wake => {}
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        drop(c);
    }
}

fn meta<'a>(v: &'a Value, k: &str) -> Option<&'a Value> {
    v.get("metadata")?.get(k)
}

/// One pass over everything marked for deletion or left without its owner.
/// Objects with neither owner references nor a deletion mark — nearly all
/// of them — cost two map lookups.
pub fn sweep(c: &Arc<Cluster>) {
    let (_, all) = c.store.dump();
    let mut uids = std::collections::HashSet::with_capacity(all.len());
    for (_, o) in &all {
        uids.insert(o.uid());
    }
    let mut types: std::collections::HashMap<&ResKey, Option<super::resources::ResourceType>> =
        std::collections::HashMap::new();
    for (key, o) in &all {
        let v = &o.value;
        let owned = meta(v, "ownerReferences")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        if !owned && meta(v, "deletionTimestamp").is_none() {
            continue;
        }
        let Some(rt) = types.entry(key).or_insert_with(|| c.type_of(key)).as_ref() else {
            continue;
        };
        let ns = str_at(v, "/metadata/namespace");
        let name = str_at(v, "/metadata/name");
        // Dependents whose owners are all gone are deleted (background policy).
        if let Some(refs) = v.ptr("/metadata/ownerReferences").and_then(Value::as_array)
            && !refs.is_empty()
            && refs
                .iter()
                .all(|r| !uids.contains(r.get("uid").and_then(Value::as_str).unwrap_or_default()))
            && v.ptr("/metadata/deletionTimestamp").is_none()
        {
            let _ = c.delete(rt, ns, name, &DeleteOpts::default());
            continue;
        }
        if v.ptr("/metadata/deletionTimestamp").is_none() {
            continue;
        }
        let fins = finalizers(v);
        let deps = c.store.dependents_of(o.uid());
        if fins.iter().any(|f| f == "orphan") {
            for (dk, dns, dname) in &deps {
                strip_owner(c, dk, dns, dname, o.uid());
            }
            c.remove_finalizer(rt, ns, name, "orphan");
        } else if fins.iter().any(|f| f == "foregroundDeletion") {
            if deps.is_empty() {
                c.remove_finalizer(rt, ns, name, "foregroundDeletion");
            } else {
                delete_all(c, &deps);
            }
        } else if !deps.is_empty() {
            delete_all(c, &deps);
        }
        if key.group.is_empty()
            && key.plural == "namespaces"
            && fins.iter().any(|f| f == "kubernetes")
        {
            let mut left = 0;
            for k in c.store.kinds() {
                let (items, _) = c.store.list(&k, Some(name), None);
                left += items.len();
                if let Some(krt) = c.type_of(&k)
                    && krt.namespaced
                {
                    for it in items {
                        if it.value.ptr("/metadata/deletionTimestamp").is_none() {
                            let _ = c.delete(
                                &krt,
                                name,
                                str_at(&it.value, "/metadata/name"),
                                &DeleteOpts::default(),
                            );
                        }
                    }
                }
            }
            if left == 0 {
                c.remove_finalizer(rt, "", name, "kubernetes");
            }
        }
    }
    super::pvc_protection::sweep(c, &all);
    super::storage::sweep(c, &all);
    // Objects of a deleted CRD go with it.
    for k in c.store.kinds() {
        if c.type_of(&k).is_none() {
            let (items, _) = c.store.list(&k, None, None);
            for it in items {
                let ns = str_at(&it.value, "/metadata/namespace").to_string();
                let name = str_at(&it.value, "/metadata/name").to_string();
                let _ = c
                    .store
                    .mutate::<()>(&k, &ns, &name, |_| Ok(super::store::Change::Delete));
            }
        }
    }
}

fn delete_all(c: &Cluster, deps: &[(ResKey, String, String)]) {
    for (dk, dns, dname) in deps {
        if let Some(rt) = c.type_of(dk)
            && let Some(cur) = c.store.get(dk, dns, dname)
            && cur.value.ptr("/metadata/deletionTimestamp").is_none()
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
