//! Cross-cluster disaster recovery (docs/disaster-recovery.md): one engine
//! per `[dr.<topology>]` keeps a PostgreSQL database in several member
//! clusters — the primary side takes writes, the replica sides stream from
//! its `<name>-dr` address — and moves the primary side between members.
//!
//! A round: observe every member (`observe.rs`), settle the state (the
//! newest copy, or the initial one), tell the controllers each side
//! (`controller::dr::registry`), copy what must be identical (`sync.rs`),
//! then take the steps `decide.rs` names. A switchover or a promotion is
//! only a new state written; the rounds bring the instances to it, so a
//! manager killed in between resumes where it was.

mod commands;
pub mod decide;
pub mod failover;
mod observe;
mod poolers;
pub mod state;
mod steps;
mod sync;
mod track;

use crate::config::dr::Topology;
use crate::controller::dr::registry::{Registry, Side};
use crate::controller::pooler::Upstream;
use crate::crd::PostgresCluster;
use crate::fleet::{Fleet, Member};
use anyhow::Context;
use decide::SideView;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::Serialize;
use state::State;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::Instrument;

/// The annotation that tells a PostgresCluster (and whoever reads it) its
/// side; changing it is also what makes its controller reconcile at once.
pub const ANN_SIDE: &str = "pgfleet.io/dr-side";
/// Set while an automatic promotion of this side is blocked (the condition
/// `DisasterRecoveryBlocked` says why).
pub const ANN_BLOCKED: &str = "pgfleet.io/dr-promotion-blocked";

/// Whether an automatic promotion is blocked for any side.
fn t_blocked(r: &Registry, t: &Topology) -> bool {
    t.members
        .iter()
        .any(|m| r.notice(m, &t.namespace, &t.name).is_some())
}

/// One side as the last round saw it.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SideStatus {
    pub member: String,
    pub reachable: bool,
    /// "primary", "replica", "stopped" (None: no report).
    pub role: Option<String>,
    pub fenced: bool,
    /// Bytes the primary side has written that this side has not received.
    pub lag_bytes: Option<u64>,
}

/// A topology as the last round saw it.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub topology: String,
    pub epoch: u64,
    pub primary: String,
    pub sides: Vec<SideStatus>,
    /// How long the manager has not reached the primary side's primary.
    pub primary_silent_ms: u64,
    /// When this engine last wrote a forced promotion (Unix ms): the
    /// promotion itself comes after.
    pub forced_at_ms: Option<u64>,
    /// What the round did or waits for.
    pub note: String,
}

pub struct Engine {
    pub name: String,
    pub topology: Topology,
    fleet: Arc<Fleet>,
    registry: Arc<Registry>,
    last: Mutex<Status>,
    /// The side annotation last written per member.
    annotated: Mutex<HashMap<String, String>>,
    /// The witness's evidence (`track.rs`).
    track: Mutex<track::Track>,
    forced_at_ms: Mutex<Option<u64>>,
    poolers: poolers::Poolers,
    /// The trace of the switchover or failover in progress: (epoch, span).
    operation: Mutex<Option<(u64, tracing::Span)>>,
    pub tick: Duration,
}

impl Engine {
    pub fn new(name: &str, topology: Topology, fleet: Arc<Fleet>, registry: Arc<Registry>) -> Self {
        Self {
            name: name.to_string(),
            topology,
            fleet,
            registry,
            last: Mutex::new(Status::default()),
            annotated: Mutex::new(HashMap::new()),
            track: Mutex::new(track::Track::new(std::time::Instant::now())),
            forced_at_ms: Mutex::new(None),
            poolers: poolers::Poolers::default(),
            operation: Mutex::new(None),
            tick: Duration::from_secs(1),
        }
    }

    fn tracked(&self) -> std::sync::MutexGuard<'_, track::Track> {
        self.track.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The last round's view, with the time of the last forced promotion
    /// as of now: a round that promoted may still be running its other
    /// steps (demoting an unreachable side takes its timeouts) while the
    /// promoted side already takes writes.
    pub fn status(&self) -> Status {
        let mut st = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        st.forced_at_ms = *self.forced_at_ms.lock().unwrap_or_else(|e| e.into_inner());
        st
    }

