//! Every rollout decision, as pure functions over what the engine observed.
//!
//! The engine lists the live PostgresClusters (PGCs) and member clusters,
//! calls [`decide`], applies the [`Decision`] and repeats. Nothing here
//! remembers anything between calls: progress is read back from the marks
//! (annotations) the rollout wrote on each PGC, so a restarted engine makes
//! the same decision its predecessor would have. Time is an argument, so
//! tests drive a fake clock, and every list comes out in a fixed order.

use std::collections::BTreeMap;
use std::time::SystemTime;

pub use super::status::{
    DryRun, Estimate, PlannedPgc, PlannedStage, RolloutState, RolloutStatus, StageState,
    StageStatus, format_duration, plan,
};

/// `on_failure` and `unreachable` are the config's own choices: what
/// happens once failures exceed `max_failures`, and what an unreachable
/// member cluster means.
pub use crate::config::choices::{OnFailure, UnreachablePolicy as Unreachable};

/// What the engine observes and decides, as data (plan_model.rs).
pub use super::plan_model::*;

/// The state of one PGC in `spec`'s rollout.
///
/// Time plays no part: deadlines are decisions ([`decide`] fails the PGC),
/// so the state can be shown without a clock.
pub fn pgc_state(spec: &RolloutSpec, pgc: &Pgc) -> PgcState {
    let mark = own_mark(spec, pgc);
    if let Some(m) = mark {
        if m.reverted {
            return PgcState::Reverted;
        }
        if let Some(reason) = &m.failed {
            return PgcState::Failed {
                reason: reason.clone(),
            };
        }
    }
    let target = spec.target_version.as_str();
    if pgc.spec_version == target && pgc.current_version.as_deref() == Some(target) && pgc.healthy {
        return PgcState::Done {
            finished: mark.and_then(|m| m.finished),
        };
    }
    // A recorded finish stays: later health changes are the PGC's own
    // business, and re-opening it would move the next stage's soak.
    if let Some(finished) = mark.and_then(|m| m.finished) {
        return PgcState::Done {
            finished: Some(finished),
        };
    }
    let (from, to) = (major(&pgc.spec_version), major(target));
    if from != to && spec.role_set.is_none() && spec.method.is_none() {
        return PgcState::Ineligible {
            reason: format!(
                "major upgrade {from}→{to} needs pg_upgrade: set method = \"inPlace\" on the rollout"
            ),
        };
    }
    match mark {
        Some(m) => PgcState::InFlight { started: m.started },
        None => PgcState::Pending,
    }
}

use super::preflight::major;

fn own_mark<'a>(spec: &RolloutSpec, pgc: &'a Pgc) -> Option<&'a Mark> {
    pgc.mark.as_ref().filter(|m| m.rollout == spec.name)
}

/// A selected PGC with its member's condition, and its state as the
/// decision being built changes it.
pub(super) struct Entry<'a> {
    pub(super) pgc: &'a Pgc,
    pub(super) r: PgcRef,
    pub(super) stage: usize,
    /// Carries a mark of this rollout.
    pub(super) marked: bool,
    pub(super) state: PgcState,
    pub(super) reachable: bool,
    pub(super) in_window: bool,
    /// Pending or in flight on an unreachable member under `SkipAndRequeue`:
    /// neither started nor failed, and it does not hold up its stage.
    pub(super) deferred: bool,
}

impl Entry<'_> {
    fn fail(&mut self, reason: String, fail: &mut Vec<(PgcRef, String)>) {
        fail.push((self.r.clone(), reason.clone()));
        self.state = PgcState::Failed { reason };
    }

    fn in_flight(&self) -> bool {
        matches!(self.state, PgcState::InFlight { .. })
    }

    /// Nothing left to wait for before the next stage.
    pub(super) fn settled(&self) -> bool {
        self.deferred
            || matches!(
                self.state,
                PgcState::Done { .. }
                    | PgcState::Failed { .. }
                    | PgcState::Reverted
                    | PgcState::Ineligible { .. }
            )
    }
}

