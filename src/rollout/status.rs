//! What a rollout reports: its status after each decision, and the dry run
//! of `pgfleet rollout plan`, with plain-text renderings for the CLI and
//! events. Kept apart from the decisions in `plan` so each file reads in one
//! sitting; `plan` re-exports everything public here.

use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::plan::{
    Control, ControlState, Entry, Gate, Halt, Member, OnFailure, Pgc, PgcRef, PgcState, Position,
    RolloutSpec, entries,
};
use super::preflight;

/// The rollout as a whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RolloutState {
    Running,
    /// Nothing started yet: the fleet-wide pre-flight of a rollout across a
    /// major waits for `waiting` clusters' results (`preflight`).
    PreFlight {
        waiting: usize,
    },
    /// The next stage needs an operator's approval.
    WaitingApproval {
        stage: String,
    },
    /// `stage` finished and soaks until `until` before the next one starts.
    Soaking {
        stage: String,
        until: SystemTime,
    },
    Paused {
        reason: String,
    },
    Aborted {
        reason: String,
    },
    RollingBack,
    /// Every stage complete, nothing deferred or in flight.
    Completed,
}

/// One stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StageState {
    /// Not reached yet.
    Pending,
    WaitingApproval,
    /// Complete; the next stage waits until `until`.
    Soaking {
        until: SystemTime,
    },
    Running,
    Complete,
}

/// Counts of one stage's PGCs after the decision is applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageStatus {
    pub name: String,
    pub state: StageState,
    pub total: usize,
    pub done: usize,
    pub in_flight: usize,
    pub failed: usize,
    pub pending: usize,
    /// On an unreachable member under `SkipAndRequeue`; started once it is back.
    pub deferred: usize,
    pub ineligible: usize,
    pub reverted: usize,
    pub failures: Vec<(PgcRef, String)>,
}

/// The rollout's status after the decision it came with is applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutStatus {
    pub state: RolloutState,
    pub stages: Vec<StageStatus>,
    pub done: usize,
    pub total: usize,
}

/// A PGC the dry run would update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedPgc {
    pub pgc: PgcRef,
    pub from_version: String,
    /// Across a major: `passed`, `FAILED: why`, or `not reported yet`.
    pub pre_flight: Option<String>,
}

/// One stage of the dry run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedStage {
    pub name: String,
    /// Member clusters with at least one selected PGC, sorted.
    pub members: Vec<String>,
    /// Those of `members` unreachable right now.
    pub unreachable: Vec<String>,
    /// The PGCs still to update, in start order.
    pub pgcs: Vec<PlannedPgc>,
    pub already_at_target: usize,
    pub ineligible: Vec<(PgcRef, String)>,
    /// `ceil(pgcs / limit)`.
    pub waves: usize,
    pub requires_approval: bool,
    pub soak: Duration,
    /// `waves × per_pgc + soak` (no soak when there is nothing to update).
    pub estimate: Duration,
}

/// `pgfleet rollout plan NAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DryRun {
    pub rollout: String,
    pub target_version: String,
    /// `inPlace` for a rollout across a major; `None` for a minor one.
    pub method: Option<String>,
    /// The downtime each updated PGC sees (`preflight::downtime_class`).
    pub downtime: String,
    pub stages: Vec<PlannedStage>,
    /// PGCs no stage selects.
    pub unselected: usize,
    pub estimate: Duration,
}

/// Inputs of the dry-run time estimate, computed by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    /// How long one PGC takes to update.
    pub per_pgc: Duration,
}

