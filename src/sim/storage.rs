//! Storage as the API server, the PV controller, the external resizer and
//! the kubelet handle it, in the small: StorageClasses (a default
//! `standard` class that allows expansion), the `DefaultStorageClass`
//! admission plugin, binding (`Immediate` classes: a claim is Bound at once
//! with `status.capacity` its request), the API server's rules for changing
//! a claim's size, and online expansion as a real cluster shows it: the
//! resizer grows the volume (`status.allocatedResources`, condition
//! `FileSystemResizePending`), the kubelet then grows the file system of a
//! mounted volume (through the runtime: the process runtime's enforced
//! claims really grow, see `process::capacity`) and the new
//! `status.capacity` shows. The resizer's own `Resizing` phase is
//! instantaneous here, so it is never seen.
//!
//! Not emulated: PersistentVolume objects, `WaitForFirstConsumer`,
//! `RecoverVolumeExpansionFailure` (a request may never go below the
//! previous one here), volume attributes classes, offline-only drivers.

use super::cluster::{Cluster, Sub, WriteOpts};
use super::error::ApiError;
use super::quantity;
use super::resources::ResKey;
use super::resources::ResourceType;
use super::store::Lister;
use super::store::{StoredObject, str_at};
use super::stored::{ALL, Pick};
use crate::json_ptr::Ptr;
use serde_json::{Value, json};
use std::sync::Arc;

/// The default class every emulated cluster starts with.
pub const DEFAULT_CLASS: &str = "standard";
/// The annotation that makes a class the default.
pub const IS_DEFAULT: &str = "storageclass.kubernetes.io/is-default-class";

/// The default class object (`kubectl get storageclass` shows it).
pub fn default_class() -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": DEFAULT_CLASS, "annotations": {IS_DEFAULT: "true"}},
        "provisioner": "pgfleet.io/sim",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": true,
    })
}

fn key(group: &str, plural: &str) -> ResKey {
    ResKey {
        group: group.into(),
        plural: plural.into(),
    }
}

fn classes(view: &impl Lister) -> Vec<Arc<StoredObject>> {
    view.list_in(&key("storage.k8s.io", "storageclasses"), "")
}

fn class(view: &impl Lister, name: &str) -> Option<Value> {
    classes(view)
        .into_iter()
        .find(|o| o.name() == name)
        .map(|o| o.value())
}

/// The default class's name, if a class says it is the default.
fn default_name(view: &impl Lister) -> Option<String> {
    classes(view)
        .iter()
        .find(|o| {
            str_at(
                &o.value(),
                &format!("/metadata/annotations/{}", IS_DEFAULT.replace('/', "~1")),
            ) == "true"
        })
        .map(|o| o.name().to_string())
}

fn request(v: &Value) -> Option<quantity::Milli> {
    quantity::parse(v.ptr("/spec/resources/requests/storage")?.as_str()?)
}

fn capacity(v: &Value) -> Option<quantity::Milli> {
    quantity::parse(v.ptr("/status/capacity/storage")?.as_str()?)
}

/// Admission of a write (inside the store's lock, hence the `view`): only
/// claims are concerned.
pub fn admit(
    view: &impl Lister,
    rt: &ResourceType,
    old: Option<&Value>,
    v: &mut Value,
) -> Result<(), ApiError> {
    if rt.group.is_empty() && rt.plural == "persistentvolumeclaims" {
        return admit_claim(view, old, v);
    }
    Ok(())
}

