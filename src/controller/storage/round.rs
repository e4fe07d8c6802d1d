//! The storage step of one reconcile round: measure (auto-grow only),
//! decide ([`super::grow`], [`super::expand`]), patch at most one claim,
//! and say what the status shows.

use super::expand::{self, Claim, Notice};
use super::grow::{self, Decision, Reading};
use super::quantity::{self, format};
use crate::controller::Ctx;
use crate::controller::plan::{self, Observed};
use crate::controller::reconcile::{FIELD_MANAGER, event};
use crate::crd::PostgresCluster;
use crate::crd::cluster::PostgresClusterStatus;
use crate::crd::storage::{StorageStatus, VolumeUsage};
use crate::postgres::contract::Usage;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use std::time::Duration;

/// How often auto-grow reads the instances' usage.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);
/// How soon a round looks again while a claim is being resized.
const RESIZE_POLL: Duration = Duration::from_secs(2);
const USAGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Conditions announced with a Warning Event when they appear.
const WARNINGS: &[&str] = &[
    "VolumeShrinkRefused",
    "VolumeExpansionUnsupported",
    "VolumeGrowthRefused",
    "VolumeAutoGrowAtMax",
];

/// When each cluster's usage was last read, and when (and for which size)
/// an expansion was last refused. In memory only: a restarted manager
/// reads again at once and tries a refused size once more, which costs
/// one exec per instance and one patch; the readings themselves and the
/// refusal's condition are in the status.
#[derive(Default)]
pub struct Readings {
    last: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    refused: std::sync::Mutex<std::collections::HashMap<String, (u64, std::time::Instant)>>,
}

impl Readings {
    /// Whether `ns/name` is due for a reading; if so, it counts as read now.
    fn due(&self, ns: &str, name: &str) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let key = format!("{ns}/{name}");
        let now = std::time::Instant::now();
        match last.get(&key) {
            Some(t) if now.duration_since(*t) < CHECK_EVERY => false,
            _ => {
                last.insert(key, now);
                true
            }
        }
    }

    /// How long ago expanding `ns/name` to `size` was refused, if it was.
    fn refused_for(&self, ns: &str, name: &str, size: u64) -> Option<Duration> {
        let refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        match refused.get(&format!("{ns}/{name}")) {
            Some((s, at)) if *s == size => Some(at.elapsed()),
            _ => None,
        }
    }

    fn refuse(&self, ns: &str, name: &str, size: u64) {
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        refused.insert(format!("{ns}/{name}"), (size, std::time::Instant::now()));
    }

    /// Forgets a deleted cluster.
    pub fn forget(&self, ns: &str, name: &str) {
        let key = format!("{ns}/{name}");
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.remove(&key);
        drop(last);
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        refused.remove(&key);
    }
}

/// What one round of the storage step gives the status step.
pub struct Outcome {
    pub notices: Vec<Notice>,
    pub status: StorageStatus,
    pub within: Option<Duration>,
}

/// The round as the storage step needs it.
pub struct Round<'a> {
    pub pg: &'a PostgresCluster,
    pub ctx: &'a Ctx,
    pub ns: &'a str,
    pub cluster: &'a str,
    pub obs: &'a Observed,
    pub prev: Option<&'a PostgresClusterStatus>,
    pub primary: Option<&'a str>,
}

pub async fn run(r: &Round<'_>) -> Outcome {
    let prev = r.prev.and_then(|s| s.storage.clone()).unwrap_or_default();
    let mut st = prev.clone();
    let spec_size = quantity::bytes(&r.pg.spec.storage.size).unwrap_or(0);
    let grown = prev.grown_to.as_deref().and_then(quantity::bytes);
    let target = spec_size.max(grown.unwrap_or(0));
    let claims = claims(r);
    let mut notices = vec![];
    let mut within = None;
    match super::policy(&r.pg.spec) {
        Some(p) => {
            within = Some(CHECK_EVERY);
            // Every bound claim at the target: no resize under way.
            let idle = claims.iter().all(|c| {
                c.capacity.is_none()
                    || (c.request.is_some_and(|q| q >= target) && c.capacity >= c.request)
            });
            let current = claims
                .iter()
                .filter_map(|c| c.request)
                .fold(target, u64::max);
            let (decision, fresh) = auto_grow(r, &p, &mut st, idle, current).await;
            match decision {
                Decision::Grow { to, why } if fresh => {
                    // Intent first: the status write records it, the next
                    // round patches the claims.
                    st.grown_to = Some(format(to));
                    st.growths = st.growths.saturating_add(1);
                    event(r.ctx, r.pg, EventType::Normal, "VolumeAutoGrow", why).await;
                    within = Some(Duration::from_millis(500));
                }
                Decision::SlotStuck { message, .. } => {
                    notices.push(("VolumeGrowthRefused", "ReplicationSlotKeepsWAL", message));
                }
                Decision::AtMax { message } => {
                    notices.push(("VolumeAutoGrowAtMax", "MaxReached", message));
                }
                _ => {}
            }
        }
        None => st.usage.clear(),
    }
    let refused = still_refused(r, target);
    let mut exp = expand::plan(target, &claims, refused.as_deref());
    if let Some((claim, to)) = exp.patch.take() {
        patch(r, &claim, to, &mut exp.notices).await;
    }
    if exp.in_progress {
        within = Some(within.map_or(RESIZE_POLL, |w| w.min(RESIZE_POLL)));
    }
    notices.extend(exp.notices);
    announce(r, &notices).await;
    st.target = Some(format(target));
    st.claims = exp.claims;
    Outcome {
        notices,
        status: st,
        within,
    }
}

