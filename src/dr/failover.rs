//! Automatic cross-cluster failover, pure: pgfleet is the witness that
//! Patroni's documentation says a second data centre lacks. A replica side
//! is promoted only when
//! 1. the manager has not reached the primary side (its API, and through
//!    it the `status dr` heartbeat) for `failover_after`, AND
//! 2. that replica side has not heard from the primary side either (its
//!    WAL receiver) for `failover_after`, AND
//! 3. the last lag measured while both were up is within `max_rpo_bytes`
//!    and `max_rpo_lag`.
//!
//! The primary side's watchdog fences it after `failover_after / 2`
//! without both contacts (instance script, `dr_watchdog`), so by the time
//! 1 and 2 hold it has stopped taking writes. The manager alone being down
//! satisfies neither 1 (there is no manager to decide) nor the watchdog
//! (the replica side still streams); a cut between the manager and the
//! primary side only fails 2.

use std::time::Duration;

/// What the engine has tracked (its own clock) for the decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Witness {
    /// Since the manager last reached the primary side's primary.
    pub primary_silent: Duration,
    /// Replica sides that answer now: (member, since it last streamed from
    /// the primary side, last measured lag in bytes, in time, received LSN).
    pub replicas: Vec<Candidate>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub member: String,
    pub silent: Duration,
    pub lag_bytes: Option<u64>,
    pub lag: Option<Duration>,
    pub received: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The primary side answers (or not for long enough).
    Keep,
    /// Promote this member (forced).
    Promote(String),
    /// A person must decide (`pgfleet dr promote --accept-data-loss`).
    Blocked(String),
}

pub struct Limits {
    pub failover_after: Duration,
    pub automatic: bool,
    pub max_rpo_bytes: u64,
    pub max_rpo_lag: Duration,
}

pub fn decide(w: &Witness, l: &Limits) -> Verdict {
    if w.primary_silent < l.failover_after {
        return Verdict::Keep;
    }
    // Only a side that has lost the primary too: otherwise the cut is
    // between the manager and the primary side, which still works.
    let mut lost: Vec<&Candidate> = w
        .replicas
        .iter()
        .filter(|c| c.silent >= l.failover_after)
        .collect();
    if lost.is_empty() {
        return Verdict::Keep;
    }
    lost.sort_by(|a, b| b.received.cmp(&a.received).then(a.member.cmp(&b.member)));
    let best = lost[0];
    if !l.automatic {
        return Verdict::Blocked(format!(
            "the primary side is unreachable; automatic failover is off: promote {} with `pgfleet dr promote`",
            best.member
        ));
    }
    match (best.lag_bytes, best.lag) {
        (Some(b), Some(t)) if b <= l.max_rpo_bytes && t <= l.max_rpo_lag => {
            Verdict::Promote(best.member.clone())
        }
        (Some(b), Some(t)) => Verdict::Blocked(format!(
            "the primary side is unreachable, but {}'s last measured lag ({b} bytes, {} ms) exceeds max_rpo ({} bytes, {} ms): promote by hand with `pgfleet dr promote --accept-data-loss` if losing that is acceptable",
            best.member,
            t.as_millis(),
            l.max_rpo_bytes,
            l.max_rpo_lag.as_millis()
        )),
        _ => Verdict::Blocked(format!(
            "the primary side is unreachable and {}'s lag was never measured: promote by hand with `pgfleet dr promote --accept-data-loss`",
            best.member
        )),
    }
}

/// The lag in time of a replica that has received `received`: how long
/// ago the primary side first wrote past it, from the engine's samples
/// `(age, primary position)` (newest first). Zero when it has everything.
pub fn lag_in_time(samples: &[(Duration, u64)], received: u64) -> Option<Duration> {
    let newest = samples.first()?;
    if received >= newest.1 {
        return Some(Duration::ZERO);
    }
    // The oldest sample still ahead of the replica.
    let oldest_ahead = samples.iter().rev().find(|(_, lsn)| *lsn > received)?;
    Some(oldest_ahead.0.saturating_sub(newest.0))
}

#[cfg(test)]
#[path = "failover_tests.rs"]
mod tests;
