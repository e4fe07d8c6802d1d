//! Fleet rollouts (issue 6): three member clusters, thirty PostgresClusters
//! of two instances each (virtual runtime), a rollout engine driven round by
//! round with a manual clock. Outcomes come from the live objects (versions,
//! marks, the stored control) and the recorded Events; nothing is timed.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::fleet;

use fleet::*;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use pgfleet::crd::PostgresCluster;
use pgfleet::platform::clock::ManualClock;
use pgfleet::rollout::engine::Engine;
use pgfleet::rollout::plan::{Decision, RolloutState};
use pgfleet::rollout::{control, marks};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

const MEMBERS: [&str; 3] = ["member-1", "member-2", "member-3"];
const PER_MEMBER: usize = 10;

/// A fleet of 3 × 10 PostgresClusters at 15.18, all Healthy.
async fn fleet(tag: &str) -> TestFleet {
    let f = TestFleet::start(tag, &MEMBERS).await;
    for m in MEMBERS {
        for i in 0..PER_MEMBER {
            let spec = json!({"clusterSize": 2, "version": "15.18", "storage": {"size": "1Gi"}});
            f.create(m, "db", &format!("pg{i:02}"), spec).await;
        }
    }
    for m in MEMBERS {
        for i in 0..PER_MEMBER {
            f.wait_healthy(m, "db", &format!("pg{i:02}"), 2).await;
        }
    }
    f
}

/// An engine for `[rollouts.r]` given as TOML lines, on a manual clock.
/// Member labels come from the test fleet: wave = "0", "1", "2".
fn engine(f: &TestFleet, rollout: &str) -> (Arc<Engine>, Arc<ManualClock>) {
    let toml = format!("{}\n{rollout}", settings_toml(&f.dir, &MEMBERS));
    let settings = pgfleet::config::load_str(&toml, "test").unwrap_or_else(|e| panic!("{e}"));
    let clock = Arc::new(ManualClock::new(SystemTime::now()));
    let mut e = Engine::new("r", &settings, f.mgr.fleet.clone(), clock.clone()).unwrap();
    e.tick = Duration::from_millis(100);
    (Arc::new(e), clock)
}

/// Runs rounds until `done` holds for a decision (no timing asserted).
async fn rounds_until(e: &Engine, what: &str, done: impl Fn(&Decision) -> bool) -> Decision {
    eventually_within(Duration::from_secs(120), what, || async {
        let d = e.round().await.map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        if done(&d) {
            Ok(d)
        } else {
            Err(d.status.to_string())
        }
    })
    .await
}

async fn all_pgcs(f: &TestFleet) -> BTreeMap<String, PostgresCluster> {
    let mut out = BTreeMap::new();
    for m in MEMBERS {
        for pg in f.pgc(m, "db").list(&ListParams::default()).await.unwrap() {
            out.insert(format!("{m}/{}", pg.metadata.name.clone().unwrap()), pg);
        }
    }
    out
}

fn ann<'a>(pg: &'a PostgresCluster, k: &str) -> Option<&'a str> {
    pg.metadata.annotations.as_ref()?.get(k).map(String::as_str)
}

/// Rollout events across the fleet, in the order they were recorded:
/// (time, "member/name", reason, note).
async fn rollout_events(f: &TestFleet) -> Vec<(String, String, String, String)> {
    let mut out = vec![];
    for m in MEMBERS {
        let api: Api<Event> = Api::namespaced(f.client(m), "db");
        for e in api.list(&ListParams::default()).await.unwrap() {
            let reason = e.reason.clone().unwrap_or_default();
            if !reason.starts_with("Rollout") && reason != "SwitchoverStarted" {
                continue;
            }
            let t = e
                .event_time
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            let name = e
                .regarding
                .as_ref()
                .and_then(|r| r.name.clone())
                .unwrap_or_default();
            out.push((t, format!("{m}/{name}"), reason, e.note.unwrap_or_default()));
        }
    }
    out.sort();
    out
}

/// The most PostgresClusters of `stage` in flight at once, from the events.
fn max_in_flight(evs: &[(String, String, String, String)], stage: &str) -> usize {
    let mut in_stage = std::collections::BTreeSet::new();
    let (mut now, mut max) = (0usize, 0usize);
    for (_, who, reason, note) in evs {
        match reason.as_str() {
            "RolloutStarted" if note.contains(&format!("stage {stage}:")) => {
                in_stage.insert(who.clone());
                now += 1;
                max = max.max(now);
            }
            "RolloutSucceeded" | "RolloutFailed" | "RolloutReverted" if in_stage.remove(who) => {
                now -= 1;
            }
            _ => {}
        }
    }
    max
}