/// The dry run of `pgfleet rollout plan`: what `decide` would do, stage by
/// stage, if every PGC took `estimate.per_pgc` and nothing failed.
pub fn plan(spec: &RolloutSpec, members: &[Member], pgcs: &[Pgc], estimate: &Estimate) -> DryRun {
    let all = entries(spec, members, pgcs);
    let stages: Vec<PlannedStage> = spec
        .stages
        .iter()
        .enumerate()
        .map(|(i, stage)| {
            let in_stage: Vec<&Entry> = all.iter().filter(|e| e.stage == i).collect();
            let names = |f: fn(&Entry) -> bool| -> Vec<String> {
                let set: BTreeSet<&str> = in_stage
                    .iter()
                    .filter(|e| f(e))
                    .map(|e| e.r.member.as_str())
                    .collect();
                set.into_iter().map(str::to_owned).collect()
            };
            let mut planned = PlannedStage {
                name: stage.name.clone(),
                members: names(|_| true),
                unreachable: names(|e| !e.reachable),
                pgcs: Vec::new(),
                already_at_target: 0,
                ineligible: Vec::new(),
                waves: 0,
                requires_approval: stage.requires_approval,
                soak: stage.soak,
                estimate: Duration::ZERO,
            };
            for e in &in_stage {
                match &e.state {
                    PgcState::Ineligible { reason } => {
                        planned.ineligible.push((e.r.clone(), reason.clone()))
                    }
                    PgcState::Done { .. } => planned.already_at_target += 1,
                    PgcState::Pending | PgcState::InFlight { .. } => {
                        planned.pgcs.push(PlannedPgc {
                            pgc: e.r.clone(),
                            from_version: e
                                .pgc
                                .mark
                                .as_ref()
                                .filter(|_| e.marked)
                                .map_or(&e.pgc.spec_version, |m| &m.previous_version)
                                .clone(),
                            pre_flight: pre_flight_note(spec, e.pgc),
                        })
                    }
                    PgcState::Failed { .. } | PgcState::Reverted => {}
                }
            }
            // The same limit `decide` uses: over the stage's eligible PGCs.
            let limit = stage
                .max_concurrency
                .limit(in_stage.len() - planned.ineligible.len());
            planned.waves = if limit == 0 {
                0
            } else {
                planned.pgcs.len().div_ceil(limit)
            };
            // As in `decide`, a stage that changes nothing imposes no soak.
            let soak = if planned.waves == 0 {
                Duration::ZERO
            } else {
                stage.soak
            };
            let waves = u32::try_from(planned.waves).unwrap_or(u32::MAX);
            planned.estimate = estimate.per_pgc.saturating_mul(waves).saturating_add(soak);
            planned
        })
        .collect();
    let crossing = pgcs.iter().find(|p| preflight::crosses_major(spec, p));
    DryRun {
        rollout: spec.name.clone(),
        target_version: spec.target_version.clone(),
        method: spec.method.map(|m| m.as_str().to_owned()),
        downtime: match (crossing, pgcs.first()) {
            (Some(p), _) | (None, Some(p)) => preflight::downtime_class(spec, p).to_owned(),
            (None, None) => String::new(),
        },
        estimate: stages
            .iter()
            .fold(Duration::ZERO, |sum, s| sum.saturating_add(s.estimate)),
        stages,
        unselected: pgcs.len() - all.len(),
    }
}

/// What the plan shows of a PGC's pre-flight (only across a major).
fn pre_flight_note(spec: &RolloutSpec, pgc: &Pgc) -> Option<String> {
    if spec.method.is_none() || !preflight::crosses_major(spec, pgc) {
        return None;
    }
    Some(match preflight::result(spec, pgc) {
        Some(Ok(())) => "pre-flight passed".to_owned(),
        Some(Err(why)) => format!("pre-flight FAILED: {why}"),
        None => "pre-flight not reported yet".to_owned(),
    })
}