/// Selected PGCs in start order. A member the engine did not report counts
/// as unreachable: nothing can be done there.
pub(super) fn entries<'a>(
    spec: &RolloutSpec,
    members: &[Member],
    pgcs: &'a [Pgc],
) -> Vec<Entry<'a>> {
    let by_name: BTreeMap<&str, &Member> = members.iter().map(|m| (m.name.as_str(), m)).collect();
    let skip = spec.unreachable == Unreachable::SkipAndRequeue;
    let mut all: Vec<Entry<'a>> = pgcs
        .iter()
        .filter_map(|pgc| {
            let stage = pgc.stage.filter(|&s| s < spec.stages.len())?;
            let member = by_name.get(pgc.member.as_str());
            let state = pgc_state(spec, pgc);
            let reachable = member.is_some_and(|m| m.reachable);
            let open = matches!(state, PgcState::Pending | PgcState::InFlight { .. });
            Some(Entry {
                pgc,
                r: PgcRef::of(pgc),
                stage,
                marked: own_mark(spec, pgc).is_some(),
                state,
                reachable,
                in_window: member.is_some_and(|m| m.in_window),
                deferred: open && !reachable && skip,
            })
        })
        .collect();
    all.sort_by(|a, b| a.r.cmp(&b.r));
    all
}

/// Whether the current stage may start PGCs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gate {
    Open,
    /// Earlier stage `stage` soaks until `until`.
    Soak {
        stage: usize,
        until: SystemTime,
    },
    Approval,
    /// The fleet-wide pre-flight waits for `waiting` results.
    PreFlight {
        waiting: usize,
    },
}

/// Where the rollout stands among its stages.
pub(super) struct Position {
    /// The first stage neither complete nor overtaken; `None` when all are.
    pub(super) current: Option<usize>,
    /// `Open` when there is no current stage.
    pub(super) gate: Gate,
}

impl Position {
    /// Stages before the current one take late (requeued) starts; the
    /// current one only once its gate is open.
    fn startable(&self, stage: usize) -> bool {
        self.current
            .is_none_or(|c| stage < c || (stage == c && self.gate == Gate::Open))
    }
}

