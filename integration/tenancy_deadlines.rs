//! Issue 19, "no deadlines" and "one bad kubeconfig stops everything":
//! every exec and API call of the manager ends, a PgBouncer PAUSE is always
//! followed by RESUME, a chatty verb neither stalls nor floods the manager,
//! a member that stops answering fails its calls while the others are
//! managed, and a missing or garbage kubeconfig makes its member
//! `Unreachable` (with the reason) instead of stopping `pgfleet run`.
#![allow(clippy::unwrap_used)]

use crate::common::bin;
use crate::common::fleet;

use fleet::{PATIENCE, TestFleet, client_from, eventually, eventually_within};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use pgfleet::crd::PostgresCluster;
use pgfleet::fleet::ConnState;
use pgfleet::sim::faults::FaultSpec;
use serde_json::json;
use std::time::Duration;

const M: &str = "member-1";

/// The PgBouncer admin commands the pooler pods of `sim` were sent, in order.
fn pooler_commands(sim: &pgfleet::sim::SimCluster) -> Vec<&'static str> {
    sim.cluster
        .execs
        .snapshot()
        .into_iter()
        .filter(|r| r.container == "pgbouncer")
        .map(|r| {
            if r.command.contains("'PAUSE'") {
                "PAUSE"
            } else if r.command.contains("'RESUME'") {
                "RESUME"
            } else {
                "other"
            }
        })
        .collect()
}

/// Whether some RESUME was sent after the first PAUSE.
fn resumed_after_pause(cmds: &[&str]) -> bool {
    cmds.iter()
        .position(|c| *c == "PAUSE")
        .is_some_and(|p| cmds[p..].contains(&"RESUME"))
}

/// A two-instance cluster with one pooler, Healthy, its pooler pod running.
async fn pooled_cluster(f: &TestFleet) -> String {
    f.create(
        M,
        "shop",
        "orders",
        json!({"clusterSize": 2, "version": "15", "pooler": {"enabled": true, "instances": 1}}),
    )
    .await;
    // Not `wait_healthy`: it counts every pod of the cluster, the pooler's too.
    healthy(&f.client(M), "orders").await;
    let pg = f.pgc(M, "shop").get("orders").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(f.client(M), "shop");
    eventually("the pooler pod running", || {
        let pods = pods.clone();
        async move {
            let p = pods
                .get("orders-pooler-1")
                .await
                .map_err(|e| e.to_string())?;
            let phase = p.status.and_then(|s| s.phase);
            (phase.as_deref() == Some("Running"))
                .then_some(())
                .ok_or(format!("{phase:?}"))
        }
    })
    .await;
    pg.status.unwrap().current_primary.unwrap()
}

async fn request_switchover(f: &TestFleet) {
    f.patch(
        M,
        "shop",
        "orders",
        json!({"metadata": {"annotations": {"pgfleet.io/switchover-to": "auto"}}}),
    )
    .await;
}

/// Clears the faults and waits for the switchover to complete; the last
/// command any pooler got is then RESUME.
async fn completes_and_ends_resumed(f: &TestFleet, old: &str) {
    let sim = f.sim_cluster(M);
    sim.cluster.faults.clear();
    let api = f.pgc(M, "shop");
    eventually("the switchover completed", || {
        let api = api.clone();
        async move {
            let pg = api.get("orders").await.map_err(|e| e.to_string())?;
            let st = pg.status.unwrap_or_default();
            match st.current_primary {
                Some(p) if p != old && st.switchover.is_none() => Ok(()),
                other => Err(format!("primary {other:?}, switchover {:?}", st.switchover)),
            }
        }
    })
    .await;
    let cmds = pooler_commands(sim);
    assert_eq!(cmds.last(), Some(&"RESUME"), "{cmds:?}");
}

/// A PAUSE that never finishes (the exec session hangs) times out, and the
/// pooler is sent RESUME: before, the switchover awaited it forever and the
/// pooler stayed paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_pause_is_followed_by_resume() {
    let f = TestFleet::start("dl-pause", &[M]).await;
    let old = pooled_cluster(&f).await;
    let sim = f.sim_cluster(M);
    sim.cluster.faults.set(FaultSpec {
        hanging_exec: vec!["'PAUSE'".into()],
        ..Default::default()
    });
    request_switchover(&f).await;
    eventually("RESUME after the hung PAUSE", || {
        let cmds = pooler_commands(sim);
        async move {
            resumed_after_pause(&cmds)
                .then_some(())
                .ok_or(format!("{cmds:?}"))
        }
    })
    .await;
    completes_and_ends_resumed(&f, &old).await;
}

