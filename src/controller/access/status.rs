//! `status.access` and the access step's Events. The step computes the
//! status; the round's one status write (pipeline/status.rs) carries it,
//! and only when it changed, so a quiet cluster costs no writes. A round
//! that ends before its status write merge-patches it ([`write_now`]).

use crate::controller::Ctx;
use crate::controller::reconcile::event as publish;
use crate::crd::PostgresCluster;
use crate::crd::access::AccessStatus;
use crate::crd::cluster::Condition;
use crate::postgres::databases::DatabasePlan;
use crate::postgres::roles::{Action, RolePlan};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::app_secret::AppLogin;

/// The previous access status (from the object the round started with).
fn previous(pg: &PostgresCluster) -> Option<&AccessStatus> {
    pg.status.as_ref().and_then(|s| s.access.as_ref())
}

/// A condition keeping its transition time while its status is unchanged.
pub(super) fn cond(
    pg: &PostgresCluster,
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let old = previous(pg).and_then(|a| a.conditions.iter().find(|c| c.type_ == type_));
    let since = match old {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Some(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
    };
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: since,
        observed_generation: pg.metadata.generation,
    }
}

/// The first access status: whether this cluster ran before pgfleet
/// managed access (it has a primary already), which keeps its superuser
/// reachable unless the spec says otherwise. Written with the round's
/// status, before (or with) the first `currentPrimary` of a new cluster.
pub(super) fn first(pg: &PostgresCluster) -> AccessStatus {
    let legacy = pg
        .status
        .as_ref()
        .is_some_and(|s| s.current_primary.is_some());
    AccessStatus {
        legacy_superuser_access: legacy,
        ..Default::default()
    }
}

/// The conditions from the roles and databases, then the write.
pub(super) fn conclude(
    pg: &PostgresCluster,
    app: Option<&AppLogin>,
    mut st: AccessStatus,
) -> Option<AccessStatus> {
    if let Some(a) = app {
        let db = st.databases.iter().find(|d| d.name == a.dbname);
        let ok =
            db.is_some_and(|d| matches!(d.state.as_str(), "reconciled" | "created" | "altered"));
        let msg = match db.and_then(|d| d.message.clone()) {
            Some(m) => m,
            None => format!(
                "database {:?} owned by {:?}; Secret {}-app",
                a.dbname, a.username, a.cluster
            ),
        };
        st.conditions.push(cond(
            pg,
            "AppDatabaseReady",
            ok,
            if ok { "Ready" } else { "NotReady" },
            msg,
        ));
    }
    let bad: Vec<String> = st
        .roles
        .iter()
        .filter(|r| r.state == "refused" || r.state == "failed")
        .map(|r| format!("{}: {}", r.name, r.message.clone().unwrap_or_default()))
        .collect();
    let (reason, msg) = match bad.is_empty() {
        true => (
            "Reconciled",
            format!("{} roles as declared", st.roles.len()),
        ),
        false => ("RoleRefusedOrFailed", bad.join("; ")),
    };
    st.conditions
        .push(cond(pg, "RolesReconciled", bad.is_empty(), reason, msg));
    let bad: Vec<String> = st
        .databases
        .iter()
        .filter(|d| d.state == "refused" || d.state == "failed")
        .map(|d| format!("{}: {}", d.name, d.message.clone().unwrap_or_default()))
        .collect();
    let (reason, msg) = match bad.is_empty() {
        true => (
            "Reconciled",
            format!("{} databases as declared", st.databases.len()),
        ),
        false if bad.iter().any(|b| b.contains("not available")) => {
            ("ExtensionUnavailable", bad.join("; "))
        }
        false => ("DatabaseRefusedOrFailed", bad.join("; ")),
    };
    st.conditions
        .push(cond(pg, "DatabasesReconciled", bad.is_empty(), reason, msg));
    changed(pg, st)
}

/// `st` when it differs from what the round started with: what the
/// round's status write is to carry.
pub(super) fn changed(pg: &PostgresCluster, st: AccessStatus) -> Option<AccessStatus> {
    (previous(pg) != Some(&st)).then_some(st)
}

