//! The `pgfleet-instance` verbs of the virtual kubelet's instance model
//! (`virtual_kubelet.rs`): what each does to the model and the contract
//! reply the real script would print.

use super::{VirtualRuntime, reply};
use crate::emulated::virtual_extensions;
use crate::postgres::{CONTRACT_VERSION, contract, format_lsn};
use serde_json::{Value, json};
use std::time::Instant;

impl VirtualRuntime {
    /// Runs one `pgfleet-instance` verb against the model.
    pub(super) fn verb(&self, pod_id: &str, verb: &str, args: &[String]) -> Result<Value, String> {
        let key = Self::lock(&self.pods)
            .get(pod_id)
            .cloned()
            .ok_or("the instance is not running")?;
        if verb == "status" {
            let report = self.report(pod_id).ok_or("the instance is not running")?;
            return serde_json::to_value(report).map_err(|e| e.to_string());
        }
        if verb == "promote-after" {
            let want = args
                .first()
                .and_then(|a| crate::postgres::parse_lsn(a))
                .ok_or("promote-after: an LSN (like 0/3000028) is required")?;
            let r = self.report(pod_id).ok_or("the instance is not running")?;
            let at = [&r.received_lsn, &r.replayed_lsn]
                .into_iter()
                .filter_map(|l| l.as_deref().and_then(crate::postgres::parse_lsn))
                .max()
                .unwrap_or(0);
            if r.role != "primary" && at <= want {
                return Ok(
                    json!({"contract": CONTRACT_VERSION, "promoted": false, "behind": true}),
                );
            }
            return self.verb(pod_id, "promote", &[]);
        }
        let mut data = Self::lock(&self.data);
        let inst = data.get_mut(&key).ok_or("no data directory")?;
        match verb {
            "promote" => {
                if !inst.primary {
                    inst.primary = true;
                    inst.timeline += 1;
                    inst.since = Instant::now();
                }
                reply(contract::Promoted {
                    contract: CONTRACT_VERSION,
                    promoted: true,
                })
            }
            "demote" => {
                let lsn = inst.lsn();
                inst.base_lsn = lsn;
                inst.primary = false;
                let cluster = inst.cluster.clone();
                // A clean shutdown sends all WAL, the shutdown checkpoint
                // record (120 bytes, starting at `lsn`) included.
                for other in data
                    .values_mut()
                    .filter(|i| i.cluster == cluster && !i.primary)
                {
                    other.base_lsn = other.base_lsn.max(lsn + 120);
                }
                reply(contract::Demoted {
                    contract: CONTRACT_VERSION,
                    demoted: true,
                    lsn: Some(format_lsn(lsn)),
                })
            }
            "fence" => {
                inst.base_lsn = inst.lsn();
                inst.fenced = true;
                reply(contract::Fenced {
                    contract: CONTRACT_VERSION,
                    fenced: true,
                })
            }
            "unfence" => {
                inst.fenced = false;
                inst.since = Instant::now();
                reply(contract::Fenced {
                    contract: CONTRACT_VERSION,
                    fenced: false,
                })
            }
            // Backups: a model good enough for scheduling and caps (the
            // process runtime runs the real pgBackRest).
            "backup-init" | "backup-upgrade" => reply(contract::StanzaReady {
                contract: CONTRACT_VERSION,
                stanza: "db".into(),
                created: true,
            }),
            "backup" => {
                let now = chrono::Utc::now();
                let label = format!("{}F", now.format("%Y%m%d-%H%M%S%3f"));
                let at = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                let ns = key.split('/').next().unwrap_or_default();
                Self::lock(&self.backups)
                    .entry(format!("{ns}/{}", inst.cluster))
                    .or_default()
                    .push(label.clone());
                let wal = "000000010000000000000003";
                reply(contract::BackupTaken {
                    contract: CONTRACT_VERSION,
                    backup: contract::Backup {
                        label,
                        kind: Some("full".into()),
                        started_at: Some(at.clone()),
                        stopped_at: Some(at),
                        size: Some(25_165_824),
                        repo_size: Some(3_145_728),
                        wal_start: Some(wal.into()),
                        wal_stop: Some(wal.into()),
                        ..contract::Backup::default()
                    },
                })
            }
            "backup-info" => {
                let ns = key.split('/').next().unwrap_or_default();
                let labels = Self::lock(&self.backups)
                    .get(&format!("{ns}/{}", inst.cluster))
                    .cloned()
                    .unwrap_or_default();
                let backups = labels
                    .into_iter()
                    .map(|label| contract::Backup {
                        label,
                        ..contract::Backup::default()
                    })
                    .collect();
                reply(contract::BackupInfo {
                    contract: CONTRACT_VERSION,
                    backups,
                    archive_min: None,
                    archive_max: None,
                })
            }
            // No list of kept backups: the manager then keeps every record.
            "expire" => reply(contract::Expired {
                contract: CONTRACT_VERSION,
                backups: None,
            }),
            "query" => {
                let sql = args.first().map(String::as_str).unwrap_or_default();
                inst.extensions.extend(virtual_extensions::created(sql));
                reply(contract::QueryResult {
                    contract: CONTRACT_VERSION,
                    ok: true,
                    rows: 1,
                })
            }
            // No SQL here: the access step reports that and changes nothing.
            "catalog" => reply(crate::postgres::catalog::Catalog {
                contract: CONTRACT_VERSION,
                emulated: true,
                ..Default::default()
            }),
            "reload" => reply(contract::Reloaded {
                contract: CONTRACT_VERSION,
                reloaded: true,
            }),
            "checkpoint" => reply(contract::Checkpointed {
                contract: CONTRACT_VERSION,
                checkpoint: true,
            }),
            "slots" => reply(contract::Slots {
                contract: CONTRACT_VERSION,
                slots: 0,
            }),
            // No data is stored: an almost empty 1 GiB volume, no slot
            // holding WAL back (auto-grow never fires here).
            "usage" => reply(contract::Usage {
                contract: CONTRACT_VERSION,
                total_bytes: 1 << 30,
                used_bytes: 48 << 20,
                available_bytes: (1 << 30) - (48 << 20),
                wal_bytes: 16 << 20,
                slots: Some(vec![]),
            }),
            "version" => reply(contract::Version {
                contract: CONTRACT_VERSION,
            }),
            // In-place major upgrade: the model has no data to convert; the
            // version follows the image of the Pods built afterwards.
            "upgrade-check" => {
                let new_bin = args.first().map(String::as_str).unwrap_or_default();
                match virtual_extensions::missing(&inst.extensions, new_bin) {
                    Some(why) => Err(why),
                    None => reply(contract::UpgradeStep::ok()),
                }
            }
            "upgrade" => reply(contract::UpgradeStep {
                upgraded: Some(true),
                ..contract::UpgradeStep::ok()
            }),
            "analyze" => reply(contract::UpgradeStep {
                analyzed: Some(true),
                ..contract::UpgradeStep::ok()
            }),
            other => Err(format!("unknown verb {other}")),
        }
    }
}