/// Admission of a claim: on create the default class fills in a missing
/// `storageClassName`; on update the size may only grow, only where the
/// class allows expansion and only for a bound claim, as the API server
/// validates it (same messages).
fn admit_claim(view: &impl Lister, old: Option<&Value>, v: &mut Value) -> Result<(), ApiError> {
    let Some(old) = old else {
        if v.ptr("/spec/storageClassName").is_none()
            && let Some(name) = default_name(view)
        {
            v["spec"]["storageClassName"] = json!(name);
        }
        return Ok(());
    };
    let (before, after) = (request(old), request(v));
    if before == after || after.is_none() {
        return Ok(());
    }
    let name = str_at(v, "/metadata/name").to_string();
    let field = "spec.resources.requests.storage";
    let forbid = |field: &str, msg: &str| {
        ApiError::invalid(
            "PersistentVolumeClaim",
            &name,
            vec![(
                field.into(),
                "FieldValueForbidden".into(),
                format!("{field}: Forbidden: {msg}"),
            )],
        )
    };
    if after < before {
        return Err(forbid(field, "field can not be less than previous value"));
    }
    if str_at(old, "/status/phase") != "Bound" {
        return Err(forbid(
            "spec",
            "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
        ));
    }
    let expandable = class(view, str_at(v, "/spec/storageClassName"))
        .and_then(|sc| sc.get("allowVolumeExpansion").and_then(Value::as_bool))
        .unwrap_or(false);
    if !expandable {
        return Err(forbid(
            "spec",
            "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
        ));
    }
    Ok(())
}

/// What the controllers do next to one claim, pure.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Nothing,
    /// The PV controller binds it with its request as capacity.
    Bind,
    /// The resizer grew the volume: the file system still has to follow.
    Expanded,
    /// The kubelet grew the file system: the new capacity shows.
    FileSystemGrown,
}

/// The next step for claim `v`; `mounted`: a running pod uses it (the
/// kubelet grows a file system only on a mounted volume).
pub fn step(v: &Value, mounted: bool) -> Step {
    if v.ptr("/metadata/deletionTimestamp").is_some() {
        return Step::Nothing;
    }
    if str_at(v, "/status/phase") != "Bound" || str_at(v, "/spec/volumeName").is_empty() {
        return Step::Bind;
    }
    let (Some(want), Some(have)) = (request(v), capacity(v)) else {
        return Step::Nothing;
    };
    let pending = condition(v, "FileSystemResizePending");
    match () {
        _ if want > have && !pending => Step::Expanded,
        _ if pending && mounted => Step::FileSystemGrown,
        _ => Step::Nothing,
    }
}

