//! The switch of a blue/green upgrade (`blue_green_exec.rs` decides when):
//! PAUSE, blue frozen, green confirms blue's last position, sequences, the
//! point of no return, relabel, the poolers follow green, RESUME — and its
//! undoing before that point. A child module of the executor: the same
//! `Upgrade`, its methods split by concern.

use super::super::blue_green::{self as machine, Limits, Record};
use super::super::blue_green_io as io;
use super::super::blue_green_sql as bg_sql;
use super::{RETIRED, Upgrade, now_ms};
use crate::controller::build::{LABEL_KIND, LABEL_ROLE};
use crate::controller::pooler;
use crate::controller::reconcile::{Error, kerr};
use crate::crd::Role;
use crate::crd::major_upgrade::MajorUpgradeStatus;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;
use std::time::{Duration, Instant};

impl Upgrade<'_> {
    pub(super) async fn pause(&self) -> Result<pooler::pause::Paused, Error> {
        pooler::pause::Paused::pause(&self.ctx.client, self.ns, pooler::live_pods(self.obs)).await
    }

    /// PAUSE, blue read-only, its last position recorded; green confirms
    /// it within what is left of the timeout, then the cutover — all in
    /// this round, while clients wait. Whatever fails before the point of
    /// no return leaves blue writable before the poolers go on.
    pub(super) async fn switch(&self, r: &Record, l: &Limits) -> Result<Action, Error> {
        let mut m = self.latest();
        m.step = machine::SWITCHING.into();
        let started = r.bg.switch_started_at_ms.unwrap_or_else(now_ms);
        if let Some(b) = m.blue_green.as_mut() {
            b.switch_started_at_ms = Some(started);
        }
        self.save(&m, json!({})).await?;
        let t0 = Instant::now();
        let paused = self.pause().await?;
        let blue = self.on(&self.blue_primary);
        let frozen = async {
            let lsn = io::freeze(blue).await?;
            if let Some(b) = m.blue_green.as_mut() {
                b.target_lsn = Some(lsn.clone());
            }
            self.save(&m, json!({})).await?;
            let dbs = blue.databases().await?;
            while !io::confirmed(blue, bg_sql::SLOT_PREFIX, &lsn, dbs.len()).await? {
                if now_ms() - started >= l.switch_timeout_ms {
                    return Ok(None);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            io::copy_sequences(blue, self.on(&self.green_primary()), &dbs).await?;
            Ok::<_, Error>(Some(dbs))
        };
        match frozen.await {
            Ok(Some(dbs)) => self.cut_over(paused, t0, dbs).await,
            // Timed out: blue writable, clients on; the next round undoes
            // the record (or rolls back after the last attempt).
            Ok(None) => {
                io::thaw(blue).await?;
                paused.resume().await;
                Ok(Action::requeue(Duration::from_millis(50)))
            }
            Err(e) => {
                let thawed = io::thaw(blue).await;
                paused.resume().await;
                thawed?;
                Err(e)
            }
        }
    }

    /// A switch found confirmed after a restart (the poolers may still be
    /// paused): sequences again (idempotent), then the cutover.
    pub(super) async fn resume_cutover(&self) -> Result<Action, Error> {
        let paused = self.pause().await?;
        let t0 = Instant::now();
        let blue = self.on(&self.blue_primary);
        let copied = async {
            let dbs = blue.databases().await?;
            io::copy_sequences(blue, self.on(&self.green_primary()), &dbs).await?;
            Ok::<_, Error>(dbs)
        };
        match copied.await {
            Ok(dbs) => self.cut_over(paused, t0, dbs).await,
            Err(e) => {
                let thawed = io::thaw(blue).await;
                paused.resume().await;
                thawed?;
                Err(e)
            }
        }
    }

    /// Green has all of blue, sequences too: the point of no return is
    /// written, then the Services and the poolers move to green.
    async fn cut_over(
        &self,
        paused: pooler::pause::Paused,
        t0: Instant,
        dbs: Vec<String>,
    ) -> Result<Action, Error> {
        let green = self.green_primary();
        let mut m = self.latest();
        m.step = machine::SWITCHED.into();
        // Blue's primary as it stopped: the one that follows green.
        m.primary = self.blue_primary.clone();
        if let Some(b) = m.blue_green.as_mut() {
            b.switched_at_ms = Some(now_ms());
        }
        let primary = json!({"currentPrimary": green, "targetPrimary": green});
        self.save(&m, primary).await?;
        // Before green's first write: the slots blue will follow it from
        // (without them blue stays a fenced copy as of now). Not when
        // blue goes at once (`keepBlueMinutes: 0`).
        if !self.keeps_blue() {
        } else if let Err(e) = io::open_back(self.on(&green), &dbs).await {
            tracing::warn!(error = %e, "blue/green: no reverse replication slots on green");
        }
        self.relabel().await?;
        self.follow().await?;
        paused.resume().await;
        let stall = t0.elapsed().as_millis() as i64;
        tracing::info!(cluster = %self.owner.name, stall_ms = stall, "blue/green: switched to green");
        self.finish_switch(&mut m, Some(dbs), stall).await?;
        let kept = match m.blue_green.as_ref().and_then(|b| b.reverse) {
            Some(true) => "following green (the path of a switch back)",
            _ => "fenced, as of the switch",
        };
        let note = format!(
            "switched to {green} on {}; writes paused {stall} ms; blue ({}) kept, {kept}",
            m.to_version,
            self.bg().blue.join(", ")
        );
        self.announce(EventType::Normal, "MajorUpgradeSwitched", note)
            .await;
        Ok(Action::requeue(Duration::from_millis(200)))
    }

    /// The parts of a cutover after the point of no return, repeated by a
    /// manager that finds `Switched` without a measured stall.
    pub(super) async fn after_switch(&self, dbs: Option<Vec<String>>) -> Result<(), Error> {
        self.relabel().await?;
        self.follow().await?;
        let pods = pooler::live_pods(self.obs);
        pooler::pause::admin(&self.ctx.client, self.ns, &pods, "RESUME").await;
        let mut m = self.latest();
        self.finish_switch(&mut m, dbs, -1).await
    }

    async fn finish_switch(
        &self,
        m: &mut MajorUpgradeStatus,
        dbs: Option<Vec<String>>,
        stall: i64,
    ) -> Result<(), Error> {
        let bg = self.bg();
        for pod in bg.blue.iter().filter(|p| **p != self.blue_primary) {
            self.verb(pod, "fence").await;
        }
        let green = self.green_primary();
        let dbs = match dbs {
            Some(d) => d,
            None => self.on(&green).databases().await?,
        };
        io::detach(self.on(&green), &dbs).await?;
        let reverse = self.keeps_blue() && self.follow_green(&dbs).await;
        if !reverse {
            self.verb(&self.blue_primary, "fence").await;
        }
        if let Some(b) = m.blue_green.as_mut() {
            b.stall_ms = Some(stall);
            b.reverse = Some(reverse);
        }
        self.save(m, json!({})).await
    }

    /// Blue's primary subscribes to green, when green has every slot made
    /// under the switch's PAUSE (a manager stopped before they were made
    /// cannot know what green took since: no reverse path then, and
    /// green's slots go).
    async fn follow_green(&self, dbs: &[String]) -> bool {
        let green_primary = self.green_primary();
        let green = self.on(&green_primary);
        let ready = io::back_slots(green).await.is_ok_and(|n| n == dbs.len());
        let host = format!("{}-rw", self.owner.name);
        let blue = self.on(&self.blue_primary);
        let followed = match ready {
            true => io::follow_green(blue, green, &host, !self.green_tls, dbs).await,
            false => Err(Error::Validate("green has no slots for blue".into())),
        };
        match followed {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "blue/green: blue does not follow green; it stays a copy as of the switch");
                let _ = io::unfollow(blue, dbs).await;
                let _ = io::drop_back_slots(green).await;
                false
            }
        }
    }

    /// Blue is kept after the switch (`keepBlueMinutes` is not 0).
    fn keeps_blue(&self) -> bool {
        let keep = self.pg.spec.major_upgrade.as_ref();
        keep.and_then(|m| m.keep_blue_minutes) != Some(0)
    }

    /// An instance verb whose failure is only logged (a fence of a Pod
    /// that is gone, an unfence of one that is not fenced).
    pub(super) async fn verb(&self, pod: &str, verb: &str) {
        let ran = crate::postgres::exec::run_verb(
            &self.ctx.client,
            self.ns,
            pod,
            &[verb],
            Duration::from_secs(60),
        )
        .await;
        if let Err(e) = ran {
            tracing::info!(pod = %pod, verb = %verb, error = %e, "blue/green: instance verb failed");
        }
    }

    /// Green's Pod into the Services (kind `instance`, primary), blue's out
    /// (its primary still labelled one: restarted, it must come back as
    /// the primary it is, never as a replica of `-rw`, which is green).
    async fn relabel(&self) -> Result<(), Error> {
        let mut patches = vec![(self.green_primary(), ("instance", Role::Primary))];
        for pod in self.bg().blue {
            let role = match pod == self.blue_primary {
                true => Role::Primary,
                false => Role::Fenced,
            };
            patches.push((pod, (RETIRED, role)));
        }
        self.label(patches).await
    }

    /// Sets the kind and role labels of each Pod (one that is gone is
    /// skipped).
    pub(super) async fn label(&self, patches: Vec<(String, (&str, Role))>) -> Result<(), Error> {
        let api = Api::<Pod>::namespaced(self.ctx.client.clone(), self.ns);
        let set = |(kind, role): (&str, Role)| json!({"metadata": {"labels": {LABEL_KIND: kind, LABEL_ROLE: role}}});
        for (pod, labels) in patches {
            let patch = set(labels);
            match api
                .patch(&pod, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(kerr("relabel", "Pod", &pod)(e)),
            }
        }
        Ok(())
    }

    /// The running poolers talk to green the way green's image can.
    async fn follow(&self) -> Result<(), Error> {
        let to = match self.green_tls {
            true => pooler::Upstream::own(self.owner),
            false => pooler::Upstream::own_plain(self.owner),
        };
        pooler::apply::follow(self.ctx, self.ns, self.obs, &to).await
    }

    /// Timed out: blue takes writes again, the poolers go on, and the
    /// switch is tried again from `CatchingUp`.
    pub(super) async fn undo_switch(&self, why: &str) -> Result<(), Error> {
        io::thaw(self.on(&self.blue_primary)).await?;
        let pods = pooler::live_pods(self.obs);
        pooler::pause::admin(&self.ctx.client, self.ns, &pods, "RESUME").await;
        let mut m = self.latest();
        m.step = machine::CATCHING_UP.into();
        if let Some(b) = m.blue_green.as_mut() {
            b.switch_attempts += 1;
            b.switch_started_at_ms = None;
            b.target_lsn = None;
        }
        self.save(&m, json!({})).await?;
        let note = format!("switch undone, blue takes writes again: {why}");
        self.announce(EventType::Warning, "BlueGreenSwitchUndone", note)
            .await;
        Ok(())
    }
}
