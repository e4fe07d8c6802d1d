//! Disaster-recovery topologies (`crate::dr`), refreshed after every DR
//! engine round: the epoch, which member is the primary side, and per
//! replica side whether it answers and its lag (the live RPO).

use super::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopologyLabel {
    pub topology: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SideLabel {
    pub topology: String,
    pub member: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PromotionLabel {
    pub topology: String,
    /// `switchover`, `failover` or `manual`.
    pub kind: String,
}

/// The families, registered by `Metrics::new`.
#[derive(Default)]
pub struct Families {
    pub epoch: Family<TopologyLabel, Gauge>,
    pub primary: Family<SideLabel, Gauge>,
    pub reachable: Family<SideLabel, Gauge>,
    pub lag_bytes: Family<SideLabel, Gauge>,
    pub lag_seconds: Family<SideLabel, Gauge<f64, AtomicU64>>,
    pub blocked: Family<TopologyLabel, Gauge>,
    pub promotions: Family<PromotionLabel, Counter>,
}

impl Families {
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "pgfleet_dr_epoch",
            "The DR topology's epoch (raised by every switchover and promotion)",
            self.epoch.clone(),
        );
        r.register(
            "pgfleet_dr_primary",
            "1 for the member that is the DR topology's primary side",
            self.primary.clone(),
        );
        r.register(
            "pgfleet_dr_reachable",
            "1 while the side's API and primary instance answer the DR engine",
            self.reachable.clone(),
        );
        r.register("pgfleet_dr_lag_bytes", "WAL the primary side wrote that this replica side has not received (live RPO in bytes)", self.lag_bytes.clone());
        r.register(
            "pgfleet_dr_lag_seconds",
            "Age of the oldest write this replica side lacks (live RPO in time)",
            self.lag_seconds.clone(),
        );
        r.register("pgfleet_dr_promotion_blocked", "1 while the primary side is lost and automatic promotion is blocked (max_rpo, or automatic failover off)", self.blocked.clone());
        r.register(
            "pgfleet_dr_promotions",
            "Promotions of a replica side, by kind (switchover, failover, manual)",
            self.promotions.clone(),
        );
    }
}

/// One side after a round: reachable, primary side or not, lag if measured.
pub struct SideFigures<'a> {
    pub member: &'a str,
    pub primary: bool,
    pub reachable: bool,
    pub lag: Option<(u64, f64)>,
}

/// Records a topology after a round.
pub fn observe(topology: &str, epoch: u64, blocked: bool, sides: &[SideFigures<'_>]) {
    let m = &get().dr;
    let t = TopologyLabel {
        topology: topology.to_string(),
    };
    m.epoch
        .get_or_create(&t)
        .set(i64::try_from(epoch).unwrap_or(i64::MAX));
    m.blocked.get_or_create(&t).set(i64::from(blocked));
    for s in sides {
        let l = SideLabel {
            topology: topology.to_string(),
            member: s.member.to_string(),
        };
        m.primary.get_or_create(&l).set(i64::from(s.primary));
        m.reachable.get_or_create(&l).set(i64::from(s.reachable));
        if let Some((bytes, secs)) = s.lag {
            m.lag_bytes
                .get_or_create(&l)
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
            m.lag_seconds.get_or_create(&l).set(secs);
        }
    }
}

/// A promotion was decided (`kind`: switchover, failover, manual).
pub fn promoted(topology: &str, kind: &str) {
    get()
        .dr
        .promotions
        .get_or_create(&PromotionLabel {
            topology: topology.to_string(),
            kind: kind.to_string(),
        })
        .inc();
}
