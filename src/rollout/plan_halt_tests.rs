//! Halting: the failure budget, abort, rollback and pause.

use super::*;

#[test]
fn failure_beyond_budget_halts_with_reason_and_starts_nothing() {
    let mut pgcs = vec![finished(pgc("m1", "c1", 0), t0())];
    pgcs.extend(["w1", "w2", "w3"].map(|n| pgc("m2", n, 1)));
    let mut sim = Sim::new(two_stages(), vec![member("m1"), member("m2")], pgcs);
    sim.now = t0() + 11 * MIN;
    let d = sim.step();
    assert_eq!(names(&d.start), ["w1", "w2"]);
    let w1 = d.start[0].clone();
    sim.find(&w1).update_failure = Some("image pull failed".to_owned());
    let d = sim.step();
    assert_eq!(d.fail, [(w1, "image pull failed".to_owned())]);
    let halt = d.halt.clone().unwrap();
    assert_eq!(halt.on_failure, OnFailure::Pause);
    let why = "1 failed (max_failures 0): db/w1 on m2: image pull failed";
    assert_eq!(halt.reason, why);
    assert!(d.start.is_empty(), "w1's slot is not refilled");
    assert!(matches!(d.status.state, RolloutState::Paused { .. }));
    for _ in 0..20 {
        let d = sim.step();
        assert!(d.start.is_empty() && d.halt.is_none());
    }
    assert_eq!(pgc_state(&sim.spec, &sim.pgcs[3]), PgcState::Pending);
}

#[test]
fn failures_within_budget_do_not_halt() {
    let mut s = two_stages();
    s.max_failures = 1;
    let mut w1 = in_flight(pgc("m1", "w1", 1), t0());
    w1.update_failure = Some("crash loop".to_owned());
    let mut pgcs = vec![finished(pgc("m1", "c1", 0), t0()), w1];
    pgcs.extend(["w2", "w3"].map(|n| pgc("m1", n, 1)));
    let d = run(&s, &pgcs, &active(), t0() + 11 * MIN);
    assert_eq!(d.fail.len(), 1);
    assert!(d.halt.is_none());
    assert_eq!(names(&d.start), ["w2", "w3"]);
}

/// c1 done, w1 in flight, w2 failed, w3 pending, w4 reverted.
fn touched() -> Vec<Pgc> {
    let mut w2 = in_flight(pgc("m1", "w2", 1), t0());
    w2.mark.as_mut().unwrap().failed = Some("boom".to_owned());
    let mut w4 = pgc("m1", "w4", 1);
    w4.mark = Some(Mark {
        reverted: true,
        ..mark(t0())
    });
    let c1 = finished(pgc("m1", "c1", 0), t0());
    vec![
        c1,
        in_flight(pgc("m1", "w1", 1), t0()),
        w2,
        pgc("m1", "w3", 1),
        w4,
    ]
}

#[test]
fn abort_reverts_in_flight_and_failed_but_keeps_finished() {
    let d = run(
        &two_stages(),
        &touched(),
        &control(ControlState::Aborted),
        t0() + 20 * MIN,
    );
    assert_eq!(names(&d.revert), ["w1", "w2"]);
    assert!(d.start.is_empty() && d.fail.is_empty() && d.halt.is_none());
    assert!(matches!(d.status.state, RolloutState::Aborted { .. }));
}

#[test]
fn rollback_reverts_every_marked_pgc_at_target() {
    let ctl = control(ControlState::RollingBack);
    let d = run(&two_stages(), &touched(), &ctl, t0() + 20 * MIN);
    assert_eq!(names(&d.revert), ["c1", "w1", "w2"]);
    assert!(d.start.is_empty());
    assert_eq!(d.status.state, RolloutState::RollingBack);
}

#[test]
fn halt_with_rollback_reverts_in_the_same_decision() {
    let mut s = two_stages();
    s.on_failure = OnFailure::Rollback;
    let mut pgcs = touched();
    pgcs[2].mark.as_mut().unwrap().failed = None;
    pgcs[2].update_failure = Some("boom".to_owned());
    let d = run(&s, &pgcs, &active(), t0() + 20 * MIN);
    assert_eq!(
        d.halt.as_ref().map(|h| h.on_failure),
        Some(OnFailure::Rollback)
    );
    assert_eq!(names(&d.revert), ["c1", "w1", "w2"]);
    assert!(d.start.is_empty());
}

#[test]
fn paused_records_finishes_but_starts_nothing() {
    let w1 = arrived(in_flight(pgc("m1", "w1", 0), t0()));
    let s = spec(vec![stage(
        "all",
        Concurrency::Count(1),
        Duration::ZERO,
        false,
    )]);
    let ctl = control(ControlState::Paused);
    let d = run(&s, &[w1, pgc("m1", "w2", 0)], &ctl, t0() + MIN);
    assert_eq!(d.finish.len(), 1);
    assert!(d.start.is_empty());
    let reason = "by an operator".to_owned();
    assert_eq!(d.status.state, RolloutState::Paused { reason });
}
