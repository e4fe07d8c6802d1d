//! Backup scheduling: when each PostgresCluster's backup is due, and which of
//! the due backups may start now.
//!
//! Everything here is pure. The I/O layer lists PostgresClusters and
//! PostgresBackup records every few seconds and passes `now` in, so the whole
//! policy is tested with a fake clock and a restart of the manager changes
//! nothing: every decision is recomputed from the same inputs.
//!
//! The model:
//! * A cron tick only *enqueues*. Each PostgresCluster's scheduled run times
//!   ("slots") are the cron occurrences shifted by a stable per-cluster
//!   [`offset`] within a spread window, so a fleet-wide `0 2 * * *` does not
//!   start hundreds of backups in the same second.
//! * [`due`] looks only at the latest slot. A slot missed by more than
//!   `start_deadline` is skipped (the caller emits an Event) and older missed
//!   slots are superseded, so a manager outage never replays a storm.
//! * [`select`] picks what starts now under global, per-member-cluster and
//!   per-repository caps, with at most one backup per PostgresCluster.
//! * A failed backup is retried after [`retry_after`], up to
//!   [`MAX_ATTEMPTS`], as an ordinary candidate with `not_before` set, so it
//!   never holds a cap while it waits.
//!
//! Cron times are UTC.

use crate::platform::hash::fnv1a64;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use croner::Cron;

/// The stable spread of one PostgresCluster's slots within `window`.
///
/// FNV-1a 64 of `member/namespace/name`, modulo the window in whole seconds
/// (a window under one second gives zero). FNV-1a is fixed by its
/// specification, unlike `std`'s `DefaultHasher`, whose output may change
/// between Rust releases: the same cluster gets the same offset on every
/// manager restart and upgrade, so restarts never move a backup and never
/// make one slot look missed or due twice.
pub fn offset(window: Duration, member: &str, namespace: &str, name: &str) -> Duration {
    let secs = window.as_secs();
    if secs == 0 {
        return Duration::ZERO;
    }
    let key = format!("{member}/{namespace}/{name}");
    Duration::from_secs(fnv1a64(key.as_bytes()) % secs)
}

/// The latest slot (cron occurrence + `offset`) at or before `now`.
///
/// A slot is `occurrence + offset <= now`, i.e. `occurrence <= now - offset`,
/// so the search runs on the shifted clock. Searching from `now` instead
/// would be wrong whenever `offset > 0`: the latest occurrence at or before
/// `now` may have its slot still in the future.
///
/// `None` when the schedule has no such occurrence (croner searches a
/// bounded range) or the arithmetic overflows.
pub fn last_slot(cron: &Cron, offset: Duration, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let shift = TimeDelta::from_std(offset).ok()?;
    let shifted = now.checked_sub_signed(shift)?;
    // croner works in whole seconds and truncates `shifted`, so an inclusive
    // backward search never returns a time after it.
    let occurrence = cron.find_previous_occurrence(&shifted, true).ok()?;
    occurrence.checked_add_signed(shift)
}

/// The earliest slot strictly after `now`; see [`last_slot`].
pub fn next_slot(cron: &Cron, offset: Duration, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let shift = TimeDelta::from_std(offset).ok()?;
    let shifted = now.checked_sub_signed(shift)?;
    // An exclusive forward search starts at the next whole second, so the
    // result is strictly after `shifted` even when it has a fraction.
    let occurrence = cron.find_next_occurrence(&shifted, false).ok()?;
    occurrence.checked_add_signed(shift)
}

/// What the schedule asks of one PostgresCluster right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Nothing to do. `next` is the slot at which [`due`] will next say
    /// `Start` if nothing else changes (`None` if the schedule never fires).
    Idle { next: Option<DateTime<Utc>> },
    /// Enqueue a backup for `slot`; [`select`] decides when it starts.
    Start { slot: DateTime<Utc> },
    /// `slot` was missed by `late_by`, more than the start deadline. Emit an
    /// Event and record `slot` as handled; do not back up.
    Skip {
        slot: DateTime<Utc>,
        late_by: Duration,
    },
}

/// Decides what the latest slot of one PostgresCluster needs at `now`.
///
/// * `handled`: the latest slot already started or skipped, read back from
///   PostgresBackup records (or an annotation). The caller records a slot
///   only when its backup is actually created or skipped: while a `Start`
///   waits for a cap, `due` keeps answering `Start`, and once the wait
///   exceeds `start_deadline` it answers `Skip` instead.
/// * `created`: the PostgresCluster's creation time; slots before it are not
///   owed, so a new cluster does not start (or skip) a backup at once.
///
/// Only the latest slot is ever reported. Older missed slots are superseded
/// rather than replayed: after a three-day outage with a daily schedule this
/// returns one `Skip` and no `Start`, which is what keeps a manager restart
/// from starting a storm of overdue backups across the fleet.
pub fn due(
    cron: &Cron,
    offset: Duration,
    handled: Option<DateTime<Utc>>,
    created: DateTime<Utc>,
    now: DateTime<Utc>,
    start_deadline: Duration,
) -> Due {
    let owed = last_slot(cron, offset, now)
        .filter(|&slot| slot >= created && handled.is_none_or(|h| h < slot));
    let Some(slot) = owed else {
        return Due::Idle {
            next: next_owed_slot(cron, offset, handled, created, now),
        };
    };
    // `slot <= now`, so the difference is never negative.
    let late_by = (now - slot).to_std().unwrap_or(Duration::ZERO);
    if late_by > start_deadline {
        Due::Skip { slot, late_by }
    } else {
        Due::Start { slot }
    }
}

