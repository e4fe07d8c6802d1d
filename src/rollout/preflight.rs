//! Rollouts whose target crosses a major version (`method = "inPlace"`):
//! which PGCs take the pre-flight, what their results say, and whether the
//! fleet-wide pre-flight still holds the first stage back.
//!
//! Why a fleet-wide pre-flight: a cluster that cannot be upgraded (an
//! extension the new version lacks, too little space) should be known before
//! the canary starts, not hours later in the last stage. The engine asks
//! every such PGC for a check (the annotation of
//! `controller::major_upgrade::check`) and starts nothing until each
//! reachable one has answered; a failed check fails the PGC when its stage
//! comes (it counts against `max_failures` there, as any failure would),
//! and its `spec.version` is never touched.

use super::plan::{Entry, Pgc, PgcRef, PgcState, RolloutSpec};
use crate::config::choices::MajorMethod;

/// A pre-flight result as observed on a PGC (`status.preFlight`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreFlight {
    pub version: String,
    /// The running version it was checked from.
    pub from_version: String,
    /// `None` when it passed.
    pub failure: Option<String>,
}

pub(super) fn major(version: &str) -> &str {
    version.split('.').next().unwrap_or(version).trim()
}

/// The PGC's `spec.version` is of another major than the target.
pub fn crosses_major(spec: &RolloutSpec, pgc: &Pgc) -> bool {
    major(&pgc.spec_version) != major(&spec.target_version)
}

/// The method the start patch writes to `spec.majorUpgrade`, if any.
pub fn method_for(spec: &RolloutSpec, pgc: &Pgc) -> Option<MajorMethod> {
    spec.method.filter(|_| crosses_major(spec, pgc))
}

/// The PGC's pre-flight result for this rollout's target, from the version
/// it runs now: `Some(Ok)` passed, `Some(Err(why))` failed, `None` not
/// (yet) reported.
pub fn result(spec: &RolloutSpec, pgc: &Pgc) -> Option<Result<(), String>> {
    let p = pgc.pre_flight.as_ref()?;
    let current = pgc.current_version.as_deref()?;
    if p.version != spec.target_version || p.from_version != current {
        return None;
    }
    Some(match &p.failure {
        None => Ok(()),
        Some(why) => Err(why.clone()),
    })
}

/// Takes part in the fleet-wide pre-flight: a major crossing, not started.
fn checked(spec: &RolloutSpec, e: &Entry) -> bool {
    spec.method.is_some() && crosses_major(spec, e.pgc) && e.state == PgcState::Pending
}

/// PGCs the engine asks for a check (their annotation names another
/// version, or none), on reachable members.
pub(super) fn requests(spec: &RolloutSpec, all: &[Entry]) -> Vec<PgcRef> {
    all.iter()
        .filter(|e| checked(spec, e) && e.reachable && !e.marked)
        .filter(|e| e.pgc.pre_flight_requested.as_deref() != Some(spec.target_version.as_str()))
        .map(|e| e.r.clone())
        .collect()
}

/// Reachable PGCs whose result the fleet-wide pre-flight still waits for.
pub(super) fn waiting(spec: &RolloutSpec, all: &[Entry]) -> usize {
    all.iter()
        .filter(|e| checked(spec, e) && e.reachable && result(spec, e.pgc).is_none())
        .count()
}

/// Why a PGC whose stage has come fails instead of starting.
pub(super) fn failure(spec: &RolloutSpec, e: &Entry) -> Option<String> {
    if !checked(spec, e) {
        return None;
    }
    match result(spec, e.pgc)? {
        Ok(()) => None,
        Err(why) => Some(format!("pre-flight for {}: {why}", spec.target_version)),
    }
}

/// A PGC this rollout started across a major is not set back by an abort
/// or rollback unless its upgrade failed (then it runs the old version and
/// the controller drops the record): once the instances stopped, the
/// upgrade finishes, and going back a major is a restore
/// (docs/major-upgrades.md).
pub(super) fn no_way_back(spec: &RolloutSpec, pgc: &Pgc) -> bool {
    let crossed = pgc
        .mark
        .as_ref()
        .is_some_and(|m| major(&m.previous_version) != major(&spec.target_version));
    crossed && pgc.update_failure.is_none()
}

/// What the plan says about downtime for a PGC of this rollout.
pub fn downtime_class(spec: &RolloutSpec, pgc: &Pgc) -> &'static str {
    match method_for(spec, pgc) {
        Some(MajorMethod::InPlace) => {
            "offline: stop → pg_upgrade --link → start (seconds; grows with the catalog, not the data)"
        }
        Some(MajorMethod::BlueGreen) => {
            "online: a new instance set kept in sync by logical replication, then a switch through the pooler (writes held about a second)"
        }
        None => "rolling: one switchover (about a second of refused writes)",
    }
}

#[cfg(test)]
#[path = "preflight_tests.rs"]
mod tests;
