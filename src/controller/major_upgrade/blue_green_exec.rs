//! Carrying out a blue/green upgrade (the decisions and why they are safe
//! are in `blue_green.rs`; the SQL in `blue_green_sql.rs`, sent by
//! `blue_green_io.rs`). Each step is written to `status.majorUpgrade`
//! before it acts, and every action is idempotent, so a killed manager
//! resumes where it was.
//!
//! Green is one instance on the new version until the switch (its
//! replicas are cloned from it afterwards, through `-rw`, by the usual
//! build): a replica of green can only be cloned from green's primary, and
//! before the switch no Service leads there. Until the switch the round
//! sees only blue (green's names are hidden from the plan, the Services
//! select `pgfleet.io/kind=instance` and green's Pod says `green`); from
//! the switch on only green (blue's Pods say `retired`: its replicas are
//! fenced, its primary follows green until blue is removed, the path of a
//! switch back — `blue_green_back.rs`).

#[path = "blue_green_switch.rs"]
mod switch;

#[path = "blue_green_back.rs"]
mod back;

#[path = "blue_green_keep.rs"]
mod keep;

use super::blue_green::{self as machine, Limits, Next, Record};
use super::blue_green_io::{self as io, On};
use super::blue_green_sql as bg_sql;
use super::execute::{GreenInstance, Round};
use crate::controller::Ctx;
use crate::controller::build::Owner;
use crate::controller::image_policy::Effective;
use crate::controller::plan::{Observed, ordinal};
use crate::controller::pooler;
use crate::controller::reconcile::{Error, event, kerr};
use crate::controller::record::status_patch;
use crate::crd::PostgresCluster;
use crate::crd::major_upgrade::{BlueGreenStatus, MajorUpgradeStatus};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use std::time::Duration;

/// The annotation asking a blue/green upgrade to `finish` (remove blue
/// now, after the switch) or to `rollback` (before the switch).
pub const ANNOTATION: &str = "pgfleet.io/blue-green";
/// The kind label of green's Pod before the switch, and of blue's after.
pub const GREEN: &str = "green";
pub const RETIRED: &str = "retired";

