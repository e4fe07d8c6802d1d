//! The in-place upgrade's steps from the fence to the new primary's start
//! and after (`execute.rs` decides which; `decide.rs` says why each is
//! safe): a child module of the executor, the same `Step`, split so that
//! each file reads in one sitting. From `Stopping` to `Replacing` one
//! round carries on from step to step (each recorded before it acts):
//! every round between the fence and the new primary's start is downtime.

use super::{Round, Step, at_once, backups, decide, now, soon, soon_ms};
use crate::controller::plan::Observed;
use crate::controller::reconcile::{Error, event, kerr};
use crate::controller::record::status_patch;
use crate::crd::major_upgrade::MajorUpgradeStatus;
use crate::postgres::exec::run_verb;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::DeleteParams;
use kube::runtime::events::EventType;
use serde_json::json;
use std::time::Duration;

use super::{LONG_VERB, SHORT_VERB};

impl Step<'_> {
    /// Fences the replicas, then the primary (a clean shutdown).
    pub(super) async fn stop(&self, round: Round) -> Result<Round, Error> {
        let Some(r) = self.record.clone() else {
            return Ok(round);
        };
        let mut pods: Vec<&String> = self.obs.pods.keys().filter(|p| **p != r.primary).collect();
        pods.push(&r.primary);
        for pod in pods {
            if let Err(e) = run_verb(&self.ctx.client, self.ns, pod, &["fence"], SHORT_VERB).await {
                // Not stopped is not safe: try again next round.
                tracing::warn!(pod = %pod, error = %e, "major upgrade: fencing failed");
                return Ok(soon(round, 5));
            }
        }
        let r = MajorUpgradeStatus {
            step: decide::UPGRADING.into(),
            stopped_at: Some(now()),
            ..r
        };
        self.record(&r).await?;
        // Recorded: go on in this round — every round between the fence
        // and the new primary's start is downtime.
        self.upgrade(r, round).await
    }

    pub(super) async fn upgrade(
        &self,
        mut r: MajorUpgradeStatus,
        round: Round,
    ) -> Result<Round, Error> {
        let (old, new) = (self.bin_dir(&r.from_version), self.bin_dir(&r.to_version));
        let verb = ["upgrade", old.as_str(), new.as_str()];
        match run_verb(&self.ctx.client, self.ns, &r.primary, &verb, LONG_VERB).await {
            Ok(_) => {
                r.step = decide::REPLACING.into();
                self.record(&r).await?;
                let note = format!(
                    "pg_upgrade --link done on {}; replacing the Pods with version {}",
                    r.primary, r.to_version
                );
                event(
                    self.ctx,
                    self.pg,
                    EventType::Normal,
                    "MajorUpgradeUpgraded",
                    note,
                )
                .await;
                return self.replace(&r, round).await;
            }
            // A run of the verb from before a restart still works on the
            // volume: wait for it, never roll back under it.
            Err(e) if reason(&e).starts_with("upgrade: already running") => {}
            Err(e) => {
                // The verb put the old data directory back: the old
                // version runs again.
                for pod in self.obs.pods.keys() {
                    let _ =
                        run_verb(&self.ctx.client, self.ns, pod, &["unfence"], SHORT_VERB).await;
                }
                let why = format!(
                    "pg_upgrade failed, back on {}: {}",
                    r.from_version,
                    reason(&e)
                );
                r.step = decide::FAILED.into();
                r.failure = Some(why.clone());
                self.record(&r).await?;
                event(
                    self.ctx,
                    self.pg,
                    EventType::Warning,
                    "MajorUpgradeFailed",
                    why,
                )
                .await;
                let m = &self.ctx.member;
                crate::metrics::ops::major_upgrade_ended(m, "inPlace", "failed", None);
            }
        }
        Ok(soon(round, 1))
    }

    /// Deletes every Pod built for the old version and the replicas'
    /// volumes (they are cloned again from the new primary), and waits a
    /// little for the Pods to go: the next round builds the new primary
    /// once they are gone, and every moment until then is downtime.
    pub(super) async fn replace(
        &self,
        r: &MajorUpgradeStatus,
        round: Round,
    ) -> Result<Round, Error> {
        let pods = kube::Api::<Pod>::namespaced(self.ctx.client.clone(), self.ns);
        let pvcs = kube::Api::<PersistentVolumeClaim>::namespaced(self.ctx.client.clone(), self.ns);
        let old: Vec<&String> = (self.obs.pods.iter())
            .filter(|(_, p)| p.version.as_deref() != Some(r.to_version.as_str()))
            .map(|(name, _)| name)
            .collect();
        for name in &old {
            if !self.obs.pods.get(*name).is_some_and(|p| p.deleting) {
                let deleted = pods.delete(name, &DeleteParams::default()).await;
                ignore_missing(deleted, "Pod", name)?;
            }
        }
        for name in replica_volumes(self.obs, r) {
            ignore_missing(
                pvcs.delete(name, &DeleteParams::default()).await,
                "PersistentVolumeClaim",
                name,
            )?;
        }
        // Fenced, their containers stop within a fraction of a second.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        for name in old {
            while (pods.get_opt(name).await)
                .map_err(kerr("read", "Pod", name))?
                .is_some()
            {
                if tokio::time::Instant::now() > deadline {
                    return Ok(soon_ms(round, 250));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(at_once(round))
    }

    pub(super) async fn analyze(&self, mut round: Round) -> Result<Round, Error> {
        let Some(mut r) = self.record.clone() else {
            return Ok(round);
        };
        self.advance(decide::ANALYZING, decide::STARTING).await?;
        // What `advance` wrote: the round's status write must not put the
        // earlier step back.
        r.step = decide::ANALYZING.into();
        if r.downtime_ms.is_none() {
            r.downtime_ms = since_ms(r.stopped_at.as_deref());
        }
        // Archiving on the new version waits for this; the step waits
        // until it is done, with a condition saying why meanwhile.
        if r.backup.is_none() && backups::applies(self.ctx, &r.to_version) {
            match backups::carry_over(self.ctx, self.pg, self.ns, &r).await {
                Ok(name) => {
                    r.backup = Some(name);
                    self.record(&r).await?;
                }
                Err(why) => {
                    tracing::warn!(error = %why, "major upgrade: backups not carried over yet");
                    round
                        .notices
                        .push(("BackupsUnavailable", "StanzaUpgradeFailed", why));
                    round.record = Some(Some(r));
                    return Ok(round);
                }
            }
        }
        if let Err(e) = run_verb(
            &self.ctx.client,
            self.ns,
            &r.primary,
            &["analyze"],
            LONG_VERB,
        )
        .await
        {
            // Statistics only: the cluster is up; the next round tries again.
            tracing::warn!(error = %e, "major upgrade: analyze failed");
            return Ok(soon(round, 10));
        }
        r.step = decide::REBUILDING.into();
        self.record(&r).await?;
        round.record = Some(Some(r));
        Ok(round)
    }

    pub(super) async fn done(&self, mut round: Round) -> Result<Round, Error> {
        status_patch(self.ctx, self.pg, json!({"majorUpgrade": null})).await?;
        if let Some(r) = &self.record {
            let note = format!(
                "major upgrade {} → {} done; downtime {} ms",
                r.from_version,
                r.to_version,
                r.downtime_ms.unwrap_or(-1)
            );
            event(
                self.ctx,
                self.pg,
                EventType::Normal,
                "MajorUpgradeCompleted",
                note,
            )
            .await;
            let m = &self.ctx.member;
            crate::metrics::ops::major_upgrade_ended(m, "inPlace", "completed", r.downtime_ms);
        }
        round.record = Some(None);
        Ok(round)
    }
}

/// The instance volumes other than the upgraded primary's.
pub(super) fn replica_volumes<'a>(
    obs: &'a Observed,
    r: &'a MajorUpgradeStatus,
) -> impl Iterator<Item = &'a String> + 'a {
    let cluster = r
        .primary
        .rsplit_once('-')
        .map(|(c, _)| c)
        .unwrap_or_default();
    obs.pvcs
        .iter()
        .filter(move |n| **n != r.primary && crate::controller::plan::ordinal(cluster, n).is_some())
}

/// The verb's own reason (its last `pgfleet-instance:` line), not the
/// whole pg_upgrade output: the text goes into a condition and an Event.
pub(super) fn reason(e: &crate::postgres::exec::ExecError) -> String {
    let text = e.to_string();
    let tail = match text.rfind("pgfleet-instance: ") {
        Some(i) => &text[i + "pgfleet-instance: ".len()..],
        None => text.as_str(),
    };
    let line = tail.lines().next().unwrap_or_default();
    line.chars().take(600).collect()
}

fn since_ms(ts: Option<&str>) -> Option<i64> {
    let t = chrono::DateTime::parse_from_rfc3339(ts?).ok()?;
    Some((chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_milliseconds())
}

fn ignore_missing<T>(
    r: Result<T, kube::Error>,
    kind: &'static str,
    name: &str,
) -> Result<(), Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(kerr("delete", kind, name)(e)),
    }
}
