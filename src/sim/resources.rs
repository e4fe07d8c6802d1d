//! The resource types the embedded API server serves: the built-in kinds the
//! manager and kubectl need, plus every CustomResourceDefinition registered at
//! run time. Discovery, routing, validation and printing all read from here, so
//! a CRD becomes servable the moment it is stored.

use crate::json_ptr::Ptr;
use serde_json::Value;
use std::collections::BTreeMap;

/// How a resource exposes `/scale` (autoscaling/v1 Scale), from a CRD's
/// `subresources.scale`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleSpec {
    pub spec_replicas_path: String,
    pub status_replicas_path: String,
    pub label_selector_path: Option<String>,
}

/// One servable resource (a group/version/plural).
#[derive(Debug, Clone)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Writes to the main resource keep the stored status; `/status` writes only status.
    pub status_subresource: bool,
    pub scale: Option<ScaleSpec>,
    /// The version's openAPIV3Schema for custom resources (None for built-ins).
    /// Shared: a `ResourceType` is cloned per request, and pgfleet's CRD
    /// schemas are large (cloning them per request held ~0.6 MB per
    /// emulated cluster in flight, by heaptrack).
    pub schema: Option<std::sync::Arc<Value>>,
    pub printer_columns: Vec<Value>,
    /// Name of the CRD that defines this type, when it is a custom resource.
    pub crd: Option<String>,
}

impl ResourceType {
    /// `v1` for the core group, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The storage key: objects are stored once per group and plural, whatever
    /// version they are read through.
    pub fn key(&self) -> ResKey {
        // As in kube, events.k8s.io/v1 and core/v1 Events are one storage,
        // so `kubectl get events` shows what kube-rs' recorder writes.
        let group = if self.group == "events.k8s.io" && self.plural == "events" {
            String::new()
        } else {
            self.group.clone()
        };
        ResKey {
            group,
            plural: self.plural.clone(),
        }
    }

    /// Review kinds (`SelfSubjectAccessReview`, ...) are create-only: the
    /// server answers them and stores nothing.
    pub fn is_review(&self) -> bool {
        matches!(
            self.group.as_str(),
            "authorization.k8s.io" | "authentication.k8s.io"
        ) && self.plural.ends_with("reviews")
    }

    /// The verbs discovery lists for the type.
    pub fn verbs(&self) -> &'static [&'static str] {
        if self.is_review() {
            &["create"]
        } else {
            &[
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        }
    }

    /// The `group/resource` form used in kube error messages (`pods`, `postgresclusters.pgfleet.io`).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// Identifies one kind of stored object independent of version.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResKey {
    pub group: String,
    pub plural: String,
}

/// (group, version, plural, kind, namespaced, short names, status subresource).
type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static [&'static str],
    bool,
);

/// Table of the built-in kinds.
const BUILTINS: &[Builtin] = &[
    ("", "v1", "namespaces", "Namespace", false, &["ns"], true),
    ("", "v1", "nodes", "Node", false, &["no"], true),
    ("", "v1", "pods", "Pod", true, &["po"], true),
    ("", "v1", "services", "Service", true, &["svc"], true),
    ("", "v1", "endpoints", "Endpoints", true, &["ep"], false),
    (
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        true,
    ),
    (
        "",
        "v1",
        "persistentvolumes",
        "PersistentVolume",
        false,
        &["pv"],
        true,
    ),
    ("", "v1", "secrets", "Secret", true, &[], false),
    ("", "v1", "configmaps", "ConfigMap", true, &["cm"], false),
    ("", "v1", "events", "Event", true, &["ev"], false),
    (
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        true,
        &["sa"],
        false,
    ),
    (
        "apps",
        "v1",
        "deployments",
        "Deployment",
        true,
        &["deploy"],
        true,
    ),
    (
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        true,
        &["sts"],
        true,
    ),
    ("batch", "v1", "jobs", "Job", true, &[], true),
    ("batch", "v1", "cronjobs", "CronJob", true, &["cj"], true),
    (
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "EndpointSlice",
        true,
        &[],
        false,
    ),
    (
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        true,
        &["pdb"],
        true,
    ),
    (
        "storage.k8s.io",
        "v1",
        "storageclasses",
        "StorageClass",
        false,
        &["sc"],
        false,
    ),
    (
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        true,
        &[],
        false,
    ),
    (
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        true,
        &["ev"],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "Role",
        true,
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "RoleBinding",
        true,
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        false,
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
        &[],
        false,
    ),
    (
        "",
        "v1",
        "resourcequotas",
        "ResourceQuota",
        true,
        &["quota"],
        true,
    ),
    (
        "",
        "v1",
        "limitranges",
        "LimitRange",
        true,
        &["limits"],
        false,
    ),
    // The review APIs: create-only, answered and never stored
    // (`server::authz`).
    (
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        false,
        &[],
        false,
    ),
    (
        "authorization.k8s.io",
        "v1",
        "selfsubjectrulesreviews",
        "SelfSubjectRulesReview",
        false,
        &[],
        false,
    ),
    (
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "SubjectAccessReview",
        false,
        &[],
        false,
    ),
    (
        "authorization.k8s.io",
        "v1",
        "localsubjectaccessreviews",
        "LocalSubjectAccessReview",
        true,
        &[],
        false,
    ),
    (
        "authentication.k8s.io",
        "v1",
        "selfsubjectreviews",
        "SelfSubjectReview",
        false,
        &[],
        false,
    ),
    (
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
        true,
    ),
];

