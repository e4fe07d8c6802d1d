//! Fixtures and a tiny engine simulator; `status_tests` reuses the fixtures.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::config::values::Concurrency;

pub(crate) const TARGET: &str = "15.20";
pub(crate) const MIN: Duration = Duration::from_secs(60);

pub(crate) fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

pub(crate) fn stage(name: &str, n: Concurrency, soak: Duration, approval: bool) -> StageSpec {
    let (name, requires_approval) = (name.to_owned(), approval);
    StageSpec {
        name,
        max_concurrency: n,
        soak,
        requires_approval,
    }
}

pub(crate) fn spec(stages: Vec<StageSpec>) -> RolloutSpec {
    RolloutSpec {
        name: "minor-15-20".to_owned(),
        target_version: TARGET.to_owned(),
        role_set: None,
        method: None,
        stages,
        max_failures: 0,
        progress_deadline: 30 * MIN,
        on_failure: OnFailure::Pause,
        unreachable: Unreachable::CountAsFailure,
    }
}

/// Canary (1 at a time, 10m soak) then a wave of up to 2.
pub(crate) fn two_stages() -> RolloutSpec {
    spec(vec![
        stage("canary", Concurrency::Count(1), 10 * MIN, false),
        stage("wave", Concurrency::Count(2), Duration::ZERO, false),
    ])
}

/// A healthy PGC on 15.18 in namespace `db`.
pub(crate) fn pgc(member: &str, name: &str, stage: usize) -> Pgc {
    Pgc {
        member: member.to_owned(),
        namespace: "db".to_owned(),
        name: name.to_owned(),
        stage: Some(stage),
        spec_version: "15.18".to_owned(),
        current_version: Some("15.18".to_owned()),
        healthy: true,
        update_failure: None,
        instances: 2,
        mark: None,
        pre_flight_requested: None,
        pre_flight: None,
    }
}

pub(crate) fn member(name: &str) -> Member {
    Member {
        name: name.to_owned(),
        reachable: true,
        in_window: true,
    }
}

fn mark(started: SystemTime) -> Mark {
    Mark {
        rollout: "minor-15-20".to_owned(),
        previous_version: "15.18".to_owned(),
        started,
        finished: None,
        failed: None,
        reverted: false,
    }
}

/// Started by the rollout, still updating.
pub(crate) fn in_flight(mut p: Pgc, started: SystemTime) -> Pgc {
    p.spec_version = TARGET.to_owned();
    p.healthy = false;
    p.mark = Some(mark(started));
    p
}

/// Now current and healthy at the target.
pub(crate) fn arrived(mut p: Pgc) -> Pgc {
    p.spec_version = TARGET.to_owned();
    p.current_version = Some(TARGET.to_owned());
    p.healthy = true;
    p
}

/// Started at t0 and finished `at` by the rollout.
pub(crate) fn finished(p: Pgc, at: SystemTime) -> Pgc {
    let mut p = arrived(in_flight(p, t0()));
    p.mark = Some(Mark {
        finished: Some(at),
        ..mark(t0())
    });
    p
}

/// `decide` with members m1 and m2 reachable and in their windows.
pub(crate) fn run(s: &RolloutSpec, pgcs: &[Pgc], ctl: &Control, now: SystemTime) -> Decision {
    decide(s, &[member("m1"), member("m2")], pgcs, ctl, now)
}

fn active() -> Control {
    Control::default()
}

fn control(state: ControlState) -> Control {
    Control {
        state,
        ..Control::default()
    }
}

fn names(refs: &[PgcRef]) -> Vec<&str> {
    refs.iter().map(|r| r.name.as_str()).collect()
}

/// Applies decisions like the engine and updates PGCs like their operators:
/// an updated PGC on a reachable member arrives after three ticks.
struct Sim {
    spec: RolloutSpec,
    members: Vec<Member>,
    pgcs: Vec<Pgc>,
    control: Control,
    now: SystemTime,
    progress: BTreeMap<PgcRef, u32>,
    starts: BTreeMap<PgcRef, u32>,
}

