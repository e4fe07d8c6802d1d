//! Failovers, switchovers and major upgrades: counted and timed where they complete
//! (`controller/failover/execute.rs`, `controller/switchover/execute.rs`), per member cluster
//! (per-PostgresCluster history is in its status: `lastFailover`,
//! `lastSwitchover`).

use super::{ClusterLabel, MethodLabel, UpgradeLabel, get};

/// A failover completed in `cluster`; `duration_ms` is detection → rewired.
pub fn failover_completed(cluster: &str, duration_ms: Option<i64>) {
    let m = get();
    let l = ClusterLabel::new(cluster);
    m.failovers.get_or_create(&l).inc();
    if let Some(ms) = duration_ms.filter(|ms| *ms >= 0) {
        m.failover_duration
            .get_or_create(&l)
            .observe(ms as f64 / 1000.0);
    }
}

/// A switchover completed in `cluster`; `requested_at` (RFC 3339) is when
/// its intent was recorded, so the duration spans manager restarts too.
pub fn switchover_completed(cluster: &str, requested_at: Option<&str>) {
    let m = get();
    let l = ClusterLabel::new(cluster);
    m.switchovers.get_or_create(&l).inc();
    let took = requested_at
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_milliseconds());
    if let Some(ms) = took.filter(|ms| *ms >= 0) {
        m.switchover_duration
            .get_or_create(&l)
            .observe(ms as f64 / 1000.0);
    }
}

/// A major upgrade of `method` ended in `cluster` with `outcome`
/// (`completed`, `rolled_back`, `failed`); `stall_ms` is how long writes
/// were held (in place: the downtime; blue/green: the cutover's pause).
pub fn major_upgrade_ended(cluster: &str, method: &str, outcome: &str, stall_ms: Option<i64>) {
    let m = get();
    m.major_upgrades
        .get_or_create(&UpgradeLabel {
            cluster: cluster.to_string(),
            method: method.to_string(),
            outcome: outcome.to_string(),
        })
        .inc();
    if let Some(ms) = stall_ms.filter(|ms| *ms >= 0) {
        let l = MethodLabel {
            cluster: cluster.to_string(),
            method: method.to_string(),
        };
        m.major_upgrade_stall
            .get_or_create(&l)
            .observe(ms as f64 / 1000.0);
    }
}
