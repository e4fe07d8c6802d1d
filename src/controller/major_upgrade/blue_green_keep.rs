//! After a blue/green switch (`blue_green_exec.rs` decides when): blue
//! kept for `keepBlueMinutes`, the backups carried over to the new
//! version, blue removed, the record ended. A child module of the
//! executor, like the switch.

use super::super::blue_green::{self as machine, Limits, Record};
use super::super::execute::Round;
use super::{ANNOTATION, Upgrade, now_ms};
use crate::controller::reconcile::Error;
use crate::controller::record::status_patch;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use serde_json::json;
use std::time::Duration;

impl Upgrade<'_> {
    /// `Switched`, kept: backups carried over, and the round looks again
    /// when the retention ends. A rollback asked for that cannot switch
    /// back says why.
    pub(super) async fn retain(
        &self,
        r: &Record,
        l: &Limits,
        round: &mut Round,
    ) -> Result<(), Error> {
        if self.pg.annotations().get(ANNOTATION).map(String::as_str) == Some("rollback") {
            let why = "blue no longer follows green (or the switch back failed too often): a rollback after the switch is a restore to a time before it";
            let n = (
                "MajorUpgradeBlocked",
                "RollbackUnavailable",
                why.to_string(),
            );
            round.notices.push(n);
        }
        self.backups_or_notice(r, round).await;
        let left =
            r.bg.switched_at_ms
                .map(|t| t + l.retention_ms - now_ms())
                .unwrap_or(l.retention_ms)
                .clamp(1_000, 3_600_000);
        round.within = Some(Duration::from_millis(left as u64));
        Ok(())
    }

    /// Blue is gone: the record goes — once the backups are carried over
    /// (the record keeps the backup's name until it was asked for).
    pub(super) async fn done(&self, r: &Record, round: &mut Round) -> Result<(), Error> {
        if !self.backups_or_notice(r, round).await {
            round.within = Some(Duration::from_secs(10));
            return Ok(());
        }
        status_patch(self.ctx, self.pg, json!({"majorUpgrade": null})).await?;
        let note = format!(
            "blue/green upgrade {} → {} done; blue removed",
            r.from_version, r.to_version
        );
        self.announce(EventType::Normal, "MajorUpgradeCompleted", note)
            .await;
        let stall = self.bg().stall_ms;
        let member = &self.ctx.member;
        crate::metrics::ops::major_upgrade_ended(member, "blueGreen", "completed", stall);
        round.record = Some(None);
        Ok(())
    }

    /// [`Self::carry_backups`], its failure shown as `BackupsUnavailable`;
    /// whether they are carried over.
    pub(super) async fn backups_or_notice(&self, r: &Record, round: &mut Round) -> bool {
        match self.carry_backups(r).await {
            Ok(()) => true,
            Err(why) => {
                tracing::warn!(error = %why, "blue/green: backups not carried over yet");
                round
                    .notices
                    .push(("BackupsUnavailable", "StanzaUpgradeFailed", why));
                false
            }
        }
    }

    /// As after an in-place upgrade (`backups.rs`): the repository's stanza
    /// upgraded on green's primary, then a full backup of the new version
    /// asked for; once, recorded in `status.majorUpgrade.backup`.
    pub(super) async fn carry_backups(&self, r: &Record) -> Result<(), String> {
        if self.latest().backup.is_some()
            || !super::super::backups::applies(self.ctx, &r.to_version)
        {
            return Ok(());
        }
        let mut m = self.latest();
        m.primary = self.green_primary();
        let name = super::super::backups::carry_over(self.ctx, self.pg, self.ns, &m).await?;
        m.backup = Some(name);
        m.primary = self.latest().primary;
        self.save(&m, json!({})).await.map_err(|e| e.to_string())
    }

    /// Blue's Pods and volumes, then the upgrade's role on green.
    pub(super) async fn remove_blue(&self, r: &Record) -> Result<(), Error> {
        self.step_to(machine::REMOVING_BLUE).await?;
        self.delete_side(&r.bg.blue).await?;
        let role = format!(
            "DROP ROLE IF EXISTS {};\n",
            crate::postgres::sql::ident(super::super::blue_green_sql::ROLE)
        );
        let green = self.green_primary();
        let _ = self.on(&green).apply("postgres", role).await;
        Ok(())
    }
}