/// The earliest slot after `now` and `handled` and not before `created`.
///
/// Slots form one increasing sequence, so the earliest slot meeting several
/// lower bounds is the latest of the earliest slots meeting each one.
fn next_owed_slot(
    cron: &Cron,
    offset: Duration,
    handled: Option<DateTime<Utc>>,
    created: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let after = handled.map_or(now, |h| h.max(now));
    let after_bound = next_slot(cron, offset, after)?;
    let created_bound = match last_slot(cron, offset, created) {
        Some(slot) if slot == created => slot,
        _ => next_slot(cron, offset, created)?,
    };
    Some(after_bound.max(created_bound))
}

/// A backup in flight: it holds one unit of every cap it falls under.
///
/// A failed backup waiting for its retry is not running and holds nothing,
/// which is why a failure never blocks other backups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// The member (Kubernetes) cluster the PostgresCluster lives in.
    pub member: String,
    /// The backup repository written to. Must identify the repository
    /// fleet-wide (e.g. its URL), since members may share one.
    pub repository: String,
    /// `member/namespace/name` of the PostgresCluster.
    pub cluster_key: String,
}

/// A backup that wants to start: a due slot, an on-demand request or a retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// See [`Running::member`].
    pub member: String,
    /// See [`Running::repository`].
    pub repository: String,
    /// `member/namespace/name` of the PostgresCluster.
    pub cluster_key: String,
    /// The slot or request time; earlier goes first, so the backup that has
    /// waited longest (and is closest to its start deadline) is served first.
    pub priority: DateTime<Utc>,
    /// Retry backoff: not eligible before this time.
    pub not_before: Option<DateTime<Utc>>,
}

/// Concurrency limits for starting backups. A cap of 0 starts nothing at
/// that scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Backups in flight across the whole fleet.
    pub global: u32,
    /// Backups in flight per member cluster (its API server, nodes, network).
    pub per_member: u32,
    /// Backups in flight per repository; `None` is unlimited.
    pub per_repository: Option<u32>,
}

/// The indices into `candidates` to start now, in start order.
///
/// Candidates are considered by `priority` (ties by `cluster_key`, then
/// input order, so the answer does not depend on listing order). A
/// candidate is passed over when its `not_before` is after `now`, when its
/// PostgresCluster already has a backup running or selected in this call
/// (one backup per PostgresCluster at a time), or when any cap is full,
/// counting `running` plus what this call selected.
///
/// Passing over is not blocking: a candidate held back by a full member or
/// repository does not stop later candidates on other members or
/// repositories from starting. Strict head-of-line order would let one busy
/// member cluster idle the whole fleet.
pub fn select(
    caps: &Caps,
    running: &[Running],
    candidates: &[Candidate],
    now: DateTime<Utc>,
) -> Vec<usize> {
    let mut busy: HashSet<&str> = running.iter().map(|r| r.cluster_key.as_str()).collect();
    let mut per_member: HashMap<&str, u32> = HashMap::new();
    let mut per_repository: HashMap<&str, u32> = HashMap::new();
    for r in running {
        *per_member.entry(&r.member).or_default() += 1;
        *per_repository.entry(&r.repository).or_default() += 1;
    }
    let mut global = u32::try_from(running.len()).unwrap_or(u32::MAX);

    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&a, &b| {
        let (ca, cb) = (&candidates[a], &candidates[b]);
        (ca.priority, &ca.cluster_key, a).cmp(&(cb.priority, &cb.cluster_key, b))
    });

    let mut chosen = Vec::new();
    for i in order {
        if global >= caps.global {
            break;
        }
        let c = &candidates[i];
        if c.not_before.is_some_and(|t| t > now) || busy.contains(c.cluster_key.as_str()) {
            continue;
        }
        let member = per_member.get(c.member.as_str()).copied().unwrap_or(0);
        let repository = per_repository
            .get(c.repository.as_str())
            .copied()
            .unwrap_or(0);
        if member >= caps.per_member || caps.per_repository.is_some_and(|cap| repository >= cap) {
            continue;
        }
        *per_member.entry(&c.member).or_default() += 1;
        *per_repository.entry(&c.repository).or_default() += 1;
        global += 1;
        busy.insert(&c.cluster_key);
        chosen.push(i);
    }
    chosen
}

/// Attempts a failed backup gets in all. After the last one fails the
/// backup stays Failed and the next slot tries again, so a broken repository
/// costs a bounded number of runs per slot. Retry while
/// `attempts < MAX_ATTEMPTS`.
pub const MAX_ATTEMPTS: u32 = 5;

/// First retry delay; each further failure doubles it.
const RETRY_BASE: Duration = Duration::from_secs(60);
/// Longest retry delay: beyond an hour, waiting for the next slot is better.
const RETRY_MAX: Duration = Duration::from_secs(60 * 60);

/// How long to wait before retrying a backup that has failed `attempts`
/// times: 1m, 2m, 4m, … capped at 1h. Zero failures need no wait.
///
/// Exponential backoff keeps a failing repository or member cluster from
/// being hammered, while the cap keeps a retry within reach of its slot.
pub fn retry_after(attempts: u32) -> Duration {
    let Some(doublings) = attempts.checked_sub(1) else {
        return Duration::ZERO;
    };
    // 2^6 minutes already exceeds the cap, so larger shifts need not be
    // computed (and could overflow).
    let factor = 1u32 << doublings.min(6);
    RETRY_BASE.saturating_mul(factor).min(RETRY_MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "schedule_tests.rs"]
mod tests;