impl Sim {
    fn new(spec: RolloutSpec, members: Vec<Member>, pgcs: Vec<Pgc>) -> Self {
        let (control, now) = (Control::default(), t0());
        let (progress, starts) = (BTreeMap::new(), BTreeMap::new());
        Self {
            spec,
            members,
            pgcs,
            control,
            now,
            progress,
            starts,
        }
    }

    fn decide(&self) -> Decision {
        decide(
            &self.spec,
            &self.members,
            &self.pgcs,
            &self.control,
            self.now,
        )
    }

    fn find(&mut self, r: &PgcRef) -> &mut Pgc {
        self.pgcs.iter_mut().find(|p| PgcRef::of(p) == *r).unwrap()
    }

    fn apply(&mut self, d: &Decision) {
        let now = self.now;
        for r in &d.start {
            *self.starts.entry(r.clone()).or_default() += 1;
            let p = self.find(r);
            let previous_version = p.spec_version.clone();
            p.mark = Some(Mark {
                previous_version,
                ..mark(now)
            });
            p.spec_version = TARGET.to_owned();
            p.healthy = false;
        }
        for (r, at) in &d.finish {
            self.find(r).mark.as_mut().unwrap().finished = Some(*at);
        }
        for (r, why) in &d.fail {
            self.find(r).mark.as_mut().unwrap().failed = Some(why.clone());
        }
        for r in &d.revert {
            let p = self.find(r);
            let m = p.mark.as_mut().unwrap();
            m.reverted = true;
            p.spec_version = m.previous_version.clone();
        }
        if let Some(h) = &d.halt {
            self.control.state = match h.on_failure {
                OnFailure::Pause => ControlState::Paused,
                OnFailure::Abort => ControlState::Aborted,
                OnFailure::Rollback => ControlState::RollingBack,
            };
            self.control.reason = Some(h.reason.clone());
        }
    }

    fn step(&mut self) -> Decision {
        let d = self.decide();
        self.apply(&d);
        for p in &mut self.pgcs {
            let up = self
                .members
                .iter()
                .any(|m| m.name == p.member && m.reachable);
            if up && p.current_version.as_deref() != Some(&p.spec_version) {
                let ticks = self.progress.entry(PgcRef::of(p)).or_default();
                *ticks += 1;
                if *ticks >= 3 {
                    (p.current_version, p.healthy) = (Some(p.spec_version.clone()), true);
                }
            }
        }
        self.now += MIN;
        d
    }

    /// PGCs of `stage` the rollout started and has not seen finish.
    fn in_flight(&self, stage: usize) -> usize {
        let open = |p: &&Pgc| p.mark.as_ref().is_some_and(|m| m.finished.is_none());
        self.pgcs
            .iter()
            .filter(|p| p.stage == Some(stage))
            .filter(open)
            .count()
    }

    /// Steps until Completed, calling `check` after each applied decision.
    fn run(&mut self, max_ticks: usize, mut check: impl FnMut(&Sim, &Decision)) {
        for _ in 0..max_ticks {
            let d = self.step();
            check(self, &d);
            if d.status.state == RolloutState::Completed {
                return;
            }
        }
        panic!(
            "not completed after {max_ticks} ticks: {}",
            self.decide().status
        );
    }
}

#[test]
fn canary_stage_goes_first() {
    let pgcs = vec![pgc("m1", "c1", 0), pgc("m2", "w1", 1), pgc("m2", "w2", 1)];
    let mut sim = Sim::new(two_stages(), vec![member("m1"), member("m2")], pgcs);
    assert_eq!(names(&sim.decide().start), ["c1"]);
    sim.run(100, |sim, d| {
        let canary = pgc_state(&sim.spec, &sim.pgcs[0]);
        if !matches!(canary, PgcState::Done { finished: Some(_) }) {
            assert!(d.start.iter().all(|r| r.name == "c1"), "{:?}", d.start);
        }
    });
    assert!(sim.starts.values().all(|n| *n == 1));
}

