//! The emulated kube-scheduler: watches the store for pods without
//! `spec.nodeName`, asks the pure [`place::place_held`] where each goes, and
//! either binds it (sets `spec.nodeName`, as the `pods/binding`
//! subresource does) or leaves it Pending with `PodScheduled=False, reason
//! Unschedulable` and a `FailedScheduling` Event, as the real scheduler
//! does. The kubelet runtimes only start pods that are bound.
//!
//! Pods are placed one at a time in creation order, each seeing the
//! bindings made before it in the same pass, so three replicas created at
//! once spread as they do on a real cluster. A pass runs after any change
//! to pods or nodes (debounced) and every few seconds while pods wait.
//!
//! Like kube-scheduler it keeps its own cache of the pods: the store keeps
//! objects as JSON, and a pass looks at every pod, so each pod version is
//! parsed once (and cut to what placement reads) rather than once per pass.

pub mod place;
pub mod terms;

use crate::cluster::{Cluster, Sub, WriteOpts, now_rfc3339};
use crate::error::ApiError;
use crate::json_ptr::Ptr;
use crate::recorder;
use crate::resources::ResKey;
use crate::store::{EventType, StoredObject, WatchEvent, str_at};
use crate::stored::PodPhase;
use place::Decision;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The name pods ask for in `spec.schedulerName` (empty means this one).
pub const NAME: &str = "default-scheduler";

fn key(plural: &str) -> ResKey {
    ResKey {
        group: String::new(),
        plural: plural.into(),
    }
}

/// Starts the scheduling loop of `c`.
pub fn start(c: &Arc<Cluster>) {
    tokio::spawn(run(Arc::downgrade(c)));
}

