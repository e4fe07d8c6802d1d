//! A kubelet's volume manager before a Pod starts: no PersistentVolumeClaim
//! the Pod mounts may be Terminating. (A missing claim is left to the
//! runtimes as before: a real scheduler would not place such a Pod.) Otherwise the Pod stays Pending (`ContainerCreating`) with a
//! `FailedMount` Warning Event, as a real kubelet leaves it ("can't start pod
//! because PVC ns/name is being deleted"), and starts once the claim is
//! usable again (the runtimes call [`waiting_on`] when a claim changes).
//! Starting it anyway would put a database on a volume that is about to go.

use super::cluster::{Cluster, Sub, WriteOpts, now_rfc3339};
use super::resources::ResKey;
use super::store::str_at;
use crate::json_ptr::Ptr;
use serde_json::{Value, json};

fn core(plural: &str) -> ResKey {
    ResKey {
        group: String::new(),
        plural: plural.into(),
    }
}

/// The claims a Pod mounts.
fn claims(pod: &Value) -> Vec<&str> {
    pod.ptr("/spec/volumes")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter_map(|v| v.ptr("/persistentVolumeClaim/claimName")?.as_str())
                .collect()
        })
        .unwrap_or_default()
}

/// Why the Pod cannot start yet (a claim being deleted), if so.
pub fn blocked(c: &Cluster, pod: &Value) -> Option<String> {
    let ns = str_at(pod, "/metadata/namespace");
    let rt = c.type_of(&core("persistentvolumeclaims"))?;
    claims(pod).into_iter().find_map(|claim| {
        let o = c.store.get(&rt.key(), ns, claim)?;
        o.is_deleting()
            .then(|| format!("can't start pod because PVC {ns}/{claim} is being deleted"))
    })
}

/// Leaves the Pod Pending with its containers `ContainerCreating` and
/// records the `FailedMount` Event (once per reason; repeated calls change
/// nothing, so the Pod's own watch events do not loop).
pub fn hold(c: &Cluster, pod: &Value, why: &str) {
    let (ns, name) = (
        str_at(pod, "/metadata/namespace").to_string(),
        str_at(pod, "/metadata/name").to_string(),
    );
    let message = format!("Unable to attach or mount volumes for pod {name}: {why}");
    let held = str_at(pod, "/status/phase") == "Pending"
        && str_at(pod, "/status/containerStatuses/0/state/waiting/message") == message;
    if held {
        return;
    }
    let opts = WriteOpts {
        field_manager: "kubelet".into(),
        ..Default::default()
    };
    let now = now_rfc3339();
    if let Some(rt) = c.type_of(&core("pods")) {
        let statuses: Vec<Value> = pod
            .ptr("/spec/containers")
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .map(|ct| {
                        json!({"name": str_at(ct, "/name"), "image": str_at(ct, "/image"),
                        "ready": false, "started": false, "restartCount": 0, "imageID": "",
                        "state": {"waiting": {"reason": "ContainerCreating", "message": message}}})
                    })
                    .collect()
            })
            .unwrap_or_default();
        let _ = c.write(&rt, &ns, &name, Sub::Status, &opts, false, |cur| {
            let mut v = cur.cloned().unwrap_or_default();
            v["status"] = json!({
                "phase": "Pending", "hostIP": "127.0.0.1", "startTime": now,
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": now},
                ],
                "containerStatuses": statuses,
            });
            Ok(v)
        });
    }
    if let Some(rt) = c.type_of(&core("events")) {
        let ev = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": format!("{name}.")},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": ns,
                               "uid": str_at(pod, "/metadata/uid")},
            "reason": "FailedMount", "message": message, "type": "Warning",
            "source": {"component": "kubelet"}, "reportingComponent": "kubelet",
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        });
        let _ = c.create(&rt, &ns, ev, &opts);
    }
}

/// Pods [`hold`] keeps Pending that mount `claim` (to look at again when
/// it changes).
pub fn waiting_on(c: &Cluster, ns: &str, claim: &str) -> Vec<Value> {
    c.store
        .list(&core("pods"), Some(ns), None)
        .0
        .into_iter()
        .filter(|p| !p.is_deleting() && p.mounts_claim(claim))
        .map(|p| p.value())
        .filter(|p| {
            str_at(p, "/status/phase") == "Pending"
                && str_at(p, "/status/containerStatuses/0/state/waiting/message")
                    .starts_with("Unable to attach or mount volumes")
                && claims(p).contains(&claim)
        })
        .collect()
}
