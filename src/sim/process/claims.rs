//! Claims of the process runtime: each bound PersistentVolumeClaim is a
//! directory on the host (a tmpfs when its capacity is enforced), created
//! when the claim binds and removed when it goes and no Pod uses it.

use super::{ProcessRuntime, capacity, key, lock};
use crate::cluster::{Cluster, Sub, WriteOpts};
use crate::json_ptr::Ptr;
use crate::store::{EventType, str_at};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

impl ProcessRuntime {
    pub(super) fn on_pvc(self: &Arc<Self>, c: &Arc<Cluster>, kind: EventType, v: &Value) {
        let (ns, name) = (
            str_at(v, "/metadata/namespace"),
            str_at(v, "/metadata/name"),
        );
        let dir = self.dir().join("pvc").join(ns).join(name);
        let uid = str_at(v, "/metadata/uid").to_string();
        if kind != EventType::Deleted && v.ptr("/metadata/deletionTimestamp").is_none() {
            self.claim_volume(&dir, &uid);
            // A claim usable again: Pods held for it start now.
            for p in crate::volume_wait::waiting_on(c, ns, name) {
                if self.pod(ns, str_at(&p, "/metadata/name")).is_none() {
                    self.on_pod(c, EventType::Modified, &p);
                }
            }
        }
        if kind == EventType::Deleted {
            let me = self.clone();
            let claim = name.to_string();
            let ns = ns.to_string();
            // The data goes with the claim, once no Pod uses it any more.
            tokio::spawn(async move {
                while lock(&me.pods)
                    .values()
                    .any(|p| p.ns == ns && uses_claim(&p.view(), &claim))
                {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                let mut claims = lock(&me.claims);
                // A new claim of that name has its own (fresh) volume there.
                if claims.get(&dir).is_none_or(|holder| *holder == uid) {
                    claims.remove(&dir);
                    capacity::release(&dir);
                    let _ = std::fs::remove_dir_all(&dir);
                }
            });
            return;
        }
        if str_at(v, "/status/phase") == "Bound" || v.ptr("/metadata/deletionTimestamp").is_some() {
            return;
        }
        let Some(rt) = c.type_of(&key("persistentvolumeclaims")) else {
            return;
        };
        let size = v
            .ptr("/spec/resources/requests/storage")
            .cloned()
            .unwrap_or(json!("1Gi"));
        let modes = v
            .ptr("/spec/accessModes")
            .cloned()
            .unwrap_or(json!(["ReadWriteOnce"]));
        let opts = WriteOpts {
            field_manager: "kube-controller-manager".into(),
            ..Default::default()
        };
        let _ = c.write(&rt, ns, name, Sub::Status, &opts, false, |cur| {
            let mut v = cur.cloned().unwrap_or_default();
            v["status"] =
                json!({"phase": "Bound", "accessModes": modes, "capacity": {"storage": size}});
            Ok(v)
        });
    }

    /// Makes `dir` the volume of claim `uid`. Data a deleted claim of the
    /// same name left there goes (its deletion may still be waiting for
    /// its Pods to stop); data of unknown origin (state kept from an
    /// earlier run) is adopted.
    fn claim_volume(&self, dir: &Path, uid: &str) {
        let mut claims = lock(&self.claims);
        match claims.get(dir) {
            Some(holder) if holder == uid => return,
            Some(_) => {
                capacity::release(dir);
                let _ = std::fs::remove_dir_all(dir);
            }
            None => {}
        }
        claims.insert(dir.to_path_buf(), uid.to_string());
    }
}

fn uses_claim(pod: &Value, claim: &str) -> bool {
    pod.ptr("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|v| {
            v.ptr("/persistentVolumeClaim/claimName")
                .and_then(Value::as_str)
                == Some(claim)
        })
}
