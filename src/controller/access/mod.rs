//! The access step (issue 13): what applications connect with. After the
//! children are applied, on a ready primary:
//!
//! 1. the `<name>-app` Secret exists (`app_secret`);
//! 2. the primary's catalog (`pgfleet-instance catalog`) is compared with
//!    the application owner, `spec.roles` and `spec.databases`
//!    (`postgres::roles`, `postgres::databases`, pure);
//! 3. what differs is applied through `pgfleet-instance apply-sql`, SQL on
//!    stdin, passwords as SCRAM verifiers — the same pods/exec path every
//!    other instance operation takes: the manager never logs in over the
//!    network and needs no superuser password;
//! 4. the outcome goes to `status.access` (merge patch, only when it
//!    changed) and every change is an Event.
//!
//! The step never fails the reconcile: a primary that cannot be read, a
//! refused role or a missing extension is a condition in `status.access`,
//! and the step runs again after [`RECHECK`]. It runs at once when a spec
//! field it reads or the primary changed (a failover, a restore), so a
//! new primary is checked before anything else reads from it.

mod app_secret;
mod fleet;
mod pooler;
mod round;
mod status;
mod superuser;

pub use app_secret::{AppLogin, data as app_secret_data, name as app_secret_name, pct};
pub use status::write_now as write_status_now;

use super::Ctx;
use super::plan::Observed;
use crate::crd::PostgresCluster;
use kube::ResourceExt;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How often a primary's catalog is compared with the spec when nothing
/// else triggers it: the bound on how long drift (a role altered by hand, a
/// changed password Secret) stays uncorrected.
pub const RECHECK: Duration = Duration::from_secs(20);

/// When each cluster (member/ns/name) was last checked, and on which
/// primary (with its role set pins) with which inputs ([`inputs_hash`]). In memory: after a restart of the manager
/// every cluster is checked once at its first reconcile.
/// The interval is `None` where nothing is to be checked periodically (the
/// virtual runtime, which runs no SQL).
type LastCheck = (Instant, String, u64, Option<Duration>);

fn last_checks() -> &'static Mutex<HashMap<String, LastCheck>> {
    static LAST: OnceLock<Mutex<HashMap<String, LastCheck>>> = OnceLock::new();
    LAST.get_or_init(Default::default)
}

/// `member/namespace/name`: a cluster's key in the access step's memory
/// (its last check, its early app Secret).
fn cluster_key(ctx: &Ctx, pg: &PostgresCluster) -> String {
    key_of(
        &ctx.member,
        &pg.namespace().unwrap_or_default(),
        &pg.name_any(),
    )
}

fn key_of(member: &str, ns: &str, name: &str) -> String {
    format!("{member}/{ns}/{name}")
}

/// Forgets a deleted cluster's last check (keyed as [`cluster_key`]).
pub fn forget(member: &str, ns: &str, name: &str) {
    let key = key_of(member, ns, name);
    app_secret::forget_early(&key);
    last_checks()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&key);
}

/// Whether the superuser may log in over TCP: `spec.enableSuperuserAccess`,
/// or, when unset, only for a cluster that ran before pgfleet managed access
/// (its applications may use the superuser Secret).
pub fn superuser_network_access(pg: &PostgresCluster) -> bool {
    pg.spec.enable_superuser_access.unwrap_or_else(|| {
        let st = pg.status.as_ref();
        match st.and_then(|s| s.access.as_ref()) {
            Some(a) => a.legacy_superuser_access,
            None => st.is_some_and(|s| s.current_primary.is_some()),
        }
    })
}

/// Whether the cluster gets a `<name>-superuser` Secret: only when the
/// superuser may log in over the network. The manager itself needs no
/// superuser password: it runs everything through exec on the local
/// socket, and the pooler logs in with its own role (pooler::auth). A
/// Secret that exists is never removed (clusters from before keep theirs).
pub fn superuser_secret_needed(pg: &PostgresCluster) -> bool {
    superuser_network_access(pg)
}

/// The pg_hba lines in front of pgfleet's own: with superuser access off,
/// `postgres` is rejected on every TCP socket; with a pooler, its role
/// (pooler::auth) must give its password. Both come before the tenant's
/// own lines, which cannot open them again.
pub fn hba_lines(pg: &PostgresCluster) -> Vec<String> {
    let pooler = pg.spec.pooler.as_ref().is_some_and(|p| p.enabled);
    let mut out = vec![];
    if !superuser_network_access(pg) {
        out.push("host all postgres 0.0.0.0/0 reject".to_string());
        out.push("host all postgres ::/0 reject".to_string());
    }
    if pooler {
        let role = super::pooler::auth::ROLE;
        out.push(format!("hostssl all {role} all scram-sha-256"));
    }
    out.extend(pg.spec.postgresql.pg_hba.iter().cloned());
    out
}

/// A brand-new cluster's `<name>-app` Secret, before its first instance
/// (`round::early_app_secret`): when the cluster has no instance, claim or
/// `<name>-app` Secret yet. Not on a replica side (its roles are the
/// primary side's).
pub async fn early_app_secret(pg: &PostgresCluster, ctx: &Ctx, obs: &Observed) {
    let fresh = obs.pods.is_empty()
        && obs.pvcs.is_empty()
        && !obs.secrets.contains(&app_secret_name(&pg.name_any()));
    if fresh {
        round::early_app_secret(pg, ctx).await;
    }
}

/// What the access step did: when it wants to run again, and the access
/// status for the round's status write (None: unchanged).
#[derive(Default)]
pub struct Step {
    pub within: Option<Duration>,
    pub status: Option<crate::crd::access::AccessStatus>,
}

