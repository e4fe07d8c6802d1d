use super::*;

fn input<'a>(spec: &'a str, running: Option<&'a str>) -> Input<'a> {
    Input {
        spec_version: spec,
        method: Some(MajorUpgradeMethod::InPlace),
        running,
        record: None,
        ready_on_target: 0,
        primary_on_target: false,
        old_left: false,
        size: 3,
    }
}

fn record(step: &str, to: &str) -> MajorUpgradeStatus {
    MajorUpgradeStatus {
        from_version: "15.18".into(),
        to_version: to.into(),
        step: step.into(),
        primary: "pg-1".into(),
        failure: Some("pg_upgrade --check: extension foo is missing".into()),
        ..Default::default()
    }
}

#[test]
fn a_minor_change_or_a_new_cluster_is_not_a_major_upgrade() {
    assert_eq!(next(&input("15.19", Some("15.18"))), Next::Idle);
    assert_eq!(next(&input("18", None)), Next::Idle);
    assert_eq!(Next::Idle.builds_for(None), None);
}

#[test]
fn raising_the_major_starts_with_the_pre_flight_on_the_old_version() {
    let n = next(&input("18", Some("15.18")));
    assert_eq!(
        n,
        Next::PreFlight {
            from: "15.18".into(),
            to: "18".into()
        }
    );
    assert_eq!(n.builds_for(None), Some("15.18"));
    assert!(!n.holds_primary());
}

#[test]
fn without_a_method_or_downwards_the_change_is_refused_and_nothing_moves() {
    let mut i = input("18", Some("15.18"));
    i.method = None;
    let n = next(&i);
    assert!(
        matches!(&n, Next::Refuse { why, .. } if why.contains("spec.majorUpgrade.method")),
        "{n:?}"
    );
    assert_eq!(n.builds_for(None), Some("15.18"));
    let down = next(&input("15", Some("18")));
    assert!(
        matches!(&down, Next::Refuse { why, .. } if why.contains("restore")),
        "{down:?}"
    );
    assert_eq!(down.builds_for(None), Some("18"));
}

#[test]
fn a_failed_pre_flight_blocks_until_the_spec_changes() {
    let r = record(PRE_FLIGHT_FAILED, "18");
    let mut i = input("18", Some("15.18"));
    i.record = Some(&r);
    let n = next(&i);
    assert!(
        matches!(&n, Next::Blocked { why, .. } if why.contains("extension foo")),
        "{n:?}"
    );
    assert_eq!(n.builds_for(Some(&r)), Some("15.18"));
    // Back to 15 (or on to another target): the record goes, still on 15.
    let mut back = input("15.18", Some("15.18"));
    back.record = Some(&r);
    assert_eq!(next(&back), Next::Clear);
    assert_eq!(Next::Clear.builds_for(Some(&r)), Some("15.18"));
}

#[test]
fn a_killed_manager_resumes_every_step_and_builds_for_the_right_version() {
    let cases = [
        (STOPPING, false, 0, Next::Stop, "15.18", true),
        (UPGRADING, false, 0, Next::Upgrade, "15.18", true),
        (REPLACING, false, 0, Next::Start, "18", true),
        (STARTING, false, 0, Next::Start, "18", true),
        (STARTING, true, 1, Next::Analyze, "18", false),
        (ANALYZING, true, 1, Next::Analyze, "18", false),
        (REBUILDING, true, 2, Next::Rebuild, "18", false),
        (REBUILDING, true, 3, Next::Done, "18", false),
    ];
    for (step, primary_on_target, ready, want, builds, holds) in cases {
        let r = record(step, "18");
        let mut i = input("18", Some("15.18"));
        i.record = Some(&r);
        i.primary_on_target = primary_on_target;
        i.ready_on_target = ready;
        let n = next(&i);
        assert_eq!(n, want, "{step}");
        assert_eq!(n.builds_for(Some(&r)), Some(builds), "{step}");
        assert_eq!(n.holds_primary(), holds, "{step}");
    }
}

#[test]
fn once_the_instances_stopped_a_spec_change_does_not_turn_the_upgrade_around() {
    for step in [
        STOPPING, UPGRADING, REPLACING, STARTING, ANALYZING, REBUILDING,
    ] {
        let r = record(step, "18");
        let mut i = input("15.18", Some("15.18"));
        i.record = Some(&r);
        assert_ne!(next(&i), Next::Clear, "{step}");
    }
    // Old Pods or replica volumes left: nothing is built yet.
    let r = record(REPLACING, "18");
    let mut i = input("18", Some("15.18"));
    i.record = Some(&r);
    i.old_left = true;
    assert_eq!(next(&i), Next::Replace);
    assert!(Next::Replace.holds_primary());
    let odd = record("Teleporting", "18");
    let mut i = input("18", Some("15.18"));
    i.record = Some(&odd);
    assert!(matches!(next(&i), Next::Blocked { .. }));
}