/// A switchover step that fails after PAUSE (promote refused) returns with
/// an error; the guard still resumes the pooler. Before, the error skipped
/// the RESUME and every retry paused it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_switchover_step_still_resumes_the_pooler() {
    let f = TestFleet::start("dl-promote", &[M]).await;
    let old = pooled_cluster(&f).await;
    let sim = f.sim_cluster(M);
    sim.cluster.faults.set(FaultSpec {
        failing_exec: vec!["promote".into()],
        ..Default::default()
    });
    request_switchover(&f).await;
    eventually("RESUME after PAUSE although promote fails", || {
        let cmds = pooler_commands(sim);
        async move {
            resumed_after_pause(&cmds)
                .then_some(())
                .ok_or(format!("{cmds:?}"))
        }
    })
    .await;
    completes_and_ends_resumed(&f, &old).await;
}

/// A verb that writes far more to stderr than kube's pipe holds returns
/// its exit and a capped message instead of blocking until its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chatty_command_returns_with_its_output_capped() {
    use pgfleet::postgres::exec::{ExecError, STDERR_CAP, run_command};
    let dir = fleet::temp_dir("dl-chatty");
    let mut opts = pgfleet::emulated::sim_options(&dir, 1);
    opts.names = vec!["host".into()];
    let sim = pgfleet::sim::start(&opts).await.unwrap();
    let client = client_from(&sim.clusters[0].kubeconfig).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}}))
    .unwrap();
    pods.create(&Default::default(), &p).await.unwrap();
    eventually("the pod to run", || {
        let pods = pods.clone();
        async move {
            let p = pods.get("p").await.map_err(|e| e.to_string())?;
            let phase = p.status.and_then(|s| s.phase);
            (phase.as_deref() == Some("Running"))
                .then_some(())
                .ok_or(format!("{phase:?}"))
        }
    })
    .await;
    let sh = |script: &str| vec!["sh".to_string(), "-c".to_string(), script.to_string()];
    // 300 KiB of stderr before the one stdout line.
    let noisy = "head -c 307200 /dev/zero | tr '\\0' e >&2";
    let deadline = Duration::from_secs(600);
    let out = run_command(
        &client,
        "default",
        "p",
        "main",
        sh(&format!("{noisy}; echo done")),
        "noisy",
        deadline,
    )
    .await
    .unwrap();
    assert_eq!(out.trim(), "done");
    let err = run_command(
        &client,
        "default",
        "p",
        "main",
        sh(&format!("{noisy}; exit 3")),
        "noisy-fail",
        deadline,
    )
    .await
    .unwrap_err();
    match err {
        ExecError::Verb { message, .. } => {
            assert!(message.len() < STDERR_CAP + 512, "{}", message.len());
            assert!(
                message.contains("more bytes not kept"),
                "{}",
                &message[..200]
            );
        }
        other => panic!("expected the command's failure, got {other}"),
    }
    drop(sim);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A manager over embedded members `names`, with a short API deadline.
async fn manager_with(
    dir: &std::path::Path,
    names: &[&str],
    extra: &str,
) -> pgfleet::manager::Manager {
    let mut toml = format!(
        "[manager]\nstate_dir = \"{}\"\nprobe_interval = \"500ms\"\nprobe_timeout = \"500ms\"\nprobe_failure_threshold = 2\nqps = 500.0\nburst = 1000\napi_request_timeout = \"2s\"\n",
        dir.display()
    );
    for n in names {
        toml.push_str(&format!(
            "\n[[clusters]]\nname = \"{n}\"\nembedded = true\n"
        ));
    }
    toml.push_str(extra);
    let settings = pgfleet::config::load_str(&toml, "test")
        .unwrap_or_else(|e| panic!("test config is invalid:\n{e}\n{toml}"));
    pgfleet::manager::start(&settings, false).await.unwrap()
}

fn sim_of<'a>(mgr: &'a pgfleet::manager::Manager, name: &str) -> &'a pgfleet::sim::SimCluster {
    mgr.sim
        .as_ref()
        .unwrap()
        .clusters
        .iter()
        .find(|c| c.name == name)
        .unwrap()
}