#[test]
fn concurrency_count_and_percent_never_exceeded() {
    let spec = spec(vec![
        stage("count", Concurrency::Count(2), Duration::ZERO, false),
        stage("percent", Concurrency::Percent(30), Duration::ZERO, false),
    ]);
    let mut pgcs: Vec<Pgc> = (0..5).map(|i| pgc("m1", &format!("a{i}"), 0)).collect();
    pgcs.extend((0..10).map(|i| pgc(&format!("m{}", i % 3), &format!("b{i}"), 1)));
    let members = (0..3).map(|i| member(&format!("m{i}"))).collect();
    let mut sim = Sim::new(spec, members, pgcs);
    let mut peak = [0, 0];
    sim.run(200, |sim, _| {
        for (stage, limit) in [(0, 2), (1, 3)] {
            let n = sim.in_flight(stage);
            assert!(n <= limit, "stage {stage}: {n} in flight > {limit}");
            peak[stage] = peak[stage].max(n);
        }
    });
    assert_eq!(peak, [2, 3], "the limits are also reached");
    assert_eq!(sim.starts.len(), 15);
    assert!(sim.starts.values().all(|n| *n == 1));
}

#[test]
fn soak_delays_next_stage_and_sets_wake_after() {
    let done_at = t0() + 5 * MIN;
    let pgcs = [finished(pgc("m1", "c1", 0), done_at), pgc("m2", "w1", 1)];
    let d = run(&two_stages(), &pgcs, &active(), done_at + 4 * MIN);
    assert!(d.start.is_empty());
    assert_eq!(d.wake_after, Some(6 * MIN));
    let until = done_at + 10 * MIN;
    let stage = "canary".to_owned();
    assert_eq!(d.status.state, RolloutState::Soaking { stage, until });
    assert_eq!(d.status.stages[0].state, StageState::Soaking { until });
    let d = run(&two_stages(), &pgcs, &active(), until);
    assert_eq!(names(&d.start), ["w1"]);
    assert_eq!(d.status.state, RolloutState::Running);
}

#[test]
fn finish_is_recorded_now_and_soak_counts_from_it() {
    let pgcs = [
        arrived(in_flight(pgc("m1", "c1", 0), t0())),
        pgc("m1", "w1", 1),
    ];
    assert_eq!(
        pgc_state(&two_stages(), &pgcs[0]),
        PgcState::Done { finished: None }
    );
    let now = t0() + 7 * MIN;
    let d = run(&two_stages(), &pgcs, &active(), now);
    assert_eq!(d.finish, [(PgcRef::of(&pgcs[0]), now)]);
    assert!(d.start.is_empty());
    assert_eq!(d.wake_after, Some(10 * MIN));
}

#[test]
fn approval_gate() {
    let mut s = two_stages();
    s.stages[1].requires_approval = true;
    let pgcs = [finished(pgc("m1", "c1", 0), t0()), pgc("m1", "w1", 1)];
    let mut ctl = active();
    let d = run(&s, &pgcs, &ctl, t0() + 11 * MIN);
    assert!(d.start.is_empty());
    let stage = "wave".to_owned();
    assert_eq!(d.status.state, RolloutState::WaitingApproval { stage });
    assert_eq!(d.status.stages[1].state, StageState::WaitingApproval);
    ctl.approved.insert("wave".to_owned());
    assert_eq!(names(&run(&s, &pgcs, &ctl, t0() + 11 * MIN).start), ["w1"]);
}

