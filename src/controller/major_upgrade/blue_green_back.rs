//! The switch back of a blue/green upgrade (`pgfleet.io/blue-green:
//! rollback` after the switch, while blue follows green): the switch
//! mirrored — PAUSE, green frozen, blue confirms green's last position,
//! sequences copied back, the point of no return (`RollingBack` with blue's
//! primary as the cluster's), blue in the Services and the poolers on it,
//! RESUME; green then goes as in any rollback. Its undoing before that
//! point leaves green serving. Also giving up the reverse path. A child
//! module of the executor, like the switch.

use super::super::blue_green::{self as machine, Limits, Record};
use super::super::blue_green_io as io;
use super::super::blue_green_sql as bg_sql;
use super::{RETIRED, Upgrade, now_ms};
use crate::controller::pooler;
use crate::controller::reconcile::Error;
use crate::crd::Role;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;
use std::time::{Duration, Instant};

impl Upgrade<'_> {
    /// PAUSE, green read-only, its last position recorded; blue confirms
    /// it within what is left of the timeout, then the cut back — all in
    /// this round, while clients wait. Whatever fails before the point of
    /// no return leaves green writable before the poolers go on.
    pub(super) async fn switch_back(&self, r: &Record, l: &Limits) -> Result<Action, Error> {
        let mut m = self.latest();
        m.step = machine::SWITCHING_BACK.into();
        let started = r.bg.back_started_at_ms.unwrap_or_else(now_ms);
        if let Some(b) = m.blue_green.as_mut() {
            b.back_started_at_ms = Some(started);
        }
        self.save(&m, json!({})).await?;
        let t0 = Instant::now();
        let paused = self.pause().await?;
        let green_primary = self.green_primary();
        let (green, blue) = (self.on(&green_primary), self.on(&self.blue_primary));
        let frozen = async {
            let lsn = io::freeze(green).await?;
            if let Some(b) = m.blue_green.as_mut() {
                b.back_lsn = Some(lsn.clone());
            }
            self.save(&m, json!({})).await?;
            // Blue's databases: the ones green got slots for at the switch.
            let dbs = blue.databases().await?;
            while !io::confirmed(green, bg_sql::BACK_PREFIX, &lsn, dbs.len()).await? {
                if now_ms() - started >= l.switch_timeout_ms {
                    return Ok(None);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            io::copy_sequences(green, blue, &dbs).await?;
            Ok::<_, Error>(Some(dbs))
        };
        match frozen.await {
            Ok(Some(dbs)) => self.cut_back(paused, t0, dbs).await,
            Ok(None) => {
                io::thaw(green).await?;
                paused.resume().await;
                Ok(Action::requeue(Duration::from_millis(50)))
            }
            Err(e) => {
                let thawed = io::thaw(green).await;
                paused.resume().await;
                thawed?;
                Err(e)
            }
        }
    }

    /// A switch back found confirmed after a restart: sequences again
    /// (idempotent), then the cut back.
    pub(super) async fn resume_cut_back(&self) -> Result<Action, Error> {
        let paused = self.pause().await?;
        let t0 = Instant::now();
        let green_primary = self.green_primary();
        let (green, blue) = (self.on(&green_primary), self.on(&self.blue_primary));
        let copied = async {
            let dbs = blue.databases().await?;
            io::copy_sequences(green, blue, &dbs).await?;
            Ok::<_, Error>(dbs)
        };
        match copied.await {
            Ok(dbs) => self.cut_back(paused, t0, dbs).await,
            Err(e) => {
                let thawed = io::thaw(green).await;
                paused.resume().await;
                thawed?;
                Err(e)
            }
        }
    }

    /// Blue has all of green: the point of no return of the switch back is
    /// written (every green instance named, so the rollback hides and
    /// removes them all), then blue serves again.
    async fn cut_back(
        &self,
        paused: pooler::pause::Paused,
        t0: Instant,
        dbs: Vec<String>,
    ) -> Result<Action, Error> {
        let blue = self.blue_primary.clone();
        let mut m = self.latest();
        m.step = machine::ROLLING_BACK.into();
        m.failure = Some(format!(
            "switched back to {} on request: the upgrade to {} is rolled back",
            m.from_version, m.to_version
        ));
        if let Some(b) = m.blue_green.as_mut() {
            let mut green: Vec<String> = self.obs.pods.keys().cloned().collect();
            green.extend(self.obs.pvcs.iter().cloned());
            green.retain(|n| !b.blue.contains(n) && !b.green.contains(n));
            green.sort();
            green.dedup();
            b.green.extend(green);
        }
        let primary = json!({"currentPrimary": blue, "targetPrimary": blue});
        self.save(&m, primary).await?;
        if let Err(e) = io::unfollow(self.on(&blue), &dbs).await {
            tracing::warn!(error = %e, "blue/green: blue's reverse subscriptions not dropped yet");
        }
        self.serve_blue().await?;
        paused.resume().await;
        let stall = t0.elapsed().as_millis() as i64;
        tracing::info!(cluster = %self.owner.name, stall_ms = stall, "blue/green: switched back to blue");
        self.retire_green(&m).await;
        let note = format!(
            "switched back to {blue} on {}; writes paused {stall} ms; green is removed",
            m.from_version
        );
        self.announce(EventType::Warning, "MajorUpgradeSwitchedBack", note)
            .await;
        Ok(Action::requeue(Duration::from_millis(200)))
    }

    /// The parts of a cut back after its point of no return that serve
    /// clients, repeated by a manager that finds `RollingBack` after a
    /// switch back (all idempotent; RESUME of a pooler not paused is
    /// harmless).
    pub(super) async fn after_cut_back(&self) -> Result<(), Error> {
        let m = self.latest();
        self.serve_blue().await?;
        let pods = pooler::live_pods(self.obs);
        pooler::pause::admin(&self.ctx.client, self.ns, &pods, "RESUME").await;
        self.retire_green(&m).await;
        Ok(())
    }

    /// Blue writable, in the Services instead of green (green out first:
    /// `-rw` never selects two primaries), the poolers on it.
    async fn serve_blue(&self) -> Result<(), Error> {
        io::thaw(self.on(&self.blue_primary)).await?;
        // By name, not from the round's view: a round after the point of
        // no return sees blue only. A Pod that is gone is skipped.
        let bg = self.latest().blue_green.unwrap_or_default();
        let out = bg
            .green
            .iter()
            .map(|p| (p.clone(), (RETIRED, Role::Fenced)));
        self.label(out.collect()).await?;
        let mut patches = vec![];
        for pod in self.bg().blue {
            let role = match pod == self.blue_primary {
                true => Role::Primary,
                false => Role::Replica,
            };
            patches.push((pod, ("instance", role)));
        }
        self.label(patches).await?;
        let run = self.ctx.images.resolve(&self.latest().from_version);
        let tls = run.map_err(Error::Validate)?.tls;
        let to = match tls {
            true => pooler::Upstream::own(self.owner),
            false => pooler::Upstream::own_plain(self.owner),
        };
        pooler::apply::follow(self.ctx, self.ns, self.obs, &to).await
    }

    /// Green (out of the Services already) stopped; blue's replicas
    /// unfenced (they follow blue's primary through `-rw` again).
    async fn retire_green(&self, m: &crate::crd::major_upgrade::MajorUpgradeStatus) {
        let bg = m.blue_green.clone().unwrap_or_default();
        for pod in &bg.green {
            self.verb(pod, "fence").await;
        }
        for pod in bg.blue.iter().filter(|p| **p != self.blue_primary) {
            self.verb(pod, "unfence").await;
        }
    }

    /// Timed out: green takes writes again, the poolers go on; blue still
    /// follows, and the annotation asks again (a few times).
    pub(super) async fn undo_switch_back(&self, why: &str) -> Result<(), Error> {
        io::thaw(self.on(&self.green_primary())).await?;
        let pods = pooler::live_pods(self.obs);
        pooler::pause::admin(&self.ctx.client, self.ns, &pods, "RESUME").await;
        let mut m = self.latest();
        m.step = machine::SWITCHED.into();
        if let Some(b) = m.blue_green.as_mut() {
            b.back_attempts += 1;
            b.back_started_at_ms = None;
            b.back_lsn = None;
        }
        self.save(&m, json!({})).await?;
        let note = format!("switch back undone, green takes writes again: {why}");
        self.announce(EventType::Warning, "BlueGreenSwitchBackUndone", note)
            .await;
        Ok(())
    }

    /// Blue stops following green (too far behind): green's slots go
    /// before they fill its disk; blue stays, fenced, a copy as of when it
    /// stopped.
    pub(super) async fn give_up_reverse(&self, why: &str) -> Result<(), Error> {
        let blue = self.on(&self.blue_primary);
        if let Ok(dbs) = blue.databases().await
            && let Err(e) = io::unfollow(blue, &dbs).await
        {
            tracing::warn!(error = %e, "blue/green: blue's reverse subscriptions not dropped");
        }
        io::drop_back_slots(self.on(&self.green_primary())).await?;
        self.verb(&self.blue_primary, "fence").await;
        let mut m = self.latest();
        if let Some(b) = m.blue_green.as_mut() {
            b.reverse = Some(false);
        }
        self.save(&m, json!({})).await?;
        let note = format!("blue no longer follows green, a rollback is now a restore: {why}");
        self.announce(EventType::Warning, "BlueGreenReverseStopped", note)
            .await;
        Ok(())
    }
}
