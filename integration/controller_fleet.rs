//! Acceptance tests of the fleet side of the controller (issue 3): many
//! member clusters managed at once by one pgfleet manager, and a member made
//! unreachable by fault injection that neither stalls the others nor misses
//! what changed while it was gone.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::fleet;

use fleet::*;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use pgfleet::crd::PostgresCluster;
use pgfleet::fleet::ConnState;
use pgfleet::sim::cluster::{Sub, WriteOpts};
use pgfleet::sim::faults::FaultSpec;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

fn spec(size: u32) -> serde_json::Value {
    json!({"clusterSize": size, "version": "15.20"})
}

/// Waits until every PostgresCluster of `member` is Healthy with its
/// status up to date, and there are `count` of them.
async fn wait_all_healthy(f: &TestFleet, member: &str, count: usize, patience: Duration) {
    let api: Api<PostgresCluster> = Api::all(f.client(member));
    eventually_within(
        patience,
        &format!("{count} Healthy PostgresClusters in {member}"),
        || {
            let api = api.clone();
            async move {
                let list = api
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let not: BTreeMap<String, String> = list
                    .items
                    .iter()
                    .filter_map(|pg| {
                        let st = pg.status.clone().unwrap_or_default();
                        let ok = st.phase == Some(pgfleet::crd::Phase::Healthy)
                            && st.ready_instances == pg.spec.cluster_size
                            && st.observed_generation == pg.metadata.generation;
                        (!ok).then(|| {
                            (
                                format!("{}/{}", pg.namespace().unwrap_or_default(), pg.name_any()),
                                format!(
                                    "{:?} {}/{}",
                                    st.phase, st.ready_instances, pg.spec.cluster_size
                                ),
                            )
                        })
                    })
                    .collect();
                if list.items.len() == count && not.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "{} objects, not healthy: {not:?}",
                        list.items.len()
                    ))
                }
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_clusters_times_twenty_postgres_clusters_converge() {
    let members = ["east", "west", "north"];
    let f = TestFleet::start("fleet", &members).await;
    for m in members {
        for i in 0..20u32 {
            let ns = format!("team-{}", i % 4);
            f.create(m, &ns, &format!("db-{i}"), spec(1 + i % 3)).await;
        }
    }
    for m in members {
        wait_all_healthy(&f, m, 20, Duration::from_secs(180)).await;
    }
    // The manager routes by hash on its side: a tenant's object is not
    // written to for the manager's bookkeeping (no shard label), and the
    // manager's own summary (from its caches) agrees.
    for m in members {
        let all = f.pgc_all(m).list(&ListParams::default()).await.unwrap();
        for pg in &all.items {
            assert_eq!(
                pg.labels().get("pgfleet.io/shard"),
                None,
                "{}",
                pg.name_any()
            );
        }
    }
    eventually("the fleet summary to report 60/60 healthy", || {
        let line = f.mgr.summary();
        async move {
            if line.contains("clusters ready 3/3") && line.contains("healthy 60/60") {
                Ok(())
            } else {
                Err(line)
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_member_is_reported_and_catches_up_without_stalling_the_others() {
    let members = ["alpha", "beta", "gamma"];
    let f = TestFleet::start("unreachable", &members).await;
    for m in members {
        f.create(m, "shop", "orders", spec(2)).await;
    }
    for m in members {
        f.wait_healthy(m, "shop", "orders", 2).await;
    }
    let member = |name: &str| f.mgr.fleet.get(name).unwrap().clone();
    for m in members {
        eventually(&format!("{m} Ready"), || {
            let s = member(m).state();
            async move {
                if s == ConnState::Ready {
                    Ok(())
                } else {
                    Err(format!("{s:?}"))
                }
            }
        })
        .await;
    }

    // gamma goes away.
    let gamma = f.sim_cluster("gamma").cluster.clone();
    gamma.faults.set(FaultSpec {
        refuse_connections: true,
        ..Default::default()
    });
    eventually("gamma reported Unreachable", || {
        let s = member("gamma").state();
        async move {
            if matches!(s, ConnState::Unreachable { .. }) {
                Ok(())
            } else {
                Err(format!("{s:?}"))
            }
        }
    })
    .await;

    // While it is gone, work in the others goes on: new clusters converge
    // and an existing one scales.
    for m in ["alpha", "beta"] {
        for i in 0..3 {
            f.create(m, "shop", &format!("new-{i}"), spec(2)).await;
        }
        f.patch(m, "shop", "orders", json!({"spec": {"clusterSize": 3}}))
            .await;
    }
    // Meanwhile gamma changes behind the manager's back (through the
    // embedded server itself, which the manager cannot reach): a new
    // PostgresCluster appears and the existing one is scaled.
    let rt = gamma
        .registry()
        .get("pgfleet.io", "v1", "postgresclusters")
        .cloned()
        .unwrap();
    let opts = WriteOpts {
        field_manager: "test".into(),
        ..Default::default()
    };
    gamma
        .create(
            &rt,
            "shop",
            json!({"apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
                   "metadata": {"name": "born-offline", "namespace": "shop"},
                   "spec": spec(2)}),
            &opts,
        )
        .unwrap();
    gamma
        .write(&rt, "shop", "orders", Sub::Main, &opts, false, |cur| {
            let mut v = cur.cloned().unwrap();
            v["spec"]["clusterSize"] = json!(3);
            Ok(v)
        })
        .unwrap();
    for m in ["alpha", "beta"] {
        wait_all_healthy(&f, m, 4, Duration::from_secs(90)).await;
        f.wait_healthy(m, "shop", "orders", 3).await;
    }
    assert!(
        matches!(member("gamma").state(), ConnState::Unreachable { .. }),
        "gamma stayed unreachable while the others converged: {:?}",
        member("gamma").state()
    );
    for m in ["alpha", "beta"] {
        assert_eq!(member(m).state(), ConnState::Ready, "{m}");
    }
    let line = f.mgr.summary();
    assert!(line.contains("gamma Unreachable"), "{line}");

    // gamma comes back: Ready again, and it catches up.
    gamma.faults.clear();
    eventually("gamma Ready again", || {
        let s = member("gamma").state();
        async move {
            if s == ConnState::Ready {
                Ok(())
            } else {
                Err(format!("{s:?}"))
            }
        }
    })
    .await;
    f.wait_healthy("gamma", "shop", "born-offline", 2).await;
    f.wait_healthy("gamma", "shop", "orders", 3).await;
    // And it is managed as before: a change made now is applied.
    f.patch(
        "gamma",
        "shop",
        "orders",
        json!({"spec": {"clusterSize": 1}}),
    )
    .await;
    f.wait_healthy("gamma", "shop", "orders", 1).await;
    f.create("gamma", "shop", "after", spec(1)).await;
    wait_all_healthy(&f, "gamma", 3, Duration::from_secs(90)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_kubeconfig_file_is_followed_by_the_controllers() {
    let f = TestFleet::start("kubeconfig", &["mover"]).await;
    f.create("mover", "shop", "before", spec(1)).await;
    f.wait_healthy("mover", "shop", "before", 1).await;

    // The member's control plane moves to a new address (restored from a
    // snapshot: same objects and resource versions, new port and CA), the
    // kubeconfig file is rewritten, and the old address goes dark.
    let old = f.sim_cluster("mover");
    let dir = temp_dir("moved");
    pgfleet::sim::persist::save_now(&old.cluster, &dir, old.addr.port(), &old.token).unwrap();
    let moved = pgfleet::sim::start(&pgfleet::sim::SimOptions {
        dir: dir.clone(),
        names: vec!["mover".into()],
        runtime: pgfleet::emulated::virtual_runtime(),
        persist: true,
        history: 10_000,
        admin: false,
        images: vec![],
        run_as: None,
        nodes: Default::default(),
    })
    .await
    .unwrap();
    assert_ne!(moved.clusters[0].addr, old.addr);
    old.cluster.faults.set(FaultSpec {
        refuse_connections: true,
        ..Default::default()
    });
    let text = std::fs::read(&moved.clusters[0].kubeconfig).unwrap();
    let path = f.kubeconfig("mover");
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();

    // The manager follows: Ready again (probing the new address), and the
    // controllers reconcile what changes there.
    let target = client_from(&moved.clusters[0].kubeconfig).await;
    Api::<PostgresCluster>::namespaced(target.clone(), "shop")
        .create(&Default::default(), &pgc_object("after", spec(2)))
        .await
        .unwrap();
    let member = f.mgr.fleet.get("mover").unwrap().clone();
    let api = Api::<PostgresCluster>::namespaced(target.clone(), "shop");
    eventually(
        "the PostgresCluster created at the new address to become Healthy",
        || {
            let (api, member) = (api.clone(), member.clone());
            async move {
                let pg = api.get("after").await.map_err(|e| e.to_string())?;
                let st = pg.status.clone().unwrap_or_default();
                if st.phase == Some(pgfleet::crd::Phase::Healthy) && st.ready_instances == 2 {
                    Ok(())
                } else {
                    Err(format!("member {:?}, status {st:?}", member.state()))
                }
            }
        },
    )
    .await;
    assert_eq!(member.state(), ConnState::Ready);
    drop(moved);
    let _ = std::fs::remove_dir_all(dir);
}

/// A restore from a member cluster the fleet does not have is refused with
/// a condition and an Event naming it, before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_from_an_unknown_member_cluster_is_invalid_and_creates_nothing() {
    let f = TestFleet::start("restore-unknown-member", &["alpha"]).await;
    let mut s = spec(1);
    s["bootstrap"] = json!({"fromBackup": {"cluster": "src", "memberCluster": "nowhere"}});
    f.create("alpha", "db", "copy", s).await;
    let api = f.pgc("alpha", "db");
    let invalid = |pg: &PostgresCluster| {
        pg.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Invalid"))
            .map(|c| (c.status.clone(), c.message.clone()))
    };
    eventually("Invalid=True naming the member", || async {
        let pg = api.get("copy").await.map_err(|e| e.to_string())?;
        match invalid(&pg) {
            Some((st, msg)) if st == "True" && msg.contains("nowhere is not a member cluster") => {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let kids = child_names(&f.client("alpha"), "db", "copy").await;
    assert!(kids.pods.is_empty() && kids.pvcs.is_empty(), "{kids:?}");
    // The events say it once, as for any invalid spec.
    let evs = events_about(&f.client("alpha"), "db", "copy").await;
    assert!(
        evs.iter()
            .any(|(r, n)| r == "InvalidSpec" && n.contains("nowhere")),
        "{evs:?}"
    );
}