#[test]
fn progress_deadline() {
    let s = spec(vec![stage(
        "all",
        Concurrency::Count(1),
        Duration::ZERO,
        false,
    )]);
    let pgcs = [in_flight(pgc("m1", "a", 0), t0())];
    let d = run(&s, &pgcs, &active(), t0() + 20 * MIN);
    assert!(d.fail.is_empty());
    assert_eq!(d.wake_after, Some(10 * MIN));
    let d = run(&s, &pgcs, &active(), t0() + 31 * MIN);
    let why = "did not reach 15.20 within 30m (phase not Healthy/currentVersion 15.18)";
    assert_eq!(d.fail, [(PgcRef::of(&pgcs[0]), why.to_owned())]);
    assert!(d.halt.unwrap().reason.contains(why));
}

#[test]
fn unreachable_counts_as_failure() {
    let mut s = two_stages();
    s.max_failures = 5;
    let pgcs = [pgc("m1", "c1", 0), pgc("m2", "c2", 0), pgc("m2", "w1", 1)];
    let members = [
        member("m1"),
        Member {
            reachable: false,
            ..member("m2")
        },
    ];
    let d = decide(&s, &members, &pgcs, &active(), t0());
    let why = "member cluster m2 unreachable".to_owned();
    assert_eq!(d.fail, [(PgcRef::of(&pgcs[1]), why.clone())]);
    assert_eq!(names(&d.start), ["c1"]);
    let pgcs = [in_flight(pgc("m2", "c2", 0), t0())];
    assert_eq!(decide(&s, &members, &pgcs, &active(), t0()).fail[0].1, why);
}

#[test]
fn unreachable_skip_and_requeue() {
    let mut s = two_stages();
    s.unreachable = Unreachable::SkipAndRequeue;
    s.stages[0].soak = Duration::ZERO;
    let mut pgcs = vec![pgc("m1", "c1", 0), pgc("m2", "c2", 0)];
    pgcs.extend(["w1", "w2", "w3"].map(|n| pgc("m1", n, 1)));
    let members = vec![
        member("m1"),
        Member {
            reachable: false,
            ..member("m2")
        },
    ];
    let mut sim = Sim::new(s, members, pgcs);
    for _ in 0..30 {
        let d = sim.step();
        assert!(d.fail.is_empty() && d.halt.is_none());
        assert!(!d.start.iter().any(|r| r.name == "c2"));
        assert_ne!(d.status.state, RolloutState::Completed);
    }
    let d = sim.decide();
    assert_eq!(d.status.stages[0].state, StageState::Complete);
    assert_eq!(d.status.stages[0].deferred, 1);
    assert_eq!(d.status.stages[1].done, 3);
    assert_eq!(d.status.state, RolloutState::Running);
    sim.members[1].reachable = true;
    assert_eq!(names(&sim.step().start), ["c2"]);
    sim.run(20, |_, _| {});
    assert_eq!(sim.starts.len(), 5);
}

#[test]
fn requeued_pgc_respects_its_stage_limit_while_a_later_stage_runs() {
    let mut s = two_stages();
    s.unreachable = Unreachable::SkipAndRequeue;
    // c1 and c2 are back while wave runs; canary's one slot is still taken by c0.
    let mut pgcs = vec![in_flight(pgc("m1", "c0", 0), t0())];
    pgcs.extend(["c1", "c2"].map(|n| pgc("m2", n, 0)));
    pgcs.extend([in_flight(pgc("m1", "w1", 1), t0()), pgc("m1", "w2", 1)]);
    let d = run(&s, &pgcs, &active(), t0() + MIN);
    assert_eq!(names(&d.start), ["w2"]);
    pgcs[0] = finished(pgc("m1", "c0", 0), t0() + MIN);
    let d = run(&s, &pgcs, &active(), t0() + 2 * MIN);
    assert_eq!(names(&d.start), ["c1", "w2"]);
}

