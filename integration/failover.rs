//! Failover and switchover with real PostgreSQL (process runtime), proven by
//! data: the rows a client saw acknowledged are there afterwards, and a
//! switchover through the pooler fails no transaction.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::process as env;

use env::{Env, NS, Writer, connect, rows};
use std::time::Duration;

async fn one_primary(e: &Env, cluster: &str) -> String {
    let mut primaries = vec![];
    for p in e.pods().list(&Default::default()).await.unwrap() {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        if labels.get("pgfleet.io/cluster").map(String::as_str) == Some(cluster)
            && labels.get("pgfleet.io/kind").map(String::as_str) == Some("instance")
            && labels.get("pgfleet.io/role").map(String::as_str) == Some("primary")
        {
            primaries.push(p.metadata.name.unwrap());
        }
    }
    assert_eq!(
        primaries.len(),
        1,
        "exactly one pod labelled primary, got {primaries:?}"
    );
    primaries.remove(0)
}

/// The primary dies (its pod is force-deleted: every process SIGKILLed) under
/// a client writing numbered rows with synchronous replication: a new
/// primary takes writes through -rw and no acknowledged row is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_primary_fails_over_without_losing_acknowledged_writes() {
    let e = Env::start("fo-sync").await;
    e.create(
        "ha",
        serde_json::json!({"clusterSize": 3, "version": "15", "failoverDelay": "2s",
        "synchronous": {"mode": "quorum", "number": 1}}),
    )
    .await;
    let old = e.wait_healthy("ha", 3).await;
    let (rw, pw) = e.setup_table("ha").await;
    let w = Writer::start(rw.clone(), 5432, pw.clone());
    e.wait_acked(&w, 50).await;
    e.force_delete_pod(&old).await;
    e.wait("a new primary", Duration::from_secs(60), || async {
        e.status("ha")
            .await
            .current_primary
            .is_some_and(|p| p != old)
    })
    .await;
    e.wait_acked(&w, 50).await;
    let (acked, failed) = w.stop().await;
    let present = rows(&rw, &pw).await;
    let lost: Vec<_> = acked.difference(&present).collect();
    assert!(
        lost.is_empty(),
        "acknowledged rows lost: {lost:?} (failed transactions: {failed})"
    );
    let new = one_primary(&e, "ha").await;
    assert_ne!(new, old);
    let st = e.status("ha").await;
    let lf = st.last_failover.expect("lastFailover recorded");
    assert_eq!(
        (lf.from.as_str(), lf.to.as_str()),
        (old.as_str(), new.as_str())
    );
    assert!(lf.detected_at.is_some() && lf.promoted_at.is_some() && lf.rewired_at.is_some());
    failover_events_in_kubectl(&e, "ha", &old, &new).await;
    // The old primary comes back as a replica of the new timeline.
    e.wait(
        "old primary back as a ready replica",
        Duration::from_secs(120),
        || async {
            e.role_of(&old).await.as_deref() == Some("replica") && e.wait_ready(&old).await
        },
    )
    .await;
    // ... by pg_rewind, not by a new copy of the whole database.
    let logs = e.kubectl(&["logs", &old]);
    assert!(
        logs.contains("rewinding to follow") && !logs.contains("re-cloning"),
        "the old primary was not rewound:\n{logs}"
    );
    eprintln!(
        "acked {} rows, {failed} failed transactions during failover",
        acked.len()
    );
}

/// `kubectl describe pgc` and `kubectl events --for` list the failover's
/// Events (FailoverStarted, FailedOver) as on a real cluster.
async fn failover_events_in_kubectl(e: &Env, cluster: &str, old: &str, new: &str) {
    let started = format!("primary {old} lost; promoting {new}");
    e.wait(
        "failover Events in kubectl describe",
        Duration::from_secs(60),
        || async {
            let d = e.kubectl(&["describe", "pgc", cluster]);
            let events = d.split("Events:").nth(1).unwrap_or_default().to_string();
            events.contains("FailoverStarted")
                && events.contains(&started)
                && events.contains("FailedOver")
                && events.contains(&format!("{new} promoted (was {old})"))
        },
    )
    .await;
    let listed = e.kubectl(&["events", "--for", &format!("pgc/{cluster}")]);
    assert!(
        listed.contains("FailoverStarted") && listed.contains("FailedOver"),
        "{listed}"
    );
}

