//! A fleet rollout across a major (issue 17 item 3): three member clusters
//! (virtual runtime), PostgresClusters on 15, `target_version = "18"` with
//! `method = "inPlace"`, a canary stage then the rest. member-2's cluster
//! has pgcrypto, which the PostgreSQL 18 installation here lacks: the
//! fleet-wide pre-flight reports it before anything starts, the canary
//! upgrades, and the second stage halts as configured (pause) without
//! touching member-2's or member-3's version. Outcomes come from the live
//! objects and the stored control; nothing is timed.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::fleet::*;
use pgfleet::platform::clock::ManualClock;
use pgfleet::rollout::control;
use pgfleet::rollout::engine::Engine;
use pgfleet::rollout::plan::{ControlState, Decision, RolloutState};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

const MEMBERS: [&str; 3] = ["member-1", "member-2", "member-3"];

const ROLLOUT: &str = r#"
[rollouts.r]
target_version = "18"
method = "inPlace"
progress_deadline = "24h"
[[rollouts.r.stages]]
name = "canary"
clusters = "wave=0"
soak = "10m"
[[rollouts.r.stages]]
name = "rest"
clusters = "wave in (1,2)"
max_concurrency = 2
"#;

fn engine(f: &TestFleet) -> (Arc<Engine>, Arc<ManualClock>) {
    let toml = format!("{}\n{ROLLOUT}", settings_toml(&f.dir, &MEMBERS));
    let settings = pgfleet::config::load_str(&toml, "test").unwrap_or_else(|e| panic!("{e}"));
    let clock = Arc::new(ManualClock::new(SystemTime::now()));
    let mut e = Engine::new("r", &settings, f.mgr.fleet.clone(), clock.clone()).unwrap();
    e.tick = Duration::from_millis(100);
    (Arc::new(e), clock)
}

async fn rounds_until(e: &Engine, what: &str, done: impl Fn(&Decision) -> bool) -> Decision {
    eventually_within(Duration::from_secs(180), what, || async {
        let d = e.round().await.map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        match done(&d) {
            true => Ok(d),
            false => Err(d.status.to_string()),
        }
    })
    .await
}

/// (spec.version, status.currentVersion, a major upgrade record exists).
async fn versions(f: &TestFleet, m: &str) -> (String, String, bool) {
    let pg = f.pgc(m, "db").get("app").await.unwrap();
    let st = pg.status.unwrap_or_default();
    let cur = st.current_version.unwrap_or_default();
    (pg.spec.version, cur, st.major_upgrade.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_major_rollout_reports_pre_flight_failures_first_and_halts_in_the_second_stage() {
    let f = TestFleet::start("major-rollout", &MEMBERS).await;
    for m in MEMBERS {
        f.create(m, "db", "app", json!({"clusterSize": 2, "version": "15"}))
            .await;
    }
    for m in MEMBERS {
        f.wait_healthy(m, "db", "app", 2).await;
    }
    // pgcrypto on member-2's primary, the way a client would create it.
    let pg = f.pgc("member-2", "db").get("app").await.unwrap();
    let primary = pg.status.unwrap().current_primary.unwrap();
    let sql = ["query", "CREATE EXTENSION pgcrypto"];
    let timeout = Duration::from_secs(30);
    pgfleet::postgres::exec::run_verb(&f.client("member-2"), "db", &primary, &sql, timeout)
        .await
        .unwrap();

    let (e, clock) = engine(&f);
    // Nothing starts before every cluster answered its pre-flight.
    let first = rounds_until(&e, "the canary started", |d| !d.start.is_empty()).await;
    assert_eq!(first.start.len(), 1, "{:?}", first.start);
    assert_eq!(first.start[0].member, "member-1");
    let obs = e.observe().await;
    let plan = pgfleet::rollout::plan::plan(&e.spec, &obs.members, &obs.pgcs, &estimate());
    let text = plan.to_string();
    println!("{text}");
    assert!(text.contains("method inPlace"), "{text}");
    let line = |m: &str| {
        text.lines()
            .find(|l| l.contains(&format!("{m}/db/app")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line("member-2").contains("pre-flight FAILED"), "{text}");
    assert!(line("member-2").contains("pgcrypto"), "{text}");
    assert!(line("member-3").contains("pre-flight passed"), "{text}");
    for m in ["member-2", "member-3"] {
        assert_eq!(
            versions(&f, m).await.0,
            "15",
            "{m} untouched before its stage"
        );
    }

    // The canary upgrades in place and soaks.
    eventually_within(Duration::from_secs(180), "the canary on 18", || async {
        e.round().await.map_err(|e| e.to_string())?;
        let v = versions(&f, "member-1").await;
        (v.1 == "18" && !v.2).then_some(()).ok_or(format!("{v:?}"))
    })
    .await;
    // Only once the engine itself has seen the canary done (its soak
    // clock starts then) may the manual clock jump past the soak.
    rounds_until(&e, "the canary soaking", |d| {
        matches!(d.status.state, RolloutState::Soaking { .. })
    })
    .await;
    clock.advance(Duration::from_secs(3600));

    // The second stage: member-2 fails on its pre-flight, the budget
    // (max_failures 0) pauses the rollout before member-3 starts.
    let d = rounds_until(&e, "paused", |d| {
        matches!(d.status.state, RolloutState::Paused { .. })
    })
    .await;
    let RolloutState::Paused { reason } = &d.status.state else {
        unreachable!()
    };
    assert!(reason.contains("db/app on member-2"), "{reason}");
    assert!(reason.contains("pgcrypto"), "{reason}");
    println!("halted: {}", d.status);
    let stored = control::read(e.control_home(), "r").await.unwrap();
    assert_eq!(stored.control.state, ControlState::Paused);
    for _ in 0..3 {
        assert!(e.round().await.unwrap().start.is_empty());
    }
    assert_eq!(versions(&f, "member-1").await.1, "18");
    for m in ["member-2", "member-3"] {
        let (spec, cur, record) = versions(&f, m).await;
        assert_eq!(
            (spec.as_str(), cur.as_str(), record),
            ("15", "15", false),
            "{m}"
        );
    }
    f.wait_healthy("member-2", "db", "app", 2).await;
}

fn estimate() -> pgfleet::rollout::plan::Estimate {
    pgfleet::rollout::plan::Estimate {
        per_pgc: Duration::from_secs(60),
    }
}
