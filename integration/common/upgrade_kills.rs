//! A major upgrade driven by a manager that is killed as soon as each new
//! `status.majorUpgrade.step` appears and started again
//! (`major_upgrade_resume.rs`, `blue_green_resume.rs`), and the checks
//! both methods owe: at most one instance clients can reach takes writes,
//! at every kill and at the end.

use super::eventually_within;
use super::manager_process::ManagerProcess;
use super::process::connect;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use pgfleet::crd::{PostgresCluster, PostgresClusterStatus};
use std::path::Path;
use std::time::{Duration, Instant};

/// (pod, server_version_num) of every instance clients can reach (kind
/// `instance`: a blue/green upgrade's green before the switch and blue
/// after it are not) that takes writes now (not in recovery, not
/// read-only).
pub async fn writable(pods: &Api<Pod>, pw: &str) -> Vec<(String, String)> {
    let mut out = vec![];
    for p in pods.list(&Default::default()).await.unwrap().items {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        if labels.get("pgfleet.io/kind").map(String::as_str) != Some("instance") {
            continue;
        }
        let name = p.metadata.name.clone().unwrap_or_default();
        let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        let Ok(c) = connect(&ip, 5432, pw).await else {
            continue;
        };
        let q = "SELECT NOT pg_is_in_recovery() AND current_setting('default_transaction_read_only') = 'off', \
                 current_setting('server_version_num')";
        if let Ok(r) = c.query_one(q, &[]).await
            && r.get::<_, bool>(0)
        {
            out.push((name, r.get::<_, String>(1)));
        }
    }
    out
}

/// The manager of one member, restarted after every kill.
pub struct Killer<'a> {
    pub kubeconfig: &'a Path,
    pub dir: &'a Path,
    pub restarts: usize,
    pub killed_at: Vec<String>,
}

impl Killer<'_> {
    /// Kills `mgr` at every new step of `name`'s upgrade until it is on
    /// `version` with `size` ready instances and no record; a step in
    /// `refused` fails the test. Returns the manager running at the end.
    pub async fn run(
        &mut self,
        mgr: ManagerProcess,
        pgc: &Api<PostgresCluster>,
        (name, version, size): (&str, &str, i32),
        (pods, pw): (&Api<Pod>, &str),
        refused: &[&str],
        limit: Duration,
    ) -> ManagerProcess {
        let done = |s: &PostgresClusterStatus| {
            s.current_version.as_deref() == Some(version)
                && s.major_upgrade.is_none()
                && s.ready_instances == size
        };
        self.run_until(mgr, pgc, name, (pods, pw), refused, limit, done)
            .await
    }

    /// As [`Killer::run`], until `done` holds for `name`'s status.
    #[allow(clippy::too_many_arguments)]
    pub async fn run_until(
        &mut self,
        mut mgr: ManagerProcess,
        pgc: &Api<PostgresCluster>,
        name: &str,
        (pods, pw): (&Api<Pod>, &str),
        refused: &[&str],
        limit: Duration,
        done: impl Fn(&PostgresClusterStatus) -> bool,
    ) -> ManagerProcess {
        let start = Instant::now();
        // Every status the API server sends, not a poll: a step the
        // manager writes and leaves within a few milliseconds (one round
        // goes from `Stopping` to `Replacing`) is still seen.
        let mut updates = watcher(pgc.clone(), watcher::Config::default())
            .applied_objects()
            .boxed();
        loop {
            let next = tokio::time::timeout(Duration::from_millis(500), updates.next()).await;
            let s = match next {
                Ok(Some(Ok(pg))) if pg.metadata.name.as_deref() == Some(name) => {
                    pg.status.unwrap_or_default()
                }
                Ok(Some(Ok(_))) => continue,
                _ => pgc.get(name).await.unwrap().status.unwrap_or_default(),
            };
            let step = s.major_upgrade.as_ref().map(|m| m.step.clone());
            if let Some(step) = step.filter(|st| self.killed_at.last() != Some(st)) {
                assert!(!refused.contains(&step.as_str()), "{s:?}");
                mgr.kill();
                let w = writable(pods, pw).await;
                assert!(
                    w.len() <= 1,
                    "two writable instances after a kill at {step}: {w:?}"
                );
                println!("killed at {step}; writable: {w:?}");
                self.killed_at.push(step);
                self.restarts += 1;
                let dir = self.dir.join(format!("m{}", self.restarts));
                mgr = ManagerProcess::start(self.kubeconfig, "pg-a", &dir);
            }
            if done(&s) {
                return mgr;
            }
            assert!(
                start.elapsed() < limit,
                "not upgraded: {s:?}; killed at {:?}",
                self.killed_at
            );
        }
    }

    /// Fails unless the manager was killed at each of `steps`.
    pub fn assert_killed_at(&self, steps: &[&str]) {
        for step in steps {
            assert!(
                self.killed_at.iter().any(|s| s == step),
                "never killed at {step}: {:?}",
                self.killed_at
            );
        }
    }
}

/// Waits until one reachable instance takes writes, on `version`, and
/// streams to a replica.
pub async fn one_writable_and_streaming(pods: &Api<Pod>, rw: &str, pw: &str, version: &str) {
    eventually_within(
        Duration::from_secs(120),
        "one writable instance on the new version and a streaming replica",
        || async {
            let w = writable(pods, pw).await;
            let Ok(c) = connect(rw, 5432, pw).await else {
                return false;
            };
            let streaming = c
                .query_one(
                    "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
                    &[],
                )
                .await
                .map(|r| r.get::<_, i64>(0))
                .unwrap_or(0);
            w.len() == 1 && w[0].1.starts_with(version) && streaming == 1
        },
    )
    .await;
}