async fn run(weak: Weak<Cluster>) {
    let Some(c) = weak.upgrade() else { return };
    let (_, mut rx) = c.store.subscribe();
    drop(c);
    // Last FailedScheduling message per pod uid, so a pod that stays
    // unschedulable for the same reason gets one Event, not one per pass.
    let mut reported: HashMap<String, String> = HashMap::new();
    let mut cache = PodCache::default();
    loop {
        let waiting = match weak.upgrade() {
            Some(c) => pass(&c, &mut reported, &mut cache),
            None => return,
        };
        let retry = if waiting {
            Duration::from_secs(5)
        } else {
            Duration::from_secs(3600)
        };
        // Wait for a change to pods or nodes (or the retry tick).
        let deadline = tokio::time::sleep(retry);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                ev = rx.recv() => match ev {
                    Ok(ev) if wakes(&ev, waiting) => break,
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                    Err(_) => return,
                },
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Whether a write can give the scheduler work: a node changed, a Pod
/// waits to be bound, or — while pods wait as unschedulable — any Pod
/// changed (one that went or moved can make room), as kube-scheduler moves
/// its unschedulable pods back to the active queue on cluster events. The
/// other Pod writes, most of them the kubelets' status updates, leave
/// nothing to place; a pass for each of them (each looking at every Pod of
/// the cluster) was a fifth of the emulator's CPU in a fleet's cold start.
fn wakes(ev: &WatchEvent, waiting: bool) -> bool {
    let core = |plural: &str| ev.key.group.is_empty() && ev.key.plural == plural;
    if core("nodes") {
        return true;
    }
    if !core("pods") {
        return false;
    }
    waiting
        || (ev.kind != EventType::Deleted
            && !ev.obj.is_deleting()
            && ev
                .obj
                .pod_state()
                .is_some_and(|s| !s.bound && s.phase != PodPhase::Finished))
}

fn finished(p: &Value) -> bool {
    matches!(str_at(p, "/status/phase"), "Succeeded" | "Failed")
}

fn wants_this_scheduler(p: &Value) -> bool {
    matches!(str_at(p, "/spec/schedulerName"), "" | NAME)
}

/// One scheduling pass; true when pods are left waiting.
fn pass(c: &Cluster, reported: &mut HashMap<String, String>, cache: &mut PodCache) -> bool {
    let (pods, _) = c.store.list(&key("pods"), None, None);
    let pods = cache.refresh(&pods);
    let pending: Vec<&Value> = pods
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| {
            str_at(p, "/spec/nodeName").is_empty()
                && p.ptr("/metadata/deletionTimestamp").is_none()
                && !finished(p)
                && wants_this_scheduler(p)
        })
        .collect();
    if pending.is_empty() {
        reported.clear();
        return false;
    }
    let mut pending = pending;
    pending.sort_by(|a, b| {
        str_at(a, "/metadata/creationTimestamp")
            .cmp(str_at(b, "/metadata/creationTimestamp"))
            .then_with(|| str_at(a, "/metadata/name").cmp(str_at(b, "/metadata/name")))
    });
    let (nodes, _) = c.store.list(&key("nodes"), None, None);
    let nodes: Vec<Value> = nodes.iter().map(|o| o.value()).collect();
    // References into the listed objects; only the pods bound in this pass
    // are copies (with their new node), kept apart so the borrows stay valid.
    let bound: Vec<(&Value, &place::Held)> = pods
        .iter()
        .copied()
        .filter(|(p, _)| !str_at(p, "/spec/nodeName").is_empty() && !finished(p))
        .collect();
    let mut now_bound: Vec<(Value, place::Held)> = vec![];
    let mut waiting = false;
    for p in pending {
        let all: Vec<(&Value, &place::Held)> = bound
            .iter()
            .copied()
            .chain(now_bound.iter().map(|(v, h)| (v, h)))
            .collect();
        match place::place_held(p, &nodes, &all) {
            Decision::Bind(node) => {
                if bind(c, p, &node).is_ok() {
                    let mut b = p.clone();
                    b["spec"]["nodeName"] = json!(node);
                    let held = place::Held::of(&b);
                    now_bound.push((b, held));
                    reported.remove(str_at(p, "/metadata/uid"));
                } else {
                    // Not bound (a race with its deletion, a failed
                    // write): looked at again on the retry tick.
                    waiting = true;
                }
            }
            Decision::Unschedulable(msg) => {
                waiting = true;
                mark_unschedulable(c, p, &msg);
                let uid = str_at(p, "/metadata/uid").to_string();
                if reported.get(&uid) != Some(&msg) {
                    recorder::record(c, &recorder::SCHEDULER, p, true, "FailedScheduling", &msg);
                    reported.insert(uid, msg);
                }
            }
        }
    }
    waiting
}

/// The pods as placement sees them, by uid, each with the revision it was
/// parsed at and the terms it holds against others.
#[derive(Default)]
struct PodCache(HashMap<Box<str>, (u64, Value, place::Held)>);

impl PodCache {
    /// Brings the cache to `pods` (parsing only new versions) and returns
    /// their cached forms in the same order.
    fn refresh(&mut self, pods: &[Arc<StoredObject>]) -> Vec<(&Value, &place::Held)> {
        let live: std::collections::HashSet<&str> = pods.iter().map(|o| o.uid()).collect();
        self.0.retain(|uid, _| live.contains(uid.as_ref()));
        let parsed = |o: &StoredObject| {
            let v = placement_view(o.value());
            let held = place::Held::of(&v);
            (o.rv(), v, held)
        };
        for o in pods {
            match self.0.get_mut(o.uid()) {
                Some((rv, _, _)) if *rv == o.rv() => {}
                Some(entry) => *entry = parsed(o),
                None => {
                    self.0.insert(o.uid().into(), parsed(o));
                }
            }
        }
        pods.iter()
            .filter_map(|o| self.0.get(o.uid()))
            .map(|(_, v, h)| (v, h))
            .collect()
    }
}

/// A pod cut to what placement, binding and the scheduler's Events read:
/// identity, labels and owners, the scheduling part of the spec, the phase
/// and conditions.
fn placement_view(mut pod: Value) -> Value {
    if let Some(m) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
        m.retain(|k, _| {
            matches!(
                k.as_str(),
                "name"
                    | "namespace"
                    | "uid"
                    | "resourceVersion"
                    | "labels"
                    | "ownerReferences"
                    | "creationTimestamp"
                    | "deletionTimestamp"
            )
        });
    }
    if let Some(s) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        s.retain(|k, _| !matches!(k.as_str(), "containers" | "initContainers" | "volumes"));
    }
    if let Some(s) = pod.get_mut("status").and_then(Value::as_object_mut) {
        s.retain(|k, _| matches!(k.as_str(), "phase" | "conditions"));
    }
    if let Some(o) = pod.as_object_mut() {
        o.retain(|k, _| {
            matches!(
                k.as_str(),
                "apiVersion" | "kind" | "metadata" | "spec" | "status"
            )
        });
        // Events name the kind (the recorder would take a pod without
        // containers for a Node).
        o.entry("kind").or_insert_with(|| json!("Pod"));
    }
    pod
}

