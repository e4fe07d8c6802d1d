//! One trace per rollout. A rollout outlives an engine round and possibly
//! the process, so its root span's context is stored durably, as a W3C
//! `traceparent` in the rollout's control ConfigMaps (`pgfleet-system/
//! pgfleet-rollout-<name>`, key `traceparent`, field manager
//! `pgfleet-rollout-trace` so the control's own writes leave it alone).
//! Every later span of the rollout, in this process or the next, is
//! parented on it: patches (`rollout.start`, `rollout.finish`,
//! `rollout.fail`, `rollout.revert`), halts (`rollout.halt`) and the wait
//! for each PostgresCluster's update (`rollout.wait`, from its start mark to
//! its finish). The root span itself is short: it marks the rollout's
//! beginning, not its length.

use super::control::{NAMESPACE, object_name};
use super::plan::PgcRef;
use crate::fleet::Member;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::telemetry::propagation::KEY;
const FIELD_MANAGER: &str = "pgfleet-rollout-trace";

/// A rollout's trace: its root context once known.
pub struct RolloutTrace {
    rollout: String,
    target_version: String,
    root: Mutex<Option<opentelemetry::Context>>,
}

pub use crate::telemetry::propagation::{extract, inject};

impl RolloutTrace {
    pub fn new(rollout: &str, target_version: &str) -> Self {
        RolloutTrace {
            rollout: rollout.to_string(),
            target_version: target_version.to_string(),
            root: Mutex::default(),
        }
    }

    fn cached(&self) -> Option<opentelemetry::Context> {
        self.root.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The root context: cached, else read from the members' control
    /// ConfigMaps, else a new root span stored in every reachable member.
    /// Only called for rounds that act, and only while traces are exported.
    pub async fn root(&self, members: &[Arc<Member>]) -> Option<opentelemetry::Context> {
        if !crate::telemetry::tracing_enabled() {
            return None;
        }
        if let Some(cx) = self.cached() {
            return Some(cx);
        }
        let name = object_name(&self.rollout);
        for m in members {
            let api: Api<ConfigMap> = Api::namespaced(m.client(), NAMESPACE);
            if let Ok(Some(cm)) = api.get_opt(&name).await
                && let Some(cx) = cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get(KEY))
                    .and_then(|v| extract(v))
            {
                *self.root.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.clone());
                return Some(cx);
            }
        }
        let span = tracing::info_span!(
            parent: None,
            "rollout",
            rollout = %self.rollout,
            target_version = %self.target_version,
        );
        let cx = span.context();
        drop(span);
        let traceparent = inject(&cx)?;
        let mut stored = false;
        for m in members {
            match store(m, &self.rollout, &traceparent).await {
                Ok(()) => stored = true,
                Err(e) => {
                    tracing::debug!(cluster = %m.name, error = %e, "could not store the rollout's trace context")
                }
            }
        }
        // Kept in memory even when no member took it: this process's spans
        // still form one trace.
        if !stored {
            tracing::debug!(rollout = %self.rollout, "rollout trace context kept in memory only");
        }
        *self.root.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.clone());
        Some(cx)
    }

    /// A child span of the rollout for work on one PostgresCluster.
    pub fn span(
        &self,
        op: &'static str,
        r: &PgcRef,
        root: Option<&opentelemetry::Context>,
    ) -> Span {
        let (cluster, namespace, name) = (r.member.as_str(), r.namespace.as_str(), r.name.as_str());
        let span = tracing::info_span!(
            parent: None,
            "rollout.op",
            otel.name = op,
            rollout = %self.rollout,
            cluster,
            namespace,
            name,
        );
        if let Some(cx) = root {
            let _ = span.set_parent(cx.clone());
        }
        span
    }

    /// The rollout halted; `clusters` are the members its control went to.
    pub fn halt_span(&self, clusters: &str, root: Option<&opentelemetry::Context>) -> Span {
        let span = tracing::info_span!(
            parent: None,
            "rollout.halt",
            rollout = %self.rollout,
            clusters,
        );
        if let Some(cx) = root {
            let _ = span.set_parent(cx.clone());
        }
        span
    }

    /// The wait for one PostgresCluster's update, from its start mark to the
    /// finish the engine just recorded.
    pub fn wait(
        &self,
        root: Option<&opentelemetry::Context>,
        r: &PgcRef,
        started: SystemTime,
        finished: SystemTime,
    ) {
        let Some(root) = root else { return };
        let attrs = vec![
            opentelemetry::KeyValue::new("rollout", self.rollout.clone()),
            opentelemetry::KeyValue::new("cluster", r.member.clone()),
            opentelemetry::KeyValue::new("namespace", r.namespace.clone()),
            opentelemetry::KeyValue::new("name", r.name.clone()),
        ];
        crate::telemetry::spans::record_interval("rollout.wait", root, attrs, started, finished);
    }
}

/// Stores the traceparent in one member's control ConfigMap.
async fn store(m: &Member, rollout: &str, traceparent: &str) -> anyhow::Result<()> {
    let pp = PatchParams::apply(FIELD_MANAGER);
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    Api::<Namespace>::all(m.client())
        .patch(NAMESPACE, &pp, &Patch::Apply(&ns))
        .await?;
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": object_name(rollout), "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/managed-by": "pgfleet", "pgfleet.io/rollout": rollout}},
        "data": {KEY: traceparent},
    });
    Api::<ConfigMap>::namespaced(m.client(), NAMESPACE)
        .patch(&object_name(rollout), &pp, &Patch::Apply(&cm))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = extract(tp).expect("a valid traceparent");
        assert_eq!(inject(&cx).as_deref(), Some(tp));
        assert!(extract("garbage").is_none());
        assert!(extract("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
    }
}
