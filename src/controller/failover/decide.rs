//! Failover decisions, pure: is the primary lost, and which replica may take
//! over. The I/O that carries a decision out lives in `execute.rs`. The
//! candidate ranking here is also how a switchover picks its target
//! (`switchover::decide`), so both choose the same replica from the same
//! reports.
//!
//! Rules (DESIGN §2, issue "automatic failover"):
//! - a primary whose Pod is gone is lost at once; one that is not ready (or
//!   whose instance does not answer) is lost after `failoverDelay`;
//! - the most advanced healthy replica wins: received LSN first, then
//!   replayed LSN, then the lowest ordinal for a stable tie-break;
//! - with synchronous replication (`ANY n` / `FIRST n`), only a replica that
//!   is guaranteed to hold every acknowledged commit may be promoted: with a
//!   quorum of `n` among `m` synchronous standbys, any `m - n + 1` of them
//!   include one that confirmed each commit, so the most advanced of at least
//!   that many answering standbys is safe. With fewer answers, stay without a
//!   primary and say so — never lose an acknowledged write.

use crate::postgres::{InstanceReport, parse_lsn};
use std::time::Duration;

/// What is known about the current primary.
#[derive(Debug, Clone, PartialEq)]
pub enum PrimaryState {
    Healthy,
    /// Its Pod no longer exists (deleted, evicted, node gone).
    PodGone,
    /// Not ready (or not answering) for this long.
    Unhealthy {
        for_: Duration,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Keep,
    /// Not lost yet; look again after this long.
    WaitFor(Duration),
    FailOver,
}

pub fn verdict(state: &PrimaryState, delay: Duration) -> Verdict {
    match state {
        PrimaryState::Healthy => Verdict::Keep,
        PrimaryState::PodGone => Verdict::FailOver,
        PrimaryState::Unhealthy { for_ } if *for_ >= delay => Verdict::FailOver,
        PrimaryState::Unhealthy { for_ } => Verdict::WaitFor(delay - *for_),
    }
}

/// How the lost primary is fenced once it is out of `-rw` (its label says
/// `fenced` first, in every case).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// Stop it through `pgfleet-instance fence` (exec), then delete its Pod
    /// when that fails.
    Exec,
    /// Delete its Pod without trying the exec.
    DeletePod,
}

/// A Pod that is not ready does not answer through its kubelet either: on
/// a lost node (kubelet down, Ready=False set by the node controller) the
/// API server cannot dial the kubelet and an exec would only burn its
/// timeout before the promotion. Fencing by label and Service already
/// keeps clients away; the Pod is deleted (the kubelet, if it ever comes
/// back, kills the process).
pub fn fence_for(old_ready: bool) -> Fence {
    if old_ready {
        Fence::Exec
    } else {
        Fence::DeletePod
    }
}

/// One replica that might be promoted, with what its instance reported
/// (None when it did not answer).
#[derive(Debug, Clone)]
pub struct Candidate {
    pub name: String,
    pub ordinal: u32,
    pub ready: bool,
    pub report: Option<InstanceReport>,
}

/// The synchronous replication in force when the primary was lost.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncRule {
    /// Commits wait for this many standbys.
    pub number: u32,
    /// The standbys named in synchronous_standby_names.
    pub standbys: Vec<String>,
}

/// Where a replica stands: WAL received (or replayed, when the receive
/// position restarted at a segment boundary), then WAL replayed.
fn position(r: &InstanceReport) -> (u64, u64) {
    let rx = r.received_lsn.as_deref().and_then(parse_lsn).unwrap_or(0);
    let replay = r.replayed_lsn.as_deref().and_then(parse_lsn).unwrap_or(0);
    (rx.max(replay), replay)
}

/// A replica that answered as a replica and is not fenced: the only kind
/// that may be promoted.
pub fn eligible(c: &Candidate) -> bool {
    c.report
        .as_ref()
        .is_some_and(|r| r.role == "replica" && !r.fenced)
}

/// The ranking failover and switchover share: the most advanced candidate
/// (received, then replayed LSN), ties to the lowest ordinal — compared as
/// numbers, so `pg-2` wins over `pg-10`.
pub fn most_advanced<'a>(
    candidates: impl IntoIterator<Item = &'a Candidate>,
) -> Option<&'a Candidate> {
    candidates.into_iter().max_by(|a, b| {
        let (pa, pb) = (
            a.report.as_ref().map(position),
            b.report.as_ref().map(position),
        );
        pa.cmp(&pb).then(b.ordinal.cmp(&a.ordinal))
    })
}

