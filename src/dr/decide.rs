//! The DR engine's decisions, pure: from what each member shows now and
//! the topology's newest state, what the sides must be and which step
//! brings the instances there. The engine (`mod.rs`) only carries them out,
//! one round at a time, so a manager killed anywhere resumes by deciding
//! again from what it sees.
//!
//! The state is written first, the instances follow it:
//! - a member that is not the primary side but whose primary still takes
//!   writes is demoted (cleanly for a switchover; with a rewind after a
//!   forced promotion, since it may hold WAL the new primary never saw);
//! - the primary side's designated primary is promoted only when nothing
//!   can be lost: for a switchover, every other side is demoted and the new
//!   primary has received all of their WAL (RPO 0); for a forced promotion
//!   (automatic failover or `pgfleet dr promote`) the checks were made when
//!   the state was written;
//! - a side that fenced itself rejoins (unfence, then rewind) only when
//!   every member's copy of the state was read, so a manager that sees
//!   only the old primary side can never unfence it into a second primary.

use super::state::State;
use crate::config::dr::Topology;
use crate::controller::dr::registry::{Endpoint, Side};
use crate::postgres::{InstanceReport, parse_lsn};

/// One member of a topology as observed in this round.
#[derive(Clone, Debug, Default)]
pub struct SideView {
    pub member: String,
    /// Its API answered this round.
    pub reachable: bool,
    /// Its copy of the state (None: none, or unreadable).
    pub copy: Option<State>,
    /// Its primary (or designated primary) instance: `status.currentPrimary`.
    pub primary_pod: Option<String>,
    /// What that instance reported (None: no answer).
    pub report: Option<InstanceReport>,
    /// Its `<name>-dr` LoadBalancer address, "HOST:PORT".
    pub endpoint: Option<String>,
}

/// A step on one member's primary instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// `demote dr` (clean; `rewind`: after a forced promotion).
    Demote {
        member: String,
        pod: String,
        rewind: bool,
    },
    Promote {
        member: String,
        pod: String,
    },
    /// `unfence dr` on a replica side (refused until its configuration
    /// names its source), plain `unfence` on the primary side.
    Unfence {
        member: String,
        pod: String,
        replica: bool,
    },
}

impl Step {
    /// (member, instance, verb) for traces and logs.
    pub fn names(&self) -> (&str, &str, &'static str) {
        match self {
            Step::Demote { member, pod, .. } => (member, pod, "demote"),
            Step::Promote { member, pod } => (member, pod, "promote"),
            Step::Unfence { member, pod, .. } => (member, pod, "unfence"),
        }
    }
}

/// The state a topology starts with: the first member is the primary
/// side. Only when every member answered and none holds a state (a copy
/// might exist on a member that did not answer).
pub fn initial(members: &[String], views: &[SideView]) -> Option<State> {
    let all_read = views.iter().all(|v| v.reachable);
    let none = views.iter().all(|v| v.copy.is_none());
    let first = members.first()?;
    (all_read && none).then(|| State {
        epoch: 1,
        primary: first.clone(),
        ..State::default()
    })
}

/// The side each member is on. A replica side needs the primary side's
/// address; without one it stays [`Side::Unknown`] (its controller waits).
/// The new primary of a switchover stays a replica of the old one until it
/// has received everything (`handed_over`): it must not stop streaming
/// before the old primary's last WAL arrived.
pub fn sides(
    topology: &str,
    state: &State,
    t: &Topology,
    views: &[SideView],
) -> Vec<(String, Side)> {
    let source = state.endpoint.as_deref().and_then(parse_endpoint);
    let new = views.iter().find(|v| v.member == state.primary);
    let promoted = new
        .and_then(|v| v.report.as_ref())
        .is_some_and(|r| r.role == "primary");
    let previous = state.previous_endpoint.as_deref().and_then(parse_endpoint);
    let waiting = previous.is_some()
        && !state.forced
        && !promoted
        && !new.is_some_and(|n| handed_over(state, n, views));
    // Synchronous: every other side (strict: writes wait while the link is
    // cut), except after a forced promotion, when the lost side would hold
    // every commit of the new primary: then only the sides that stream
    // again, so the promoted side takes writes at once and is synchronous
    // again as soon as the old side has rejoined.
    let streaming = |m: &String| {
        views
            .iter()
            .any(|v| v.member == *m && v.report.as_ref().is_some_and(|r| r.streaming()))
    };
    let others: Vec<String> = t
        .members
        .iter()
        .filter(|m| **m != state.primary)
        .filter(|m| !state.forced || streaming(m))
        .cloned()
        .collect();
    t.members
        .iter()
        .map(|m| {
            let side = if *m == state.primary && waiting {
                match &previous {
                    Some(p) => Side::Replica {
                        topology: topology.to_string(),
                        epoch: state.epoch,
                        source: p.clone(),
                        member: m.clone(),
                    },
                    None => Side::Unknown,
                }
            } else if *m == state.primary {
                Side::Primary {
                    topology: topology.to_string(),
                    epoch: state.epoch,
                    fence_after_secs: t.fence_after().as_secs().max(1),
                    synchronous_with: match t.synchronous {
                        true => others.clone(),
                        false => vec![],
                    },
                }
            } else {
                match &source {
                    Some(source) => Side::Replica {
                        topology: topology.to_string(),
                        epoch: state.epoch,
                        source: source.clone(),
                        member: m.clone(),
                    },
                    None => Side::Unknown,
                }
            };
            (m.clone(), side)
        })
        .collect()
}