fn condition(v: &Value, t: &str) -> bool {
    v.ptr("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| str_at(c, "/type") == t))
}

/// `status` after `step` (the claim's other status fields kept).
pub fn apply_step(v: &Value, step: &Step, now: &str) -> Value {
    let mut st = v.get("status").cloned().unwrap_or_else(|| json!({}));
    let size = v
        .ptr("/spec/resources/requests/storage")
        .cloned()
        .unwrap_or(json!("1Gi"));
    match step {
        Step::Nothing => {}
        Step::Bind => {
            st["phase"] = json!("Bound");
            st["accessModes"] = v
                .ptr("/spec/accessModes")
                .cloned()
                .unwrap_or(json!(["ReadWriteOnce"]));
            st["capacity"] = json!({"storage": size});
        }
        Step::Expanded => {
            st["allocatedResources"] = json!({"storage": size});
            st["allocatedResourceStatuses"] = json!({"storage": "NodeResizePending"});
            st["conditions"] = json!([{
                "type": "FileSystemResizePending", "status": "True", "lastTransitionTime": now,
                "message": "Waiting for user to (re-)start a pod to finish file system resize of volume on node.",
            }]);
        }
        Step::FileSystemGrown => {
            st["capacity"] = json!({"storage": size});
            if let Some(o) = st.as_object_mut() {
                o.remove("conditions");
                o.remove("allocatedResourceStatuses");
            }
        }
    }
    st
}

/// What the claim controller reads of a Pod.
const POD_PHASE: Pick<'static> = Pick(&[("status", Pick(&[("phase", ALL)]))]);

/// The PV controller, resizer and kubelet for one claim, given the pods of
/// its namespace (run by gc's task on every write of the claim or of a pod).
/// False: the file system did not grow, ask again a little later.
pub fn reconcile_claim(
    c: &Arc<Cluster>,
    rt: &ResourceType,
    v: &Value,
    pods: &[Arc<StoredObject>],
) -> bool {
    let (ns, name) = (
        str_at(v, "/metadata/namespace"),
        str_at(v, "/metadata/name"),
    );
    let mounted = pods
        .iter()
        .filter(|p| p.namespace() == ns && p.mounts_claim(name))
        // Only the phase is parsed: this runs for every Pod of the
        // namespace on each write of a Pod or claim.
        .any(|p| str_at(&p.pick(POD_PHASE), "/status/phase") == "Running");
    let s = step(v, mounted);
    if s == Step::Nothing {
        return true;
    }
    if s == Step::FileSystemGrown && !grow_fs(c, v, ns, name) {
        return false;
    }
    let opts = WriteOpts {
        field_manager: "kube-controller-manager".into(),
        ..Default::default()
    };
    if s == Step::Bind && str_at(v, "/spec/volumeName").is_empty() {
        // The volume the provisioner made for it (kubectl shows a
        // claim's capacity only once it names its volume).
        let pv = format!("pvc-{}", str_at(v, "/metadata/uid"));
        let _ = c.write(rt, ns, name, Sub::Main, &opts, false, |cur| {
            let mut cur = cur.cloned().unwrap_or_default();
            cur["spec"]["volumeName"] = json!(pv);
            Ok(cur)
        });
    }
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let _ = c.write(rt, ns, name, Sub::Status, &opts, false, |cur| {
        let mut cur = cur.cloned().unwrap_or_default();
        if step(&cur, mounted) == s {
            cur["status"] = apply_step(&cur, &s, &now);
        }
        Ok(cur)
    });
    true
}

/// The kubelet's file system expansion through the runtime (a process
/// runtime's enforced claim really grows); false: not grown, try again on
/// a later pass, the claim stays `FileSystemResizePending`.
fn grow_fs(c: &Cluster, v: &Value, ns: &str, name: &str) -> bool {
    let Some(bytes) = request(v).and_then(|m| u64::try_from(m / 1000).ok()) else {
        return false;
    };
    let Some(rt) = c.runtime() else {
        return true;
    };
    match rt.expand_volume(ns, name, bytes) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(claim = %format!("{ns}/{name}"), error = %e, "file system expansion failed");
            false
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn claim(req: &str, status: Value) -> Value {
        json!({"metadata": {"name": "d", "namespace": "x"},
            "spec": {"resources": {"requests": {"storage": req}}}, "status": status})
    }

    #[test]
    fn a_claim_binds_then_grows_in_two_steps_once_mounted() {
        let mut v = claim("1Gi", json!({"phase": "Pending"}));
        assert_eq!(step(&v, false), Step::Bind);
        v["status"] = apply_step(&v, &Step::Bind, "t");
        assert_eq!(step(&v, false), Step::Bind, "no volume named yet");
        v["spec"]["volumeName"] = json!("pvc-1");
        assert_eq!(v["status"]["capacity"]["storage"], "1Gi");
        assert_eq!(step(&v, true), Step::Nothing);
        v["spec"]["resources"]["requests"]["storage"] = json!("2Gi");
        assert_eq!(step(&v, false), Step::Expanded);
        v["status"] = apply_step(&v, &Step::Expanded, "t");
        assert_eq!(
            v["status"]["conditions"][0]["type"],
            "FileSystemResizePending"
        );
        assert_eq!(v["status"]["capacity"]["storage"], "1Gi");
        // Not mounted: the file system waits for a pod.
        assert_eq!(step(&v, false), Step::Nothing);
        assert_eq!(step(&v, true), Step::FileSystemGrown);
        v["status"] = apply_step(&v, &Step::FileSystemGrown, "t");
        assert_eq!(v["status"]["capacity"]["storage"], "2Gi");
        assert!(v["status"].get("conditions").is_none());
        assert_eq!(step(&v, true), Step::Nothing);
    }
}
