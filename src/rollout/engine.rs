//! The rollout engine: observe every member cluster, ask the planner, apply
//! its decision, repeat. It only changes `spec.version` — or, for a role set
//! rotation, the set's generation annotation (`target`) — and its marks on
//! PostgresClusters; each cluster's controller carries out the rolling
//! update. Nothing lives only in memory: marks are on the PostgresClusters,
//! operator commands and halts in the control ConfigMaps, so a restarted
//! engine decides exactly what the stopped one would have.

use super::control::{self, Stored};
use super::plan::{
    self, ControlState, Decision, Halt, Member, Pgc, PgcRef, RolloutSpec, RolloutState, StageSpec,
    Unreachable,
};
use crate::config::{Rollout, Settings};
use crate::controller::SlimMeta;
use crate::crd::PostgresCluster;
use crate::fleet::{ConnState, Fleet};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tracing::Instrument;

use crate::platform::clock::Clock;

/// Everything the engine saw in one round.
#[derive(Debug, Clone)]
pub struct Observation {
    pub members: Vec<Member>,
    pub pgcs: Vec<Pgc>,
    pub stored: Stored,
    /// Why the control could not be read from its home (then `stored` is a
    /// pause that exists only in memory and commands are refused).
    pub control_error: Option<String>,
    /// Unreachable members this engine never listed: their PostgresClusters
    /// are unknown, so the rollout can neither count them nor finish.
    pub unknown: Vec<String>,
}

pub struct Engine {
    pub spec: RolloutSpec,
    config: Rollout,
    /// What the rollout moves on each PostgresCluster.
    target: super::target::Target,
    /// The role set of a rotation (which PostgresClusters have the role).
    role_set: Option<crate::config::roles::RoleSet>,
    fleet: Arc<Fleet>,
    /// The member holding the only trusted copy of the control.
    home: Arc<crate::fleet::Member>,
    windows: BTreeMap<String, Option<crate::config::window::Window>>,
    clock: Arc<dyn Clock>,
    /// The last listing of each member: while one is unreachable its
    /// PostgresClusters are still known (and deferred or failed by policy).
    seen: Mutex<BTreeMap<String, Vec<Pgc>>>,
    /// The longest pause between rounds.
    pub tick: Duration,
    /// The rollout's trace (its root context is stored with the control).
    trace: super::trace::RolloutTrace,
}

/// The planner's form of a configured rollout.
pub fn spec_of(name: &str, r: &Rollout) -> RolloutSpec {
    RolloutSpec {
        name: name.to_string(),
        target_version: match (&r.role_set, r.generation) {
            (Some(_), Some(g)) => g.to_string(),
            _ => r.version().to_string(),
        },
        role_set: r.role_set.clone(),
        method: r.major_method(),
        stages: r
            .stages
            .iter()
            .map(|s| StageSpec {
                name: s.name.clone(),
                max_concurrency: s.max_concurrency.get(),
                soak: s.soak.get(),
                requires_approval: s.requires_approval,
            })
            .collect(),
        max_failures: r.max_failures,
        progress_deadline: r.progress_deadline.get(),
        on_failure: r.on_failure.get(),
        unreachable: r.unreachable.get(),
    }
}