    /// Runs rounds until dropped.
    /// Runs rounds until dropped: every `tick`, and back to back (200 ms)
    /// while a switchover or failover is under way — its clients wait in
    /// the paused poolers for every round it takes.
    pub async fn run(self: Arc<Self>) {
        loop {
            if let Err(e) = self.round().await {
                tracing::warn!(topology = %self.name, error = format!("{e:#}"), "DR round failed");
            }
            let moving = self
                .operation
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some();
            let pace = if moving {
                self.tick.min(Duration::from_millis(200))
            } else {
                self.tick
            };
            tokio::time::sleep(pace).await;
        }
    }

    fn members(&self) -> Vec<Arc<Member>> {
        self.topology
            .members
            .iter()
            .filter_map(|m| self.fleet.get(m).cloned())
            .collect()
    }

    fn member(&self, name: &str) -> anyhow::Result<Arc<Member>> {
        self.fleet
            .get(name)
            .cloned()
            .with_context(|| format!("member cluster {name} is not in the fleet"))
    }

    pub async fn observe(&self) -> Vec<SideView> {
        let (t, members) = (&self.topology, self.members());
        let views = members
            .iter()
            .map(|m| observe::side(m, &self.name, &t.namespace, &t.name));
        futures::future::join_all(views).await
    }

    /// One round; returns what it saw.
    pub async fn round(&self) -> anyhow::Result<Status> {
        let views = self.observe().await;
        let Some(mut state) = self.settle(&views).await? else {
            return Ok(self.record(
                &views,
                None,
                "waiting: not every member's state could be read",
            ));
        };
        let now = std::time::Instant::now();
        self.tracked().observe(now, &state.primary, &views);
        self.hold_fenced(&views);
        let mut notes = vec![];
        if let Some(next) = self.witness(&state, &views, now).await? {
            notes.push(format!("automatic failover to {}", next.primary));
            state = next;
        }
        // A switchover in progress holds every pooler (clients wait).
        let switching = state.previous_endpoint.is_some() && !state.forced;
        let paused = !switching || self.pooler_round(&state, &views, &[], true).await;
        let sides = decide::sides(&self.name, &state, &self.topology, &views);
        let (ns, name) = (&self.topology.namespace, &self.topology.name);
        for (m, side) in &sides {
            self.registry.set(m, ns, name, side.clone());
            if let Some(v) = views.iter().find(|v| v.member == *m && v.reachable) {
                self.annotate(&v.member, side).await;
            }
        }
        self.replicate(&state, &views).await;
        // The old primary is not stopped while a pooler may still have a
        // transaction in flight on it (its PAUSE did not complete).
        let steps = match paused {
            true => decide::converge(&state, &views),
            false => {
                notes.push("waiting for every pooler to pause".to_string());
                vec![]
            }
        };
        let op = self.operation(&state, &views);
        let work = async {
            for step in &steps {
                notes.push(format!("{step:?}"));
                let (member, target, verb) = step.names();
                let span = crate::telemetry::spans::dr_step(&op, member, target, verb);
                if let Err(e) = self.take(step).instrument(span).await {
                    notes.push(format!("failed: {e:#}"));
                }
            }
        };
        // Steps can take long (a rewind, a demotion waiting for its
        // source to be mounted): the primary side's watchdog must go on
        // hearing from the manager meanwhile, or a side just promoted
        // fences itself while the lost side is still being rewound.
        tokio::select! {
            () = work => {}
            () = self.heartbeat(&state, &views) => {}
        }
        if !switching {
            self.pooler_round(&state, &views, &sides, false).await;
        }
        Ok(self.record(&views, Some(&state), &notes.join("; ")))
    }

    /// The span of the operation in progress (a switchover until its new
    /// primary takes writes, a forced promotion likewise), started the
    /// first round that sees its epoch; `Span::none()` otherwise.
    fn operation(&self, state: &State, views: &[SideView]) -> tracing::Span {
        let mut op = self.operation.lock().unwrap_or_else(|e| e.into_inner());
        let moving = state.epoch > 1 && !decide::promoted(state, views);
        match (&*op, moving) {
            (Some((epoch, span)), true) if *epoch == state.epoch => span.clone(),
            (_, true) => {
                let kind = if state.forced {
                    "dr.failover"
                } else {
                    "dr.switchover"
                };
                let span = crate::telemetry::spans::dr_operation(
                    kind,
                    &self.name,
                    &state.primary,
                    state.epoch,
                );
                *op = Some((state.epoch, span.clone()));
                span
            }
            (_, false) => {
                *op = None;
                tracing::Span::none()
            }
        }
    }

