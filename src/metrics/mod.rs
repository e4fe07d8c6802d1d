//! Prometheus metrics (prometheus-client). One registry for the process,
//! built on first use; the HTTP API serves [`encode`] on `/metrics`.
//!
//! Series are labelled with `cluster` (the member cluster), and with
//! `namespace`/`name` only where they describe one PostgresCluster. Those
//! per-PostgresCluster series are not stored as prometheus-client families
//! (one copy of the three labels per family and series) but as one compact
//! record per PostgresCluster in [`pgc`], rendered at scrape time: ages are
//! then exact at scrape, and forgetting a PostgresCluster is one removal.
//! See `docs/observability.md` for every series.

pub mod dr;
pub mod leases;
pub mod ops;
pub mod pgc;
pub mod reconcile;
pub mod replicas;
pub mod requests;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::LazyLock;

pub use pgc::forget_postgrescluster;

/// The media type of [`encode`]'s output (OpenMetrics text).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `cluster` label alone: per-member series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabel {
    pub cluster: String,
}

impl ClusterLabel {
    pub fn new(cluster: &str) -> Self {
        Self {
            cluster: cluster.to_string(),
        }
    }
}

/// A member cluster and the category of a failed reconcile
/// (`controller::error::Category`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub cluster: String,
    pub category: String,
}

/// A member cluster, a major upgrade's method and how it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpgradeLabel {
    pub cluster: String,
    pub method: String,
    pub outcome: String,
}

/// A member cluster and a major upgrade's method.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabel {
    pub cluster: String,
    pub method: String,
}

/// A member cluster and one of its connection states.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub cluster: String,
    pub state: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every metric of the process.
pub struct Metrics {
    registry: Registry,
    pub reconcile_duration: HistogramFamily<ClusterLabel>,
    pub reconcile_errors: Family<ErrorLabel, Counter>,
    pub reconcile_queue: Family<ClusterLabel, Gauge>,
    pub cluster_up: Family<ClusterLabel, Gauge>,
    pub cluster_state: Family<StateLabel, Gauge>,
    pub failovers: Family<ClusterLabel, Counter>,
    pub failover_duration: HistogramFamily<ClusterLabel>,
    pub switchovers: Family<ClusterLabel, Counter>,
    pub switchover_duration: HistogramFamily<ClusterLabel>,
    pub major_upgrades: Family<UpgradeLabel, Counter>,
    pub major_upgrade_stall: HistogramFamily<MethodLabel>,
    pub rollout_pgcs: Family<RolloutStageLabel, Gauge>,
    pub rollout_state: Family<RolloutStateLabel, Gauge>,
    pub pgcs: std::sync::Arc<pgc::Store>,
    pub replicas: std::sync::Arc<replicas::Store>,
    pub requests: std::sync::Arc<requests::Store>,
    pub leases: std::sync::Arc<leases::Store>,
    pub dr: dr::Families,
}

/// Reconcile latencies: 5 ms … ~40 s.
fn reconcile_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Failover and switchover durations: 250 ms … ~8.5 min.
fn operation_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.25, 2.0, 12))
}

