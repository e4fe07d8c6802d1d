//! Backups across an in-place major upgrade (issue 17). Once the new
//! primary runs, the repository's stanza is upgraded to the new version and
//! system identifier (`pgbackrest stanza-upgrade`, through the instance verb
//! `backup-upgrade`): until then every WAL segment of the new version is
//! refused by `archive-push`. The old version's backups and WAL stay in the
//! repository, so a point-in-time restore to before the upgrade still goes
//! into a cluster of the old version. Then a full backup is asked for at
//! once: WAL of the new version replays only onto a backup of the new
//! version, so until that backup completes nothing after the upgrade can be
//! restored.
//!
//! Both steps are idempotent (an up-to-date stanza is left as it is; the
//! backup's name is fixed per target version and a second create finds it),
//! so a manager killed in between repeats them harmlessly.

use crate::controller::Ctx;
use crate::crd::PostgresBackup;
use crate::crd::PostgresCluster;
use crate::crd::major_upgrade::MajorUpgradeStatus;
use crate::postgres::exec::run_verb;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use std::time::Duration;

/// A stanza upgrade reads the new cluster's control file and rewrites the
/// repository's info files: seconds, more on a slow object store.
const STANZA_UPGRADE: Duration = Duration::from_secs(300);

/// The full backup asked for after upgrading `cluster` to `to_version`
/// (`orders-major-18`); dots of a minor become dashes.
pub fn backup_name(cluster: &str, to_version: &str) -> String {
    format!("{cluster}-major-{}", to_version.replace('.', "-"))
}

/// Whether the cluster archives on the new version: the fleet has a
/// repository and the new version's image carries a pgBackRest for it
/// (otherwise `BackupsUnavailable` says so and there is nothing to carry).
pub fn applies(ctx: &Ctx, to_version: &str) -> bool {
    ctx.backup.is_some()
        && ctx
            .images
            .resolve(to_version)
            .is_ok_and(|run| run.pgbackrest)
}

/// Upgrades the stanza on the new primary, then asks for the full backup;
/// returns the backup's name. The error says which of the two failed.
pub async fn carry_over(
    ctx: &Ctx,
    pg: &PostgresCluster,
    ns: &str,
    r: &MajorUpgradeStatus,
) -> Result<String, String> {
    run_verb(
        &ctx.client,
        ns,
        &r.primary,
        &["backup-upgrade"],
        STANZA_UPGRADE,
    )
    .await
    .map_err(|e| format!("upgrading the backup stanza to {}: {e}", r.to_version))?;
    let name = backup_name(&pg.name_any(), &r.to_version);
    let backup: PostgresBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "pgfleet.io/v1",
        "kind": "PostgresBackup",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"cluster": pg.name_any(), "type": "full", "trigger": "majorUpgrade"},
    }))
    .map_err(|e| format!("building PostgresBackup {name}: {e}"))?;
    match Api::<PostgresBackup>::namespaced(ctx.client.clone(), ns)
        .create(&PostParams::default(), &backup)
        .await
    {
        Ok(_) => Ok(name),
        // Asked for by an earlier round (or a manager before a restart) —
        // unless the name is taken by a record for another cluster.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let found = Api::<PostgresBackup>::namespaced(ctx.client.clone(), ns)
                .get(&name)
                .await
                .map_err(|e| format!("reading PostgresBackup {name}: {e}"))?;
            if found.spec.cluster == pg.name_any() {
                Ok(name)
            } else {
                Err(format!(
                    "PostgresBackup {name} exists for cluster {:?}; delete it so the full backup after the upgrade can be taken",
                    found.spec.cluster
                ))
            }
        }
        Err(e) => Err(format!("asking for the full backup {name}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backup_after_an_upgrade_is_named_by_cluster_and_version() {
        assert_eq!(backup_name("orders", "18"), "orders-major-18");
        assert_eq!(backup_name("orders", "18.1"), "orders-major-18-1");
    }
}