/// The instance claims, the primary's first, sizes in bytes.
fn claims(r: &Round<'_>) -> Vec<Claim> {
    let mut out: Vec<Claim> = r
        .obs
        .claims
        .iter()
        .filter(|(name, _)| r.obs.pvcs.contains(*name) && plan::ordinal(r.cluster, name).is_some())
        .map(|(name, c)| Claim {
            name: name.clone(),
            request: c.request.as_deref().and_then(quantity::bytes),
            capacity: c.capacity.as_deref().and_then(quantity::bytes),
            fs_pending: c.resize_pending,
        })
        .collect();
    out.sort_by_key(|c| {
        (
            Some(c.name.as_str()) != r.primary,
            plan::ordinal(r.cluster, &c.name),
        )
    });
    out
}

/// Reads usage when due (claims idle, last reading older than
/// [`CHECK_EVERY`]) and decides; otherwise decides on the last reading
/// (so conditions hold between readings), which never grows (`fresh`
/// false).
async fn auto_grow(
    r: &Round<'_>,
    p: &grow::Policy,
    st: &mut StorageStatus,
    idle: bool,
    current: u64,
) -> (Decision, bool) {
    let due = idle && r.ctx.storage.due(r.ns, r.cluster);
    if due {
        st.usage = read_usage(r, &st.usage).await;
    }
    let readings: Vec<Reading> = st.usage.iter().map(reading).collect();
    (grow::decide(p, current, &readings), due)
}

fn reading(u: &VolumeUsage) -> Reading {
    Reading {
        instance: u.name.clone(),
        used: u.used_bytes,
        available: u.available_bytes,
        inactive_slots: u
            .inactive_slot
            .clone()
            .map(|s| (s, u.inactive_slot_wal_bytes))
            .into_iter()
            .collect(),
    }
}