/// The access step.
pub async fn run(pg: &PostgresCluster, ctx: &Ctx, obs: &Observed, primary: Option<&str>) -> Step {
    let prev = pg.status.as_ref().and_then(|s| s.access.as_ref());
    // A cluster's first round marks it (with the round's status write).
    let first = prev.is_none().then(|| status::first(pg));
    let legacy = prev
        .or(first.as_ref())
        .is_some_and(|a| a.legacy_superuser_access);
    let waiting = |within| Step {
        within,
        status: first.clone(),
    };
    let Some(primary) = primary else {
        return waiting(None);
    };
    let ready = obs
        .pods
        .get(primary)
        .is_some_and(|p| p.ready && !p.deleting);
    if !ready {
        return waiting(Some(RECHECK));
    }
    let key = cluster_key(ctx, pg);
    // A rollout moving a fleet role set's generation (an annotation, not a
    // spec change) is applied at once too.
    let marker = format!("{primary} {}", role_set_pins(pg));
    let inputs = inputs_hash(pg);
    let due = {
        let last = last_checks().lock().unwrap_or_else(|e| e.into_inner());
        match last.get(&key) {
            Some((at, p, h, every)) if *p == marker && *h == inputs => {
                Some(every.map(|e| e.checked_sub(at.elapsed())))
            }
            _ => None,
        }
    };
    match due {
        Some(None) => return waiting(None),
        Some(Some(Some(wait))) => return waiting(Some(wait.max(Duration::from_millis(500)))),
        Some(Some(None)) | None => {}
    }
    // Also after a failed round: a primary that cannot answer is asked
    // again after RECHECK, not at every trigger.
    let app_rv = obs.app_secret_rv.as_deref();
    let (outcome, status) = round::run(pg, ctx, primary, legacy, app_rv).await;
    let every = match outcome {
        round::Outcome::Emulated => None,
        round::Outcome::Checked | round::Outcome::Unreadable => Some(RECHECK),
    };
    last_checks()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, (Instant::now(), marker, inputs, every));
    Step {
        within: every,
        status: status.or(first),
    }
}

/// A hash of the spec fields the access round reads. A change of any other
/// field (parameters, resources, size) does not run it again: each run
/// costs an exec on the primary, a Secret read and a status write, which
/// made a plain spec change cost four requests instead of one (issue 16).
/// Drift is still corrected every [`RECHECK`].
fn inputs_hash(pg: &PostgresCluster) -> u64 {
    use std::hash::{Hash, Hasher};
    let s = &pg.spec;
    let fields = serde_json::json!([
        s.bootstrap,
        s.roles,
        s.databases,
        s.pooler.as_ref().map(|p| p.enabled),
        s.enable_superuser_access,
        s.version,
        s.image,
    ]);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    fields.to_string().hash(&mut h);
    h.finish()
}

/// The fleet role set generations the annotations pin, as one string.
fn role_set_pins(pg: &PostgresCluster) -> String {
    let prefix = crate::crd::access::role_set_annotation("");
    pg.annotations()
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pg(spec: serde_json::Value, status: serde_json::Value) -> PostgresCluster {
        let mut pg = PostgresCluster::new("orders", serde_json::from_value(spec).unwrap());
        pg.status = serde_json::from_value(status).unwrap();
        pg
    }

    #[test]
    fn superuser_is_rejected_on_tcp_by_default_for_new_clusters() {
        let new = pg(
            serde_json::json!({"postgresql": {"pgHba": ["host all all 10.0.0.0/8 md5"]}}),
            serde_json::json!(null),
        );
        assert!(!superuser_network_access(&new));
        assert_eq!(
            hba_lines(&new),
            [
                "host all postgres 0.0.0.0/0 reject",
                "host all postgres ::/0 reject",
                "host all all 10.0.0.0/8 md5"
            ]
        );
        let on = pg(
            serde_json::json!({"enableSuperuserAccess": true}),
            serde_json::json!(null),
        );
        assert!(hba_lines(&on).is_empty());
        // The pooler logs in with its own role: the superuser stays
        // rejected, and the pooler role must give its password.
        let pooled = pg(
            serde_json::json!({"pooler": {"enabled": true}}),
            serde_json::json!(null),
        );
        assert_eq!(
            hba_lines(&pooled),
            [
                "host all postgres 0.0.0.0/0 reject",
                "host all postgres ::/0 reject",
                "hostssl all pgfleet_pooler all scram-sha-256"
            ]
        );
        assert!(!superuser_secret_needed(&pooled));
    }

    #[test]
    fn clusters_from_before_keep_superuser_access_unless_told() {
        let old = pg(
            serde_json::json!({}),
            serde_json::json!({"currentPrimary": "orders-1"}),
        );
        assert!(superuser_network_access(&old));
        let marked = pg(
            serde_json::json!({}),
            serde_json::json!({"currentPrimary": "orders-1", "access": {"legacySuperuserAccess": true}}),
        );
        assert!(superuser_network_access(&marked));
        let new_marked = pg(
            serde_json::json!({}),
            serde_json::json!({"currentPrimary": "orders-1", "access": {"legacySuperuserAccess": false}}),
        );
        assert!(!superuser_network_access(&new_marked));
        let off = pg(
            serde_json::json!({"enableSuperuserAccess": false}),
            serde_json::json!({"currentPrimary": "orders-1", "access": {"legacySuperuserAccess": true}}),
        );
        assert!(!superuser_network_access(&off));
    }
}