/// A replica held back (its WAL receiver stopped) is not promoted: the most
/// advanced one is, and it has every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_most_advanced_replica_wins() {
    let e = Env::start("fo-adv").await;
    e.create(
        "adv",
        serde_json::json!({"clusterSize": 3, "version": "15", "failoverDelay": "2s"}),
    )
    .await;
    let old = e.wait_healthy("adv", 3).await;
    let (rw, pw) = e.setup_table("adv").await;
    let replicas: Vec<String> = (1..=3)
        .map(|i| format!("adv-{i}"))
        .filter(|n| *n != old)
        .collect();
    let (held, ahead) = (replicas[0].clone(), replicas[1].clone());
    let held_ip = e
        .pods()
        .get(&held)
        .await
        .unwrap()
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    let c = connect(&held_ip, 5432, &pw).await.unwrap();
    c.batch_execute("ALTER SYSTEM SET primary_conninfo = ''")
        .await
        .unwrap();
    c.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    let w = Writer::start(rw.clone(), 5432, pw.clone());
    e.wait_acked(&w, 100).await;
    let (acked, _) = w.stop().await;
    e.force_delete_pod(&old).await;
    e.wait("failover", Duration::from_secs(60), || async {
        e.status("adv")
            .await
            .current_primary
            .is_some_and(|p| p != old)
    })
    .await;
    assert_eq!(
        e.status("adv").await.current_primary.as_deref(),
        Some(ahead.as_str()),
        "{held} was held back"
    );
    let present = rows(&rw, &pw).await;
    assert!(
        acked.is_subset(&present),
        "rows missing on the promoted replica"
    );
}

/// A frozen primary (SIGSTOP) is failed over after failoverDelay; once it
/// thaws it never takes writes through -rw again, and rejoins as a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_primary_is_replaced_and_rejoins_as_replica() {
    let e = Env::start("fo-frozen").await;
    e.create(
        "fz",
        serde_json::json!({"clusterSize": 2, "version": "15", "failoverDelay": "3s"}),
    )
    .await;
    let old = e.wait_healthy("fz", 2).await;
    let (rw, pw) = e.setup_table("fz").await;
    e.wait_replicated("fz", &pw).await;
    e.runtime().freeze(NS, &old).unwrap();
    e.wait(
        "failover away from the frozen primary",
        Duration::from_secs(90),
        || async {
            e.status("fz")
                .await
                .current_primary
                .is_some_and(|p| p != old)
        },
    )
    .await;
    let _ = e.runtime().thaw(NS, &old);
    let c = connect(&rw, 5432, &pw).await.unwrap();
    c.batch_execute("INSERT INTO marks VALUES (424242)")
        .await
        .unwrap();
    let in_recovery: bool = c
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!in_recovery, "-rw must reach a primary");
    e.wait(
        "old primary rejoined as replica",
        Duration::from_secs(120),
        || async {
            e.role_of(&old).await.as_deref() == Some("replica") && e.wait_ready(&old).await
        },
    )
    .await;
    let ip = e
        .pods()
        .get(&old)
        .await
        .unwrap()
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    let oc = connect(&ip, 5432, &pw).await.unwrap();
    let rec: bool = oc
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(rec, "the thawed old primary must run as a replica");
    assert_eq!(
        one_primary(&e, "fz").await,
        e.status("fz").await.current_primary.unwrap()
    );
}