async fn crd_served(client: &kube::Client, what: &str) {
    let api: Api<PostgresCluster> = Api::all(client.clone());
    eventually(&format!("the PostgresCluster CRD served in {what}"), || {
        let api = api.clone();
        async move {
            api.list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())
        }
    })
    .await;
}

async fn healthy(client: &kube::Client, name: &str) {
    let api: Api<PostgresCluster> = Api::namespaced(client.clone(), "shop");
    eventually(&format!("{name} Healthy"), || {
        let api = api.clone();
        async move {
            let pg = api.get(name).await.map_err(|e| e.to_string())?;
            let phase = pg.status.and_then(|s| s.phase);
            (phase == Some(pgfleet::crd::Phase::Healthy))
                .then_some(())
                .ok_or(format!("{phase:?}"))
        }
    })
    .await;
}

async fn create(client: &kube::Client, name: &str) {
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let _ = ns
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap(),
        )
        .await;
    let api: Api<PostgresCluster> = Api::namespaced(client.clone(), "shop");
    api.create(
        &Default::default(),
        &fleet::pgc_object(name, json!({"clusterSize": 1, "version": "15"})),
    )
    .await
    .unwrap();
}

/// A member whose API server stops answering (600 s injected latency): a
/// call through the manager's client fails with a timeout naming the call,
/// and the other member keeps being reconciled. Before, the call hung.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_a_slow_member_times_out_and_the_others_are_managed() {
    fleet::init_tracing();
    let dir = fleet::temp_dir("dl-slow");
    let mgr = manager_with(&dir, &["fast", "slow"], "").await;
    let fast = client_from(&sim_of(&mgr, "fast").kubeconfig).await;
    let slow = client_from(&sim_of(&mgr, "slow").kubeconfig).await;
    crd_served(&fast, "fast").await;
    crd_served(&slow, "slow").await;
    sim_of(&mgr, "slow").cluster.faults.set(FaultSpec {
        latency_ms: 600_000,
        ..Default::default()
    });
    let member = mgr.fleet.get("slow").unwrap().client();
    let api: Api<PostgresCluster> = Api::all(member);
    // The outer bound only keeps a regression from hanging the suite.
    let err = tokio::time::timeout(PATIENCE, api.list(&ListParams::default()))
        .await
        .expect("the call to the slow member returned")
        .expect_err("the call to the slow member fails");
    assert!(pgfleet::fleet::deadline::is_timeout(&err), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("/apis/pgfleet.io/v1/postgresclusters"),
        "{msg}"
    );
    create(&fast, "orders").await;
    healthy(&fast, "orders").await;
    let slow_member = mgr.fleet.get("slow").unwrap().clone();
    eventually("slow reported Unreachable", || {
        let s = slow_member.state();
        async move {
            matches!(s, ConnState::Unreachable { .. })
                .then_some(())
                .ok_or(format!("{s:?}"))
        }
    })
    .await;
    sim_of(&mgr, "slow").cluster.faults.clear();
    mgr.release().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A member whose kubeconfig does not exist yet: the manager starts, the
/// member is Unreachable naming the file, the other member is managed; once
/// the file appears the member is connected and managed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_kubeconfig_is_unreachable_until_the_file_appears() {
    fleet::init_tracing();
    let dir = fleet::temp_dir("dl-late");
    let late_path = dir.join("late.kubeconfig");
    let extra = format!(
        "\n[[clusters]]\nname = \"late\"\nkubeconfig = \"{}\"\n",
        late_path.display()
    );
    let mgr = manager_with(&dir, &["good"], &extra).await;
    let late = mgr.fleet.get("late").unwrap().clone();
    match late.state() {
        ConnState::Unreachable { reason } => {
            assert!(reason.contains("late.kubeconfig"), "{reason}")
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
    let good = client_from(&sim_of(&mgr, "good").kubeconfig).await;
    crd_served(&good, "good").await;
    create(&good, "orders").await;
    healthy(&good, "orders").await;

    // The member cluster comes up and its kubeconfig is put in place.
    let other_dir = fleet::temp_dir("dl-late-sim");
    let mut opts = pgfleet::emulated::sim_options(&other_dir, 1);
    opts.names = vec!["late".into()];
    opts.runtime = pgfleet::emulated::virtual_runtime();
    let sim = pgfleet::sim::start(&opts).await.unwrap();
    std::fs::copy(&sim.clusters[0].kubeconfig, &late_path).unwrap();
    eventually_within(Duration::from_secs(120), "late Ready", || {
        let s = late.state();
        async move {
            (s == ConnState::Ready)
                .then_some(())
                .ok_or(format!("{s:?}"))
        }
    })
    .await;
    let late_client = client_from(&late_path).await;
    crd_served(&late_client, "late").await;
    create(&late_client, "stock").await;
    healthy(&late_client, "stock").await;
    mgr.release().await;
    drop(sim);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&other_dir);
}