/// Decide what the engine does now; see the module docs and [`Decision`].
pub fn decide(
    spec: &RolloutSpec,
    members: &[Member],
    pgcs: &[Pgc],
    control: &Control,
    now: SystemTime,
) -> Decision {
    let mut all = entries(spec, members, pgcs);
    let active = control.state == ControlState::Active;
    // Under rollback, PGCs that just arrived are reverted instead.
    let mut finish = Vec::new();
    if control.state != ControlState::RollingBack {
        for e in all
            .iter_mut()
            .filter(|e| e.marked && e.state == PgcState::Done { finished: None })
        {
            e.state = PgcState::Done {
                finished: Some(now),
            };
            finish.push((e.r.clone(), now));
        }
    }
    // After an abort or rollback everything in flight is reverted anyway.
    let judging = matches!(control.state, ControlState::Active | ControlState::Paused);
    let mut fail = Vec::new();
    for e in all
        .iter_mut()
        .filter(|e| judging && e.in_flight() && !e.deferred)
    {
        if let Some(reason) = in_flight_failure(spec, e, now) {
            e.fail(reason, &mut fail);
        }
    }
    let position = locate(spec, &all, control, now);
    if active && spec.unreachable == Unreachable::CountAsFailure {
        let lost =
            |e: &Entry| e.state == PgcState::Pending && !e.reachable && position.startable(e.stage);
        for e in all.iter_mut().filter(|e| lost(e)) {
            e.fail(
                format!("member cluster {} unreachable", e.r.member),
                &mut fail,
            );
        }
    }
    if active {
        let due = |e: &Entry| e.reachable && position.startable(e.stage);
        for e in all.iter_mut().filter(|e| due(e)) {
            if let Some(why) = super::preflight::failure(spec, e) {
                e.fail(why, &mut fail);
            }
        }
    }
    fail.sort();

    let failed: Vec<&Entry> = all
        .iter()
        .filter(|e| matches!(e.state, PgcState::Failed { .. }))
        .collect();
    let halt = (active && failed.len() > spec.max_failures as usize).then(|| Halt {
        on_failure: spec.on_failure,
        reason: budget_reason(spec, &failed),
    });
    let revert = revert(spec, &mut all, control, halt.as_ref());
    finish.retain(|(r, _)| !revert.contains(r));
    let start = match (active, &halt) {
        (true, None) => start(spec, &mut all, &position, now),
        _ => Vec::new(),
    };

    let soak_end = match position.gate {
        Gate::Soak { until, .. } if active && halt.is_none() => Some(until),
        _ => None,
    };
    let deadlines = all
        .iter()
        .filter(|e| judging && e.reachable)
        .filter_map(|e| match e.state {
            PgcState::InFlight { started } => Some(started + spec.progress_deadline),
            _ => None,
        });
    let wake_after = soak_end
        .into_iter()
        .chain(deadlines)
        .filter_map(|at| at.duration_since(now).ok().filter(|d| !d.is_zero()))
        .min();
    let status = super::status::summarize(spec, &all, control, halt.as_ref(), &position);
    Decision {
        start,
        finish,
        fail,
        revert,
        pre_flight: super::preflight::requests(spec, &all),
        halt,
        status,
        wake_after,
    }
}

/// Unreachable (under `CountAsFailure`), a failure the PGC reported, or the
/// progress deadline passed.
fn in_flight_failure(spec: &RolloutSpec, e: &Entry, now: SystemTime) -> Option<String> {
    let PgcState::InFlight { started } = e.state else {
        return None;
    };
    if !e.reachable {
        return Some(format!("member cluster {} unreachable", e.r.member));
    }
    if let Some(reason) = &e.pgc.update_failure {
        return Some(reason.clone());
    }
    // A start in the future (clock skew between engines) counts as just now.
    let elapsed = now.duration_since(started).unwrap_or_default();
    (elapsed >= spec.progress_deadline).then(|| {
        format!(
            "did not reach {} within {} (phase {}/currentVersion {})",
            spec.target_version,
            format_duration(spec.progress_deadline),
            if e.pgc.healthy {
                "Healthy"
            } else {
                "not Healthy"
            },
            e.pgc.current_version.as_deref().unwrap_or("unknown"),
        )
    })
}

fn budget_reason(spec: &RolloutSpec, failed: &[&Entry]) -> String {
    let list: Vec<String> = failed
        .iter()
        .filter_map(|e| match &e.state {
            PgcState::Failed { reason } => Some(format!(
                "{}/{} on {}: {reason}",
                e.r.namespace, e.r.name, e.r.member
            )),
            _ => None,
        })
        .collect();
    format!(
        "{} failed (max_failures {}): {}",
        failed.len(),
        spec.max_failures,
        list.join("; ")
    )
}

/// The first stage neither complete nor overtaken, and whether it may start.
///
/// Stages before the furthest one entered (holding a mark) were passed, even
/// if a deferred PGC has since come back there: it is started late without
/// holding anything up. For the same reason an entered stage is not gated
/// again, or a late finish in an earlier stage would stall it halfway.
fn locate(spec: &RolloutSpec, all: &[Entry], control: &Control, now: SystemTime) -> Position {
    let frontier = all.iter().filter(|e| e.marked).map(|e| e.stage).max();
    let complete = |i: usize| all.iter().filter(|e| e.stage == i).all(Entry::settled);
    let current = (0..spec.stages.len()).find(|&i| !complete(i) && frontier.is_none_or(|f| i >= f));
    let waiting = super::preflight::waiting(spec, all);
    let gate = match current {
        Some(_) if frontier.is_none() && waiting > 0 => Gate::PreFlight { waiting },
        Some(c) if frontier.is_none_or(|f| f < c) => entry_gate(spec, all, control, c, now),
        _ => Gate::Open,
    };
    Position { current, gate }
}