/// A merge patch of `status.access`, for a round that ends before its
/// status write (a rolling-update step writes its own status); a failure
/// is logged and the next round checks again (`super::forget`).
pub async fn write_now(pg: &PostgresCluster, ctx: &Ctx, st: &AccessStatus) {
    let api: Api<PostgresCluster> =
        Api::namespaced(ctx.client.clone(), &pg.namespace().unwrap_or_default());
    let body = json!({"status": {"access": st}});
    match api
        .patch_status(
            &pg.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&body),
        )
        .await
    {
        Ok(written) => ctx.written.saw(&written),
        Err(e) => {
            tracing::debug!(error = %e, "could not write status.access");
            super::forget(
                &ctx.member,
                &pg.namespace().unwrap_or_default(),
                &pg.name_any(),
            );
        }
    }
}

pub(super) async fn event(ctx: &Ctx, pg: &PostgresCluster, reason: &str, note: String) {
    publish(ctx, pg, EventType::Normal, reason, note).await;
}

/// Whether the previous round already reported `name` in `state` (a
/// refusal or failure is announced once, not every round).
fn already(pg: &PostgresCluster, name: &str, state: &str, role: bool) -> bool {
    let Some(a) = previous(pg) else { return false };
    match role {
        true => a.roles.iter().any(|r| r.name == name && r.state == state),
        false => a
            .databases
            .iter()
            .any(|d| d.name == name && d.state == state),
    }
}

pub(super) async fn role_event(ctx: &Ctx, pg: &PostgresCluster, p: &RolePlan, err: Option<&str>) {
    let n = &p.name;
    let (type_, reason, note) = match (p.action, err) {
        (Action::Refused, _) if !already(pg, n, "refused", true) => (
            EventType::Warning,
            "RoleRefused",
            p.refusal.clone().unwrap_or_default(),
        ),
        (Action::Refused | Action::None, _) => return,
        (_, Some(e)) if !already(pg, n, "failed", true) => {
            (EventType::Warning, "RoleFailed", format!("role {n:?}: {e}"))
        }
        (_, Some(_)) => return,
        (Action::Create, None) => (
            EventType::Normal,
            "RoleCreated",
            format!("role {n:?} created"),
        ),
        (Action::Drop, None) => (
            EventType::Normal,
            "RoleDropped",
            format!("role {n:?} dropped"),
        ),
        (Action::Alter, None) => (
            EventType::Normal,
            "RoleAltered",
            format!(
                "role {n:?} brought back to the spec: {}",
                p.drift.join(", ")
            ),
        ),
    };
    publish(ctx, pg, type_, reason, note).await;
}

pub(super) async fn db_event(ctx: &Ctx, pg: &PostgresCluster, p: &DatabasePlan, err: Option<&str>) {
    let n = &p.name;
    if !p.unavailable.is_empty() && !already(pg, n, "failed", false) {
        let note = format!(
            "database {n:?}: extensions not available in the image: {}",
            p.unavailable.join(", ")
        );
        publish(ctx, pg, EventType::Warning, "ExtensionUnavailable", note).await;
    }
    let (type_, reason, note) = match (p.action, err) {
        (Action::Refused, _) if !already(pg, n, "refused", false) => (
            EventType::Warning,
            "DatabaseRefused",
            p.refusal.clone().unwrap_or_default(),
        ),
        (Action::Refused | Action::None, _) => return,
        (_, Some(e)) if !already(pg, n, "failed", false) => (
            EventType::Warning,
            "DatabaseFailed",
            format!("database {n:?}: {e}"),
        ),
        (_, Some(_)) => return,
        (Action::Create, None) => (
            EventType::Normal,
            "DatabaseCreated",
            format!("database {n:?} created"),
        ),
        (Action::Drop, None) => (
            EventType::Normal,
            "DatabaseDropped",
            format!("database {n:?} dropped"),
        ),
        (Action::Alter, None) => (
            EventType::Normal,
            "DatabaseAltered",
            format!("database {n:?} brought back to the spec"),
        ),
    };
    publish(ctx, pg, type_, reason, note).await;
}