fn opts() -> WriteOpts {
    WriteOpts {
        field_manager: NAME.into(),
        ..Default::default()
    }
}

/// Binds `pod` to `node` (this uid only, and only if still unbound).
pub fn bind(c: &Cluster, pod: &Value, node: &str) -> Result<(), ApiError> {
    let rt = c
        .type_of(&key("pods"))
        .ok_or_else(|| ApiError::new(500, "InternalError", "pods are not served"))?;
    let uid = str_at(pod, "/metadata/uid").to_string();
    let (ns, name) = (
        str_at(pod, "/metadata/namespace"),
        str_at(pod, "/metadata/name"),
    );
    c.write(&rt, ns, name, Sub::Binding, &opts(), false, |cur| {
        let mut v = cur.cloned().unwrap_or_default();
        if str_at(&v, "/metadata/uid") != uid || !str_at(&v, "/spec/nodeName").is_empty() {
            return Err(ApiError::conflict("pods", name));
        }
        v["spec"]["nodeName"] = json!(node);
        // The binding records the decision in the status too.
        set_condition(
            &mut v,
            json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null,
                "lastTransitionTime": now_rfc3339()}),
        );
        Ok(v)
    })?;
    Ok(())
}

/// Replaces (or adds) the condition of the same type in `status.conditions`.
fn set_condition(v: &mut Value, cond: Value) {
    let ty = str_at(&cond, "/type").to_string();
    if !v["status"].is_object() {
        v["status"] = json!({});
    }
    let list = v["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut list: Vec<Value> = list
        .into_iter()
        .filter(|c| str_at(c, "/type") != ty)
        .collect();
    list.insert(0, cond);
    v["status"]["conditions"] = json!(list);
}

/// `phase: Pending` with `PodScheduled=False, reason Unschedulable`,
/// written only when the message changed.
fn mark_unschedulable(c: &Cluster, pod: &Value, msg: &str) {
    let current = pod
        .ptr("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| str_at(c, "/type") == "PodScheduled"));
    if current
        .is_some_and(|c| str_at(c, "/reason") == "Unschedulable" && str_at(c, "/message") == msg)
    {
        return;
    }
    let Some(rt) = c.type_of(&key("pods")) else {
        return;
    };
    let uid = str_at(pod, "/metadata/uid").to_string();
    let name = str_at(pod, "/metadata/name");
    let _ = c.write(
        &rt,
        str_at(pod, "/metadata/namespace"),
        name,
        Sub::Status,
        &opts(),
        false,
        |cur| {
            let mut v = cur.cloned().unwrap_or_default();
            if str_at(&v, "/metadata/uid") != uid {
                return Err(ApiError::conflict("pods", name));
            }
            set_condition(
                &mut v,
                json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": msg, "lastProbeTime": null, "lastTransitionTime": now_rfc3339()}),
            );
            v["status"]["phase"] = json!("Pending");
            Ok(v)
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(plural: &str, kind: EventType, obj: Value) -> WatchEvent {
        WatchEvent {
            rv: 1,
            key: key(plural),
            kind,
            obj: StoredObject::new(&obj),
            prev: None,
        }
    }

    fn pod(node: &str, phase: &str) -> Value {
        json!({"kind": "Pod", "metadata": {"name": "p", "namespace": "n", "uid": "u"},
            "spec": {"nodeName": node}, "status": {"phase": phase}})
    }

    #[test]
    fn only_writes_that_can_give_it_work_start_a_pass() {
        use EventType::{Added, Deleted, Modified};
        // A pod to place, a node: always.
        assert!(wakes(&event("pods", Added, pod("", "Pending")), false));
        assert!(wakes(&event("pods", Modified, pod("", "Pending")), false));
        assert!(wakes(
            &event("nodes", Modified, json!({"kind": "Node"})),
            false
        ));
        // A bound pod's status update, a finished pod, a deleted pod, an
        // unrelated kind: nothing to place while no pod waits …
        for (kind, p) in [
            (Modified, pod("n1", "Running")),
            (Added, pod("", "Succeeded")),
            (Deleted, pod("n1", "Running")),
        ] {
            assert!(!wakes(&event("pods", kind, p.clone()), false), "{p}");
            // … and a reason to look again while pods wait unschedulable.
            assert!(wakes(&event("pods", kind, p), true));
        }
        let cm = json!({"kind": "ConfigMap", "metadata": {"name": "c"}});
        assert!(!wakes(&event("configmaps", Added, cm), true));
    }
}
