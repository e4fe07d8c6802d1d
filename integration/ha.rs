//! HA replicas: two managers share three member clusters through the
//! ownership Leases. Each member is reconciled by exactly one of them; a
//! dead replica's members move to the survivor; a replica cut off from one
//! cluster loses just that one, and healing does not move it back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "ha_env.rs"]
mod env;

use env::fleet::{eventually, eventually_within};
use env::{Env, LEASE, MEMBERS, Proxy, settled, takeover_patience};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

fn ids<'a>(owners: &'a BTreeMap<String, String>, id: &str) -> Vec<&'a str> {
    owners
        .iter()
        .filter(|(_, o)| o.as_str() == id)
        .map(|(m, _)| m.as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_member_is_reconciled_by_exactly_one_of_two_managers() {
    let env = Env::start("ha-split").await;
    let none = BTreeMap::new();
    let (m1, m2) = tokio::join!(env.manager("m1", &none), env.manager("m2", &none));
    let both = [("m1", &m1), ("m2", &m2)];
    let owners = eventually("every member owned by exactly one manager", || {
        settled(&env, &both)
    })
    .await;
    env.crds_served().await;
    for m in MEMBERS {
        env.create_pgc(m, &format!("pg-{m}")).await;
    }
    for m in MEMBERS {
        let name = format!("pg-{m}");
        eventually(&format!("{name} healthy"), || env.healthy(m, &name)).await;
    }
    // Ownership did not move while they converged: nobody took anything over.
    assert_eq!(settled(&env, &both).await.unwrap(), owners);
    for m in MEMBERS {
        assert_eq!(env.lease(m).await.unwrap().1, 0, "transitions in {m}");
        let owner = &owners[m];
        for (id, mgr) in both {
            let n = mgr.ha.ownership.reconciles(m);
            if id == owner {
                assert!(n > 0, "{id} owns {m} but never reconciled it");
            } else {
                assert_eq!(n, 0, "{id} reconciled {m}, which {owner} owns");
                assert!(!mgr.controllers().iter().any(|h| h.member.name == m));
            }
        }
    }
    // Both replicas come to see the same owners (a loser of the first race
    // learns the winner on its next read).
    for (id, mgr) in both {
        eventually(&format!("{id} sees the owners"), || async {
            let seen: BTreeMap<String, String> = mgr
                .ownership()
                .into_iter()
                .map(|o| (o.member, o.owner.unwrap_or_default()))
                .collect();
            if seen == owners {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_survivor_takes_over_a_dead_managers_members() {
    let env = Env::start("ha-kill").await;
    let none = BTreeMap::new();
    let (m1, m2) = tokio::join!(env.manager("m1", &none), env.manager("m2", &none));
    let both = [("m1", &m1), ("m2", &m2)];
    let owners = eventually("every member owned by exactly one manager", || {
        settled(&env, &both)
    })
    .await;
    env.crds_served().await;
    // Kill the one that owns more (at least two of three): no release.
    let (victim, survivor, sid) = if ids(&owners, "m1").len() >= 2 {
        (m1, m2, "m2")
    } else {
        (m2, m1, "m1")
    };
    let foreign: Vec<String> = MEMBERS
        .iter()
        .filter(|m| owners[**m] != sid)
        .map(|m| m.to_string())
        .collect();
    drop(victim);
    let alone = [(sid, &survivor)];
    eventually_within(
        takeover_patience(),
        "the survivor owns every member",
        || settled(&env, &alone),
    )
    .await;
    for m in &foreign {
        assert_eq!(env.lease(m).await.unwrap().1, 1, "one transition in {m}");
        env.create_pgc(m, "after").await;
    }
    for m in &foreign {
        eventually(&format!("{m}/after healthy under {sid}"), || {
            env.healthy(m, "after")
        })
        .await;
        assert!(survivor.ha.ownership.reconciles(m) > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_graceful_stop_hands_the_members_over_without_waiting_them_out() {
    let env = Env::start("ha-release").await;
    let none = BTreeMap::new();
    let first = env.manager("m1", &none).await;
    // Started alone on a free fleet: it owns everything at once.
    assert_eq!(
        settled(&env, &[("m1", &first)]).await.unwrap().len(),
        MEMBERS.len()
    );
    let second = env.manager("m2", &none).await;
    first.release().await;
    for m in MEMBERS {
        let (holder, _) = env.lease(m).await.unwrap();
        assert_ne!(holder.as_deref(), Some("m1"), "{m} still held by m1");
    }
    let alone = [("m2", &second)];
    eventually_within(takeover_patience(), "m2 owns every member", || {
        settled(&env, &alone)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manager_cut_off_from_one_cluster_loses_only_that_one_and_it_does_not_flap_back() {
    let env = Env::start("ha-cut").await;
    let cut = "b";
    let proxy = Proxy::start(env.sim.get(cut).unwrap().addr).await;
    let via = BTreeMap::from([(cut.to_string(), env.kubeconfig_via(cut, proxy.addr))]);
    // m1 first, alone: it owns all three; m2 stands by.
    let m1 = env.manager("m1", &via).await;
    let m2 = env.manager("m2", &BTreeMap::new()).await;
    let both = [("m1", &m1), ("m2", &m2)];
    let owners = eventually("m1 owns every member", || async {
        let o = settled(&env, &both).await?;
        if ids(&o, "m1").len() == MEMBERS.len() {
            Ok(o)
        } else {
            Err(format!("{o:?}"))
        }
    })
    .await;
    assert_eq!(owners.len(), 3);
    env.crds_served().await;

    // Sampled all along the takeover: the cut-off holder stops (renew
    // deadline) before the other may start (lease duration).
    let double = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (o1, o2, d) = (
            m1.ha.ownership.clone(),
            m2.ha.ownership.clone(),
            double.clone(),
        );
        tokio::spawn(async move {
            loop {
                if o1.owns(cut) && o2.owns(cut) {
                    d.store(true, Ordering::SeqCst);
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
    };
    proxy.cut();
    let after = eventually_within(
        takeover_patience(),
        "b owned by m2, a and c by m1",
        || async {
            let o = settled(&env, &both).await?;
            let want = BTreeMap::from([
                ("a".to_string(), "m1".to_string()),
                ("b".to_string(), "m2".to_string()),
                ("c".to_string(), "m1".to_string()),
            ]);
            if o == want {
                Ok(o)
            } else {
                Err(format!("{o:?}"))
            }
        },
    )
    .await;
    sampler.abort();
    assert!(
        !double.load(Ordering::SeqCst),
        "both managers owned b at once"
    );
    let transitions = env.lease(cut).await.unwrap().1;
    env.create_pgc(cut, "while-cut").await;
    eventually("b/while-cut healthy under m2", || {
        env.healthy(cut, "while-cut")
    })
    .await;

    // Heal: m1 reads b's Lease again, sees m2 renewing it, and stays out.
    let flapped = Arc::new(AtomicBool::new(false));
    let mut m1_b = m1.ha.ownership.subscribe(cut).unwrap();
    let f = flapped.clone();
    let watch = tokio::spawn(async move {
        while m1_b.changed().await.is_ok() {
            if m1_b.borrow_and_update().mine {
                f.store(true, Ordering::SeqCst);
            }
        }
    });
    let before = m1.ha.ownership.reconciles(cut);
    proxy.heal();
    eventually_within(
        takeover_patience(),
        "m1 sees m2 holding b again",
        || async {
            match m1.fleet.get(cut).unwrap().state() {
                pgfleet::fleet::ConnState::Ready => {}
                s => return Err(format!("m1's connection to b is {}", s.label())),
            }
            let seen = m1
                .ownership()
                .into_iter()
                .find(|o| o.member == cut)
                .unwrap();
            if seen.owner.as_deref() == Some("m2") && !seen.mine {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        },
    )
    .await;
    // Several lease durations later nothing has moved (not a speed check:
    // the test only looks for a flap within a window).
    tokio::time::sleep(LEASE * 3).await;
    assert_eq!(settled(&env, &both).await.unwrap(), after);
    assert_eq!(
        env.lease(cut).await.unwrap(),
        (Some("m2".into()), transitions)
    );
    watch.abort();
    assert!(
        !flapped.load(Ordering::SeqCst),
        "m1 took b back after healing"
    );
    assert_eq!(m1.ha.ownership.reconciles(cut), before);
}

/// One rollout, two replicas, members owned by either: only the owner of
/// the lowest-named member runs the engine, so `max_concurrency = 1` holds
/// fleet-wide, and the owners' controllers do the restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rollout_under_two_replicas_updates_one_cluster_at_a_time() {
    let env = Env::start("ha-rollout").await;
    let none = BTreeMap::new();
    // The clusters exist and are healthy before any engine looks at them.
    let setup = env.manager("m0", &none).await;
    env.crds_served().await;
    for m in MEMBERS {
        for i in 0..2 {
            env.create_pgc_at(m, &format!("pg{i}"), "15.18").await;
        }
    }
    for m in MEMBERS {
        for i in 0..2 {
            let name = format!("pg{i}");
            eventually(&format!("{m}/{name} healthy"), || env.healthy(m, &name)).await;
        }
    }
    setup.release().await;
    let rollout = "\n[rollouts.r]\ntarget_version = \"15.20\"\nprogress_deadline = \"24h\"\n\
        [[rollouts.r.stages]]\nname = \"all\"\nclusters = \"env=test\"\nmax_concurrency = 1\n";
    let (m1, m2) = tokio::join!(
        env.manager_with("m1", &none, rollout),
        env.manager_with("m2", &none, rollout)
    );
    let both = [("m1", &m1), ("m2", &m2)];
    eventually("every member owned by exactly one manager", || {
        settled(&env, &both)
    })
    .await;
    let most_in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    eventually_within(takeover_patience() * 4, "every cluster at 15.20", || {
        let env = &env;
        let most = most_in_flight.clone();
        async move {
            let pgcs = env.all_pgcs().await?;
            // Asked to move (spec) but not yet there (status).
            let in_flight = pgcs
                .iter()
                .filter(|(_, pg)| {
                    let st = pg.status.clone().unwrap_or_default();
                    pg.spec.version == "15.20"
                        && (st.current_version.as_deref() != Some("15.20")
                            || st.phase != Some(pgfleet::crd::Phase::Healthy))
                })
                .count();
            most.fetch_max(in_flight, Ordering::SeqCst);
            // Done: there, and the engine has recorded it (its finished
            // mark follows the status by one engine round).
            let done = pgcs
                .iter()
                .filter(|(_, pg)| {
                    let st = pg.status.clone().unwrap_or_default();
                    let marked = pgfleet::rollout::marks::read(
                        &pg.metadata.annotations.clone().unwrap_or_default(),
                    )
                    .is_some_and(|m| m.finished.is_some());
                    st.current_version.as_deref() == Some("15.20")
                        && st.phase == Some(pgfleet::crd::Phase::Healthy)
                        && marked
                })
                .count();
            if done == pgcs.len() && done == 6 {
                Ok(())
            } else {
                Err(format!("{done}/{} done, {in_flight} in flight", pgcs.len()))
            }
        }
    })
    .await;
    let most = most_in_flight.load(Ordering::SeqCst);
    assert!(most <= 1, "{most} clusters updated at once");
    // The engine's own marks: each update started after the previous one
    // finished (two engines would interleave them).
    let mut spans: Vec<_> = env
        .all_pgcs()
        .await
        .unwrap()
        .iter()
        .map(|(m, pg)| {
            let mark =
                pgfleet::rollout::marks::read(&pg.metadata.annotations.clone().unwrap_or_default())
                    .unwrap_or_else(|| panic!("{m}/{:?} has no rollout mark", pg.metadata.name));
            (mark.started, mark.finished.expect("finished mark"))
        })
        .collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[1].0 >= w[0].1, "overlapping updates: {spans:?}");
    }
}