impl Engine {
    pub fn new(
        name: &str,
        settings: &Settings,
        fleet: Arc<Fleet>,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Engine> {
        let config = settings
            .rollouts
            .get(name)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no rollout named {name:?} in [rollouts]"))?;
        let home = control::home_of(&fleet.members, settings.manager.control_member.as_deref())
            .ok_or_else(|| {
                anyhow::anyhow!("[manager] control_member names no member cluster of the fleet")
            })?;
        let spec = spec_of(name, &config);
        let role_set = match &config.role_set {
            Some(set) => Some(settings.roles.get(set).cloned().ok_or_else(|| {
                anyhow::anyhow!("rollout {name}: no role set named {set:?} in [roles]")
            })?),
            None => None,
        };
        let target = match &config.role_set {
            Some(set) => super::target::Target::RoleSet(set.clone()),
            None => super::target::Target::Version,
        };
        Ok(Engine {
            home,
            trace: super::trace::RolloutTrace::new(name, &spec.target_version),
            spec,
            target,
            role_set,
            config,
            windows: settings
                .clusters
                .iter()
                .map(|c| (c.name.clone(), c.maintenance_window.clone()))
                .collect(),
            fleet,
            clock,
            seen: Mutex::default(),
            tick: Duration::from_secs(2),
        })
    }

    pub fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// Reads members, PostgresClusters and the stored control.
    pub async fn observe(&self) -> Observation {
        let now = self.now();
        let mut members = vec![];
        let mut pgcs = vec![];
        let mut reachable = vec![];
        let mut unknown = vec![];
        for m in &self.fleet.members {
            let in_window = self
                .windows
                .get(&m.name)
                .and_then(|w| w.as_ref())
                .and_then(|w| w.parsed())
                .is_none_or(|w| w.contains(now));
            let listed = if matches!(m.state(), ConnState::Unreachable { .. }) {
                None
            } else {
                Api::<PostgresCluster>::all(m.client())
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| tracing::debug!(cluster = %m.name, error = %e, "listing for the rollout"))
                    .ok()
            };
            members.push(Member {
                name: m.name.clone(),
                reachable: listed.is_some(),
                in_window,
            });
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            let Some(list) = listed else {
                match seen.get(&m.name) {
                    Some(last) => pgcs.extend(last.iter().cloned()),
                    None if self.config.stages.iter().any(|s| s.selects(&m.labels)) => {
                        unknown.push(m.name.clone())
                    }
                    None => {}
                }
                continue;
            };
            reachable.push(m.clone());
            let mine: Vec<Pgc> =
                list.items
                    .iter()
                    .map(|pg| {
                        let labels = pg.metadata.labels.clone().unwrap_or_default();
                        let has_role = self.role_set.as_ref().is_none_or(|r| r.selects(&labels));
                        let stage = self.config.stages.iter().position(|s| {
                            s.selects(&m.labels) && s.selects_postgrescluster(&labels)
                        });
                        self.target.observe(&m.name, pg, stage.filter(|_| has_role))
                    })
                    .collect();
            pgcs.extend(mine.iter().cloned());
            seen.insert(m.name.clone(), mine);
        }
        let (stored, control_error) = self.read_control(&reachable, &pgcs).await;
        Observation {
            members,
            pgcs,
            stored,
            control_error,
            unknown,
        }
    }

    /// The member whose control ConfigMap is the only one read and written.
    pub fn control_home(&self) -> &Arc<crate::fleet::Member> {
        &self.home
    }

