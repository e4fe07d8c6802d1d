//! One container as real processes, and its supervisor (restart with
//! backoff, probes, graceful stop).
//!
//! How the processes are set up: [`super::sandbox`].

use super::logs::LogBuf;
use super::sandbox::{self, Entry, ns_members, signal};
use super::spec::ContainerSpec;
use super::volumes::{PodDirs, RunUser};
use crate::cluster::now_rfc3339;
use anyhow::Context;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::sync::{Notify, watch};

/// The first restart delay; doubled per crash up to [`BACKOFF_MAX`]. Shorter
/// than kubelet's 10 s … 5 min so failover tests see restarts quickly.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A run this long resets the backoff.
const BACKOFF_RESET: Duration = Duration::from_secs(60);

/// What kubelet reports about a container.
#[derive(Debug, Default, Clone)]
pub struct State {
    /// Host pid of the container's PID 1 while it runs.
    pub pid: Option<u32>,
    pub started_at: Option<String>,
    pub ready: bool,
    pub restart_count: u32,
    pub waiting: Option<(String, String)>,
    pub terminated: Option<Value>,
    pub last_terminated: Option<Value>,
}

pub struct Container {
    pub spec: ContainerSpec,
    pub user: RunUser,
    pub pod_ip: String,
    pub log: LogBuf,
    pub restart_policy: String,
    state: Mutex<State>,
    /// Wakes the pod's status publisher.
    changed: Arc<Notify>,
}

impl Container {
    pub fn new(
        spec: ContainerSpec,
        user: RunUser,
        pod_ip: String,
        dirs: &PodDirs,
        restart_policy: &str,
        changed: Arc<Notify>,
    ) -> Self {
        let mut spec = spec;
        for (k, v) in super::netshim::env(&pod_ip) {
            match spec.env.iter_mut().find(|(name, _)| *name == k) {
                // The container's own preload goes on after the shim.
                Some((_, own)) if k == "LD_PRELOAD" => *own = format!("{v}:{own}"),
                Some((_, own)) => *own = v,
                None => spec.env.push((k, v)),
            }
        }
        Container {
            log: LogBuf::new(dirs.log(&spec.name)),
            spec,
            user,
            pod_ip,
            restart_policy: restart_policy.to_string(),
            state: Mutex::new(State {
                waiting: Some(("ContainerCreating".into(), String::new())),
                ..Default::default()
            }),
            changed,
        }
    }

    pub fn state(&self) -> State {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
        self.changed.notify_one();
    }

    fn set_ready(&self, ready: bool) {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if g.ready != ready && g.pid.is_some() {
            g.ready = ready;
            drop(g);
            self.changed.notify_one();
        }
    }

    /// How to enter the container, while it runs.
    pub fn entry(&self) -> Option<Entry> {
        Some(Entry {
            pid: self.state().pid?,
            user: self.user.clone(),
            env: self.spec.env.clone(),
            working_dir: self.spec.working_dir.clone(),
        })
    }

    /// The containerStatuses entry.
    pub fn status_json(&self) -> Value {
        let s = self.state();
        let state = if let Some(t) = &s.terminated {
            json!({"terminated": t})
        } else if let (Some(_), Some(at)) = (s.pid, &s.started_at) {
            json!({"running": {"startedAt": at}})
        } else {
            let (reason, message) = s.waiting.clone().unwrap_or_default();
            let mut w = json!({"reason": reason});
            if !message.is_empty() {
                w["message"] = json!(message);
            }
            json!({"waiting": w})
        };
        let mut v = json!({
            "name": self.spec.name, "image": self.spec.image, "imageID": "",
            "ready": s.ready, "started": s.pid.is_some(), "restartCount": s.restart_count,
            "state": state, "lastState": {},
        });
        if let Some(pid) = s.pid {
            v["containerID"] = json!(format!("process://{pid}"));
        }
        if let Some(t) = s.last_terminated {
            v["lastState"] = json!({"terminated": t});
        }
        v
    }