const TWO_STAGES: &str = r#"
[rollouts.r]
target_version = "15.20"
progress_deadline = "24h"
[[rollouts.r.stages]]
name = "canary"
clusters = "wave=0"
max_concurrency = 2
soak = "1h"
[[rollouts.r.stages]]
name = "rest"
clusters = "wave!=0"
max_concurrency = "25%"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_goes_first_concurrency_holds_and_soak_is_respected() {
    let f = fleet("rollout-order").await;
    let (e, clock) = engine(&f, TWO_STAGES);
    let d = rounds_until(&e, "the canary stage to finish and soak", |d| {
        matches!(d.status.state, RolloutState::Soaking { .. })
    })
    .await;
    assert_eq!(
        d.wake_after,
        Some(Duration::from_secs(3600)),
        "{}",
        d.status
    );
    // Soaking: a few more rounds start nothing in the next stage.
    for _ in 0..3 {
        let d = e.round().await.unwrap();
        assert!(d.start.is_empty(), "{:?}", d.start);
    }
    let pgcs = all_pgcs(&f).await;
    for (k, pg) in &pgcs {
        if k.starts_with("member-1/") {
            assert_eq!(
                pg.status.as_ref().unwrap().current_version.as_deref(),
                Some("15.20"),
                "{k}"
            );
            assert!(ann(pg, marks::FINISHED).is_some(), "{k}");
        } else {
            assert_eq!(
                pg.spec.version, "15.18",
                "{k} started before the canary soaked"
            );
        }
    }
    clock.advance(Duration::from_secs(3600));
    rounds_until(&e, "the rollout to complete", |d| {
        d.status.state == RolloutState::Completed
    })
    .await;
    for (k, pg) in all_pgcs(&f).await {
        let st = pg.status.unwrap();
        assert_eq!(st.current_version.as_deref(), Some("15.20"), "{k}");
        assert_eq!(st.phase, Some(pgfleet::crd::Phase::Healthy), "{k}");
    }
    let evs = rollout_events(&f).await;
    assert!(max_in_flight(&evs, "canary") <= 2, "{evs:#?}");
    assert_eq!(max_in_flight(&evs, "canary"), 2);
    assert!(max_in_flight(&evs, "rest") <= 5, "{evs:#?}");
    let last_canary = evs
        .iter()
        .filter(|(_, w, r, _)| w.starts_with("member-1/") && r == "RolloutSucceeded")
        .map(|(t, ..)| t.clone())
        .max()
        .unwrap();
    let first_rest = evs
        .iter()
        .filter(|(_, _, r, n)| r == "RolloutStarted" && n.contains("stage rest:"))
        .map(|(t, ..)| t.clone())
        .min()
        .unwrap();
    assert!(first_rest > last_canary, "{evs:#?}");
    // Every PostgresCluster: started once, switched over once.
    for who in all_pgcs(&f).await.keys() {
        let count = |r: &str| {
            evs.iter()
                .filter(|(_, w, rr, _)| w == who && rr == r)
                .count()
        };
        assert_eq!(count("RolloutStarted"), 1, "{who}");
        assert_eq!(count("SwitchoverStarted"), 1, "{who}");
    }
}

const HALTING: &str = r#"
[rollouts.r]
target_version = "15.20"
progress_deadline = "24h"
on_failure = "ON_FAILURE"
[[rollouts.r.stages]]
name = "canary"
clusters = "wave=0"
max_concurrency = 5
[[rollouts.r.stages]]
name = "rest"
clusters = "wave!=0"
max_concurrency = 2
"#;

