use super::*;

fn record(step: &str) -> Record {
    Record {
        step: step.into(),
        from_version: "15.18".into(),
        to_version: "18".into(),
        bg: crate::crd::major_upgrade::BlueGreenStatus {
            blue: vec!["pg-1".into(), "pg-2".into()],
            green: vec!["pg-3".into(), "pg-4".into()],
            ..Default::default()
        },
        ..Record::default()
    }
}

/// Green caught up, guardrails hold.
fn ready() -> Seen {
    Seen {
        now_ms: 1_000_000,
        blue_logical: true,
        green_ready: 2,
        size: 2,
        seeded: true,
        tables_syncing: Some(0),
        lag_bytes: Some(0),
        oldest_transaction_secs: Some(0),
        blue_left: true,
        green_left: true,
        ..Seen::default()
    }
}

#[test]
fn the_steps_go_forward_in_order_when_each_is_done() {
    let l = Limits::default();
    let mut s = ready();
    s.blue_logical = false;
    assert_eq!(next(&record(PREPARING_BLUE), &s, &l), Next::PrepareBlue);
    s.blue_logical = true;
    assert_eq!(next(&record(PREPARING_BLUE), &s, &l), Next::CreateGreen);
    s.green_ready = 1;
    assert_eq!(next(&record(CREATING_GREEN), &s, &l), Next::CreateGreen);
    s.green_ready = 2;
    assert_eq!(next(&record(CREATING_GREEN), &s, &l), Next::Seed);
    s.seeded = false;
    assert_eq!(next(&record(SEEDING), &s, &l), Next::Seed);
    s.seeded = true;
    assert_eq!(next(&record(SEEDING), &s, &l), Next::Switch);
    assert_eq!(next(&record(CATCHING_UP), &s, &l), Next::Switch);
}

#[test]
fn the_guardrails_hold_the_switch_with_a_reason() {
    let l = Limits::default();
    let r = record(CATCHING_UP);
    type Change = fn(&mut Seen);
    let cases: [(Change, &str); 4] = [
        (|s| s.tables_syncing = Some(3), "3 tables still copying"),
        (|s| s.lag_bytes = Some(64 << 20), "bytes behind"),
        (|s| s.oldest_transaction_secs = Some(600), "has run 600 s"),
        (|s| s.lag_bytes = None, "could not be read"),
    ];
    for (change, why) in cases {
        let mut s = ready();
        change(&mut s);
        let n = next(&r, &s, &l);
        assert!(
            matches!(&n, Next::Wait(w) if w.contains(why)),
            "{why}: {n:?}"
        );
        assert!(!n.holds_clients());
    }
}

#[test]
fn a_table_without_replica_identity_rolls_back_before_anything_switches() {
    let mut s = ready();
    s.without_identity = vec!["public.log".into(), "public.audit".into()];
    let n = next(&record(CATCHING_UP), &s, &Limits::default());
    assert!(
        matches!(&n, Next::RollBack(w) if w.contains("public.log") && w.contains("1 more")),
        "{n:?}"
    );
}

#[test]
fn the_cutover_needs_the_recorded_lsn_confirmed() {
    let l = Limits::default();
    let mut r = record(SWITCHING);
    r.bg.switch_started_at_ms = Some(999_000);
    let mut s = ready();
    // PAUSE recorded, the LSN not yet read (killed in between): again.
    s.target_confirmed = true;
    assert_eq!(next(&r, &s, &l), Next::Switch);
    r.bg.target_lsn = Some("0/3000060".into());
    s.target_confirmed = false;
    assert_eq!(next(&r, &s, &l), Next::Switch);
    assert!(Next::Switch.holds_clients());
    s.target_confirmed = true;
    assert_eq!(next(&r, &s, &l), Next::Cutover);
    assert!(!Next::Cutover.serves_green(&r));
}

#[test]
fn a_switch_past_its_timeout_is_undone_then_rolled_back_after_the_last_attempt() {
    let l = Limits::default();
    let mut r = record(SWITCHING);
    r.bg.switch_started_at_ms = Some(0);
    r.bg.target_lsn = Some("0/3000060".into());
    let s = ready();
    assert!(matches!(next(&r, &s, &l), Next::UndoSwitch(w) if w.contains("30000 ms")));
    r.bg.switch_attempts = l.max_switch_attempts - 1;
    assert!(matches!(next(&r, &s, &l), Next::RollBack(w) if w.contains("attempts")));
}

#[test]
fn a_killed_manager_resumes_every_step_before_the_switch_and_continues_after() {
    let l = Limits::default();
    let s = ready();
    let cases = [
        (PREPARING_BLUE, Next::CreateGreen),
        (CREATING_GREEN, Next::Seed),
        (SEEDING, Next::Switch),
        (CATCHING_UP, Next::Switch),
        (SWITCHED, Next::Retain),
        (REMOVING_BLUE, Next::RemoveBlue),
    ];
    for (step, want) in cases {
        let mut r = record(step);
        r.bg.switched_at_ms = Some(s.now_ms - 1000);
        assert_eq!(next(&r, &s, &l), want, "{step}");
    }
    // After the switch, Services stay on green whatever happens next.
    let r = record(SWITCHED);
    assert!(Next::Retain.serves_green(&r));
    let mut gone = ready();
    gone.blue_left = false;
    assert_eq!(next(&record(REMOVING_BLUE), &gone, &l), Next::Done);
}