/// Every servable type, built-in and custom, keyed by (group, version, plural).
#[derive(Debug, Clone)]
pub struct Registry {
    types: BTreeMap<(String, String, String), ResourceType>,
}

impl Default for Registry {
    fn default() -> Self {
        let mut types = BTreeMap::new();
        for (group, version, plural, kind, namespaced, short, status) in BUILTINS {
            let rt = ResourceType {
                group: (*group).to_string(),
                version: (*version).to_string(),
                plural: (*plural).to_string(),
                singular: kind.to_lowercase(),
                kind: (*kind).to_string(),
                namespaced: *namespaced,
                short_names: short.iter().map(|s| (*s).to_string()).collect(),
                categories: if ["pods", "services", "deployments", "statefulsets", "jobs"]
                    .contains(plural)
                {
                    vec!["all".to_string()]
                } else {
                    vec![]
                },
                status_subresource: *status,
                scale: None,
                schema: None,
                printer_columns: vec![],
                crd: None,
            };
            types.insert(
                (
                    (*group).to_string(),
                    (*version).to_string(),
                    (*plural).to_string(),
                ),
                rt,
            );
        }
        Registry { types }
    }
}

impl Registry {
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
    }

    /// All types, in a stable order.
    pub fn all(&self) -> impl Iterator<Item = &ResourceType> {
        self.types.values()
    }

    /// The preferred (first served) type for a stored kind; used where a stored
    /// object must be interpreted without a request path (GC, persistence).
    pub fn by_key(&self, key: &ResKey) -> Option<&ResourceType> {
        self.types
            .values()
            .find(|t| t.group == key.group && t.plural == key.plural)
    }

    /// Groups with their versions, in registration order of first appearance.
    pub fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for t in self.types.values() {
            let versions = out.entry(t.group.clone()).or_default();
            if !versions.contains(&t.version) {
                versions.push(t.version.clone());
            }
        }
        out
    }

    /// Replaces the custom types defined by CRD `crd_name` with what `crd` now declares.
    pub fn register_crd(&mut self, crd: &Value) {
        let Some(name) = crd.ptr("/metadata/name").and_then(Value::as_str) else {
            return;
        };
        self.remove_crd(name);
        for rt in types_from_crd(crd) {
            self.types.insert(
                (rt.group.clone(), rt.version.clone(), rt.plural.clone()),
                rt,
            );
        }
    }

    pub fn remove_crd(&mut self, crd_name: &str) {
        self.types.retain(|_, t| t.crd.as_deref() != Some(crd_name));
    }
}

/// The served versions of a CRD as resource types.
pub fn types_from_crd(crd: &Value) -> Vec<ResourceType> {
    let s = |p: &str| {
        crd.ptr(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let strings = |p: &str| -> Vec<String> {
        crd.ptr(p)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let group = s("/spec/group");
    let plural = s("/spec/names/plural");
    let kind = s("/spec/names/kind");
    let singular = {
        let v = s("/spec/names/singular");
        if v.is_empty() { kind.to_lowercase() } else { v }
    };
    let namespaced = s("/spec/scope") != "Cluster";
    let versions = crd
        .ptr("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    versions
        .iter()
        .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(true))
        .filter_map(|v| {
            let version = v.get("name")?.as_str()?.to_string();
            let sub = v.get("subresources");
            let scale = sub.and_then(|s| s.get("scale")).map(|sc| ScaleSpec {
                spec_replicas_path: sc
                    .get("specReplicasPath")
                    .and_then(Value::as_str)
                    .unwrap_or(".spec.replicas")
                    .to_string(),
                status_replicas_path: sc
                    .get("statusReplicasPath")
                    .and_then(Value::as_str)
                    .unwrap_or(".status.replicas")
                    .to_string(),
                label_selector_path: sc
                    .get("labelSelectorPath")
                    .and_then(Value::as_str)
                    .map(String::from),
            });
            Some(ResourceType {
                group: group.clone(),
                version,
                plural: plural.clone(),
                singular: singular.clone(),
                kind: kind.clone(),
                namespaced,
                short_names: strings("/spec/names/shortNames"),
                categories: strings("/spec/names/categories"),
                status_subresource: sub.and_then(|s| s.get("status")).is_some(),
                scale,
                schema: v
                    .ptr("/schema/openAPIV3Schema")
                    .cloned()
                    .map(std::sync::Arc::new),
                printer_columns: v
                    .get("additionalPrinterColumns")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
                crd: Some(s("/metadata/name")),
            })
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn crd_registration_serves_its_versions() {
        let mut reg = Registry::default();
        let crd = json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wg"]},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.size", "statusReplicasPath": ".status.size"}}}]}
        });
        reg.register_crd(&crd);
        let t = reg.get("example.com", "v1", "widgets").unwrap();
        assert_eq!(t.kind, "Widget");
        assert!(t.status_subresource);
        assert_eq!(t.scale.as_ref().unwrap().spec_replicas_path, ".spec.size");
        assert_eq!(t.short_names, vec!["wg"]);
        reg.remove_crd("widgets.example.com");
        assert!(reg.get("example.com", "v1", "widgets").is_none());
        assert!(reg.get("", "v1", "pods").is_some());
    }
}
