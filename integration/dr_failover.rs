//! Automatic cross-cluster failover with pgfleet as the witness (issue
//! 15), process runtime, real PostgreSQL, the emulator's whole-cluster
//! network faults (`pgfleet::testkit::network`). A writer on the primary
//! side logs every acknowledged commit with its time; the checks are on
//! rows and on that log, never on durations.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::dr::{NS, World, until};
use common::process::connect;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use pgfleet::crd::PostgresCluster;
use pgfleet::testkit::network;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn topology(extra: &str) -> String {
    format!(
        "\n[dr.orders]\nnamespace = \"app\"\nname = \"orders\"\nmembers = [\"dr-a\", \"dr-b\"]\n\
         failover_after = \"8s\"\n{extra}"
    )
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A client of one address writing numbered rows, each in its own
/// transaction, logging the acknowledged ones with the time of the ack.
struct TimedWriter {
    acks: Arc<Mutex<BTreeMap<i64, u64>>>,
    failed: Arc<Mutex<u64>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl TimedWriter {
    fn start(host: String, password: String, first: i64) -> TimedWriter {
        let acks = Arc::new(Mutex::new(BTreeMap::new()));
        let failed = Arc::new(Mutex::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a, f, s) = (acks.clone(), failed.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut next = first;
            let mut conn: Option<tokio_postgres::Client> = None;
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                if conn.as_ref().is_none_or(|c| c.is_closed()) {
                    conn = connect(&host, 5432, &password).await.ok();
                    if conn.is_none() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                }
                let Some(c) = conn.as_ref() else { continue };
                let sql = format!("INSERT INTO marks(id) VALUES ({next})");
                match tokio::time::timeout(Duration::from_secs(5), c.batch_execute(&sql)).await {
                    Ok(Ok(())) => {
                        a.lock().unwrap().insert(next, unix_ms());
                    }
                    _ => {
                        *f.lock().unwrap() += 1;
                        conn = None;
                    }
                }
                next += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        TimedWriter {
            acks,
            failed,
            stop,
            task,
        }
    }

    fn acked(&self) -> usize {
        self.acks.lock().unwrap().len()
    }

    async fn more(&self, n: usize, what: &str) {
        let target = self.acked() + n;
        until(what, || async {
            (self.acked() >= target)
                .then_some(())
                .ok_or(format!("{} of {target} acknowledged", self.acked()))
        })
        .await;
    }

    async fn stop(self) -> (BTreeMap<i64, u64>, u64) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.task.await;
        let acks = self.acks.lock().unwrap().clone();
        let failed = *self.failed.lock().unwrap();
        (acks, failed)
    }
}

/// Each pod of member `m`: name, creation time, restarts, readiness, and
/// the cluster's status (diagnostics for a failure).
async fn pods_of(w: &World, m: &str) -> String {
    let pods = Api::<Pod>::namespaced(w.client(m), NS)
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut out: Vec<String> = pods
        .iter()
        .map(|p| {
            let st = p.status.clone().unwrap_or_default();
            let cs = st.container_statuses.unwrap_or_default();
            format!(
                "{} created {:?} restarts {:?} ready {:?}",
                p.metadata.name.clone().unwrap_or_default(),
                p.metadata.creation_timestamp.as_ref().map(|t| t.0),
                cs.iter().map(|c| c.restart_count).collect::<Vec<_>>(),
                cs.iter().map(|c| c.ready).collect::<Vec<_>>()
            )
        })
        .collect();
    let pg = Api::<PostgresCluster>::namespaced(w.client(m), NS)
        .get("orders")
        .await
        .ok();
    out.push(format!("cluster: {:?}", pg.and_then(|p| p.status)));
    out.join("\n")
}

fn sim(w: &World) -> &pgfleet::sim::Sim {
    w.mgr.sim.as_ref().unwrap()
}

/// Waits until the engine has not reached the primary side for three
/// times `failover_after`: every round in between had the chance to
/// promote.
async fn witness_waited(w: &World) {
    until(
        "the engine silent on dr-a for 3 × failover_after",
        || async {
            let st = w.engine().status();
            (st.primary_silent_ms > 24_000)
                .then_some(())
                .ok_or(format!("{} ms", st.primary_silent_ms))
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_isolated_primary_side_fences_itself_and_the_replica_side_takes_over_losing_nothing() {
    let w = World::start_with("dr-isolate", &topology("synchronous = true\n")).await;
    let (a_primary, b_primary) = w.setup(false).await;
    let (rw, pw) = (w.ip("dr-a", "orders-rw").await, w.password("dr-a").await);
    let writer = TimedWriter::start(rw, pw.clone(), 1);
    writer.more(50, "50 commits on dr-a").await;

    network::isolate(sim(&w), "dr-a").unwrap();
    until("dr-b takes writes", || w.writable("dr-b")).await;
    let Some(forced) = w.engine().status().forced_at_ms else {
        let pg = Api::<PostgresCluster>::namespaced(w.client("dr-b"), NS)
            .get("orders")
            .await
            .ok();
        panic!(
            "dr-b takes writes without a forced promotion: DR {:?}\ndr-b's cluster: {:?}\ndr-b's primary:\n{}",
            w.engine().status(),
            pg.map(|p| (p.metadata.annotations, p.status)),
            w.logs("dr-b", &b_primary).await
        );
    };
    let (acks, _) = writer.stop().await;
    // No commit on the old side was acknowledged once the promotion began.
    let last = acks.values().max().copied().unwrap_or(0);
    assert!(
        last < forced,
        "an ack at {last} after the promotion was written at {forced}"
    );
    // Synchronous: every acknowledged row is on the new primary side.
    let rows = w.rows("dr-b").await.unwrap();
    let lost: Vec<&i64> = acks.keys().filter(|id| !rows.contains(id)).collect();
    assert!(lost.is_empty(), "acknowledged rows lost: {lost:?}");
    // The old primary fenced itself.
    let observer = network::observer_client(sim(&w), "dr-a").await.unwrap();
    let report = pgfleet::postgres::exec::run_verb(
        &observer,
        NS,
        &a_primary,
        &["status"],
        Duration::from_secs(20),
    )
    .await
    .unwrap();
    assert!(report.contains("\"fenced\":true"), "{report}");

    // Healed: dr-a is outvoted, rewinds onto dr-b's timeline and follows.
    network::heal(sim(&w), "dr-a").unwrap();
    let on_b = w.write("dr-b", 20).await;
    let followed =
        pgfleet::testkit::until(Duration::from_secs(240), "dr-a follows dr-b", || async {
            let got = w.rows("dr-a").await?;
            on_b.is_subset(&got).then_some(()).ok_or(format!(
                "{} rows; DR {:?}",
                got.len(),
                w.engine().status()
            ))
        })
        .await;
    let a_replica = if a_primary.ends_with("-1") {
        "orders-2"
    } else {
        "orders-1"
    };
    if let Err(e) = followed {
        panic!(
            "{e}\ndr-a's primary:\n{}\nprevious:\n{}\ndr-a's replica:\n{}\ndr-b's primary:\n{}",
            w.logs("dr-a", &a_primary).await,
            w.logs_of("dr-a", &a_primary, true).await,
            w.logs("dr-a", a_replica).await,
            w.logs("dr-b", &b_primary).await
        );
    }
    assert!(w.writable("dr-a").await.is_err(), "two primary sides");
    let logs = w.logs("dr-a", &a_primary).await;
    if !logs.contains("rewinding to follow") || logs.contains("re-cloning") {
        let b = until("dr-b is Healthy", || w.healthy("dr-b")).await;
        panic!(
            "dr-a was not rewound:\n{logs}\nprevious:\n{}\ndr-a's pods: {}\ndr-a's replica:\n{}\ndr-b's primary:\n{}",
            w.logs_of("dr-a", &a_primary, true).await,
            pods_of(&w, "dr-a").await,
            w.logs("dr-a", a_replica).await,
            w.logs("dr-b", &b).await
        );
    }
    // dr-a's own replica followed its primary on the lost side past the
    // point dr-b forked off (the fenced primary's shutdown checkpoint): it
    // rejoins too, and the rewound instance stayed the designated primary.
    let replica = pgfleet::testkit::until(
        Duration::from_secs(240),
        "dr-a's replica follows",
        || async {
            let got = w.rows_via("dr-a", "orders-ro").await?;
            on_b.is_subset(&got)
                .then_some(())
                .ok_or(format!("{} rows", got.len()))
        },
    )
    .await;
    if let Err(e) = replica {
        panic!(
            "{e}\ndr-a's primary:\n{}\ndr-a's replica:\n{}",
            w.logs("dr-a", &a_primary).await,
            w.logs("dr-a", a_replica).await
        );
    }
    let now = until("dr-a is Healthy", || w.healthy("dr-a")).await;
    assert_eq!(now, a_primary, "dr-a failed over in-cluster");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manager_cut_from_the_primary_side_or_down_neither_fences_nor_promotes() {
    let w = World::start_with("dr-nofence", &topology("")).await;
    w.setup(false).await;
    let (rw, pw) = (w.ip("dr-a", "orders-rw").await, w.password("dr-a").await);
    let writer = TimedWriter::start(rw, pw, 1);
    writer.more(20, "20 commits on dr-a").await;

    // The manager cannot reach dr-a; dr-b still streams from it.
    network::cut_manager(sim(&w), "dr-a").unwrap();
    witness_waited(&w).await;
    writer.more(20, "commits continue on dr-a").await;
    assert_eq!(w.engine().status().epoch, 1, "{:?}", w.engine().status());
    network::heal(sim(&w), "dr-a").unwrap();

    // The manager down: it reaches no member at all (its engine stops).
    // 2000 commits, each followed by a 10 ms pause, outlast the primary
    // side's fence window (4 s) several times over.
    network::cut_manager(sim(&w), "dr-a").unwrap();
    network::cut_manager(sim(&w), "dr-b").unwrap();
    writer
        .more(2000, "commits continue with the manager away")
        .await;
    network::heal(sim(&w), "dr-a").unwrap();
    network::heal(sim(&w), "dr-b").unwrap();
    until("the engine back on both sides", || async {
        let st = w.engine().status();
        (st.primary_silent_ms < 5_000 && st.sides.iter().all(|s| s.reachable))
            .then_some(())
            .ok_or(format!("{st:?}"))
    })
    .await;
    let st = w.engine().status();
    assert_eq!((st.epoch, st.primary.as_str()), (1, "dr-a"), "{st:?}");
    let (_, failed) = writer.stop().await;
    assert_eq!(failed, 0, "writes failed on the primary side");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lag_above_max_rpo_blocks_the_promotion_until_a_person_accepts_the_loss() {
    let w = World::start_with("dr-rpo", &topology("max_rpo_bytes = 4096\n")).await;
    w.setup(false).await;
    let (rw, pw) = (w.ip("dr-a", "orders-rw").await, w.password("dr-a").await);
    let writer = TimedWriter::start(rw, pw, 1);
    // The link between the sides goes first: dr-a keeps taking writes
    // (the manager still reaches it) and dr-b falls behind.
    network::cut_members(sim(&w), "dr-a", &["dr-b"]).unwrap();
    until("dr-b more than 64 KiB behind", || async {
        let st = w.engine().status();
        let lag = st
            .sides
            .iter()
            .find(|s| s.member == "dr-b")
            .and_then(|s| s.lag_bytes);
        lag.filter(|l| *l > 65_536).ok_or(format!("{st:?}"))
    })
    .await;
    network::isolate(sim(&w), "dr-a").unwrap();
    let pgc: Api<PostgresCluster> = Api::namespaced(w.client("dr-b"), NS);
    let why = until("DisasterRecoveryBlocked on dr-b", || async {
        let pg = pgc.get("orders").await.map_err(|e| e.to_string())?;
        let conds = pg.status.map(|s| s.conditions).unwrap_or_default();
        conds
            .iter()
            .find(|c| c.type_ == "DisasterRecoveryBlocked" && c.status == "True")
            .map(|c| c.message.clone())
            .ok_or("no condition yet".to_string())
    })
    .await;
    assert!(why.contains("max_rpo"), "{why}");
    witness_waited(&w).await;
    assert_eq!(w.engine().status().epoch, 1, "promoted despite the lag");
    let refused = w.engine().promote("dr-b", false).await.unwrap_err();
    assert!(
        refused.to_string().contains("--accept-data-loss"),
        "{refused}"
    );
    let next = w.engine().promote("dr-b", true).await.unwrap();
    assert_eq!((next.epoch, next.primary.as_str()), (2, "dr-b"));
    until("dr-b takes writes", || w.writable("dr-b")).await;
    let _ = writer.stop().await;
    let pods: Api<Pod> = Api::namespaced(w.client("dr-b"), NS);
    assert!(
        !pods
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}