/// Picks the replica to promote, or says why none may be.
pub fn choose(candidates: &[Candidate], sync: Option<&SyncRule>) -> Result<String, String> {
    let answering: Vec<&Candidate> = candidates.iter().filter(|c| eligible(c)).collect();
    if let Some(rule) = sync {
        let m = rule.standbys.len() as u32;
        let need = m.saturating_sub(rule.number) + 1;
        let got = answering
            .iter()
            .filter(|c| rule.standbys.contains(&c.name))
            .count() as u32;
        if got < need {
            return Err(format!(
                "synchronous replication: only {got} of the {m} synchronous standbys answered, {need} are needed to be sure no acknowledged commit is lost; staying without a primary"
            ));
        }
    }
    most_advanced(answering)
        .map(|c| c.name.clone())
        .ok_or_else(|| "no replica answered; staying without a primary until one does".to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_not_ready_primary_is_fenced_without_exec() {
        assert_eq!(fence_for(true), Fence::Exec);
        assert_eq!(fence_for(false), Fence::DeletePod);
    }

    fn cand(name: &str, ord: u32, rx: Option<&str>, replay: &str) -> Candidate {
        Candidate {
            name: name.into(),
            ordinal: ord,
            ready: true,
            report: Some(InstanceReport {
                contract: 1,
                role: crate::crd::Role::Replica.to_string(),
                ready: true,
                received_lsn: rx.map(String::from),
                replayed_lsn: Some(replay.into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_gone_pod_fails_over_at_once_a_slow_one_after_the_delay() {
        let d = Duration::from_secs(5);
        assert_eq!(verdict(&PrimaryState::PodGone, d), Verdict::FailOver);
        assert_eq!(
            verdict(
                &PrimaryState::Unhealthy {
                    for_: Duration::from_secs(2)
                },
                d
            ),
            Verdict::WaitFor(Duration::from_secs(3))
        );
        assert_eq!(
            verdict(&PrimaryState::Unhealthy { for_: d }, d),
            Verdict::FailOver
        );
        assert_eq!(verdict(&PrimaryState::Healthy, d), Verdict::Keep);
    }

    #[test]
    fn the_most_advanced_replica_wins_received_before_replayed() {
        let cs = vec![
            cand("pg-2", 2, Some("0/5000000"), "0/4000000"),
            cand("pg-3", 3, Some("0/6000000"), "0/3000000"),
        ];
        assert_eq!(choose(&cs, None).unwrap(), "pg-3");
        let tie = vec![
            cand("pg-3", 3, Some("0/5000000"), "0/5000000"),
            cand("pg-2", 2, Some("0/5000000"), "0/5000000"),
        ];
        assert_eq!(choose(&tie, None).unwrap(), "pg-2");
    }

    #[test]
    fn silent_or_fenced_replicas_are_not_candidates() {
        let mut silent = cand("pg-2", 2, Some("0/9000000"), "0/9000000");
        silent.report = None;
        let ok = cand("pg-3", 3, Some("0/1000000"), "0/1000000");
        assert_eq!(choose(&[silent.clone(), ok], None).unwrap(), "pg-3");
        assert!(choose(&[silent], None).is_err());
    }

    #[test]
    fn synchronous_quorum_needs_enough_answers() {
        let rule = SyncRule {
            number: 1,
            standbys: vec!["pg-2".into(), "pg-3".into()],
        };
        let only_one = vec![cand("pg-2", 2, Some("0/5000000"), "0/5000000")];
        let err = choose(&only_one, Some(&rule)).unwrap_err();
        assert!(err.contains("only 1 of the 2"), "{err}");
        let both = vec![
            cand("pg-2", 2, Some("0/5000000"), "0/5000000"),
            cand("pg-3", 3, Some("0/5000100"), "0/5000000"),
        ];
        assert_eq!(choose(&both, Some(&rule)).unwrap(), "pg-3");
        let all_sync = SyncRule {
            number: 2,
            standbys: vec!["pg-2".into(), "pg-3".into()],
        };
        assert_eq!(choose(&only_one, Some(&all_sync)).unwrap(), "pg-2");
    }
}
