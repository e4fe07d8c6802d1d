//! The child index's Pods, claims and metadata-only children as they
//! arrive over the watch, and the PostgresCluster cache's metadata: only
//! the fields the manager keeps are built, everything else is skipped
//! while parsing.
//!
//! Why not `k8s_openapi`'s `Pod`: the index reads a Pod's name, labels,
//! annotations, node, Ready condition and waiting containers, but parsing
//! the full type builds every container, volume and environment variable,
//! and its metadata's `managedFields` (every field manager's field set as a
//! JSON tree — on a real API server the largest part of a Pod's metadata).
//! Pod status updates are most of a fleet's watch events; building all of
//! that for each and dropping it at once was most of the index's share of
//! the manager's CPU in a cold converge (issue 16).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::marker::PhantomData;

/// The metadata the index reads (`index::ChildIndex::record`): identity,
/// labels, annotations, deletion mark. `managedFields`, owner references
/// and finalizers are skipped.
fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Wire {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
        labels: Option<BTreeMap<String, String>>,
        annotations: Option<BTreeMap<String, String>>,
        deletion_timestamp: Option<Time>,
    }
    let w = Wire::deserialize(d)?;
    Ok(ObjectMeta {
        name: w.name,
        namespace: w.namespace,
        uid: w.uid,
        resource_version: w.resource_version,
        labels: w.labels,
        annotations: w.annotations,
        deletion_timestamp: w.deletion_timestamp,
        ..Default::default()
    })
}

/// Every field of an object's metadata except `managedFields`, which is
/// skipped while parsing: the PostgresCluster cache drops it anyway
/// (`controller::watch`), and on a real API server it is the largest part
/// of the metadata (every writer's field set as a JSON tree), rebuilt as a
/// `serde_json::Value` for every watch event only to be dropped.
pub fn meta_without_managed_fields<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Wire {
        annotations: Option<BTreeMap<String, String>>,
        creation_timestamp: Option<Time>,
        deletion_grace_period_seconds: Option<i64>,
        deletion_timestamp: Option<Time>,
        finalizers: Option<Vec<String>>,
        generate_name: Option<String>,
        generation: Option<i64>,
        labels: Option<BTreeMap<String, String>>,
        name: Option<String>,
        namespace: Option<String>,
        owner_references: Option<Vec<OwnerReference>>,
        resource_version: Option<String>,
        self_link: Option<String>,
        uid: Option<String>,
    }
    let w = Wire::deserialize(d)?;
    Ok(ObjectMeta {
        annotations: w.annotations,
        creation_timestamp: w.creation_timestamp,
        deletion_grace_period_seconds: w.deletion_grace_period_seconds,
        deletion_timestamp: w.deletion_timestamp,
        finalizers: w.finalizers,
        generate_name: w.generate_name,
        generation: w.generation,
        labels: w.labels,
        managed_fields: None,
        name: w.name,
        namespace: w.namespace,
        owner_references: w.owner_references,
        resource_version: w.resource_version,
        self_link: w.self_link,
        uid: w.uid,
    })
}

/// The metadata of a `K` as a metadata-only watch delivers it (kube's
/// `PartialObjectMeta<K>`: the same requests, `metadata_api`), read as the
/// index reads it ([`slim_meta`]). `PartialObjectMeta` builds every
/// `managedFields` entry of every Secret, Service, ConfigMap and budget
/// event; on the API server's side they are most of the metadata.
#[derive(Clone, Debug, Deserialize)]
pub struct SlimMeta<K> {
    #[serde(deserialize_with = "slim_meta", default)]
    pub metadata: ObjectMeta,
    #[serde(skip)]
    kind: PhantomData<fn() -> K>,
}