#[test]
fn a_rollback_request_is_honoured_only_before_the_switch() {
    let l = Limits::default();
    let mut s = ready();
    s.rollback_requested = true;
    for step in [PREPARING_BLUE, CREATING_GREEN, SEEDING, CATCHING_UP] {
        assert!(
            matches!(next(&record(step), &s, &l), Next::RollBack(_)),
            "{step}"
        );
    }
    // Mid-switch the switch finishes or times out first; after it, green
    // took writes blue only has while it follows green: without that
    // path, forward only.
    let mut r = record(SWITCHING);
    r.bg.switch_started_at_ms = Some(s.now_ms);
    assert_eq!(next(&r, &s, &l), Next::Switch);
    assert_eq!(next(&record(SWITCHED), &s, &l), Next::Retain);
    let mut r = record(SWITCHED);
    r.bg.reverse = Some(false);
    assert_eq!(next(&r, &s, &l), Next::Retain);
    r.bg.reverse = Some(true);
    assert_eq!(next(&r, &s, &l), Next::SwitchBack);
    r.bg.back_attempts = l.max_switch_attempts;
    assert_eq!(next(&r, &s, &l), Next::Retain);
}

#[test]
fn a_switch_back_mirrors_the_switch_and_its_timeout_leaves_green_serving() {
    let l = Limits::default();
    let mut s = ready();
    s.rollback_requested = true;
    let mut r = record(SWITCHING_BACK);
    r.bg.reverse = Some(true);
    r.bg.back_started_at_ms = Some(s.now_ms - 100);
    // Not confirmed yet (or no LSN recorded): the switch back goes on.
    assert_eq!(next(&r, &s, &l), Next::SwitchBack);
    s.back_confirmed = true;
    assert_eq!(next(&r, &s, &l), Next::SwitchBack, "no LSN recorded yet");
    r.bg.back_lsn = Some("0/3000060".into());
    assert_eq!(next(&r, &s, &l), Next::CutBack);
    assert!(Next::CutBack.holds_clients() && Next::SwitchBack.holds_clients());
    // Clients stay on green until the cut back writes `RollingBack`.
    assert!(Next::SwitchBack.serves_green(&r));
    s.back_confirmed = false;
    r.bg.back_started_at_ms = Some(s.now_ms - l.switch_timeout_ms);
    assert!(matches!(next(&r, &s, &l), Next::UndoSwitchBack(w) if w.contains("green's final")));
    // After the cut back: a rollback (green removed), blue serving.
    let mut r = record(ROLLING_BACK);
    r.bg.back_lsn = Some("0/3000060".into());
    assert!(!Next::RollBack(String::new()).serves_green(&r));
}

#[test]
fn blue_too_far_behind_green_gives_up_the_reverse_path() {
    let l = Limits::default();
    let mut s = ready();
    let mut r = record(SWITCHED);
    r.bg.switched_at_ms = Some(s.now_ms);
    r.bg.reverse = Some(true);
    s.reverse_lag_bytes = Some(l.max_reverse_lag_bytes);
    assert_eq!(next(&r, &s, &l), Next::Retain);
    s.reverse_lag_bytes = Some(l.max_reverse_lag_bytes + 1);
    assert!(matches!(next(&r, &s, &l), Next::GiveUpReverse(w) if w.contains("bytes behind green")));
    // Given up once, never again.
    r.bg.reverse = Some(false);
    assert_eq!(next(&r, &s, &l), Next::Retain);
}

#[test]
fn blue_goes_after_the_retention_or_an_explicit_finish() {
    let l = Limits::default();
    let mut s = ready();
    let mut r = record(SWITCHED);
    r.bg.switched_at_ms = Some(s.now_ms - l.retention_ms + 1);
    assert_eq!(next(&r, &s, &l), Next::Retain);
    r.bg.switched_at_ms = Some(s.now_ms - l.retention_ms);
    assert_eq!(next(&r, &s, &l), Next::RemoveBlue);
    r.bg.switched_at_ms = Some(s.now_ms);
    s.finish_requested = true;
    assert_eq!(next(&r, &s, &l), Next::RemoveBlue);
}

#[test]
fn a_rollback_deletes_green_then_stays_blocked_with_its_reason() {
    let l = Limits::default();
    let mut r = record(ROLLING_BACK);
    r.failure = Some("table public.log has no replica identity".into());
    let mut s = ready();
    assert!(matches!(next(&r, &s, &l), Next::RollBack(w) if w.contains("public.log")));
    s.green_left = false;
    assert!(matches!(next(&r, &s, &l), Next::Blocked(w) if w.contains("public.log")));
    r.step = ROLLED_BACK.into();
    assert!(matches!(next(&r, &s, &l), Next::Blocked(_)));
    r.step = "Teleporting".into();
    assert!(matches!(next(&r, &s, &l), Next::Blocked(w) if w.contains("Teleporting")));
}

#[test]
fn the_record_is_read_from_the_status_in_camel_case() {
    let m: crate::crd::major_upgrade::MajorUpgradeStatus = serde_json::from_value(serde_json::json!({
        "fromVersion": "15", "toVersion": "18", "step": SWITCHING, "primary": "pg-1",
        "blueGreen": {"blue": ["pg-1"], "green": ["pg-2"], "targetLsn": "0/3000060", "switchAttempts": 1}}))
    .unwrap_or_default();
    let r = Record::of(&m);
    assert_eq!(r.step, SWITCHING);
    assert_eq!(r.bg.target_lsn.as_deref(), Some("0/3000060"));
    assert_eq!(r.bg.switch_attempts, 1);
    assert_eq!(r.bg.green, vec!["pg-2".to_string()]);
}

#[test]
fn green_takes_the_ordinals_after_every_blue_one() {
    let blue = vec![
        "pg-1".into(),
        "pg-4".into(),
        "pg-green".into(),
        "other-9".into(),
    ];
    assert_eq!(green_instances("pg", &blue, 2), ["pg-5", "pg-6"]);
    assert_eq!(green_instances("pg", &[], 0), ["pg-1"]);
}