/// The gate of stage `c` before it starts. Every earlier stage's soak counts
/// (normally only the previous one's is still running), so an empty or
/// already-current stage in between does not cut a canary's soak short; a
/// stage that finished nothing imposes none.
fn entry_gate(
    spec: &RolloutSpec,
    all: &[Entry],
    control: &Control,
    c: usize,
    now: SystemTime,
) -> Gate {
    let soak = all
        .iter()
        .filter(|e| e.stage < c)
        .filter_map(|e| match e.state {
            PgcState::Done { finished: Some(at) } => {
                Some((at + spec.stages[e.stage].soak, e.stage))
            }
            _ => None,
        })
        .max();
    if let Some((until, stage)) = soak.filter(|(until, _)| *until > now) {
        return Gate::Soak { stage, until };
    }
    let stage = &spec.stages[c];
    if stage.requires_approval && !control.approved.contains(&stage.name) {
        return Gate::Approval;
    }
    Gate::Open
}

/// What an abort (in-flight and failed PGCs) or rollback (every PGC this rollout moved
/// to the target) sends back, by operator command or by this decision's halt.
fn revert(
    spec: &RolloutSpec,
    all: &mut [Entry],
    control: &Control,
    halt: Option<&Halt>,
) -> Vec<PgcRef> {
    let undo = match (control.state, halt) {
        (ControlState::Aborted, _) => OnFailure::Abort,
        (ControlState::RollingBack, _) => OnFailure::Rollback,
        (_, Some(h)) => h.on_failure,
        _ => return Vec::new(),
    };
    let mut revert = Vec::new();
    for e in all.iter_mut() {
        let back = match undo {
            OnFailure::Pause => false,
            // In flight or failed on the way: back to what worked. Finished
            // ones stay updated.
            OnFailure::Abort => {
                (e.in_flight() || matches!(e.state, PgcState::Failed { .. }))
                    && e.pgc.spec_version == spec.target_version
            }
            OnFailure::Rollback => {
                e.marked
                    && e.state != PgcState::Reverted
                    && e.pgc.spec_version == spec.target_version
            }
        } && !super::preflight::no_way_back(spec, e.pgc);
        if back {
            e.state = PgcState::Reverted;
            e.deferred = false;
            revert.push(e.r.clone());
        }
    }
    revert
}

/// Fills each startable stage up to its own limit, in start order. PGCs
/// outside their member's maintenance window wait without blocking others.
fn start(
    spec: &RolloutSpec,
    all: &mut [Entry],
    position: &Position,
    now: SystemTime,
) -> Vec<PgcRef> {
    let mut start = Vec::new();
    for (i, stage) in spec
        .stages
        .iter()
        .enumerate()
        .filter(|(i, _)| position.startable(*i))
    {
        let in_stage = || all.iter().filter(move |e| e.stage == i);
        let eligible = in_stage()
            .filter(|e| !matches!(e.state, PgcState::Ineligible { .. }))
            .count();
        let limit = stage.max_concurrency.limit(eligible);
        let mut in_flight = in_stage().filter(|e| e.in_flight()).count();
        for e in all.iter_mut().filter(|e| e.stage == i) {
            if in_flight >= limit {
                break;
            }
            if e.state == PgcState::Pending && e.reachable && e.in_window {
                e.state = PgcState::InFlight { started: now };
                start.push(e.r.clone());
                in_flight += 1;
            }
        }
    }
    start
}

#[cfg(test)]
#[path = "plan_tests.rs"]
pub(super) mod tests;