/// Builds the status from the entries as the decision left them.
pub(super) fn summarize(
    spec: &RolloutSpec,
    all: &[Entry],
    control: &Control,
    halt: Option<&Halt>,
    position: &Position,
) -> RolloutStatus {
    let (current, gate) = (position.current, position.gate);
    let complete: Vec<bool> = (0..spec.stages.len())
        .map(|i| all.iter().filter(|e| e.stage == i).all(Entry::settled))
        .collect();
    let soaking = match gate {
        Gate::Soak { stage, until } => Some((stage, until)),
        _ => None,
    };
    let stages: Vec<StageStatus> = spec
        .stages
        .iter()
        .enumerate()
        .map(|(i, stage)| {
            let state = match (complete[i], current) {
                (true, _) => match soaking {
                    Some((s, until)) if s == i => StageState::Soaking { until },
                    _ => StageState::Complete,
                },
                (false, Some(c)) if i == c => match gate {
                    Gate::Open => StageState::Running,
                    Gate::Approval => StageState::WaitingApproval,
                    Gate::Soak { .. } | Gate::PreFlight { .. } => StageState::Pending,
                },
                // Passed, with PGCs started late after their member came back.
                (false, Some(c)) if i < c => StageState::Running,
                (false, None) => StageState::Running,
                (false, Some(_)) => StageState::Pending,
            };
            stage_status(&stage.name, state, all.iter().filter(|e| e.stage == i))
        })
        .collect();
    let deferred: usize = stages.iter().map(|s| s.deferred).sum();
    let state = match (halt, control.state) {
        (Some(h), _) => match h.on_failure {
            OnFailure::Pause => RolloutState::Paused {
                reason: h.reason.clone(),
            },
            OnFailure::Abort => RolloutState::Aborted {
                reason: h.reason.clone(),
            },
            OnFailure::Rollback => RolloutState::RollingBack,
        },
        (None, ControlState::Paused) => RolloutState::Paused {
            reason: operator_reason(control),
        },
        (None, ControlState::Aborted) => RolloutState::Aborted {
            reason: operator_reason(control),
        },
        (None, ControlState::RollingBack) => RolloutState::RollingBack,
        (None, ControlState::Active) if complete.iter().all(|c| *c) && deferred == 0 => {
            RolloutState::Completed
        }
        (None, ControlState::Active) => match (gate, current) {
            (Gate::Soak { stage, until }, _) => RolloutState::Soaking {
                stage: spec.stages[stage].name.clone(),
                until,
            },
            (Gate::Approval, Some(c)) => RolloutState::WaitingApproval {
                stage: spec.stages[c].name.clone(),
            },
            (Gate::PreFlight { waiting }, _) => RolloutState::PreFlight { waiting },
            _ => RolloutState::Running,
        },
    };
    RolloutStatus {
        state,
        done: stages.iter().map(|s| s.done).sum(),
        total: stages.iter().map(|s| s.total).sum(),
        stages,
    }
}

fn operator_reason(control: &Control) -> String {
    control
        .reason
        .clone()
        .unwrap_or_else(|| "by an operator".to_owned())
}

fn stage_status<'e, 'a: 'e>(
    name: &str,
    state: StageState,
    entries: impl Iterator<Item = &'e Entry<'a>>,
) -> StageStatus {
    let mut s = StageStatus {
        name: name.to_owned(),
        state,
        total: 0,
        done: 0,
        in_flight: 0,
        failed: 0,
        pending: 0,
        deferred: 0,
        ineligible: 0,
        reverted: 0,
        failures: Vec::new(),
    };
    for e in entries {
        s.total += 1;
        match &e.state {
            _ if e.deferred => s.deferred += 1,
            PgcState::Pending => s.pending += 1,
            PgcState::InFlight { .. } => s.in_flight += 1,
            PgcState::Done { .. } => s.done += 1,
            PgcState::Failed { reason } => {
                s.failed += 1;
                s.failures.push((e.r.clone(), reason.clone()));
            }
            PgcState::Reverted => s.reverted += 1,
            PgcState::Ineligible { .. } => s.ineligible += 1,
        }
    }
    s
}

impl fmt::Display for RolloutStatus {
    /// One line, e.g. `running 4/13 done · stage canary 3/3 done · stage
    /// wave-1 running 1/10 (2 in flight)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            RolloutState::Running => write!(f, "running")?,
            RolloutState::PreFlight { waiting } => {
                write!(f, "pre-flight: waiting for {waiting} cluster(s)")?
            }
            RolloutState::WaitingApproval { stage } => {
                write!(f, "waiting for approval of {stage}")?
            }
            RolloutState::Soaking { stage, until } => {
                write!(f, "soaking after {stage} until {}", format_utc(*until))?
            }
            RolloutState::Paused { reason } => write!(f, "paused ({reason})")?,
            RolloutState::Aborted { reason } => write!(f, "aborted ({reason})")?,
            RolloutState::RollingBack => write!(f, "rolling back")?,
            RolloutState::Completed => write!(f, "completed")?,
        }
        write!(f, " {}/{} done", self.done, self.total)?;
        for stage in &self.stages {
            write!(f, " · {stage}")?;
        }
        Ok(())
    }
}

