//! The backup dispatcher: one loop for the whole fleet. Each round it lists
//! the PostgresClusters and PostgresBackups of every reachable member,
//! asks `schedule` what is due and what may start under the caps, and acts:
//! creates the records of scheduled backups (at start, never queued in
//! advance, so an outage cannot pile them up), skips late slots with an
//! Event, retries failures after their backoff, and hands each started
//! backup to a runner task (`run.rs`). Cron ticks (tokio-cron-scheduler),
//! new PostgresBackups and finished backups only wake the loop; it also
//! looks every `tick`.
//!
//! Its memory is in the cluster: `status.backup.lastSlot` and the
//! PostgresBackup records (`spec.slot`, `status.attempts`,
//! `status.nextAttemptAt`), so a restarted manager neither repeats a slot
//! nor replays missed ones.

use super::run::{self, Job};
use super::schedule::{self, Candidate, Caps, Due, Running};
use crate::config::backups::Backups;
use crate::controller::SlimMeta;
use crate::crd::{PostgresBackup, PostgresCluster};
use crate::fleet::{ConnState, Fleet, Member};
use crate::pgbackrest::repo::BackupEnv;
use crate::platform::clock::Clock;
use crate::platform::time::{parse_ts, ts};
use chrono::{DateTime, Utc};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod checks;

use crate::platform::labels::DRILL_OF;

/// Whether this replica owns a member (see `Dispatcher::acts_on`).
pub type Owned = Arc<dyn Fn(&str) -> bool + Send + Sync>;

pub struct Dispatcher {
    cfg: Backups,
    env: Arc<BackupEnv>,
    fleet: Arc<Fleet>,
    clock: Arc<dyn Clock>,
    /// Backups this process is running (`member/ns/backup`).
    running: Arc<Mutex<HashMap<String, tokio::task::JoinHandle<()>>>>,
    /// When each cluster's archiving was last checked (`member/ns/name`).
    archive_checked: Mutex<HashMap<String, DateTime<Utc>>>,
    /// One per PostgresCluster: its backup and its archive checks take turns.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pub tick: Duration,
    pub archive_interval: Duration,
    /// The member clusters backed up (all when `None`): without a
    /// configured repository only the embedded ones can reach the default.
    pub members: Option<std::collections::BTreeSet<String>>,
    /// The members this replica owns (HA, `ha::Ownership`); all when
    /// `None`. Only they are acted on; the others' running backups still
    /// count against the fleet-wide caps.
    pub acts_on: Option<Owned>,
    pub wake: Arc<tokio::sync::Notify>,
}

/// One PostgresCluster as the dispatcher sees it.
struct Pgc {
    member: Arc<Member>,
    pg: PostgresCluster,
    backups: Vec<PostgresBackup>,
}

impl Pgc {
    fn key(&self) -> String {
        format!(
            "{}/{}/{}",
            self.member.name,
            self.pg.namespace().unwrap_or_default(),
            self.pg.name_any()
        )
    }
}

impl Dispatcher {
    pub fn new(
        cfg: &Backups,
        env: Arc<BackupEnv>,
        fleet: Arc<Fleet>,
        clock: Arc<dyn Clock>,
    ) -> Dispatcher {
        Dispatcher {
            cfg: cfg.clone(),
            env,
            fleet,
            clock,
            running: Arc::default(),
            archive_checked: Mutex::default(),
            locks: Mutex::default(),
            tick: Duration::from_secs(10),
            members: None,
            acts_on: None,
            archive_interval: Duration::from_secs(30),
            wake: Arc::default(),
        }
    }

    fn now(&self) -> DateTime<Utc> {
        DateTime::<Utc>::from(self.clock.now())
    }

    fn repository_id(&self) -> String {
        match &self.env.repository {
            crate::config::backups::Repository::S3(s) => format!("s3:{}/{}", s.endpoint, s.bucket),
            crate::config::backups::Repository::Filesystem { path } => {
                format!("fs:{}", path.display())
            }
        }
    }

