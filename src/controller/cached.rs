//! The form in which a member's PostgresCluster cache keeps each object:
//! typed metadata, and the spec and status as the JSON the API server sent.
//!
//! Why (issue 16, memory per PostgresCluster): the manager caches every
//! PostgresCluster of the fleet, but a reconcile reads one at a time. Typed,
//! a cached cluster was about 3 KB of heap in ~100 allocations (every
//! string, list and optional section of the spec and the status, and the
//! copy the reflector makes of each object it stores) — the largest share of
//! the manager's heap per PostgresCluster in a heaptrack snapshot after a
//! cold converge. As text the spec and the status are two allocations of
//! their own size. A round parses its copy when a worker takes it
//! ([`CachedCluster::typed`]); what it costs (tens of microseconds) is
//! small beside the round's own requests.
//!
//! The JSON is taken as it arrives (serde_json's `RawValue`), which needs
//! the watch event's `type` before its `object`: the Kubernetes API server
//! writes them in that order (Go's `metav1.WatchEvent` field order), as
//! every list and watch answer is decoded by kube's own client.
//!
//! A spec or status that does not parse as the typed PostgresCluster (the
//! API server checks the CRD's schema, which may be another pgfleet
//! version's during an upgrade) no longer fails the member's whole list —
//! one such object kept kube's typed watcher re-listing and the member's
//! cache empty — or vanishes from a watch with a decode error nobody saw:
//! that object's rounds fail with an invalid-spec error naming the part and
//! the column, as a Warning Event on it.

use crate::crd::{Phase, PostgresCluster};
use kube::api::ObjectMeta;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// A PostgresCluster as the member's cache holds it.
#[derive(Clone, Debug)]
pub struct CachedCluster {
    pub metadata: ObjectMeta,
    spec: Box<RawValue>,
    status: Option<Box<RawValue>>,
    /// `status.phase` and `status.observedGeneration`, read once when the
    /// object arrives: the fleet's health summary (and the benchmarks'
    /// convergence checks) count them over every cached cluster.
    summary: Summary,
}

/// What the API server sends; unknown top-level fields (`apiVersion`,
/// `kind`) are skipped.
#[derive(Deserialize)]
struct Wire {
    /// Without `managedFields` (skipped while parsing, never cached).
    #[serde(
        default,
        deserialize_with = "super::index_wire::meta_without_managed_fields"
    )]
    metadata: ObjectMeta,
    spec: Box<RawValue>,
    #[serde(default)]
    status: Option<Box<RawValue>>,
}

/// What is read of the status on arrival (the rest is skipped).
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Summary {
    #[serde(default)]
    phase: Option<Phase>,
    #[serde(default)]
    observed_generation: Option<i64>,
}

impl<'de> Deserialize<'de> for CachedCluster {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Wire {
            metadata,
            spec,
            status,
        } = Wire::deserialize(d)?;
        // An unreadable summary counts as none here; the round that parses
        // the whole status says what is wrong with it.
        let summary = status
            .as_ref()
            .and_then(|s| serde_json::from_str(s.get()).ok())
            .unwrap_or_default();
        Ok(CachedCluster {
            metadata,
            spec,
            status,
            summary,
        })
    }
}

impl kube::Resource for CachedCluster {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        PostgresCluster::kind(&())
    }
    fn group(_: &()) -> Cow<'_, str> {
        PostgresCluster::group(&())
    }
    fn version(_: &()) -> Cow<'_, str> {
        PostgresCluster::version(&())
    }
    fn plural(_: &()) -> Cow<'_, str> {
        PostgresCluster::plural(&())
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A cached spec or status that is not a PostgresCluster's. The message
/// names the part and the position, never the value (a tenant's input).
#[derive(Debug, thiserror::Error)]
#[error("the cached PostgresCluster's {part} cannot be read ({kind} at column {column})")]
pub struct Unreadable {
    pub part: &'static str,
    kind: &'static str,
    column: usize,
}

fn unreadable(part: &'static str, e: &serde_json::Error) -> Unreadable {
    let kind = match e.classify() {
        serde_json::error::Category::Data => "a field does not match the schema",
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => "not JSON",
        serde_json::error::Category::Io => "unreadable",
    };
    Unreadable {
        part,
        kind,
        column: e.column(),
    }
}

impl CachedCluster {
    /// The typed PostgresCluster a round works from.
    pub fn typed(&self) -> Result<PostgresCluster, Unreadable> {
        let spec = serde_json::from_str(self.spec.get()).map_err(|e| unreadable("spec", &e))?;
        let status = match &self.status {
            Some(s) => serde_json::from_str(s.get()).map_err(|e| unreadable("status", &e))?,
            None => None,
        };
        Ok(PostgresCluster {
            metadata: self.metadata.clone(),
            spec,
            status,
        })
    }

