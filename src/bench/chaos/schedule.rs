//! The fault schedule of a chaos run, drawn from a seed: the same seed gives
//! the same faults at the same offsets, so any violation replays. Pure.
//!
//! A round is [`ROUND`] long: one or two faults start in its first half (a
//! second one overlaps the first), every fault is healed at the end of the
//! round, and a quiet period follows (the runner waits for Healthy).

use std::fmt;
use std::time::Duration;

/// How long the faults of one round may run before healing.
pub const ROUND: Duration = Duration::from_secs(12);

/// The faults the runner can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// SIGKILL every process of the primary's pod (force delete, grace 0).
    KillPrimary,
    /// The same for one replica.
    KillReplica,
    /// SIGSTOP the primary's processes until the round heals (SIGCONT).
    FreezePrimary,
    /// A switchover requested through the annotation.
    Switchover,
    /// SIGSTOP the primary until the manager has failed over, then SIGCONT:
    /// the deposed primary comes back while its successor takes writes, the
    /// case fencing exists for (a [`FaultKind::FreezePrimary`] is mostly
    /// thawed before failure detection). It holds the round until the
    /// failover, so a second fault of that round may start late.
    FreezePrimaryUntilFailover,
    /// Every API request of the member waits [`API_LATENCY_MS`] until the
    /// round heals.
    ApiLatency,
    /// A share of the member's API requests ([`API_ERROR_RATE`]) answered
    /// 429 (with Retry-After) in odd rounds and 500 in even ones, until the
    /// round heals.
    ApiErrors,
    /// Every open watch of the member ends at once (the manager re-lists).
    DropWatches,
    /// The member's API server refuses every connection until the round
    /// heals (the database pods keep running: the manager alone is cut off).
    MemberUnreachable,
    /// A pod-template change (`spec.resources.cpu`), so the cluster rolls
    /// its instances, primary last, in the middle of everything else.
    RollingUpdate,
}

/// Added to each API request by [`FaultKind::ApiLatency`].
pub const API_LATENCY_MS: u64 = 400;
/// The share of API requests [`FaultKind::ApiErrors`] refuses.
pub const API_ERROR_RATE: f64 = 0.3;

impl FaultKind {
    pub const ALL: [FaultKind; 10] = [
        FaultKind::KillPrimary,
        FaultKind::KillReplica,
        FaultKind::FreezePrimary,
        FaultKind::Switchover,
        FaultKind::FreezePrimaryUntilFailover,
        FaultKind::ApiLatency,
        FaultKind::ApiErrors,
        FaultKind::DropWatches,
        FaultKind::MemberUnreachable,
        FaultKind::RollingUpdate,
    ];

    /// Whether the fault hits the member's API server rather than one
    /// PostgresCluster (it then needs no primary to aim at).
    pub fn member_wide(self) -> bool {
        matches!(
            self,
            FaultKind::ApiLatency
                | FaultKind::ApiErrors
                | FaultKind::DropWatches
                | FaultKind::MemberUnreachable
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::KillPrimary => "kill -9 primary",
            FaultKind::KillReplica => "kill -9 replica",
            FaultKind::FreezePrimary => "freeze primary",
            FaultKind::Switchover => "switchover",
            FaultKind::FreezePrimaryUntilFailover => "freeze primary until failover",
            FaultKind::ApiLatency => "API server latency",
            FaultKind::ApiErrors => "API server 429/500",
            FaultKind::DropWatches => "watches dropped",
            FaultKind::MemberUnreachable => "member unreachable",
            FaultKind::RollingUpdate => "rolling update",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One scheduled fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// Round number, from 1.
    pub round: u32,
    /// Offset from the start of the round.
    pub at: Duration,
    /// Index into the runner's list of clusters.
    pub cluster: usize,
    pub kind: FaultKind,
}

/// splitmix64: small, fast, and with no dependency whose stream could change
/// between versions (a seed must replay the same schedule forever).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The faults of `rounds` rounds over `clusters` clusters, from `seed`.
/// Two faults of one round never hit the same cluster with a second
/// primary fault while the first is unhealed (a frozen primary cannot be
/// killed as well: the pod is already being replaced).
pub fn schedule(seed: u64, rounds: u32, clusters: usize) -> Vec<Fault> {
    let mut rng = Rng(seed);
    let mut out = vec![];
    let half = ROUND.as_millis() as u64 / 2;
    for round in 1..=rounds {
        let n = 1 + rng.below(2) as usize;
        let mut used: Vec<usize> = vec![];
        for i in 0..n {
            let kind = FaultKind::ALL[rng.below(FaultKind::ALL.len() as u64) as usize];
            let mut cluster = rng.below(clusters.max(1) as u64) as usize;
            if used.contains(&cluster) && clusters > 1 {
                cluster = (cluster + 1) % clusters;
            }
            if used.contains(&cluster) {
                continue;
            }
            used.push(cluster);
            let at = if i == 0 { 0 } else { rng.below(half) };
            out.push(Fault {
                round,
                at: Duration::from_millis(at),
                cluster,
                kind,
            });
        }
        let from = out.len() - used.len();
        out[from..].sort_by_key(|f| f.at);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        assert_eq!(schedule(42, 20, 2), schedule(42, 20, 2));
        assert_ne!(schedule(42, 20, 2), schedule(43, 20, 2));
    }

    #[test]
    fn every_round_has_a_fault_and_faults_stay_in_the_first_half() {
        let s = schedule(7, 50, 2);
        for r in 1..=50 {
            let of: Vec<&Fault> = s.iter().filter(|f| f.round == r).collect();
            assert!(!of.is_empty() && of.len() <= 2, "round {r}: {of:?}");
            assert!(of.iter().all(|f| f.at < ROUND / 2 && f.cluster < 2));
            assert!(of.windows(2).all(|w| w[0].at <= w[1].at));
            // Overlapping faults hit different clusters.
            if of.len() == 2 {
                assert_ne!(of[0].cluster, of[1].cluster);
            }
        }
    }

    #[test]
    fn fifty_rounds_draw_every_kind() {
        let s = schedule(1, 50, 2);
        for k in FaultKind::ALL {
            assert!(s.iter().any(|f| f.kind == k), "{k} never drawn");
        }
    }

    #[test]
    fn one_cluster_gets_one_fault_per_round() {
        let s = schedule(9, 30, 1);
        for r in 1..=30 {
            assert_eq!(s.iter().filter(|f| f.round == r).count(), 1);
        }
    }
}