/// Blue's instances and green's names when a blue/green upgrade begins
/// (after its pre-flight): one green instance, after blue's ordinals.
pub fn start(cluster: &str, obs: &Observed) -> BlueGreenStatus {
    let mut blue: Vec<String> = obs.pods.keys().cloned().collect();
    blue.extend(obs.pvcs.iter().cloned());
    blue.retain(|n| ordinal(cluster, n).is_some());
    blue.sort();
    blue.dedup();
    let green = machine::green_instances(cluster, &blue, 1);
    BlueGreenStatus {
        blue,
        green,
        ..BlueGreenStatus::default()
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

struct Upgrade<'a> {
    pg: &'a PostgresCluster,
    ctx: &'a Ctx,
    ns: &'a str,
    obs: &'a Observed,
    owner: &'a Owner,
    m: MajorUpgradeStatus,
    /// Blue's primary (before the switch: the cluster's).
    blue_primary: String,
    /// The target version's catalog entry has SSL.
    green_tls: bool,
    /// The record as this round last wrote it: the round's status write
    /// (which starts from the status read at its beginning) must carry it.
    saved: std::sync::Mutex<Option<MajorUpgradeStatus>>,
}

/// One round of a recorded blue/green upgrade.
pub async fn round(
    pg: &PostgresCluster,
    ctx: &Ctx,
    ns: &str,
    obs: &Observed,
    owner: &Owner,
    m: MajorUpgradeStatus,
) -> Result<Round, Error> {
    let status = pg.status.clone().unwrap_or_default();
    let target = ctx.images.resolve(&m.to_version).map_err(Error::Validate)?;
    let blue_primary = m
        .blue_green
        .as_ref()
        .and_then(|b| {
            let current = status.current_primary.clone()?;
            b.blue.contains(&current).then_some(current)
        })
        .unwrap_or_else(|| m.primary.clone());
    let u = Upgrade {
        pg,
        ctx,
        ns,
        obs,
        owner,
        green_tls: target.tls,
        blue_primary,
        m,
        saved: std::sync::Mutex::new(None),
    };
    let record = Record::of(&u.m);
    let limits = Limits {
        retention_ms: i64::from(
            pg.spec
                .major_upgrade
                .as_ref()
                .and_then(|s| s.keep_blue_minutes)
                .unwrap_or(1440),
        ) * 60_000,
        ..Limits::default()
    };
    let seen = u.see(&record).await;
    let next = machine::next(&record, &seen, &limits);
    let mut round = u.shape(&record, &next).await?;
    u.act(next, &record, &limits, &mut round).await?;
    if round.record.is_none() {
        let saved = u.saved.lock().unwrap_or_else(|e| e.into_inner()).take();
        round.record = saved.map(Some);
    }
    Ok(round)
}

impl Upgrade<'_> {
    fn bg(&self) -> BlueGreenStatus {
        self.m.blue_green.clone().unwrap_or_default()
    }

    /// The record as this round last wrote it, else as it began: every
    /// change starts from it, so a later write never puts back an earlier
    /// step.
    fn latest(&self) -> MajorUpgradeStatus {
        let saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        saved.clone().unwrap_or_else(|| self.m.clone())
    }

    fn on<'b>(&'b self, pod: &'b str) -> On<'b> {
        On {
            ctx: self.ctx,
            ns: self.ns,
            pod,
        }
    }

    fn green_primary(&self) -> String {
        self.bg().green.first().cloned().unwrap_or_default()
    }

    /// What the decision looks at; SQL only in the steps that need it.
    async fn see(&self, r: &Record) -> machine::Seen {
        let bg = self.bg();
        let present = |n: &String| self.obs.pods.contains_key(n) || self.obs.pvcs.contains(n);
        let wanted = self.pg.annotations().get(ANNOTATION).map(String::as_str);
        let mut seen = machine::Seen {
            now_ms: now_ms(),
            size: bg.green.len() as u32,
            green_ready: bg
                .green
                .iter()
                .filter(|n| {
                    self.obs
                        .pods
                        .get(*n)
                        .is_some_and(|p| p.ready && !p.deleting)
                })
                .count() as u32,
            blue_left: bg.blue.iter().any(present),
            green_left: bg.green.iter().any(present),
            finish_requested: wanted == Some("finish"),
            rollback_requested: wanted == Some("rollback"),
            ..machine::Seen::default()
        };
        let blue = self.on(&self.blue_primary);
        match r.step.as_str() {
            machine::PREPARING_BLUE => {
                seen.blue_logical = io::wal_level(blue).await.is_ok_and(|l| l == "logical");
            }
            machine::CATCHING_UP => {
                let green_primary = self.green_primary();
                let green = self.on(&green_primary);
                let progress = match blue.databases().await {
                    Ok(dbs) => io::progress(blue, green, &dbs).await,
                    Err(e) => Err(e),
                };
                match progress {
                    Ok(p) => {
                        seen.tables_syncing = Some(p.syncing);
                        seen.lag_bytes = Some(p.lag);
                        seen.oldest_transaction_secs = Some(p.oldest);
                        seen.without_identity = p.without_identity;
                    }
                    Err(e) => tracing::info!(error = %e, "blue/green: progress not readable"),
                }
            }
            machine::SWITCHING => {
                if let (Some(lsn), Ok(dbs)) = (r.bg.target_lsn.as_deref(), blue.databases().await) {
                    let slots = io::confirmed(blue, bg_sql::SLOT_PREFIX, lsn, dbs.len());
                    seen.target_confirmed = slots.await.unwrap_or(false);
                }
            }
            machine::SWITCHED if r.bg.reverse == Some(true) => {
                let green_primary = self.green_primary();
                seen.reverse_lag_bytes = io::back_lag(self.on(&green_primary)).await.ok();
            }
            machine::SWITCHING_BACK => {
                let green_primary = self.green_primary();
                let green = self.on(&green_primary);
                if let (Some(lsn), Ok(dbs)) = (r.bg.back_lsn.as_deref(), blue.databases().await) {
                    let slots = io::confirmed(green, bg_sql::BACK_PREFIX, lsn, dbs.len());
                    seen.back_confirmed = slots.await.unwrap_or(false);
                }
            }
            _ => {}
        }
        seen
    }

    /// What the rest of the round builds: which side it sees, for which
    /// version, with `wal_level = logical` and (green without SSL) the
    /// upgrade role's plain-text rule on blue.
    async fn shape(&self, r: &Record, next: &Next) -> Result<Round, Error> {
        let green_side = next.serves_green(r);
        let version = match green_side {
            true => &r.to_version,
            false => &r.from_version,
        };
        let run = self.ctx.images.resolve(version).map_err(Error::Validate)?;
        let eff = Effective {
            image: run.image.clone(),
            pgbackrest: run.pgbackrest,
            tls: run.tls,
            entry: run,
        };
        let mut round = Round {
            builds_for: Some((version.clone(), eff)),
            hide: match green_side {
                true => r.bg.blue.clone(),
                false => r.bg.green.clone(),
            },
            // Blue publishes (restarted for it), then green while blue
            // follows it (it started with it; its template stays).
            wal_logical: !green_side,
            wal_logical_config_only: green_side && reverse(r),
            ..Round::default()
        };
        let replicating = reverse(r)
            || matches!(
                r.step.as_str(),
                machine::CREATING_GREEN
                    | machine::SEEDING
                    | machine::CATCHING_UP
                    | machine::SWITCHING
            );
        if replicating && !self.green_tls {
            round.hba = self.plain_text_rules().await;
        }
        if matches!(
            r.step.as_str(),
            machine::SEEDING | machine::CATCHING_UP | machine::SWITCHING
        ) {
            let why = format!(
                "a blue/green upgrade to {} replicates rows, not schema changes: run no DDL until it has switched",
                r.to_version
            );
            round.notices.push(("DDLFrozen", "BlueGreenUpgrade", why));
        }
        Ok(round)
    }

    /// The upgrade's role let in, in plain text, from green's primary (to
    /// blue) and from blue's (to green, once blue follows it): one
    /// configuration serves both sides.
    async fn plain_text_rules(&self) -> Vec<String> {
        let api = Api::<Pod>::namespaced(self.ctx.client.clone(), self.ns);
        let mut ips = vec![];
        for pod in [self.green_primary(), self.blue_primary.clone()] {
            if let Ok(Some(p)) = api.get_opt(&pod).await
                && let Some(ip) = p.status.and_then(|s| s.pod_ip)
            {
                ips.push(ip);
            }
        }
        bg_sql::plain_text_rules(&ips).unwrap_or_default()
    }

    async fn save(&self, m: &MajorUpgradeStatus, extra: Value) -> Result<(), Error> {
        let mut v = serde_json::to_value(m)
            .map_err(|e| Error::Validate(format!("blue/green record: {e}")))?;
        // Absent options are cleared, not left as they were (merge patch).
        if let Some(o) = v.as_object_mut() {
            o.entry("failure").or_insert(Value::Null);
        }
        if let Some(b) = v.get_mut("blueGreen").and_then(Value::as_object_mut) {
            for key in ["switchStartedAtMs", "targetLsn", "switchedAtMs", "stallMs"] {
                b.entry(key).or_insert(Value::Null);
            }
        }
        let mut patch = json!({ "majorUpgrade": v });
        if let (Some(p), Some(e)) = (patch.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        status_patch(self.ctx, self.pg, patch).await?;
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Some(m.clone());
        Ok(())
    }

    async fn step_to(&self, step: &str) -> Result<MajorUpgradeStatus, Error> {
        let mut m = self.latest();
        if m.step != step {
            m.step = step.into();
            self.save(&m, json!({})).await?;
        }
        Ok(m)
    }

    async fn announce(&self, kind: EventType, reason: &str, note: String) {
        event(self.ctx, self.pg, kind, reason, note).await;
    }

    async fn act(
        &self,
        next: Next,
        r: &Record,
        l: &Limits,
        round: &mut Round,
    ) -> Result<(), Error> {
        let soon = |ms| Some(Action::requeue(Duration::from_millis(ms)));
        let switched = matches!(r.step.as_str(), machine::SWITCHED | machine::REMOVING_BLUE);
        if switched && self.bg().stall_ms.is_none() {
            // A manager stopped mid-cutover (the poolers may still be
            // paused): finish its parts first, whatever comes next.
            self.after_switch(None).await?;
        }
        match next {
            Next::PrepareBlue => round.within = Some(Duration::from_secs(2)),
            Next::CreateGreen => {
                self.create_green(r, round).await?;
                round.within = Some(Duration::from_secs(2));
            }
            Next::Seed => {
                round.done = self.seed_round(round).await?;
                round.within = Some(Duration::from_secs(5));
            }
            Next::Wait(why) => {
                round
                    .notices
                    .push(("MajorUpgradeProgressing", "BlueGreen", why));
                round.within = Some(Duration::from_secs(1));
            }
            Next::Switch => round.done = Some(self.switch(r, l).await?),
            Next::Cutover => round.done = Some(self.resume_cutover().await?),
            Next::UndoSwitch(why) => {
                self.undo_switch(&why).await?;
                round.done = soon(500);
            }
            Next::Retain => self.retain(r, l, round).await?,
            Next::SwitchBack => round.done = Some(self.switch_back(r, l).await?),
            Next::CutBack => round.done = Some(self.resume_cut_back().await?),
            Next::UndoSwitchBack(why) => {
                self.undo_switch_back(&why).await?;
                round.done = soon(500);
            }
            Next::GiveUpReverse(why) => self.give_up_reverse(&why).await?,
            Next::RemoveBlue => {
                self.remove_blue(r).await?;
                self.backups_or_notice(r, round).await;
                round.within = Some(Duration::from_secs(1));
            }
            Next::Done => self.done(r, round).await?,
            Next::RollBack(why) => {
                if r.bg.back_lsn.is_some() {
                    // Switched back: blue serves again before green goes.
                    self.after_cut_back().await?;
                }
                round.done = Some(self.roll_back(r, &why).await?)
            }
            Next::Blocked(why) => {
                if r.step == machine::ROLLING_BACK {
                    // Green is gone: the rollback is complete.
                    self.step_to(machine::ROLLED_BACK).await?;
                    let m = &self.ctx.member;
                    crate::metrics::ops::major_upgrade_ended(m, "blueGreen", "rolled_back", None);
                }
                if self.pg.spec.version != r.to_version {
                    // The tenant went back to the running version.
                    status_patch(self.ctx, self.pg, json!({"majorUpgrade": null})).await?;
                    round.record = Some(None);
                } else {
                    round
                        .notices
                        .push(("MajorUpgradeBlocked", "UpgradeFailed", why));
                }
            }
        }
        Ok(())
    }

    /// Seeds green; on success the step is `CatchingUp` and the round
    /// looks again soon, else the reason is shown and it tries again.
    async fn seed_round(&self, round: &mut Round) -> Result<Option<Action>, Error> {
        let mut m = self.step_to(machine::SEEDING).await?;
        match self.seed().await {
            Ok(n) => {
                m.step = machine::CATCHING_UP.into();
                self.save(&m, json!({})).await?;
                let note = format!("green subscribed to blue in {n} databases; catching up");
                self.announce(EventType::Normal, "BlueGreenSeeded", note)
                    .await;
                Ok(Some(Action::requeue(Duration::from_millis(200))))
            }
            Err(e) => {
                tracing::warn!(error = %e, "blue/green: seeding not done yet");
                let why = format!("seeding green: {e}");
                round
                    .notices
                    .push(("MajorUpgradeProgressing", "Seeding", why));
                Ok(None)
            }
        }
    }

    /// Green's volume and Pod (idempotent): the new version's image,
    /// initdb, wanted role primary, kind `green` (no Service selects it).
    /// Green's instance for the round's build, while its Pod is missing
    /// (the build creates volume and Pod like any new instance's).
    async fn create_green(&self, r: &Record, round: &mut Round) -> Result<(), Error> {
        if r.step != machine::CREATING_GREEN {
            self.step_to(machine::CREATING_GREEN).await?;
            let note = format!(
                "blue runs wal_level = logical; creating green ({}) on {}",
                r.bg.green.join(", "),
                r.to_version
            );
            self.announce(EventType::Normal, "BlueGreenCreatingGreen", note)
                .await;
        }
        let version = r.to_version.as_str();
        let name = self.green_primary();
        let Some(ordinal) = ordinal(&self.owner.name, &name) else {
            return Ok(());
        };
        if self.obs.pods.contains_key(&name) {
            return Ok(());
        }
        let mut pg = self.pg.clone();
        let run = self.ctx.images.resolve(version).map_err(Error::Validate)?;
        pg.spec.version = version.to_string();
        pg.spec.image = Some(run.image.clone());
        round.green = Some(Box::new(GreenInstance {
            pg,
            ordinal,
            repository: super::backups::applies(self.ctx, version),
        }));
        Ok(())
    }

    async fn seed(&self) -> Result<usize, Error> {
        let green = self.green_primary();
        let host = format!("{}-rw", self.owner.name);
        io::seed(
            self.on(&self.blue_primary),
            self.on(&green),
            &host,
            !self.green_tls,
        )
        .await
    }

    /// Before the switch only: blue as it was, green and what the upgrade
    /// made on blue gone; the reason stays.
    async fn roll_back(&self, r: &Record, why: &str) -> Result<Action, Error> {
        let mut m = self.latest();
        if m.step != machine::ROLLING_BACK {
            m.step = machine::ROLLING_BACK.into();
            m.failure = Some(format!(
                "blue/green upgrade rolled back, still on {}: {why}",
                r.from_version
            ));
            self.save(&m, json!({})).await?;
            self.announce(
                EventType::Warning,
                "MajorUpgradeRolledBack",
                why.to_string(),
            )
            .await;
        }
        let blue = self.on(&self.blue_primary);
        if r.bg.switch_started_at_ms.is_some() || r.step == machine::SWITCHING {
            io::thaw(blue).await?;
            let pods = pooler::live_pods(self.obs);
            pooler::pause::admin(&self.ctx.client, self.ns, &pods, "RESUME").await;
        }
        let dbs = blue.databases().await?;
        let green = self.green_primary();
        if self.obs.pods.get(&green).is_some_and(|p| p.ready) {
            for db in &dbs {
                let drop = super::blue_green_sql::drop_subscription(db);
                let _ = self.on(&green).apply(db, drop).await;
            }
        }
        io::clean_blue(blue, &dbs).await?;
        // The next round finds green gone and records `RolledBack`.
        self.delete_side(&r.bg.green).await?;
        Ok(Action::requeue(Duration::from_secs(1)))
    }

    async fn delete_side(&self, names: &[String]) -> Result<(), Error> {
        let pods = Api::<Pod>::namespaced(self.ctx.client.clone(), self.ns);
        let pvcs = Api::<PersistentVolumeClaim>::namespaced(self.ctx.client.clone(), self.ns);
        for n in names {
            gone(pods.delete(n, &DeleteParams::default()).await, "Pod", n)?;
            gone(
                pvcs.delete(n, &DeleteParams::default()).await,
                "PersistentVolumeClaim",
                n,
            )?;
        }
        Ok(())
    }
}

/// Blue follows green (or may: the switch's last part not done yet).
fn reverse(r: &Record) -> bool {
    matches!(r.step.as_str(), machine::SWITCHED | machine::SWITCHING_BACK)
        && r.bg.reverse != Some(false)
}

fn gone<T>(r: Result<T, kube::Error>, kind: &'static str, name: &str) -> Result<(), Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(kerr("delete", kind, name)(e)),
    }
}