    /// Runs the container until `stop` carries a grace period; restarts it per
    /// the restart policy.
    pub async fn supervise(
        self: Arc<Self>,
        dirs: PodDirs,
        mut stop: watch::Receiver<Option<Duration>>,
        grace: Duration,
    ) {
        let mut backoff = BACKOFF_MIN;
        loop {
            if stop.borrow().is_some() {
                return;
            }
            let started = Instant::now();
            let (exit, stop_after) = match self.run_once(&dirs, &mut stop, grace).await {
                Ok(r) => r,
                Err(e) => {
                    let msg = format!("{e:#}");
                    tracing::warn!(container = %self.spec.name, error = %msg, "container failed to start");
                    self.update(|s| s.waiting = Some(("RunContainerError".into(), msg)));
                    (None, false)
                }
            };
            if stop_after || stop.borrow().is_some() {
                return;
            }
            let code = exit.unwrap_or(128);
            let restart = match self.restart_policy.as_str() {
                "Never" => false,
                "OnFailure" => code != 0,
                _ => true,
            };
            if !restart {
                self.update(|s| s.terminated = s.last_terminated.take());
                return;
            }
            if started.elapsed() >= BACKOFF_RESET {
                backoff = BACKOFF_MIN;
            }
            self.update(|s| {
                s.restart_count += 1;
                s.waiting = Some((
                    "CrashLoopBackOff".into(),
                    format!(
                        "back-off {}s restarting failed container={}",
                        backoff.as_secs(),
                        self.spec.name
                    ),
                ));
            });
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.changed() => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// One container instance: start, probe, wait for it to end. Returns the
    /// exit code and whether it ended because the pod is stopping.
    async fn run_once(
        self: &Arc<Self>,
        dirs: &PodDirs,
        stop: &mut watch::Receiver<Option<Duration>>,
        grace: Duration,
    ) -> anyhow::Result<(Option<i32>, bool)> {
        let mut child = sandbox::spawn(&self.spec, &self.user, dirs)?;
        let unshare = child.id().context("the container exited at once")?;
        let pumps: Vec<_> = [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ]
        .into_iter()
        .flatten()
        .map(|mut r| {
            let me = self.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n) = r.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    me.log.append(&buf[..n]);
                }
            })
        })
        .collect();
        // Not found: the container ended before it started; exec finds no
        // running container (never the unshare process, which is outside
        // the container's namespaces).
        let found = sandbox::find_init(unshare).await;
        let init = found.unwrap_or(unshare);
        let has_readiness = self.spec.readiness.is_some();
        self.update(|s| {
            s.pid = found;
            s.started_at = Some(now_rfc3339());
            s.waiting = None;
            s.terminated = None;
            s.ready = !has_readiness;
        });
        let (live_tx, mut live_rx) = watch::channel(true);
        let probes = self.clone().probes(init, live_tx);
        tokio::pin!(probes);
        let mut stopping = false;
        let status = loop {
            tokio::select! {
                st = child.wait() => break st,
                _ = &mut probes => {}
                r = stop.changed() => {
                    let g = if r.is_err() { Duration::ZERO } else { stop.borrow().unwrap_or(grace) };
                    stopping = true;
                    break Self::terminate(&mut child, init, g).await;
                }
                r = live_rx.changed() => {
                    if r.is_ok() && !*live_rx.borrow() {
                        tracing::info!(container = %self.spec.name, "liveness probe failed; restarting");
                        break Self::terminate(&mut child, init, grace).await;
                    }
                }
            }
        };
        let finished = now_rfc3339();
        for p in pumps {
            let _ = tokio::time::timeout(Duration::from_secs(2), p).await;
        }
        self.log.end_instance();
        let code = status.ok().map(|st| {
            use std::os::unix::process::ExitStatusExt;
            st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(9))
        });
        self.update(|s| {
            let t = json!({
                "exitCode": code.unwrap_or(137),
                "reason": if code == Some(0) { "Completed" } else { "Error" },
                "startedAt": s.started_at.take(),
                "finishedAt": finished,
                "containerID": format!("process://{init}"),
            });
            s.pid = None;
            s.ready = false;
            if stopping {
                s.terminated = Some(t);
            } else {
                s.last_terminated = Some(t);
            }
        });
        Ok((code, stopping))
    }

    /// SIGTERM to PID 1, SIGKILL after the grace period (PID 1 of a PID
    /// namespace only gets SIGTERM when it handles it, as in a real container).
    async fn terminate(
        child: &mut tokio::process::Child,
        init: u32,
        grace: Duration,
    ) -> std::io::Result<std::process::ExitStatus> {
        if !grace.is_zero() {
            signal(&[init], "TERM");
            if let Ok(st) = tokio::time::timeout(grace, child.wait()).await {
                return st;
            }
        }
        signal(&[init], "KILL");
        child.wait().await
    }

    /// Runs the probes of one instance; never returns on its own. Readiness
    /// goes straight into the state; liveness failures are sent on `live`.
    async fn probes(self: Arc<Self>, init: u32, live: watch::Sender<bool>) {
        let Some(entry) = self.entry().filter(|e| e.pid == init) else {
            return std::future::pending().await;
        };
        let (ip, ports) = (self.pod_ip.clone(), self.spec.ports.clone());
        if let Some(p) = &self.spec.startup {
            let (tx, mut rx) = watch::channel(None);
            let run = p.run(&entry, &ip, &ports, |ok| {
                tx.send_replace(Some(ok));
            });
            tokio::select! {
                _ = run => {}
                _ = rx.wait_for(|v| v.is_some()) => {}
            }
            if *rx.borrow() == Some(false) {
                live.send_replace(false);
                return std::future::pending().await;
            }
        }
        let readiness = async {
            match &self.spec.readiness {
                Some(p) => p.run(&entry, &ip, &ports, |ok| self.set_ready(ok)).await,
                None => std::future::pending().await,
            }
        };
        let liveness = async {
            match &self.spec.liveness {
                Some(p) => {
                    p.run(&entry, &ip, &ports, |ok| {
                        if !ok {
                            live.send_replace(false);
                        }
                    })
                    .await
                }
                None => std::future::pending().await,
            }
        };
        tokio::join!(readiness, liveness);
    }

    /// Sends `sig` to every process of the running container (faults).
    pub fn signal_all(&self, sig: &str) -> anyhow::Result<usize> {
        let pid = self
            .state()
            .pid
            .with_context(|| format!("container {} is not running", self.spec.name))?;
        let pids = ns_members(pid);
        signal(&pids, sig);
        Ok(pids.len())
    }
}