/// Write stalls and downtimes of major upgrades: 50 ms … ~7 min.
fn stall_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.05, 2.0, 14))
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            reconcile_duration: Family::new_with_constructor(reconcile_buckets),
            reconcile_errors: Family::default(),
            reconcile_queue: Family::default(),
            cluster_up: Family::default(),
            cluster_state: Family::default(),
            failovers: Family::default(),
            failover_duration: Family::new_with_constructor(operation_buckets),
            switchovers: Family::default(),
            switchover_duration: Family::new_with_constructor(operation_buckets),
            major_upgrades: Family::default(),
            major_upgrade_stall: Family::new_with_constructor(stall_buckets),
            rollout_pgcs: Family::default(),
            rollout_state: Family::default(),
            pgcs: std::sync::Arc::default(),
            replicas: std::sync::Arc::default(),
            requests: std::sync::Arc::default(),
            leases: std::sync::Arc::default(),
            dr: dr::Families::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "pgfleet_reconcile_duration_seconds",
            "Time one PostgresCluster reconcile took, waiting for a worker included",
            m.reconcile_duration.clone(),
        );
        r.register(
            "pgfleet_reconcile_errors",
            "Reconciles that ended in an error (retried after a backoff)",
            m.reconcile_errors.clone(),
        );
        r.register(
            "pgfleet_reconcile_queue_depth",
            "Reconciles the member's controllers started and not finished (waiting for a worker or running)",
            m.reconcile_queue.clone(),
        );
        r.register(
            "pgfleet_cluster_up",
            "1 while the member cluster answers its probes (state Ready)",
            m.cluster_up.clone(),
        );
        r.register(
            "pgfleet_cluster_state",
            "1 for the member cluster's current connection state (Connecting, Ready, Unreachable)",
            m.cluster_state.clone(),
        );
        r.register(
            "pgfleet_failovers",
            "Completed automatic failovers",
            m.failovers.clone(),
        );
        r.register(
            "pgfleet_failover_duration_seconds",
            "Primary loss detected to new primary serving (-rw rewired)",
            m.failover_duration.clone(),
        );
        r.register(
            "pgfleet_switchovers",
            "Completed switchovers (operator or rolling update)",
            m.switchovers.clone(),
        );
        r.register(
            "pgfleet_switchover_duration_seconds",
            "Switchover requested to completed",
            m.switchover_duration.clone(),
        );
        r.register(
            "pgfleet_major_upgrades",
            "Major upgrades that ended, by method (inPlace, blueGreen) and outcome (completed, rolled_back, failed)",
            m.major_upgrades.clone(),
        );
        r.register(
            "pgfleet_major_upgrade_stall_seconds",
            "Writes held by a completed major upgrade: inPlace stop to new primary serving, blueGreen the cutover's pause",
            m.major_upgrade_stall.clone(),
        );
        r.register(
            "pgfleet_rollout_postgresclusters",
            "PostgresClusters of a rollout stage by state (total, done, in_flight, failed, pending, deferred)",
            m.rollout_pgcs.clone(),
        );
        r.register(
            "pgfleet_rollout_state",
            "1 for the rollout's current state",
            m.rollout_state.clone(),
        );
        m.dr.register(r);
        r.register_collector(Box::new(m.pgcs.clone()));
        r.register_collector(Box::new(m.replicas.clone()));
        r.register_collector(Box::new(m.requests.clone()));
        r.register_collector(Box::new(m.leases.clone()));
        Metrics { registry, ..m }
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn get() -> &'static Metrics {
    &METRICS
}

/// The whole registry in the OpenMetrics text format (what `/metrics` serves).
pub fn encode() -> String {
    let mut out = String::new();
    // Writing into a String cannot fail; an encoder error would be a bug in
    // a collector, and a partial page is still more useful than none.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &get().registry) {
        tracing::warn!(error = %e, "encoding metrics failed");
    }
    out
}

/// Records a member cluster's connection state (called on every change).
/// `state` is the connection state's label (`Connecting`, `Ready`,
/// `Unreachable`), so metrics need not know the fleet's types.
pub fn cluster_state(cluster: &str, current: &str) {
    let m = get();
    for s in ["Connecting", "Ready", "Unreachable"] {
        m.cluster_state
            .get_or_create(&StateLabel {
                cluster: cluster.to_string(),
                state: s.to_string(),
            })
            .set(i64::from(s == current));
    }
    m.cluster_up
        .get_or_create(&ClusterLabel::new(cluster))
        .set(i64::from(current == "Ready"));
}

/// A rollout stage's PostgresClusters by state (`pgfleet_rollout_postgresclusters`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutStageLabel {
    pub rollout: String,
    pub stage: String,
    pub state: String,
}

/// A rollout's state (`pgfleet_rollout_state`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutStateLabel {
    pub rollout: String,
    pub state: String,
}

/// Records a rollout's current state: 1 for `current`, 0 for the other
/// `states`. What the states are is the rollout's (`rollout::metrics`).
pub fn rollout_state(rollout: &str, states: &[&str], current: &str) {
    let m = get();
    for s in states {
        m.rollout_state
            .get_or_create(&RolloutStateLabel {
                rollout: rollout.to_string(),
                state: (*s).to_string(),
            })
            .set(i64::from(*s == current));
    }
}

/// Records how many PostgresClusters of a rollout stage are in each state.
pub fn rollout_stage(rollout: &str, stage: &str, counts: &[(&str, usize)]) {
    let m = get();
    for (state, n) in counts {
        m.rollout_pgcs
            .get_or_create(&RolloutStageLabel {
                rollout: rollout.to_string(),
                stage: stage.to_string(),
                state: (*state).to_string(),
            })
            .set(i64::try_from(*n).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests;