/// Member-2 cannot pull the new image: its first updates fail.
fn break_member_2(f: &TestFleet) {
    let sim = f.sim_cluster("member-2");
    let mut faults = sim.cluster.faults.get();
    faults.failing_images = vec!["postgres:15.20".into()];
    sim.cluster.faults.set(faults);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_in_the_second_stage_halts_the_rollout_and_names_the_cluster() {
    let f = fleet("rollout-halt").await;
    break_member_2(&f);
    let (e, _clock) = engine(&f, &HALTING.replace("ON_FAILURE", "pause"));
    let d = rounds_until(&e, "the rollout to halt", |d| {
        matches!(d.status.state, RolloutState::Paused { .. })
    })
    .await;
    let RolloutState::Paused { reason } = &d.status.state else {
        unreachable!()
    };
    assert!(reason.contains("db/pg00 on member-2"), "{reason}");
    assert!(reason.contains("ImagePullBackOff"), "{reason}");
    // The halt is stored (a restarted manager sees it) and nothing new starts.
    let stored = control::read(e.control_home(), "r").await.unwrap();
    assert_eq!(
        stored.control.state,
        pgfleet::rollout::plan::ControlState::Paused
    );
    for _ in 0..3 {
        assert!(e.round().await.unwrap().start.is_empty());
    }
    let pgcs = all_pgcs(&f).await;
    let started: Vec<_> = pgcs
        .iter()
        .filter(|(k, pg)| !k.starts_with("member-1/") && ann(pg, marks::ROLLOUT).is_some())
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(
        started.len(),
        2,
        "only the first wave of the stage started: {started:?}"
    );
    assert!(
        pgcs.iter()
            .filter(|(k, _)| k.starts_with("member-3/"))
            .all(|(_, pg)| pg.spec.version == "15.18")
    );
    let evs = rollout_events(&f).await;
    assert!(
        evs.iter().any(|(_, w, r, n)| w.starts_with("member-2/")
            && r == "RolloutFailed"
            && n.contains("ImagePullBackOff")),
        "{evs:#?}"
    );

    // An operator aborts: the in-flight ones go back, the canary stays.
    let s = control::apply(stored, &control::Command::Abort, 0, &[], "test").unwrap();
    control::write(e.control_home(), "r", s).await.unwrap();
    rounds_until(&e, "the aborted in-flight clusters to revert", |d| {
        d.revert.is_empty() && matches!(d.status.state, RolloutState::Aborted { .. })
    })
    .await;
    eventually("reverted clusters back on 15.18 and healthy", || async {
        let pgcs = all_pgcs(&f).await;
        let bad: Vec<String> = pgcs
            .iter()
            .filter(|(k, pg)| {
                let st = pg.status.clone().unwrap_or_default();
                let want = if k.starts_with("member-1/") {
                    "15.20"
                } else {
                    "15.18"
                };
                pg.spec.version != want
                    || st.current_version.as_deref() != Some(want)
                    || st.phase != Some(pgfleet::crd::Phase::Healthy)
            })
            .map(|(k, pg)| {
                format!(
                    "{k}: {} {:?}",
                    pg.spec.version,
                    pg.status.as_ref().map(|s| (&s.phase, &s.current_version))
                )
            })
            .collect();
        if bad.is_empty() {
            Ok(())
        } else {
            Err(format!("{bad:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_returns_every_touched_cluster_to_its_previous_version() {
    let f = fleet("rollout-rollback").await;
    break_member_2(&f);
    let (e, _clock) = engine(&f, &HALTING.replace("ON_FAILURE", "rollback"));
    rounds_until(&e, "the rollback to be decided and carried out", |d| {
        d.status.state == RolloutState::RollingBack && d.revert.is_empty()
    })
    .await;
    eventually("every cluster back on 15.18 and healthy", || async {
        let bad: Vec<String> = all_pgcs(&f)
            .await
            .iter()
            .filter(|(_, pg)| {
                let st = pg.status.clone().unwrap_or_default();
                pg.spec.version != "15.18"
                    || st.current_version.as_deref() != Some("15.18")
                    || st.phase != Some(pgfleet::crd::Phase::Healthy)
            })
            .map(|(k, _)| k.clone())
            .collect();
        if bad.is_empty() {
            Ok(())
        } else {
            Err(format!("{bad:?}"))
        }
    })
    .await;
    let evs = rollout_events(&f).await;
    let reverted = evs
        .iter()
        .filter(|(_, _, r, _)| r == "RolloutReverted")
        .count();
    assert_eq!(
        reverted, 12,
        "5+5 canary and 2 in flight in member-2: {evs:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_engine_resumes_without_redoing_work_or_switching_over_twice() {
    let f = fleet("rollout-restart").await;
    let one_stage = r#"
[rollouts.r]
target_version = "15.20"
progress_deadline = "24h"
[[rollouts.r.stages]]
name = "all"
clusters = ""
max_concurrency = 3
"#;
    let (first, _) = engine(&f, one_stage);
    let task = tokio::spawn(first.clone().run());
    eventually("a third of the fleet finished", || async {
        let n = all_pgcs(&f)
            .await
            .values()
            .filter(|pg| ann(pg, marks::FINISHED).is_some())
            .count();
        if n >= 10 { Ok(()) } else { Err(n) }
    })
    .await;
    // The manager dies mid-stage (its engine with it).
    task.abort();
    let _ = task.await;
    drop(first);
    let at_kill = all_pgcs(&f).await;
    let marked = |k: &str| -> BTreeMap<String, String> {
        at_kill
            .iter()
            .filter_map(|(n, pg)| ann(pg, k).map(|t| (n.clone(), t.to_string())))
            .collect()
    };
    let (before, started_before) = (marked(marks::FINISHED), marked(marks::STARTED));
    let (second, _) = engine(&f, one_stage);
    // In flight as the planner counts it from the durable marks after each
    // round (the Events cannot tell: the first engine may have died before
    // announcing a finish it had recorded).
    let most = std::sync::atomic::AtomicUsize::new(0);
    rounds_until(&second, "the rollout to complete", |d| {
        let now: usize = d.status.stages.iter().map(|s| s.in_flight).sum();
        most.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
        d.status.state == RolloutState::Completed
    })
    .await;
    assert!(
        most.into_inner() <= 3,
        "more than max_concurrency in flight"
    );
    let after = all_pgcs(&f).await;
    for (k, t) in &before {
        assert_eq!(
            ann(&after[k], marks::FINISHED),
            Some(t.as_str()),
            "{k} was redone"
        );
    }
    // The start mark is the durable record: one per cluster, and the
    // second engine rewrote none the first had made.
    for (k, t) in &started_before {
        assert_eq!(
            ann(&after[k], marks::STARTED),
            Some(t.as_str()),
            "{k} was started twice"
        );
    }
    let evs = rollout_events(&f).await;
    for (who, pg) in &after {
        assert!(ann(pg, marks::STARTED).is_some(), "{who} never started");
        let count = |r: &str| {
            evs.iter()
                .filter(|(_, w, rr, _)| w == who && rr == r)
                .count()
        };
        // An Event is best effort: the first engine may die between the
        // start patch and its Event, so a cluster it started may have none.
        // Never two, and always one from the engine that survived.
        let started = count("RolloutStarted");
        match started_before.contains_key(who) {
            true => assert!(started <= 1, "{who}: {evs:#?}"),
            false => assert_eq!(started, 1, "{who}: {evs:#?}"),
        }
        assert_eq!(count("SwitchoverStarted"), 1, "{who}: {evs:#?}");
    }
}

fn cut_off(f: &TestFleet, member: &str, cut: bool) {
    let sim = f.sim_cluster(member);
    let mut faults = sim.cluster.faults.get();
    faults.refuse_connections = cut;
    sim.cluster.faults.set(faults);
}

const UNREACHABLE: &str = r#"
[rollouts.r]
target_version = "15.20"
progress_deadline = "24h"
unreachable = "POLICY"
[[rollouts.r.stages]]
name = "all"
clusters = ""
max_concurrency = "100%"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_and_requeue_defers_an_unreachable_cluster_until_it_is_back() {
    let f = fleet("rollout-skip").await;
    let (e, _) = engine(&f, &UNREACHABLE.replace("POLICY", "skip_and_requeue"));
    // The engine has seen member-2's PostgresClusters before it goes away.
    assert_eq!(e.observe().await.pgcs.len(), 3 * PER_MEMBER);
    cut_off(&f, "member-2", true);
    let d = rounds_until(&e, "the reachable clusters done, member-2 deferred", |d| {
        d.status.stages[0].deferred == PER_MEMBER && d.status.stages[0].done == 2 * PER_MEMBER
    })
    .await;
    assert_ne!(d.status.state, RolloutState::Completed, "{}", d.status);
    cut_off(&f, "member-2", false);
    rounds_until(&e, "the rollout to complete", |d| {
        d.status.state == RolloutState::Completed
    })
    .await;
    for (k, pg) in all_pgcs(&f).await {
        assert_eq!(
            pg.status.unwrap().current_version.as_deref(),
            Some("15.20"),
            "{k}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_as_failure_halts_on_an_unreachable_cluster() {
    let f = fleet("rollout-count").await;
    // Unreachable before this engine ever listed it: its clusters are unknown.
    cut_off(&f, "member-2", true);
    let (e, _) = engine(&f, &UNREACHABLE.replace("POLICY", "count_as_failure"));
    let d = rounds_until(&e, "the rollout to halt", |d| {
        matches!(d.status.state, RolloutState::Paused { .. })
    })
    .await;
    let RolloutState::Paused { reason } = &d.status.state else {
        unreachable!()
    };
    assert!(
        reason.contains("member-2") && reason.contains("unreachable"),
        "{reason}"
    );
    cut_off(&f, "member-2", false);
    for _ in 0..3 {
        assert!(e.round().await.unwrap().start.is_empty());
    }
    for (k, pg) in all_pgcs(&f).await {
        if k.starts_with("member-2/") {
            assert_eq!(pg.spec.version, "15.18", "{k}");
        }
    }
}