/// Whether the primary side's primary reports itself promoted: then a
/// switchover's `previous_endpoint` is cleared for good (the engine writes
/// it), so no later silence can turn the new primary back into a replica.
pub fn promoted(state: &State, views: &[SideView]) -> bool {
    views
        .iter()
        .find(|v| v.member == state.primary)
        .and_then(|v| v.report.as_ref())
        .is_some_and(|r| r.role == "primary")
}

/// "HOST:PORT" (the port after the last colon).
pub fn parse_endpoint(s: &str) -> Option<Endpoint> {
    let (host, port) = s.rsplit_once(':')?;
    Some(Endpoint {
        host: host.to_string(),
        port: port.parse().ok()?,
    })
}

fn lsn(s: &Option<String>) -> Option<u64> {
    s.as_deref().and_then(parse_lsn)
}

/// The WAL a standby holds: the larger of what it received and what it
/// replayed (a WAL receiver that reconnects reports the segment start it
/// streams from until new WAL arrives, below what it already replayed).
pub fn has(r: &InstanceReport) -> Option<u64> {
    match (lsn(&r.received_lsn), lsn(&r.replayed_lsn)) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// The steps this round, in order (demotions before the promotion).
pub fn converge(state: &State, views: &[SideView]) -> Vec<Step> {
    let all_read = views.iter().all(|v| v.reachable && v.copy.is_some());
    let mut out = vec![];
    for v in views.iter().filter(|v| v.member != state.primary) {
        let (Some(pod), Some(r)) = (&v.primary_pod, &v.report) else {
            continue;
        };
        let (member, pod) = (v.member.clone(), pod.clone());
        if r.role == "primary" {
            out.push(Step::Demote {
                member,
                pod,
                rewind: state.forced,
            });
        } else if r.fenced && all_read {
            out.push(Step::Unfence {
                member,
                pod,
                replica: true,
            });
        }
    }
    // The primary side fenced itself (it lost the manager and every
    // replica side at once) and nobody was promoted: every copy says it is
    // still the primary side, so it may take writes again.
    if let Some(p) = views.iter().find(|v| v.member == state.primary)
        && let (Some(pod), Some(r)) = (&p.primary_pod, &p.report)
        && r.fenced
        && all_read
    {
        out.push(Step::Unfence {
            member: p.member.clone(),
            pod: pod.clone(),
            replica: false,
        });
    }
    if let Some(p) = views.iter().find(|v| v.member == state.primary)
        && let (Some(pod), Some(r)) = (&p.primary_pod, &p.report)
        && r.role == "replica"
        && (state.forced || handed_over(state, p, views))
    {
        out.push(Step::Promote {
            member: p.member.clone(),
            pod: pod.clone(),
        });
    }
    out
}

/// A switchover's promotion may happen: every other side answered, none
/// takes writes any more, and the new primary has received the WAL each
/// of them ended with (a demoted instance's replay position is the end of
/// its shutdown checkpoint).
fn handed_over(state: &State, new: &SideView, views: &[SideView]) -> bool {
    let Some(received) = new.report.as_ref().and_then(has) else {
        return false;
    };
    views
        .iter()
        .filter(|v| v.member != state.primary)
        .all(|v| match &v.report {
            Some(r) if r.role == "replica" => lsn(&r.replayed_lsn).is_some_and(|l| received >= l),
            _ => false,
        })
}

/// Replication lag of a replica side, in bytes: the primary side's current
/// position minus what the replica side has received.
pub fn lag_bytes(primary: &SideView, replica: &SideView) -> Option<u64> {
    let cur = lsn(&primary.report.as_ref()?.current_lsn)?;
    let got = has(replica.report.as_ref()?)?;
    Some(cur.saturating_sub(got))
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
