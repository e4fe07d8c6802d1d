//! The spans of pgfleet's operations (see `docs/observability.md`). Their
//! attributes are names only (member cluster, namespace, PostgresCluster,
//! backup, instance): never connection strings, Secret data or kubeconfigs.

use opentelemetry::trace::{Span as _, TraceContextExt, Tracer as _};
use opentelemetry_sdk::trace::SdkTracer;
use std::sync::OnceLock;
use std::time::SystemTime;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

pub(super) fn set_tracer(t: SdkTracer) {
    let _ = TRACER.set(t);
}

/// One reconcile of one PostgresCluster: a trace of its own.
pub fn reconcile(cluster: &str, namespace: &str, name: &str, shard: u32) -> Span {
    tracing::info_span!(parent: None, "reconcile", cluster, namespace, name, shard)
}

/// A backup-dispatcher round that starts backups: the root of one trace
/// whose children are the [`backup_job`]s it started. Rounds that start
/// nothing get no span (they run every few seconds).
pub fn backup_sweep(starting: usize) -> Span {
    if starting == 0 {
        return Span::none();
    }
    tracing::info_span!(parent: None, "backup.sweep", backups = starting)
}

/// One backup run, a child of the current span (the sweep that started it).
pub fn backup_job(cluster: &str, namespace: &str, name: &str, backup: &str) -> Span {
    tracing::info_span!("backup", cluster, namespace, name, backup)
}

/// A switchover being carried out: a trace of its own, linked from the
/// reconcile that ran it.
pub fn switchover(cluster: &str, namespace: &str, name: &str, from: &str, to: &str) -> Span {
    let span = tracing::info_span!(parent: None, "switchover", cluster, namespace, name, from, to);
    let current = Span::current().context();
    let sc = current.span().span_context().clone();
    if sc.is_valid() {
        span.add_link(sc);
    }
    span
}

/// A cross-cluster switchover or failover of a DR topology (`kind`:
/// `dr.switchover`, `dr.failover`): a trace of its own that lives from the
/// round that first sees the new epoch until its primary takes writes; the
/// steps on every member involved are its children ([`dr_step`]).
pub fn dr_operation(kind: &'static str, topology: &str, to: &str, epoch: u64) -> Span {
    match kind {
        "dr.failover" => tracing::info_span!(parent: None, "dr.failover", topology, to, epoch),
        _ => tracing::info_span!(parent: None, "dr.switchover", topology, to, epoch),
    }
}

/// One step of a DR operation on one member's instance or pooler.
pub fn dr_step(parent: &Span, member: &str, target: &str, verb: &str) -> Span {
    tracing::info_span!(parent: parent, "dr.step", cluster = member, target, verb)
}

/// A span with explicit start and end times under `parent` (something that
/// happened while no code of ours was running, such as a PostgresCluster's
/// rolling update between two rollout rounds).
pub fn record_interval(
    name: &'static str,
    parent: &opentelemetry::Context,
    attributes: Vec<opentelemetry::KeyValue>,
    start: SystemTime,
    end: SystemTime,
) {
    let Some(tracer) = TRACER.get() else { return };
    let mut span = tracer
        .span_builder(name)
        .with_start_time(start)
        .with_attributes(attributes)
        .start_with_context(tracer, parent);
    span.end_with_timestamp(end.max(start));
}