    /// Backups running in this process right now.
    pub fn running_count(&self) -> usize {
        let mut r = self.running.lock().unwrap_or_else(|e| e.into_inner());
        r.retain(|_, h| !h.is_finished());
        r.len()
    }

    fn owned(&self, member: &str) -> bool {
        self.acts_on.as_ref().is_none_or(|f| f(member))
    }

    /// Backups running in members another replica owns: they count against
    /// the fleet-wide caps, but this replica leaves them alone.
    async fn foreign_running(&self, repository: &str) -> Vec<Running> {
        let mut out = vec![];
        for m in &self.fleet.members {
            if self.owned(&m.name)
                || matches!(m.state(), ConnState::Unreachable { .. })
                || self.members.as_ref().is_some_and(|s| !s.contains(&m.name))
            {
                continue;
            }
            let Ok(pbs) = Api::<PostgresBackup>::all(m.client())
                .list(&ListParams::default())
                .await
            else {
                continue;
            };
            for b in pbs.items {
                if b.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
                    let ns = b.namespace().unwrap_or_default();
                    out.push(Running {
                        member: m.name.clone(),
                        repository: repository.to_string(),
                        cluster_key: format!("{}/{ns}/{}", m.name, b.spec.cluster),
                    });
                }
            }
        }
        out
    }

    async fn observe(&self) -> Vec<Pgc> {
        let mut out = vec![];
        for m in &self.fleet.members {
            if matches!(m.state(), ConnState::Unreachable { .. })
                || self.members.as_ref().is_some_and(|s| !s.contains(&m.name))
                || !self.owned(&m.name)
            {
                continue;
            }
            let lp = ListParams::default();
            let (pg_api, pb_api) = (
                Api::<PostgresCluster>::all(m.client()),
                Api::<PostgresBackup>::all(m.client()),
            );
            let (pgs, pbs) = tokio::join!(pg_api.list(&lp), pb_api.list(&lp));
            let (Ok(pgs), Ok(pbs)) = (pgs, pbs) else {
                tracing::debug!(cluster = %m.name, "listing for backups failed");
                continue;
            };
            let mut by_cluster: BTreeMap<(String, String), Vec<PostgresBackup>> = BTreeMap::new();
            for b in pbs.items {
                by_cluster
                    .entry((b.namespace().unwrap_or_default(), b.spec.cluster.clone()))
                    .or_default()
                    .push(b);
            }
            for pg in pgs.items {
                let k = (pg.namespace().unwrap_or_default(), pg.name_any());
                let backups = by_cluster.remove(&k).unwrap_or_default();
                out.push(Pgc {
                    member: m.clone(),
                    pg,
                    backups,
                });
            }
        }
        out
    }

    /// The cron schedule of a cluster: its own, else the fleet's for its
    /// member's labels.
    fn cron(&self, p: &Pgc) -> Option<croner::Cron> {
        let own = p.pg.spec.backup_schedule.as_deref();
        let fleet = self.cfg.schedule_for(&p.member.labels);
        match own {
            Some(s) => crate::config::values::CronSchedule::new(s)
                .parsed()
                .cloned(),
            None => fleet.parsed().cloned(),
        }
    }

    /// One round: decide and start. Returns how many backups started.
    pub async fn round(&self) -> anyhow::Result<usize> {
        let now = self.now();
        let pgcs = self.observe().await;
        crate::metrics::pgc::observe(pgcs.iter().map(|p| (p.member.name.as_str(), &p.pg)));
        let repo = self.repository_id();
        let mut running = if self.acts_on.is_some() {
            self.foreign_running(&repo).await
        } else {
            vec![]
        };
        let mut candidates = vec![];
        // What each candidate is: a slot to create, or a record to start.
        let mut origin: Vec<(usize, Option<DateTime<Utc>>, Option<String>)> = vec![];
        let local: Vec<String> = {
            let mut r = self.running.lock().unwrap_or_else(|e| e.into_inner());
            r.retain(|_, h| !h.is_finished());
            r.keys().cloned().collect()
        };
        for (i, p) in pgcs.iter().enumerate() {
            let ns = p.pg.namespace().unwrap_or_default();
            let st = p.pg.status.clone().unwrap_or_default();
            for b in &p.backups {
                let bst = b.status.clone().unwrap_or_default();
                let id = format!("{}/{ns}/{}", p.member.name, b.name_any());
                match bst.phase.as_deref() {
                    Some("Running") if local.contains(&id) => running.push(Running {
                        member: p.member.name.clone(),
                        repository: repo.clone(),
                        cluster_key: p.key(),
                    }),
                    Some("Running") => {
                        // Its runner died with a previous manager.
                        run::record_failure(
                            &p.member,
                            &ns,
                            &p.pg.name_any(),
                            &b.name_any(),
                            bst.attempts,
                            "interrupted: the manager stopped during the backup",
                            now,
                        )
                        .await;
                    }
                    None | Some("Pending") => {
                        candidates.push(Candidate {
                            member: p.member.name.clone(),
                            repository: repo.clone(),
                            cluster_key: p.key(),
                            priority: b
                                .metadata
                                .creation_timestamp
                                .as_ref()
                                .and_then(|t| parse_ts(&t.0.to_string()))
                                .unwrap_or(now),
                            not_before: None,
                        });
                        origin.push((i, None, Some(b.name_any())));
                    }
                    Some("Failed") if bst.attempts < schedule::MAX_ATTEMPTS as i32 => {
                        candidates.push(Candidate {
                            member: p.member.name.clone(),
                            repository: repo.clone(),
                            cluster_key: p.key(),
                            priority: bst.started_at.as_deref().and_then(parse_ts).unwrap_or(now),
                            not_before: bst.next_attempt_at.as_deref().and_then(parse_ts),
                        });
                        origin.push((i, None, Some(b.name_any())));
                    }
                    _ => {}
                }
            }
            if p.pg.metadata.deletion_timestamp.is_some()
                || p.pg.labels().contains_key(DRILL_OF)
                || st.current_primary.is_none()
                // The controller records the incarnation's repository first.
                || crate::pgbackrest::incarnation::recorded(&p.pg).is_none()
                // Its image has no pgBackRest for its version (image
                // catalog): no scheduled backup would succeed.
                || st
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "BackupsUnavailable" && c.status == "True")
            {
                continue;
            }
            let Some(cron) = self.cron(p) else { continue };
            let offset =
                schedule::offset(self.cfg.window.get(), &p.member.name, &ns, &p.pg.name_any());
            let handled = st
                .backup
                .as_ref()
                .and_then(|b| b.last_slot.as_deref())
                .and_then(parse_ts)
                .into_iter()
                .chain(
                    p.backups
                        .iter()
                        .filter_map(|b| b.spec.slot.as_deref().and_then(parse_ts)),
                )
                .max();
            let created =
                p.pg.metadata
                    .creation_timestamp
                    .as_ref()
                    .and_then(|t| parse_ts(&t.0.to_string()))
                    .unwrap_or(now);
            match schedule::due(
                &cron,
                offset,
                handled,
                created,
                now,
                self.cfg.start_deadline.get(),
            ) {
                Due::Idle { .. } => {}
                Due::Start { slot } => {
                    candidates.push(Candidate {
                        member: p.member.name.clone(),
                        repository: repo.clone(),
                        cluster_key: p.key(),
                        priority: slot,
                        not_before: None,
                    });
                    origin.push((i, Some(slot), None));
                }
                Due::Skip { slot, late_by } => {
                    run::skip(
                        &p.member,
                        &p.pg,
                        slot,
                        late_by,
                        self.cfg.start_deadline.get(),
                    )
                    .await;
                }
            }
        }
        let caps = Caps {
            global: self.cfg.max_concurrent,
            per_member: self.cfg.max_concurrent_per_cluster,
            per_repository: self.cfg.max_concurrent_per_repository,
        };
        let chosen = schedule::select(&caps, &running, &candidates, now);
        let mut started = 0;
        let sweep = crate::telemetry::spans::backup_sweep(chosen.len());
        for c in chosen {
            let (i, slot, record) = &origin[c];
            let p = &pgcs[*i];
            let starting = self.start(p, *slot, record.clone(), now);
            match tracing::Instrument::instrument(starting, sweep.clone()).await {
                Ok(()) => started += 1,
                Err(e) => {
                    tracing::warn!(cluster = %p.key(), error = %e, "could not start a backup")
                }
            }
        }
        self.check_archiving(&pgcs, now).await;
        self.drills(&pgcs, now).await;
        Ok(started)
    }

    /// Creates the record of a scheduled backup (or takes a pending one),
    /// marks it Running, and hands it to a runner.
    async fn start(
        &self,
        p: &Pgc,
        slot: Option<DateTime<Utc>>,
        record: Option<String>,
        now: DateTime<Utc>,
    ) -> anyhow::Result<()> {
        let Some(ns) = p.pg.namespace() else {
            anyhow::bail!("{}: metadata.namespace is missing", p.key());
        };
        let cluster = p.pg.name_any();
        let api: Api<PostgresBackup> = Api::namespaced(p.member.client(), &ns);
        let (name, attempts) = match (&record, slot) {
            (Some(r), _) => {
                let prev = p
                    .backups
                    .iter()
                    .find(|b| b.name_any() == *r)
                    .and_then(|b| b.status.as_ref())
                    .map_or(0, |s| s.attempts);
                (r.clone(), prev)
            }
            (None, Some(slot)) => {
                let name = format!("{cluster}-{}", slot.format("%Y%m%d%H%M%S"));
                let obj: PostgresBackup = serde_json::from_value(json!({
                    "apiVersion": "pgfleet.io/v1", "kind": "PostgresBackup",
                    "metadata": {"name": name, "namespace": ns,
                        "labels": {"pgfleet.io/cluster": cluster, "app.kubernetes.io/managed-by": "pgfleet"}},
                    "spec": {"cluster": cluster, "type": "full", "trigger": "schedule", "slot": ts(slot)},
                }))?;
                let created = match api.create(&PostParams::default(), &obj).await {
                    Ok(_) => true,
                    // Started already (its record is there): only remember.
                    Err(kube::Error::Api(e)) if e.code == 409 => false,
                    Err(e) => return Err(e.into()),
                };
                // The slot is handled from here on, whatever the outcome.
                run::patch_cluster_status(
                    &p.member,
                    &ns,
                    &cluster,
                    json!({"backup": {"lastSlot": ts(slot)}}),
                )
                .await;
                if !created {
                    return Ok(());
                }
                (name, 0)
            }
            (None, None) => anyhow::bail!("nothing to start"),
        };
        // A backup on pod "" would fail as an unreachable instance; the
        // record stays pending until the cluster has a primary again.
        let Some(primary) = p.pg.status.as_ref().and_then(|s| s.current_primary.clone()) else {
            anyhow::bail!("{}: no current primary to take the backup on", p.key());
        };
        let Some(repo) = crate::pgbackrest::incarnation::recorded(&p.pg) else {
            anyhow::bail!("{}: its repository is not recorded yet", p.key());
        };
        // A status value is input: a huge `attempts` must not overflow.
        let attempts = attempts.max(0).saturating_add(1);
        let status = json!({"status": {"phase": "Running", "startedAt": ts(now), "stoppedAt": null,
            "attempts": attempts, "instance": primary, "failureReason": null, "nextAttemptAt": null,
            "verifiedOn": null, "repositoryPath": repo.path}});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        let job = Job {
            member: p.member.clone(),
            namespace: ns.clone(),
            cluster,
            backup: name.clone(),
            primary,
            attempts,
            kind: record
                .as_ref()
                .and_then(|r| p.backups.iter().find(|b| b.name_any() == *r))
                .map_or_else(|| "full".to_string(), |b| b.spec.r#type.clone()),
            clock: self.clock.clone(),
            lock: self.cluster_lock(&p.key()),
        };
        let id = format!("{}/{ns}/{name}", p.member.name);
        let wake = self.wake.clone();
        let span = crate::telemetry::spans::backup_job(&p.member.name, &ns, &job.cluster, &name);
        let handle = tokio::spawn(tracing::Instrument::instrument(
            async move {
                run::run(job).await;
                wake.notify_one();
            },
            span,
        ));
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, handle);
        Ok(())
    }

    /// Serialises pgBackRest commands per PostgresCluster within this process.
    fn cluster_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.to_string())
            .or_default()
            .clone()
    }

    /// The fleet-level cron expressions (default, overrides, drills).
    fn cron_expressions(&self) -> Vec<String> {
        let mut v: Vec<String> = std::iter::once(self.cfg.default_schedule.raw().to_string())
            .chain(
                self.cfg
                    .overrides
                    .iter()
                    .map(|o| o.schedule.raw().to_string()),
            )
            .chain(self.cfg.drills.schedule.iter().map(|c| c.raw().to_string()))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Cron ticks (tokio-cron-scheduler) only wake the loop: the round
    /// decides what is due (each cluster's slot is its tick plus its spread
    /// offset, and a periodic round catches those).
    async fn cron_ticks(&self) -> Option<tokio_cron_scheduler::JobScheduler> {
        let sched = tokio_cron_scheduler::JobScheduler::new().await.ok()?;
        for expr in self.cron_expressions() {
            // The scheduler wants a seconds field.
            let six = if expr.split_whitespace().count() == 5 {
                format!("0 {expr}")
            } else {
                expr.clone()
            };
            let wake = self.wake.clone();
            let job = tokio_cron_scheduler::Job::new_async(six.as_str(), move |_, _| {
                let wake = wake.clone();
                Box::pin(async move { wake.notify_one() })
            });
            match job {
                Ok(job) => {
                    if let Err(e) = sched.add(job).await {
                        tracing::warn!(%expr, error = %e, "cron tick not scheduled");
                    }
                }
                Err(e) => tracing::warn!(%expr, error = %e, "cron tick not scheduled"),
            }
        }
        sched.start().await.ok()?;
        Some(sched)
    }

    /// Rounds until the task is dropped; cron ticks and finished backups
    /// wake it early, otherwise it looks every `tick`.
    pub async fn run(self: Arc<Self>) {
        let _ticks = self.cron_ticks().await;
        // A new PostgresBackup (an on-demand request) starts without waiting
        // for the next tick.
        let mut watches = vec![];
        for m in &self.fleet.members {
            let (wake, client) = (self.wake.clone(), m.client());
            watches.push(crate::platform::task::AbortOnDrop(tokio::spawn(
                async move {
                    use futures::StreamExt;
                    use kube::runtime::{WatchStreamExt, watcher};
                    // Metadata only: a new or changed object is all that
                    // is read.
                    let api: Api<SlimMeta<PostgresBackup>> = Api::all(client);
                    let stream = watcher(api, watcher::Config::default())
                        .default_backoff()
                        .applied_objects();
                    futures::pin_mut!(stream);
                    while stream.next().await.is_some() {
                        wake.notify_one();
                    }
                },
            )));
        }
        loop {
            if let Err(e) = self.round().await {
                tracing::warn!(error = %e, "backup round failed; retrying");
            }
            tokio::select! {
                _ = tokio::time::sleep(self.tick) => {}
                _ = self.wake.notified() => {}
            }
        }
    }
}