    /// During a switchover: PAUSE every reachable pooler (true once all
    /// did, see [`poolers::Poolers::hold`]). Otherwise: point each at the
    /// one primary, then RESUME what a switchover paused.
    async fn pooler_round(
        &self,
        state: &State,
        views: &[SideView],
        sides: &[(String, Side)],
        switching: bool,
    ) -> bool {
        let members: Vec<Arc<Member>> = views
            .iter()
            .filter(|v| v.reachable)
            .filter_map(|v| self.member(&v.member).ok())
            .collect();
        let members: Vec<&Member> = members.iter().map(|m| &**m).collect();
        let (ns, name) = (&self.topology.namespace, &self.topology.name);
        if switching {
            return self.poolers.hold(state.epoch, &members, ns, name).await;
        }
        for m in &members {
            let to = match sides.iter().find(|(n, _)| *n == m.name).map(|s| &s.1) {
                Some(Side::Replica { source, .. }) => Upstream::remote(&source.host, source.port),
                Some(Side::Primary { .. }) => Upstream::own_named(name),
                _ => continue,
            };
            self.poolers.point(m, ns, name, &to).await;
        }
        self.poolers.release(&members, ns, name).await;
        true
    }

    /// The newest state (written where a copy is older or missing), with
    /// the primary side's current address; None while a new topology
    /// cannot be started safely.
    async fn settle(&self, views: &[SideView]) -> anyhow::Result<Option<State>> {
        let mut state = match state::newest(views.iter().filter_map(|v| v.copy.clone())) {
            Some(s) => s,
            None => match decide::initial(&self.topology.members, views) {
                Some(s) => s,
                None => return Ok(None),
            },
        };
        if let Some(ep) = views
            .iter()
            .find(|v| v.member == state.primary)
            .and_then(|v| v.endpoint.clone())
        {
            state.endpoint = Some(ep);
        }
        if state.previous_endpoint.is_some() && decide::promoted(&state, views) {
            state.previous_endpoint = None;
        }
        for v in views.iter().filter(|v| v.reachable) {
            if v.copy.as_ref() != Some(&state) {
                let m = self.member(&v.member)?;
                state::write(&m, &self.name, &state).await?;
            }
        }
        Ok(Some(state))
    }

