//! Rollouts across a major: the fleet-wide pre-flight holds the first stage
//! until every reachable cluster answered, a failed check fails its PGC
//! when its stage comes (never touching its version), and the budget halts
//! the rollout as configured.
#![allow(clippy::unwrap_used)]

use std::time::SystemTime;

use super::*;
use crate::config::choices::MajorMethod;
use crate::config::values::Concurrency;
use crate::rollout::plan::tests::{MIN, member, pgc, spec, stage, t0};
use crate::rollout::plan::{Control, Decision, Mark, OnFailure, RolloutState, decide};

fn major_spec() -> RolloutSpec {
    let mut s = spec(vec![
        stage("canary", Concurrency::Count(1), MIN, false),
        stage("rest", Concurrency::Count(1), MIN, false),
    ]);
    s.target_version = "18".into();
    s.method = Some(MajorMethod::InPlace);
    s
}

fn on15(member: &str, name: &str, stage: usize) -> Pgc {
    let mut p = pgc(member, name, stage);
    (p.spec_version, p.current_version) = ("15".into(), Some("15".into()));
    p
}

fn checked(mut p: Pgc, failure: Option<&str>) -> Pgc {
    p.pre_flight_requested = Some("18".into());
    p.pre_flight = Some(PreFlight {
        version: "18".into(),
        from_version: "15".into(),
        failure: failure.map(str::to_owned),
    });
    p
}

fn decide_at(s: &RolloutSpec, pgcs: &[Pgc], now: SystemTime) -> Decision {
    let members = [member("m1"), member("m2"), member("m3")];
    decide(s, &members, pgcs, &Control::default(), now)
}

fn names(refs: &[PgcRef]) -> Vec<&str> {
    refs.iter().map(|r| r.name.as_str()).collect()
}

#[test]
fn nothing_starts_until_every_cluster_answered_its_pre_flight() {
    let s = major_spec();
    let pgcs = [on15("m1", "a", 0), on15("m2", "b", 1), on15("m3", "c", 1)];
    let d = decide_at(&s, &pgcs, t0());
    assert!(d.start.is_empty());
    assert_eq!(names(&d.pre_flight), ["a", "b", "c"]);
    assert_eq!(d.status.state, RolloutState::PreFlight { waiting: 3 });

    let pgcs = [
        checked(on15("m1", "a", 0), None),
        checked(on15("m2", "b", 1), Some("extension pgcrypto is missing")),
        on15("m3", "c", 1),
    ];
    let d = decide_at(&s, &pgcs, t0());
    assert!(d.start.is_empty(), "c has not answered");
    assert_eq!(names(&d.pre_flight), ["c"]);
    assert!(d.fail.is_empty(), "b's stage has not come");
}

#[test]
fn a_failed_pre_flight_fails_in_its_stage_and_halts_as_configured() {
    let s = major_spec();
    let mut pgcs = vec![
        checked(on15("m1", "a", 0), None),
        checked(on15("m2", "b", 1), Some("extension pgcrypto is missing")),
        checked(on15("m3", "c", 1), None),
    ];
    let d = decide_at(&s, &pgcs, t0());
    assert_eq!(names(&d.start), ["a"], "the canary starts");
    assert!(d.fail.is_empty() && d.halt.is_none());
    let p = &mut pgcs[0];
    let mark = Mark {
        rollout: s.name.clone(),
        previous_version: "15".into(),
        started: t0(),
        finished: Some(t0() + MIN),
        failed: None,
        reverted: false,
    };
    (p.spec_version, p.current_version, p.mark) = ("18".into(), Some("18".into()), Some(mark));
    let d = decide_at(&s, &pgcs, t0() + 3 * MIN);
    assert!(d.start.is_empty(), "b fails instead, and the halt stops c");
    assert_eq!(d.fail.len(), 1);
    assert!(d.fail[0].1.contains("pgcrypto"), "{:?}", d.fail);
    let halt = d.halt.unwrap();
    assert_eq!(halt.on_failure, OnFailure::Pause);
    assert!(d.revert.is_empty());
}

#[test]
fn a_rollback_does_not_set_an_upgraded_cluster_back_a_major() {
    let mut s = major_spec();
    s.on_failure = OnFailure::Rollback;
    let mut a = checked(on15("m1", "a", 0), None);
    a.mark = Some(Mark {
        rollout: s.name.clone(),
        previous_version: "15".into(),
        started: t0(),
        finished: Some(t0()),
        failed: None,
        reverted: false,
    });
    (a.spec_version, a.current_version) = ("18".into(), Some("18".into()));
    assert!(no_way_back(&s, &a));
    let b = checked(on15("m2", "b", 1), Some("no space"));
    let d = decide_at(&s, &[a, b], t0() + 3 * MIN);
    assert!(d.halt.is_some());
    assert!(d.revert.is_empty(), "{:?}", d.revert);
}

#[test]
fn without_a_method_a_major_target_is_ineligible_and_asks_nothing() {
    let mut s = major_spec();
    s.method = None;
    let d = decide_at(&s, &[on15("m1", "a", 0)], t0());
    assert!(d.pre_flight.is_empty() && d.start.is_empty());
    assert_eq!(d.status.stages[0].ineligible, 1);
}

#[test]
fn a_result_from_another_running_version_is_stale() {
    let s = major_spec();
    let mut p = checked(on15("m1", "a", 0), None);
    p.current_version = Some("15.19".into());
    assert_eq!(result(&s, &p), None);
    assert!(downtime_class(&s, &p).starts_with("offline"));
}