    /// `status.phase`, if the status has one.
    pub fn phase(&self) -> Option<Phase> {
        self.summary.phase
    }

    /// `status.observedGeneration`, if the status has one.
    pub fn observed_generation(&self) -> Option<i64> {
        self.summary.observed_generation
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kube::ResourceExt;
    use serde_json::json;

    fn object() -> serde_json::Value {
        json!({
            "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
            "metadata": {"name": "orders", "namespace": "shop", "resourceVersion": "42",
                         "generation": 3, "finalizers": ["pgfleet.io/cleanup"],
                         "managedFields": [{"manager": "kubectl", "operation": "Apply",
                             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"clusterSize": 3, "version": "15"},
            "status": {"phase": "Healthy", "readyInstances": 3, "currentPrimary": "orders-1",
                       "observedGeneration": 3,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "AllReady",
                                       "message": "3 of 3 ready",
                                       "lastTransitionTime": "2026-12-07T20:00:00Z"}]}
        })
    }

    #[test]
    fn the_cached_form_parses_to_the_same_postgres_cluster_as_the_typed_watch() {
        for v in [object(), {
            let mut v = object();
            v.as_object_mut().unwrap().remove("status");
            v
        }] {
            let text = serde_json::to_string(&v).unwrap();
            let cached: CachedCluster = serde_json::from_str(&text).unwrap();
            let typed: PostgresCluster = serde_json::from_str(&text).unwrap();
            let parsed = cached.typed().unwrap();
            // managedFields are skipped while parsing; the rest is the same.
            assert!(typed.metadata.managed_fields.is_some());
            let want = ObjectMeta {
                managed_fields: None,
                ..typed.metadata.clone()
            };
            assert_eq!(cached.metadata, want);
            assert_eq!(parsed.metadata, want);
            assert_eq!(parsed.spec, typed.spec);
            assert_eq!(parsed.status, typed.status);
            let status = typed.status.as_ref();
            assert_eq!(cached.phase(), status.and_then(|s| s.phase));
            assert_eq!(
                cached.observed_generation(),
                status.and_then(|s| s.observed_generation)
            );
            assert_eq!(cached.name_any(), "orders");
            assert_eq!(cached.resource_version().as_deref(), Some("42"));
        }
    }

    #[test]
    fn a_watch_event_carries_the_cached_form() {
        // As the API server writes it: `type` first (json! would sort).
        let line = format!(r#"{{"type":"MODIFIED","object":{}}}"#, object());
        let ev: kube::api::WatchEvent<CachedCluster> = serde_json::from_str(&line).unwrap();
        let kube::api::WatchEvent::Modified(c) = ev else {
            panic!("not a modification");
        };
        assert_eq!(c.phase(), Some(Phase::Healthy));
        assert_eq!(c.typed().unwrap().spec.cluster_size, 3);
    }

    /// One object the types cannot read (a CRD of another pgfleet version,
    /// say) used to fail the whole list, so the member's cache never
    /// filled; now only that object's rounds fail.
    #[test]
    fn one_unreadable_object_does_not_fail_the_list() {
        let mut bad = object();
        bad["metadata"]["name"] = json!("bad");
        bad["spec"]["clusterSize"] = json!("three");
        let list = json!({"apiVersion": "pgfleet.io/v1", "kind": "PostgresClusterList",
                          "metadata": {"resourceVersion": "50"}, "items": [object(), bad]});
        let text = serde_json::to_string(&list).unwrap();
        assert!(serde_json::from_str::<kube::core::ObjectList<PostgresCluster>>(&text).is_err());
        let cached: kube::core::ObjectList<CachedCluster> = serde_json::from_str(&text).unwrap();
        assert_eq!(cached.items.len(), 2);
        assert!(cached.items[0].typed().is_ok());
        assert!(cached.items[1].typed().is_err());
    }

    #[test]
    fn an_unreadable_spec_fails_the_round_naming_the_part_but_not_the_value() {
        let mut v = object();
        v["spec"]["clusterSize"] = json!("s3cr3t-value");
        let cached: CachedCluster = serde_json::from_value(v).unwrap();
        let e = cached.typed().unwrap_err().to_string();
        assert!(e.contains("spec"), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
        // The status still says the phase.
        assert_eq!(cached.phase(), Some(Phase::Healthy));
    }
}