    async fn annotate(&self, member: &str, side: &Side) {
        let value = match side {
            Side::Unknown => return,
            Side::Primary { epoch, .. } => format!("primary epoch={epoch}"),
            Side::Replica { epoch, source, .. } => {
                format!(
                    "replica epoch={epoch} source={}:{}",
                    source.host, source.port
                )
            }
        };
        let known = {
            let done = self.annotated.lock().unwrap_or_else(|e| e.into_inner());
            done.get(member) == Some(&value)
        };
        if known {
            return;
        }
        let Ok(m) = self.member(member) else { return };
        let api: Api<PostgresCluster> = Api::namespaced(m.client(), &self.topology.namespace);
        let patch = serde_json::json!({"metadata": {"annotations": {ANN_SIDE: value}}});
        let res = api
            .patch(
                &self.topology.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await;
        if res.is_ok() {
            let mut done = self.annotated.lock().unwrap_or_else(|e| e.into_inner());
            done.insert(member.to_string(), value);
        }
    }

    async fn mark_blocked(&self, member: &str, blocked: bool) {
        let Ok(m) = self.member(member) else { return };
        let api: Api<PostgresCluster> = Api::namespaced(m.client(), &self.topology.namespace);
        let value = blocked.then_some("true");
        let patch = serde_json::json!({"metadata": {"annotations": {ANN_BLOCKED: value}}});
        if let Err(e) = api
            .patch(
                &self.topology.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            tracing::debug!(topology = %self.name, %member, error = %e, "DR blocked mark");
        }
    }

    /// Copies Secrets and spec from the primary side to every reachable
    /// replica side.
    async fn replicate(&self, state: &State, views: &[SideView]) {
        let Some(primary) = views
            .iter()
            .find(|v| v.member == state.primary && v.reachable)
        else {
            return;
        };
        let Ok(from) = self.member(&primary.member) else {
            return;
        };
        let (ns, name) = (&self.topology.namespace, &self.topology.name);
        for v in views
            .iter()
            .filter(|v| v.reachable && v.member != state.primary)
        {
            let Ok(to) = self.member(&v.member) else {
                continue;
            };
            if let Err(e) = sync::replicate(&from, &to, &self.name, ns, name).await {
                tracing::warn!(topology = %self.name, to = %v.member, error = format!("{e:#}"), "DR copy failed");
            }
        }
    }

    fn record(&self, views: &[SideView], state: Option<&State>, note: &str) -> Status {
        let primary = state.and_then(|s| views.iter().find(|v| v.member == s.primary));
        let sides = views
            .iter()
            .map(|v| SideStatus {
                member: v.member.clone(),
                reachable: v.reachable,
                role: v.report.as_ref().map(|r| r.role.clone()),
                fenced: v.report.as_ref().is_some_and(|r| r.fenced),
                lag_bytes: primary
                    .filter(|p| p.member != v.member)
                    .and_then(|p| decide::lag_bytes(p, v)),
            })
            .collect();
        let status = Status {
            topology: self.name.clone(),
            epoch: state.map(|s| s.epoch).unwrap_or_default(),
            primary: state.map(|s| s.primary.clone()).unwrap_or_default(),
            sides,
            primary_silent_ms: state.map_or(0, |s| {
                let silent = self.tracked().silent(std::time::Instant::now(), &s.primary);
                u64::try_from(silent.as_millis()).unwrap_or(u64::MAX)
            }),
            forced_at_ms: *self.forced_at_ms.lock().unwrap_or_else(|e| e.into_inner()),
            note: note.to_string(),
        };
        let lags: Vec<Option<(u64, f64)>> = views
            .iter()
            .map(|v| {
                self.tracked()
                    .lag(&v.member)
                    .map(|(b, t)| (b, t.as_secs_f64()))
            })
            .collect();
        let figures: Vec<crate::metrics::dr::SideFigures<'_>> = views
            .iter()
            .zip(lags)
            .map(|(v, lag)| crate::metrics::dr::SideFigures {
                member: &v.member,
                primary: status.primary == v.member,
                reachable: v.reachable && v.report.is_some(),
                lag: lag.filter(|_| status.primary != v.member),
            })
            .collect();
        let blocked = t_blocked(&self.registry, &self.topology);
        crate::metrics::dr::observe(&self.name, status.epoch, blocked, &figures);
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = status.clone();
        status
    }

    /// The witness's decision when the primary side does not answer: a
    /// forced state for the side to promote, written to that side before
    /// anything else (a promotion no copy records could be undone by a
    /// returning primary); a blocked promotion is a condition on the
    /// candidate.
    async fn witness(
        &self,
        state: &State,
        views: &[SideView],
        now: std::time::Instant,
    ) -> anyhow::Result<Option<State>> {
        let w = self.tracked().witness(now, &state.primary, views);
        let t = &self.topology;
        let limits = failover::Limits {
            failover_after: t.failover_after(),
            automatic: t.automatic_failover,
            max_rpo_bytes: t.max_rpo_bytes,
            max_rpo_lag: t.max_rpo_lag(),
        };
        let verdict = failover::decide(&w, &limits);
        for m in t.members.iter().filter(|m| **m != state.primary) {
            let why = match &verdict {
                failover::Verdict::Blocked(why) => Some(why.clone()),
                _ => None,
            };
            let blocked = why.is_some();
            if self.registry.set_notice(m, &t.namespace, &t.name, why) {
                // Its controller reconciles now and shows the condition.
                self.mark_blocked(m, blocked).await;
            }
        }
        let failover::Verdict::Promote(to) = verdict else {
            return Ok(None);
        };
        tracing::warn!(topology = %self.name, from = %state.primary, %to, witness = ?w,
            "the primary side is lost to the manager and to the replica side: promoting");
        crate::metrics::dr::promoted(&self.name, "failover");
        Ok(Some(self.write_forced(state, &to, views).await?))
    }
}