impl<K> kube::Resource for SlimMeta<K>
where
    K: kube::Resource<DynamicType = ()>,
{
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(_: &()) -> Cow<'_, str> {
        K::kind(&())
    }
    fn group(_: &()) -> Cow<'_, str> {
        K::group(&())
    }
    fn version(_: &()) -> Cow<'_, str> {
        K::version(&())
    }
    fn plural(_: &()) -> Cow<'_, str> {
        K::plural(&())
    }
    /// Metadata-only requests (`as=PartialObjectMetadata`), as for kube's
    /// own `PartialObjectMeta<K>`: a Secret's data never crosses the wire.
    fn metadata_api() -> bool {
        true
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A Pod as the child index reads it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct SlimPod {
    #[serde(deserialize_with = "slim_meta", default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<SlimPodSpec>,
    #[serde(default)]
    pub status: Option<SlimPodStatus>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimPodSpec {
    pub node_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimPodStatus {
    pub conditions: Option<Vec<SlimCondition>>,
    pub container_statuses: Option<Vec<SlimContainerStatus>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub last_transition_time: Option<Time>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SlimContainerStatus {
    pub state: Option<SlimContainerState>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SlimContainerState {
    pub waiting: Option<SlimWaiting>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SlimWaiting {
    pub reason: Option<String>,
    pub message: Option<String>,
}

/// The core/v1 resource `K` stands for, for a slim type.
macro_rules! core_v1 {
    ($t:ty, $kind:literal, $plural:literal) => {
        impl kube::Resource for $t {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed("")
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed("v1")
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

core_v1!(SlimPod, "Pod", "pods");
core_v1!(SlimClaim, "PersistentVolumeClaim", "persistentvolumeclaims");

/// A PersistentVolumeClaim as the child index reads it: its requested and
/// actual size and whether a file system resize is pending.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct SlimClaim {
    #[serde(deserialize_with = "slim_meta", default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<SlimClaimSpec>,
    #[serde(default)]
    pub status: Option<SlimClaimStatus>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SlimClaimSpec {
    pub resources: Option<SlimResources>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SlimResources {
    pub requests: Option<BTreeMap<String, String>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SlimClaimStatus {
    pub capacity: Option<BTreeMap<String, String>>,
    pub conditions: Option<Vec<SlimClaimCondition>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SlimClaimCondition {
    #[serde(rename = "type")]
    pub type_: String,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
    use serde_json::json;

    /// The slim types read what the full ones read, from the same JSON.
    #[test]
    fn slim_types_read_the_same_fields_as_the_full_ones() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "db-1", "namespace": "t", "uid": "u1",
                "resourceVersion": "42", "labels": {"a": "1"},
                "annotations": {"pgfleet.io/hash": "h"},
                "deletionTimestamp": "2026-12-07T10:00:00Z",
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "o"}],
                "managedFields": [{"manager": "kubelet", "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "pg", "image": "i",
                "env": [{"name": "A", "value": "b"}]}]},
            "status": {"phase": "Running",
                "conditions": [{"type": "Ready", "status": "True",
                    "lastTransitionTime": "2026-12-07T09:00:00Z"}],
                "containerStatuses": [{"name": "pg", "image": "i", "imageID": "",
                    "ready": false, "restartCount": 0,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "m"}}}]}});
        let full: Pod = serde_json::from_value(pod.clone()).unwrap();
        let slim: SlimPod = serde_json::from_value(pod).unwrap();
        let m = &full.metadata;
        let want = ObjectMeta {
            managed_fields: None,
            owner_references: None,
            ..m.clone()
        };
        assert_eq!(slim.metadata, want);
        assert_eq!(slim.spec.unwrap().node_name.as_deref(), Some("n1"));
        let st = slim.status.unwrap();
        let c = &st.conditions.unwrap()[0];
        assert_eq!((c.type_.as_str(), c.status.as_str()), ("Ready", "True"));
        assert_eq!(
            c.last_transition_time,
            full.status.unwrap().conditions.unwrap()[0]
                .last_transition_time
                .clone()
        );
        let cs = st.container_statuses.unwrap();
        let w = cs[0].state.clone().unwrap().waiting.unwrap();
        assert_eq!(
            (w.reason.as_deref(), w.message.as_deref()),
            (Some("CrashLoopBackOff"), Some("m"))
        );

        let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "db-1", "namespace": "t"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}},
            "status": {"capacity": {"storage": "1Gi"},
                "conditions": [{"type": "FileSystemResizePending", "status": "True"}]}});
        let _: PersistentVolumeClaim = serde_json::from_value(claim.clone()).unwrap();
        let slim: SlimClaim = serde_json::from_value(claim).unwrap();
        let storage = |m: Option<BTreeMap<String, String>>| m.unwrap()["storage"].clone();
        assert_eq!(
            storage(slim.spec.unwrap().resources.unwrap().requests),
            "2Gi"
        );
        let st = slim.status.unwrap();
        assert_eq!(storage(st.capacity), "1Gi");
        assert_eq!(st.conditions.unwrap()[0].type_, "FileSystemResizePending");
    }

    /// Metadata with every field ObjectMeta has, and a managedFields entry.
    fn full_meta() -> serde_json::Value {
        json!({"name": "db-app", "namespace": "t", "uid": "u1", "resourceVersion": "42",
            "generation": 3, "generateName": "db-", "selfLink": "/x",
            "creationTimestamp": "2026-12-07T08:00:00Z",
            "deletionTimestamp": "2026-12-07T10:00:00Z", "deletionGracePeriodSeconds": 30,
            "labels": {"a": "1"}, "annotations": {"pgfleet.io/hash": "h"},
            "finalizers": ["pgfleet.io/cleanup"],
            "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "o"}],
            "managedFields": [{"manager": "pgfleet", "operation": "Apply",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:password": {}}}}]})
    }

    /// Everything but managedFields, read as `k8s_openapi` reads it.
    #[test]
    fn metadata_without_managed_fields_is_the_rest_of_the_metadata() {
        let full: ObjectMeta = serde_json::from_value(full_meta()).unwrap();
        assert!(full.managed_fields.is_some());
        let slim = meta_without_managed_fields(full_meta()).unwrap();
        let want = ObjectMeta {
            managed_fields: None,
            ..full
        };
        assert_eq!(slim, want);
    }

    /// A metadata-only child reads what `PartialObjectMeta` read, but for
    /// managedFields and owner references, over the same metadata-only
    /// requests of the same resource.
    #[test]
    fn slim_metadata_reads_what_partial_object_meta_read() {
        use k8s_openapi::api::core::v1::Secret;
        use kube::Resource;
        use kube::core::PartialObjectMeta;
        let obj = json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": full_meta()});
        let partial: PartialObjectMeta<Secret> = serde_json::from_value(obj.clone()).unwrap();
        let slim: SlimMeta<Secret> = serde_json::from_value(obj).unwrap();
        let want = ObjectMeta {
            name: partial.metadata.name.clone(),
            namespace: partial.metadata.namespace.clone(),
            uid: partial.metadata.uid.clone(),
            resource_version: partial.metadata.resource_version.clone(),
            labels: partial.metadata.labels.clone(),
            annotations: partial.metadata.annotations.clone(),
            deletion_timestamp: partial.metadata.deletion_timestamp.clone(),
            ..Default::default()
        };
        assert_eq!(slim.metadata, want);
        assert!(SlimMeta::<Secret>::metadata_api());
        assert_eq!(
            SlimMeta::<Secret>::url_path(&(), Some("t")),
            PartialObjectMeta::<Secret>::url_path(&(), Some("t"))
        );
        assert_eq!(SlimMeta::<Secret>::kind(&()), "Secret");
    }

    #[test]
    fn a_pod_without_spec_or_status_is_read_as_empty() {
        let slim: SlimPod =
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "t"}})).unwrap();
        assert!(slim.spec.is_none() && slim.status.is_none());
        let slim: SlimPod = serde_json::from_value(json!({"metadata": {"name": "p"},
            "status": {"conditions": null, "containerStatuses": null}}))
        .unwrap();
        assert_eq!(slim.metadata.name.as_deref(), Some("p"));
    }
}