#[test]
fn maintenance_window() {
    let s = spec(vec![stage(
        "all",
        Concurrency::Count(5),
        Duration::ZERO,
        false,
    )]);
    let pgcs = [pgc("m1", "a", 0), pgc("m2", "b", 0)];
    let mut members = vec![
        Member {
            in_window: false,
            ..member("m1")
        },
        member("m2"),
    ];
    assert_eq!(
        names(&decide(&s, &members, &pgcs, &active(), t0()).start),
        ["b"]
    );
    members[0].in_window = true;
    assert_eq!(
        names(&decide(&s, &members, &pgcs, &active(), t0()).start),
        ["a", "b"]
    );
}

#[test]
fn major_version_is_ineligible_and_does_not_block() {
    let s = two_stages();
    let old = Pgc {
        spec_version: "14.11".to_owned(),
        ..pgc("m1", "old", 0)
    };
    let why =
        "major upgrade 14→15 needs pg_upgrade: set method = \"inPlace\" on the rollout".to_owned();
    assert_eq!(pgc_state(&s, &old), PgcState::Ineligible { reason: why });
    let pgcs = [old, finished(pgc("m1", "c1", 0), t0()), pgc("m1", "w1", 1)];
    let d = run(&s, &pgcs, &active(), t0() + 10 * MIN);
    assert_eq!(names(&d.start), ["w1"]);
    assert_eq!(d.status.stages[0].ineligible, 1);
    assert_eq!(d.status.stages[0].state, StageState::Complete);
}

#[test]
fn pgc_states() {
    let s = two_stages();
    let at_target = arrived(pgc("m1", "a", 0));
    assert_eq!(pgc_state(&s, &at_target), PgcState::Done { finished: None });
    let mut foreign = in_flight(pgc("m1", "b", 0), t0());
    foreign.mark.as_mut().unwrap().rollout = "other".to_owned();
    assert_eq!(pgc_state(&s, &foreign), PgcState::Pending);
    let started = in_flight(pgc("m1", "c", 0), t0());
    assert_eq!(
        pgc_state(&s, &started),
        PgcState::InFlight { started: t0() }
    );
}

#[test]
fn restart_after_half_a_decision_starts_nothing_twice() {
    let s = spec(vec![stage(
        "all",
        Concurrency::Count(4),
        Duration::ZERO,
        false,
    )]);
    let pgcs = ["a", "b", "c", "d", "e"].map(|n| pgc("m1", n, 0)).to_vec();
    let mut sim = Sim::new(s, vec![member("m1")], pgcs);
    let d = sim.decide();
    assert_eq!(names(&d.start), ["a", "b", "c", "d"]);
    // The engine dies after patching two of them; its successor decides anew.
    sim.apply(&Decision {
        start: d.start[..2].to_vec(),
        ..d.clone()
    });
    sim.now += Duration::from_secs(5);
    let again = sim.decide();
    assert_eq!(names(&again.start), ["c", "d"]);
    sim.apply(&again);
    assert!(sim.decide().start.is_empty());
    assert!(sim.starts.values().all(|n| *n == 1));
}

#[test]
fn empty_stage_is_complete_and_does_not_cut_an_earlier_soak() {
    let s = spec(vec![
        stage("canary", Concurrency::Count(1), 10 * MIN, false),
        stage("empty", Concurrency::Count(1), 60 * MIN, false),
        stage("prod", Concurrency::Count(1), Duration::ZERO, false),
    ]);
    let pgcs = [finished(pgc("m1", "c1", 0), t0()), pgc("m1", "p1", 2)];
    let d = run(&s, &pgcs, &active(), t0() + 5 * MIN);
    assert_eq!(d.wake_after, Some(5 * MIN), "canary's soak still counts");
    let d = run(&s, &pgcs, &active(), t0() + 10 * MIN);
    assert_eq!(names(&d.start), ["p1"]);
    assert_eq!(d.status.stages[1].state, StageState::Complete);
}

#[path = "plan_halt_tests.rs"]
mod halts;
