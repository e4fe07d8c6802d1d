//! The `kubernetes.io/pvc-protection` finalizer, as kube's admission plugin
//! and pvc-protection controller run it: every new PersistentVolumeClaim gets
//! the finalizer, and a claim marked for deletion keeps it (stays
//! `Terminating`) while a scheduled pod that is not shut down still mounts
//! it, so a volume in use is never pulled away from under a running database.

use super::cluster::{Cluster, finalizers};
use super::resources::ResourceType;
use super::store::{StoredObject, str_at};
use crate::json_ptr::Ptr;
use serde_json::{Value, json};
use std::sync::Arc;

/// The finalizer kube's `StorageObjectInUseProtection` admission adds.
pub const FINALIZER: &str = "kubernetes.io/pvc-protection";

/// Admission on create: the claim carries the finalizer from the start.
pub fn admit(v: &mut Value) {
    let mut fins = finalizers(v);
    if !fins.iter().any(|f| f == FINALIZER) {
        fins.push(FINALIZER.into());
        v["metadata"]["finalizers"] = json!(fins);
    }
}

/// The controller for one claim, given the pods of its namespace: a claim
/// being deleted loses the finalizer once no pod uses it (the write then
/// completes the deletion).
pub fn reconcile_claim(c: &Cluster, rt: &ResourceType, v: &Value, pods: &[Arc<StoredObject>]) {
    if v.ptr("/metadata/deletionTimestamp").is_none()
        || !finalizers(v).iter().any(|f| f == FINALIZER)
    {
        return;
    }
    let ns = str_at(v, "/metadata/namespace");
    let name = str_at(v, "/metadata/name");
    let pods: Vec<Value> = pods
        .iter()
        .filter(|p| p.namespace() == ns && p.mounts_claim(name))
        .map(|p| p.value())
        .collect();
    let pods: Vec<&Value> = pods.iter().collect();
    if !in_use(ns, name, &pods) {
        c.remove_finalizer(rt, ns, name, FINALIZER);
    }
}

/// Whether any pod of the claim's namespace still uses it.
pub fn in_use(ns: &str, claim: &str, pods: &[&Value]) -> bool {
    pods.iter()
        .any(|p| str_at(p, "/metadata/namespace") == ns && pod_uses(p, claim))
}

/// Kube's rule: only scheduled pods count (the kubelet refuses to start a
/// pod on a claim being deleted), and a pod that is shut down (Succeeded,
/// Failed, or force-deleted) no longer holds its claims. Generic ephemeral
/// volumes name their claim `<pod>-<volume>`.
pub fn pod_uses(pod: &Value, claim: &str) -> bool {
    if str_at(pod, "/spec/nodeName").is_empty() || shut_down(pod) {
        return false;
    }
    claims_of(pod).iter().any(|c| c == claim)
}

/// The claims a pod mounts: by name, and its generic ephemeral volumes'
/// (`<pod>-<volume>`). The store keeps them with each stored Pod
/// ([`StoredObject::mounts_claim`]).
pub fn claims_of(pod: &Value) -> Vec<String> {
    let pod_name = str_at(pod, "/metadata/name");
    pod.ptr("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|vol| {
            if let Some(n) = vol
                .ptr("/persistentVolumeClaim/claimName")
                .and_then(Value::as_str)
            {
                Some(n.to_string())
            } else if vol.get("ephemeral").is_some() {
                Some(format!("{pod_name}-{}", str_at(vol, "/name")))
            } else {
                None
            }
        })
        .collect()
}

fn shut_down(pod: &Value) -> bool {
    let phase = str_at(pod, "/status/phase");
    let force_deleted = pod.ptr("/metadata/deletionTimestamp").is_some()
        && pod
            .ptr("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            == Some(0);
    phase == "Succeeded" || phase == "Failed" || force_deleted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: &str, phase: &str, claim: &str) -> Value {
        json!({
            "metadata": {"name": "p", "namespace": "db"},
            "spec": {"nodeName": node, "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": claim}},
                {"name": "scratch", "ephemeral": {}}
            ]},
            "status": {"phase": phase}
        })
    }

    #[test]
    fn running_scheduled_pod_holds_its_claims() {
        let p = pod("node-1", "Running", "data-0");
        assert!(in_use("db", "data-0", &[&p]));
        assert!(in_use("db", "p-scratch", &[&p]));
        assert!(!in_use("other", "data-0", &[&p]));
        assert!(!in_use("db", "data-1", &[&p]));
    }

    #[test]
    fn unscheduled_or_finished_pods_do_not() {
        assert!(!pod_uses(&pod("", "Pending", "data-0"), "data-0"));
        assert!(!pod_uses(&pod("node-1", "Succeeded", "data-0"), "data-0"));
        assert!(!pod_uses(&pod("node-1", "Failed", "data-0"), "data-0"));
    }

    #[test]
    fn admission_adds_the_finalizer_once() {
        let mut v = json!({"metadata": {"finalizers": ["a.example/x"]}});
        admit(&mut v);
        admit(&mut v);
        assert_eq!(
            v["metadata"]["finalizers"],
            json!(["a.example/x", FINALIZER])
        );
    }
}
