use std::time::Duration;

use super::*;
use crate::config::values::Concurrency;
use crate::rollout::plan::tests::{
    MIN, TARGET, arrived, finished, in_flight, member, pgc, run, spec, stage, t0, two_stages,
};
use crate::rollout::plan::{Control, Pgc, PgcState, pgc_state};

#[test]
fn status_line() {
    let started = t0() + 11 * MIN;
    let pgcs = [
        finished(pgc("m1", "c1", 0), t0()),
        in_flight(pgc("m1", "w1", 1), started),
        in_flight(pgc("m1", "w2", 1), started),
        pgc("m1", "w3", 1),
    ];
    let d = run(&two_stages(), &pgcs, &Control::default(), t0() + 12 * MIN);
    let line = "running 1/4 done · stage canary 1/1 done · stage wave running 0/3 (2 in flight)";
    assert_eq!(d.status.to_string(), line);
    let d = run(&two_stages(), &pgcs[..1], &Control::default(), t0() + MIN);
    let line = "completed 1/1 done · stage canary 1/1 done · stage wave 0/0 done";
    assert_eq!(d.status.to_string(), line);
    let soaking = [pgcs[0].clone(), pgcs[3].clone()];
    let d = run(&two_stages(), &soaking, &Control::default(), t0());
    let line = "soaking after canary until 2027-01-15T08:10:00Z 1/2 done · \
                stage canary 1/1 done, soaking until 2027-01-15T08:10:00Z · stage wave pending 0/1";
    assert_eq!(d.status.to_string(), line);
}

#[test]
fn durations_and_timestamps() {
    assert_eq!(format_duration(Duration::from_secs(3900)), "1h 5m");
    assert_eq!(format_duration(Duration::from_secs(3605)), "1h");
    assert_eq!(format_duration(Duration::from_secs(90_061)), "1d 1h");
    assert_eq!(format_duration(Duration::from_secs(45)), "45s");
    assert_eq!(format_duration(Duration::ZERO), "0s");
    assert_eq!(format_utc(t0()), "2027-01-15T08:00:00Z");
    let leap_day = std::time::UNIX_EPOCH + Duration::from_secs(951_782_400);
    assert_eq!(format_utc(leap_day), "2000-02-29T00:00:00Z");
}

#[test]
fn dry_run_waves_and_estimate() {
    let s = spec(vec![
        stage("canary", Concurrency::Count(1), 10 * MIN, false),
        stage("prod", Concurrency::Percent(25), 5 * MIN, true),
    ]);
    let mut pgcs = vec![pgc("m1", "c1", 0)];
    pgcs.extend((0..8).map(|i| pgc(&format!("m{}", 2 + i % 2), &format!("p{i}"), 1)));
    pgcs.push(arrived(pgc("m2", "p8", 1)));
    pgcs.push(Pgc {
        spec_version: "14.3".to_owned(),
        ..pgc("m2", "old", 1)
    });
    pgcs.push(Pgc {
        stage: None,
        ..pgc("m9", "x", 0)
    });
    let members = [member("m1"), member("m2"), member("m3")];
    let dry = plan(&s, &members, &pgcs, &Estimate { per_pgc: 5 * MIN });
    assert_eq!(dry.unselected, 1);
    let (canary, prod) = (&dry.stages[0], &dry.stages[1]);
    assert_eq!((canary.waves, canary.estimate), (1, 15 * MIN));
    // 9 eligible → 25% is 2 at a time; 8 to update → 4 waves × 5m + 5m soak.
    let counts = (
        prod.pgcs.len(),
        prod.already_at_target,
        prod.ineligible.len(),
    );
    assert_eq!(counts, (8, 1, 1));
    assert_eq!((prod.waves, prod.estimate), (4, 25 * MIN));
    assert_eq!(prod.members, ["m2", "m3"]);
    assert_eq!(dry.estimate, 40 * MIN);
    let text = dry.to_string();
    assert!(text.contains("m2/db/p0  15.18 → 15.20"), "{text}");
    assert!(
        text.contains("prod    yes       2        8     4      5m       25m"),
        "{text}"
    );
    assert!(text.contains("estimate 40m"), "{text}");
    assert!(text.contains("1 already at 15.20"), "{text}");
    assert!(pgcs.iter().all(|p| pgc_state(&s, p) != PgcState::Reverted));
    assert_eq!(TARGET, dry.target_version);
}