impl fmt::Display for StageStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, done, total) = (&self.name, self.done, self.total);
        match &self.state {
            StageState::Complete => write!(f, "stage {name} {done}/{total} done")?,
            StageState::Soaking { until } => {
                write!(
                    f,
                    "stage {name} {done}/{total} done, soaking until {}",
                    format_utc(*until)
                )?;
            }
            StageState::Running => write!(f, "stage {name} running {done}/{total}")?,
            StageState::WaitingApproval => {
                write!(f, "stage {name} waiting for approval {done}/{total}")?
            }
            StageState::Pending => write!(f, "stage {name} pending {done}/{total}")?,
        }
        let running = self.state == StageState::Running;
        let notes: Vec<String> = [
            (self.in_flight, "in flight", running),
            (self.failed, "failed", false),
            (self.deferred, "deferred", false),
            (self.reverted, "reverted", false),
            (self.ineligible, "ineligible", false),
        ]
        .into_iter()
        .filter(|(n, _, always)| *n > 0 || *always)
        .map(|(n, what, _)| format!("{n} {what}"))
        .collect();
        if !notes.is_empty() {
            write!(f, " ({})", notes.join(", "))?;
        }
        Ok(())
    }
}

impl fmt::Display for DryRun {
    /// A table of the stages, then each stage's PGCs in start order.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let to_update: usize = self.stages.iter().map(|s| s.pgcs.len()).sum();
        writeln!(
            f,
            "rollout {} to {}: {} stage(s), {to_update} PGC(s) to update, {} not selected, estimate {}",
            self.rollout,
            self.target_version,
            self.stages.len(),
            self.unselected,
            format_duration(self.estimate),
        )?;
        if let Some(m) = &self.method {
            writeln!(f, "method {m}; downtime per cluster: {}", self.downtime)?;
        }
        let w = self
            .stages
            .iter()
            .map(|s| s.name.len())
            .max()
            .unwrap_or(0)
            .max("STAGE".len());
        writeln!(
            f,
            "{:<w$}  APPROVAL  MEMBERS  PGCS  WAVES  SOAK     ESTIMATE",
            "STAGE"
        )?;
        for s in &self.stages {
            writeln!(
                f,
                "{:<w$}  {:<8}  {:<7}  {:<4}  {:<5}  {:<7}  {}",
                s.name,
                if s.requires_approval { "yes" } else { "no" },
                s.members.len(),
                s.pgcs.len(),
                s.waves,
                format_duration(s.soak),
                format_duration(s.estimate),
            )?;
        }
        for s in &self.stages {
            writeln!(f)?;
            writeln!(f, "stage {} (members: {}):", s.name, s.members.join(", "))?;
            for p in &s.pgcs {
                write!(
                    f,
                    "  {}  {} → {}",
                    p.pgc, p.from_version, self.target_version
                )?;
                match &p.pre_flight {
                    Some(note) => writeln!(f, "  {note}")?,
                    None => writeln!(f)?,
                }
            }
            if s.already_at_target > 0 {
                writeln!(
                    f,
                    "  {} already at {}",
                    s.already_at_target, self.target_version
                )?;
            }
            for (pgc, reason) in &s.ineligible {
                writeln!(f, "  {pgc}  ineligible: {reason}")?;
            }
            if !s.unreachable.is_empty() {
                writeln!(f, "  unreachable now: {}", s.unreachable.join(", "))?;
            }
        }
        Ok(())
    }
}

/// `"1h 5m"`, `"45s"`: the two largest non-zero units, rounded down.
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let parts: Vec<String> = [
        (secs / 86_400, "d"),
        (secs / 3600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ]
    .into_iter()
    .skip_while(|(n, _)| *n == 0)
    .take(2)
    .filter(|(n, _)| *n > 0)
    .map(|(n, unit)| format!("{n}{unit}"))
    .collect();
    if parts.is_empty() {
        "0s".to_owned()
    } else {
        parts.join(" ")
    }
}

/// RFC 3339 in UTC to the second, without a date library.
fn format_utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days, for days since 1970-01-01 (no negatives).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let (h, m, s) = (rest / 3600, rest / 60 % 60, rest % 60);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