/// The fixture of the binary tests: a config with one embedded member and
/// two broken kubeconfig members.
fn broken_config(dir: &std::path::Path) -> std::path::PathBuf {
    let garbage = dir.join("garbage.kubeconfig");
    std::fs::write(&garbage, "token: hunter2-secret-token ]] {{ not yaml\n").unwrap();
    let missing = dir.join("missing.kubeconfig");
    let extra = format!(
        "\n[[clusters]]\nname = \"bad-garbage\"\nkubeconfig = \"{}\"\n\n[[clusters]]\nname = \"bad-missing\"\nkubeconfig = \"{}\"\n",
        garbage.display(),
        missing.display()
    );
    bin::config(dir, &["good"], None, &extra)
}

/// `config check` loads every kubeconfig: a garbage and a missing one are
/// both reported with their file names (never the content) and a non-zero
/// exit. Before, the check passed with 0.
#[test]
fn config_check_reports_every_unusable_kubeconfig() {
    let dir = bin::temp_dir("dl-check");
    let config = broken_config(&dir);
    let (code, out, err) = bin::cli(&dir, &["config", "check", config.to_str().unwrap()], &[]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("garbage.kubeconfig"), "{err}");
    assert!(err.contains("missing.kubeconfig"), "{err}");
    assert!(
        err.contains("bad-garbage") && err.contains("bad-missing"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `500000y` duration is refused, naming the key. Before, it was accepted
/// (a Lease that long never expires: HA silently off).
#[test]
fn config_check_refuses_absurd_durations() {
    let dir = bin::temp_dir("dl-years");
    let config = bin::config(&dir, &["good"], None, "");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "[manager]\n",
        "[manager]\nlease_duration = \"500000y\"\nrenew_deadline = \"10s\"\n",
    );
    std::fs::write(&config, text).unwrap();
    let (code, out, err) = bin::cli(&dir, &["config", "check", config.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("manager.lease_duration"), "{err}");
    assert!(err.contains("at most"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `pgfleet run` with the same config starts, manages the healthy member and
/// reports the broken ones Unreachable with the reason through the API.
/// Before, it exited 1 and nothing was managed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_manages_the_healthy_member_and_reports_the_broken_ones() {
    let dir = bin::temp_dir("dl-run");
    let config = broken_config(&dir);
    let m = bin::ManagerBin::start(&dir, Some(&config), &[]);
    let clusters = bin::eventually("the members' states", || {
        let m = &m;
        async move {
            let v = m.json("/api/v1/clusters").await;
            let all = v["clusters"].as_array().cloned().unwrap_or_default();
            let state = |n: &str| {
                all.iter()
                    .find(|c| c["name"] == n)
                    .map(|c| c["connectivity"].as_str().unwrap_or("").to_string())
            };
            let ok = state("good").as_deref() == Some("Ready")
                && state("bad-garbage").as_deref() == Some("Unreachable")
                && state("bad-missing").as_deref() == Some("Unreachable");
            if ok { Ok(all) } else { Err(format!("{all:?}")) }
        }
    })
    .await;
    let reason = |n: &str| {
        clusters
            .iter()
            .find(|c| c["name"] == n)
            .and_then(|c| c["reason"].as_str())
            .unwrap_or("")
            .to_string()
    };
    assert!(
        reason("bad-garbage").contains("garbage.kubeconfig"),
        "{clusters:?}"
    );
    assert!(
        reason("bad-missing").contains("missing.kubeconfig"),
        "{clusters:?}"
    );
    assert!(!format!("{clusters:?}").contains("hunter2"));
    let good = client_from(&m.kubeconfig(&dir.join("state"), "good")).await;
    crd_served(&good, "good").await;
    // Not "orders": `pgfleet run` applies the samples, which include it.
    create(&good, "deadlines").await;
    healthy(&good, "deadlines").await;
    assert!(!m.output().contains("hunter2"));
}