/// `pgfleet-instance usage` on every instance Pod, at once. An instance
/// that does not answer keeps no entry; a server that cannot be asked
/// about its slots keeps the slot the last reading blamed.
async fn read_usage(r: &Round<'_>, before: &[VolumeUsage]) -> Vec<VolumeUsage> {
    let pods: Vec<&str> = r
        .obs
        .pods
        .values()
        .filter(|p| !p.deleting && plan::ordinal(r.cluster, &p.name).is_some())
        .map(|p| p.name.as_str())
        .collect();
    let asks = pods.iter().map(|pod| async move {
        let out =
            crate::postgres::exec::run_verb(&r.ctx.client, r.ns, pod, &["usage"], USAGE_TIMEOUT)
                .await;
        match out.map(|o| serde_json::from_str::<Usage>(o.trim())) {
            Ok(Ok(u)) => Some(usage_of(pod, &u, before)),
            Ok(Err(e)) => {
                tracing::warn!(pod, error = %e, "pgfleet-instance usage printed no usage line");
                None
            }
            Err(e) => {
                tracing::debug!(pod, error = %e, "pgfleet-instance usage failed");
                None
            }
        }
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect()
}

fn usage_of(pod: &str, u: &Usage, before: &[VolumeUsage]) -> VolumeUsage {
    let size = u.used_bytes.saturating_add(u.available_bytes).max(1);
    let percent = u32::try_from(u.used_bytes.saturating_mul(100) / size).unwrap_or(100);
    let (slot, wal) = match &u.slots {
        Some(slots) => slots
            .iter()
            .filter(|s| !s.active)
            .max_by_key(|s| s.wal_bytes)
            .map(|s| {
                (
                    Some(s.name.clone()),
                    u64::try_from(s.wal_bytes).unwrap_or(0),
                )
            })
            .unwrap_or((None, 0)),
        None => before
            .iter()
            .find(|b| b.name == pod)
            .map(|b| (b.inactive_slot.clone(), b.inactive_slot_wal_bytes))
            .unwrap_or((None, 0)),
    };
    // Whole MiB: a quiet database's reading then does not change, and
    // neither does the status (no write every few seconds per cluster).
    let mib = |b: u64| b >> 20 << 20;
    VolumeUsage {
        name: pod.to_string(),
        used_bytes: mib(u.used_bytes),
        available_bytes: mib(u.available_bytes),
        percent,
        inactive_slot: slot,
        inactive_slot_wal_bytes: wal,
    }
}

/// The refusal to keep showing instead of patching again, if the API
/// server refused this size recently.
fn still_refused(r: &Round<'_>, target: u64) -> Option<String> {
    let c = r
        .prev?
        .conditions
        .iter()
        .find(|c| c.type_ == "VolumeExpansionUnsupported")?;
    let age = r.ctx.storage.refused_for(r.ns, r.cluster, target)?;
    expand::still_refused(&c.message, age, target).then(|| c.message.clone())
}

/// Raises one claim's request (a merge patch: only that field changes,
/// the rest stays as created). A class that cannot expand answers 422.
async fn patch(r: &Round<'_>, claim: &str, to: u64, notices: &mut Vec<Notice>) {
    let body = serde_json::json!({"spec": {"resources": {"requests": {"storage": format(to)}}}});
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let api: Api<PersistentVolumeClaim> = Api::namespaced(r.ctx.client.clone(), r.ns);
    match api.patch(claim, &pp, &Patch::Merge(&body)).await {
        Ok(_) => {
            let note = format!("claim {claim}: request raised to {}", format(to));
            event(r.ctx, r.pg, EventType::Normal, "VolumeExpanding", note).await;
        }
        Err(kube::Error::Api(e)) if e.code == 422 || e.code == 403 => {
            r.ctx.storage.refuse(r.ns, r.cluster, to);
            notices.retain(|n| n.0 != "VolumeResizing");
            let why = crate::postgres::shown(&e.message);
            notices.push((
                "VolumeExpansionUnsupported",
                "StorageClassCannotExpand",
                expand::refused_message(claim, to, &why),
            ));
        }
        Err(e) => tracing::warn!(claim, error = %e, "raising a claim's request failed; retrying"),
    }
}

/// A Warning Event for each problem condition that was not there before.
async fn announce(r: &Round<'_>, notices: &[Notice]) {
    let before = r.prev.map(|s| s.conditions.as_slice()).unwrap_or_default();
    for (t, _, msg) in notices.iter().filter(|n| WARNINGS.contains(&n.0)) {
        if !before.iter().any(|c| c.type_ == *t) {
            event(r.ctx, r.pg, EventType::Warning, t, msg.clone()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::contract::SlotUsage;

    fn usage(slots: Option<Vec<SlotUsage>>) -> Usage {
        Usage {
            contract: 1,
            total_bytes: 100,
            used_bytes: 90,
            available_bytes: 10,
            wal_bytes: 0,
            slots,
        }
    }

    fn slot(name: &str, active: bool, wal: i64) -> SlotUsage {
        SlotUsage {
            name: name.into(),
            active,
            wal_bytes: wal,
        }
    }

    #[test]
    fn the_biggest_idle_slot_is_kept_and_trusted_while_the_server_is_down() {
        let slots = vec![
            slot("pg_2", true, 900),
            slot("old", false, 40),
            slot("tiny", false, 1),
        ];
        let u = usage_of("pg-1", &usage(Some(slots)), &[]);
        assert_eq!((u.percent, u.inactive_slot.as_deref()), (90, Some("old")));
        assert_eq!(u.inactive_slot_wal_bytes, 40);
        // The server PANICked: slots unknown, the last reading's slot holds.
        let down = usage_of("pg-1", &usage(None), std::slice::from_ref(&u));
        assert_eq!(down.inactive_slot.as_deref(), Some("old"));
        let r = reading(&down);
        assert_eq!(r.inactive_slots, vec![("old".to_string(), 40)]);
        // Down, with no earlier reading: nothing to blame.
        assert_eq!(usage_of("pg-1", &usage(None), &[]).inactive_slot, None);
    }
}