    /// Failed PostgresClusters now (what a resume acknowledges).
    pub fn failures(&self, pgcs: &[Pgc]) -> u32 {
        let n = pgcs
            .iter()
            .filter(|p| {
                matches!(
                    plan::pgc_state(&self.spec, p),
                    plan::PgcState::Failed { .. }
                )
            })
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The control from its home, checked against this rollout
    /// ([`control::trusted`]). When the home cannot be read the rollout
    /// counts as paused (in memory only): nothing starts on an untrusted or
    /// unknown control.
    async fn read_control(
        &self,
        reachable: &[Arc<crate::fleet::Member>],
        pgcs: &[Pgc],
    ) -> (Stored, Option<String>) {
        let read = if reachable.iter().any(|m| m.name == self.home.name) {
            control::read(&self.home, &self.spec.name).await
        } else {
            Err(anyhow::anyhow!(
                "member cluster {} (the rollout control home) is unreachable",
                self.home.name
            ))
        };
        match read {
            Ok(s) => {
                let stages: Vec<&str> = self.spec.stages.iter().map(|s| s.name.as_str()).collect();
                (control::trusted(s, &stages, self.failures(pgcs)), None)
            }
            Err(e) => {
                let why = format!("{e:#}");
                let mut s = Stored::default();
                s.control.state = ControlState::Paused;
                s.control.reason = Some(format!(
                    "the rollout control cannot be read ({why}); nothing new starts until it can"
                ));
                (s, Some(why))
            }
        }
    }

    /// The spec the planner sees: failures an operator acknowledged by
    /// resuming do not count against the budget again.
    fn effective_spec(&self, stored: &Stored) -> RolloutSpec {
        let mut spec = self.spec.clone();
        spec.max_failures = spec.max_failures.saturating_add(stored.acknowledged);
        spec
    }

    /// What the planner decides now, without applying it (status, dry runs).
    pub fn decide(&self, obs: &Observation) -> Decision {
        let mut d = plan::decide(
            &self.effective_spec(&obs.stored),
            &obs.members,
            &obs.pgcs,
            &obs.stored.control,
            self.now(),
        );
        if let Some(m) = obs.unknown.first() {
            let active = obs.stored.control.state == ControlState::Active;
            if self.spec.unreachable == Unreachable::CountAsFailure && active && d.halt.is_none() {
                d.halt = Some(Halt {
                    on_failure: self.spec.on_failure,
                    reason: format!(
                        "member cluster {m} unreachable (unreachable = count_as_failure); its PostgresClusters could not be listed"
                    ),
                });
                d.start.clear();
            }
            if d.status.state == RolloutState::Completed {
                // Not done while a member's PostgresClusters are unknown.
                d.status.state = RolloutState::Running;
            }
        }
        d
    }

    /// One round: observe, decide, apply. Returns the decision.
    pub async fn round(&self) -> anyhow::Result<Decision> {
        let obs = self.observe().await;
        let d = self.decide(&obs);
        self.apply(&obs, &d).await?;
        Ok(d)
    }

    /// Runs rounds until the task is dropped; never gives up on errors.
    pub async fn run(self: Arc<Self>) {
        // Any PostgresCluster change (a finished update, a failure) wakes
        // the next round at once: pacing follows the clusters, not the tick.
        let wake = Arc::new(tokio::sync::Notify::new());
        let mut watches = vec![];
        for m in &self.fleet.members {
            let (wake, client) = (wake.clone(), m.client());
            watches.push(crate::platform::task::AbortOnDrop(tokio::spawn(
                async move {
                    use futures::StreamExt;
                    use kube::runtime::{WatchStreamExt, watcher};
                    // Metadata only: a change is all that is read (every
                    // change, status too, moves the resourceVersion).
                    let api: Api<SlimMeta<PostgresCluster>> = Api::all(client);
                    let stream = watcher(api, watcher::Config::default())
                        .default_backoff()
                        .touched_objects();
                    futures::pin_mut!(stream);
                    while stream.next().await.is_some() {
                        wake.notify_one();
                    }
                },
            )));
        }
        let mut last = String::new();
        loop {
            let wait = match self.round().await {
                Ok(d) => {
                    super::metrics::observe(&self.spec.name, &d.status);
                    let line = d.status.to_string();
                    if line != last {
                        tracing::info!(rollout = %self.spec.name, status = %line, "rollout progress");
                        last = line;
                    }
                    d.wake_after.map_or(self.tick, |w| w.min(self.tick))
                }
                Err(e) => {
                    tracing::warn!(rollout = %self.spec.name, error = %e, "rollout round failed; retrying");
                    self.tick
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait.max(Duration::from_millis(50))) => {}
                _ = wake.notified() => {}
            }
        }
    }

    async fn apply(&self, obs: &Observation, d: &Decision) -> anyhow::Result<()> {
        let find = |r: &PgcRef| {
            obs.pgcs
                .iter()
                .find(|p| p.member == r.member && p.namespace == r.namespace && p.name == r.name)
        };
        let stage_name = |p: &Pgc| {
            p.stage
                .and_then(|i| self.spec.stages.get(i))
                .map(|s| s.name.clone())
                .unwrap_or_default()
        };
        let name = &self.spec.name;
        let target = &self.spec.target_version;
        // Rounds that only watch (most of them) need no trace context.
        let idle = d.finish.is_empty()
            && d.fail.is_empty()
            && d.revert.is_empty()
            && d.start.is_empty()
            && d.pre_flight.is_empty()
            && d.halt.is_none();
        let root = match idle {
            true => None,
            false => self.trace.root(&self.reachable(obs)).await,
        };
        let root = root.as_ref();
        for (r, at) in &d.finish {
            if let Some(m) = find(r).and_then(|p| p.mark.as_ref()) {
                self.trace.wait(root, r, m.started, *at);
            }
            let span = self.trace.span("rollout.finish", r, root);
            let patched = self.patch(r, self.target.finish_patch(*at));
            if let Err(e) = patched.instrument(span.clone()).await {
                tracing::warn!(rollout = %name, error = %e, "could not record a finish");
                continue;
            }
            self.event(
                r,
                EventType::Normal,
                "RolloutSucceeded",
                format!("rollout {name}: runs {target}"),
            )
            .instrument(span)
            .await;
        }
        for (r, reason) in &d.fail {
            let span = self.trace.span("rollout.fail", r, root);
            let patched = self.patch(r, self.target.fail_patch(reason));
            if patched.instrument(span.clone()).await.is_ok() {
                self.event(
                    r,
                    EventType::Warning,
                    "RolloutFailed",
                    format!("rollout {name}: {reason}"),
                )
                .instrument(span)
                .await;
            }
        }
        if let Some(h) = &d.halt
            && obs.stored.control.state == ControlState::Active
            && obs.control_error.is_none()
        {
            let mut next = obs.stored.clone();
            next.control.state = match h.on_failure {
                crate::config::choices::OnFailure::Pause => ControlState::Paused,
                crate::config::choices::OnFailure::Abort => ControlState::Aborted,
                crate::config::choices::OnFailure::Rollback => ControlState::RollingBack,
            };
            next.control.reason = Some(h.reason.clone());
            tracing::warn!(rollout = %name, reason = %h.reason, "rollout halted");
            let span = self.trace.halt_span(&self.home.name, root);
            control::write(&self.home, name, next)
                .instrument(span)
                .await?;
        }
        for r in &d.revert {
            let Some(prev) = find(r)
                .and_then(|p| p.mark.as_ref())
                .map(|m| m.previous_version.clone())
            else {
                continue;
            };
            let span = self.trace.span("rollout.revert", r, root);
            let patched = self.patch(r, self.target.revert_patch(&prev));
            if let Err(e) = patched.instrument(span.clone()).await {
                // Retried next round (the decision is made again).
                tracing::warn!(rollout = %name, error = %e, "could not revert");
                continue;
            }
            self.event(
                r,
                EventType::Normal,
                "RolloutReverted",
                format!("rollout {name}: back to {prev}"),
            )
            .instrument(span)
            .await;
        }
        for r in &d.pre_flight {
            let span = self.trace.span("rollout.pre_flight", r, root);
            let patched = self.patch(r, super::marks::pre_flight_patch(target));
            if let Err(e) = patched.instrument(span).await {
                tracing::warn!(rollout = %name, error = %e, "could not ask for a pre-flight");
            }
        }
        for r in &d.start {
            let Some(p) = find(r) else { continue };
            let span = self.trace.span("rollout.start", r, root);
            let method = super::preflight::method_for(&self.spec, p);
            let patch = self
                .target
                .start_patch(name, &p.spec_version, target, self.now(), method);
            if let Err(e) = self.patch(r, patch).instrument(span.clone()).await {
                tracing::warn!(rollout = %name, error = %e, "could not start");
                continue;
            }
            self.event(
                r,
                EventType::Normal,
                "RolloutStarted",
                format!(
                    "rollout {name} stage {}: {} → {target}",
                    stage_name(p),
                    p.spec_version
                ),
            )
            .instrument(span)
            .await;
        }
        Ok(())
    }

    fn reachable(&self, obs: &Observation) -> Vec<Arc<crate::fleet::Member>> {
        self.fleet
            .members
            .iter()
            .filter(|m| obs.members.iter().any(|o| o.name == m.name && o.reachable))
            .cloned()
            .collect()
    }

    fn member(&self, name: &str) -> anyhow::Result<&Arc<crate::fleet::Member>> {
        self.fleet
            .get(name)
            .ok_or_else(|| anyhow::anyhow!("no member cluster {name}"))
    }

    async fn patch(&self, r: &PgcRef, patch: Value) -> anyhow::Result<()> {
        let api: Api<PostgresCluster> =
            Api::namespaced(self.member(&r.member)?.client(), &r.namespace);
        api.patch(&r.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| anyhow::anyhow!("updating {r}: {e}"))?;
        Ok(())
    }

    async fn event(&self, r: &PgcRef, type_: EventType, reason: &str, note: String) {
        let Ok(m) = self.member(&r.member) else {
            return;
        };
        crate::platform::events::on_postgres_cluster(
            m.client(),
            "pgfleet-rollout",
            &r.namespace,
            &r.name,
            type_,
            reason,
            note,
        )
        .await;
    }
}