/// Switchover through the pooler under a writing client: zero failed
/// transactions. Without the pooler the same switchover, requested at once,
/// completes too (issue 20: it used to abort, its target not streaming) and
/// its failures are reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn switchover_through_the_pooler_fails_no_transaction() {
    let e = Env::start("so").await;
    e.create(
        "so",
        serde_json::json!({"clusterSize": 2, "version": "15", "enableSuperuserAccess": true,
        "pooler": {"enabled": true, "instances": 1}}),
    )
    .await;
    let old = e.wait_healthy("so", 2).await;
    let (rw, pw) = e.setup_table("so").await;
    // Through the pooler as the application: it logs no superuser in.
    let (pooler, app_pw) = e.pooled_app("so", &rw, &pw).await;
    assert!(
        connect(&pooler, 6432, &pw).await.is_err(),
        "the superuser logged in through the pooler"
    );
    let w = Writer::start_as(pooler.clone(), 6432, "app", app_pw.clone());
    e.wait_acked(&w, 50).await;
    let before = *w.failed.lock().unwrap();
    e.pgc()
        .patch(
            "so",
            &Default::default(),
            &kube::api::Patch::Merge(&serde_json::json!(
            {"metadata": {"annotations": {"pgfleet.io/switchover-to": "auto"}}})),
        )
        .await
        .unwrap();
    e.wait("switchover done", Duration::from_secs(90), || async {
        let st = e.status("so").await;
        st.switchover.is_none() && st.current_primary.is_some_and(|p| p != old)
    })
    .await;
    e.wait_acked(&w, 50).await;
    let (acked, failed) = w.stop().await;
    assert_eq!(
        failed - before,
        0,
        "transactions failed during a pooled switchover"
    );
    let present = rows(&rw, &pw).await;
    assert!(acked.is_subset(&present));
    let stall = e
        .status("so")
        .await
        .last_switchover
        .and_then(|s| s.stall_ms);
    eprintln!("pooled switchover: 0 failed transactions, write stall {stall:?} ms");

    // Without the pooler: same switchover, clients on -rw, requested as soon
    // as the old primary is a ready standby, which is before its WAL
    // receiver streams again (it failed to connect while -rw had no
    // endpoint and waits out wal_retrieve_retry_interval): the switchover
    // must wait for it to stream rather than demote into a dead end.
    e.wait_healthy("so", 2).await;
    // The new writer numbers from 1 again: start from an empty table (the
    // first writer's rows were checked above).
    connect(&rw, 5432, &pw)
        .await
        .unwrap()
        .batch_execute("TRUNCATE marks")
        .await
        .unwrap();
    let w = Writer::start(rw.clone(), 5432, pw.clone());
    let before = *w.failed.lock().unwrap();
    let cur = e.status("so").await.current_primary.unwrap();
    e.pgc()
        .patch(
            "so",
            &Default::default(),
            &kube::api::Patch::Merge(&serde_json::json!(
            {"metadata": {"annotations": {"pgfleet.io/switchover-to": "auto"}}})),
        )
        .await
        .unwrap();
    // The old primary of the pooled switchover streams again, so this one
    // completes (it used to abort: issue 20). Exactly one primary serves
    // -rw and no acknowledged row is lost.
    let start = std::time::Instant::now();
    loop {
        let st = e.status("so").await;
        if st.switchover.is_none() && st.current_primary.as_ref().is_some_and(|p| *p != cur) {
            break;
        }
        if start.elapsed() > Duration::from_secs(120) || aborted(&e).await {
            dump(&e, &["so-1", "so-2"]).await;
            panic!("second switchover did not complete: {st:#?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    e.wait_acked(&w, 50).await;
    let (acked, failed) = w.stop().await;
    assert!(
        acked.is_subset(&rows(&rw, &pw).await),
        "acknowledged rows lost"
    );
    assert_eq!(
        one_primary(&e, "so").await,
        e.status("so").await.current_primary.unwrap()
    );
    eprintln!(
        "switchover without the pooler: completed, {} failed transactions",
        failed - before
    );
}

/// Whether a `SwitchoverAborted` Event was recorded.
async fn aborted(e: &Env) -> bool {
    kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(e.client.clone(), NS)
        .list(&Default::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .any(|ev| ev.reason.as_deref() == Some("SwitchoverAborted"))
        })
        .unwrap_or(false)
}

/// Events and the instances' recent logs, for a failure message.
async fn dump(e: &Env, pods: &[&str]) {
    let evs = kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(e.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap();
    let notes: Vec<String> = evs
        .items
        .iter()
        .map(|ev| format!("{:?}: {:?}", ev.reason, ev.note))
        .collect();
    eprintln!("events: {notes:#?}");
    for pod in pods {
        let lp = kube::api::LogParams {
            tail_lines: Some(40),
            ..Default::default()
        };
        eprintln!(
            "--- {pod}\n{}",
            e.pods().logs(pod, &lp).await.unwrap_or_default()
        );
    }
}

/// A rolling upgrade (version change) under a client writing through the
/// pooler: replicas restart one at a time, one switchover through PgBouncer's
/// PAUSE/RESUME, then the old primary. No transaction fails, every
/// acknowledged row is there, every instance runs the new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_upgrade_through_the_pooler_fails_no_transaction() {
    let e = Env::start("roll").await;
    e.create(
        "roll",
        serde_json::json!({"clusterSize": 3, "version": "15.17", "enableSuperuserAccess": true,
            "pooler": {"enabled": true, "instances": 1}}),
    )
    .await;
    let old = e.wait_healthy("roll", 3).await;
    let (rw, pw) = e.setup_table("roll").await;
    let (pooler, app_pw) = e.pooled_app("roll", &rw, &pw).await;
    let w = Writer::start_as(pooler.clone(), 6432, "app", app_pw.clone());
    e.wait_acked(&w, 50).await;
    let before = *w.failed.lock().unwrap();
    e.pgc()
        .patch(
            "roll",
            &Default::default(),
            &kube::api::Patch::Merge(&serde_json::json!({"spec": {"version": "15.18"}})),
        )
        .await
        .unwrap();
    e.wait(
        "every instance on 15.18",
        Duration::from_secs(300),
        || async {
            let st = e.status("roll").await;
            st.rolling_update.is_none()
                && st.phase == Some(pgfleet::crd::Phase::Healthy)
                && st.instances.len() == 3
                && st
                    .instances
                    .iter()
                    .all(|i| i.version.as_deref() == Some("15.18") && i.ready)
        },
    )
    .await;
    e.wait_acked(&w, 50).await;
    let (acked, failed) = w.stop().await;
    let st = e.status("roll").await;
    assert_eq!(
        failed - before,
        0,
        "transactions failed during the rolling upgrade"
    );
    assert_ne!(st.current_primary.as_deref(), Some(old.as_str()));
    let present = rows(&rw, &pw).await;
    let lost: Vec<_> = acked.difference(&present).collect();
    assert!(lost.is_empty(), "acknowledged rows lost: {lost:?}");
    eprintln!(
        "rolling upgrade through the pooler: {} writes, 0 failed, switchover stall {:?} ms",
        acked.len(),
        st.last_switchover.and_then(|s| s.stall_ms)
    );
    one_primary(&e, "roll").await;
}

/// A replica whose WAL receiver stops (its primary_conninfo emptied) is made
/// visible: after the grace period the condition `ReplicasStreaming` turns
/// False naming it, a Warning Event `ReplicaNotStreaming` is recorded and
/// `pgfleet_replica_streaming` is 0 for it; once it streams again the
/// condition is True and the gauge 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_not_streaming_is_a_condition_an_event_and_a_metric() {
    let e = Env::start("fo-stream").await;
    e.create("st", serde_json::json!({"clusterSize": 2, "version": "15"}))
        .await;
    let primary = e.wait_healthy("st", 2).await;
    let (_, pw) = e.setup_table("st").await;
    let replica = if primary == "st-1" { "st-2" } else { "st-1" };
    let gauge = |v: u8| {
        format!(
            "pgfleet_replica_streaming{{cluster=\"pg-a\",namespace=\"{NS}\",name=\"st\",instance=\"{replica}\"}} {v}"
        )
    };
    let cond = |st: &pgfleet::crd::PostgresClusterStatus| {
        st.conditions
            .iter()
            .find(|c| c.type_ == "ReplicasStreaming")
            .map(|c| (c.status.clone(), c.message.clone()))
    };
    e.wait(
        "the replica reported streaming",
        Duration::from_secs(120),
        || async {
            cond(&e.status("st").await).is_some_and(|(s, _)| s == "True")
                && pgfleet::metrics::encode().contains(&gauge(1))
        },
    )
    .await;
    let ip = e
        .pods()
        .get(replica)
        .await
        .unwrap()
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    let c = connect(&ip, 5432, &pw).await.unwrap();
    c.batch_execute("ALTER SYSTEM SET primary_conninfo = ''")
        .await
        .unwrap();
    c.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    e.wait(
        "ReplicasStreaming=False naming the replica",
        Duration::from_secs(180),
        || async {
            cond(&e.status("st").await).is_some_and(|(s, m)| s == "False" && m.contains(replica))
        },
    )
    .await;
    assert!(
        pgfleet::metrics::encode().contains(&gauge(0)),
        "{}",
        pgfleet::metrics::encode()
    );
    let evs = kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(e.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        evs.items
            .iter()
            .any(|ev| ev.reason.as_deref() == Some("ReplicaNotStreaming")
                && ev.type_.as_deref() == Some("Warning")
                && ev.note.as_deref().is_some_and(|n| n.contains(replica))),
        "no ReplicaNotStreaming Warning Event"
    );
    c.batch_execute("ALTER SYSTEM RESET primary_conninfo")
        .await
        .unwrap();
    c.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    e.wait(
        "ReplicasStreaming=True again",
        Duration::from_secs(180),
        || async {
            cond(&e.status("st").await).is_some_and(|(s, _)| s == "True")
                && pgfleet::metrics::encode().contains(&gauge(1))
        },
    )
    .await;
}
