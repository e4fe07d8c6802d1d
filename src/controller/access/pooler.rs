//! The pooler's login on the primary (controller::pooler::auth), kept by
//! every access round while `spec.pooler.enabled`: the role `pgfleet_pooler`
//! with exactly LOGIN and the password of Secret `<name>-pooler-auth`
//! (drift — an attribute, a membership, the password — is corrected like a
//! spec role's), then the lookup function in every database the pooler
//! serves (`postgres` and each database the spec declares present),
//! installed where it is missing or differs. The statements go through
//! `apply-sql` like every other role change.
//!
//! The outcome is the condition `PoolerAuthReady` in `status.access`.
//! Disabling the pooler leaves role and functions in place (the Secret is
//! the cluster's and goes with it); nothing logs in with them then.

use super::status;
use crate::controller::Ctx;
use crate::controller::pooler::auth;
use crate::crd::PostgresCluster;
use crate::crd::access::RoleSpec;
use crate::crd::cluster::Condition;
use crate::postgres::catalog::Catalog;
use crate::postgres::roles::{self, Action};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};

/// The pooler role as pgfleet declares it: LOGIN, nothing else.
fn role_spec() -> RoleSpec {
    RoleSpec {
        name: auth::ROLE.into(),
        login: true,
        inherit: false,
        connection_limit: -1,
        comment: Some(
            "PgBouncer's auth_user (pgfleet): LOGIN and EXECUTE on pgfleet.pooler_lookup only"
                .into(),
        ),
        ..Default::default()
    }
}

/// The databases whose lookup is checked: with a pooler, those it serves
/// (`postgres` and `declared`); without, `declared` as they are.
pub(super) fn served<'a>(pg: &PostgresCluster, declared: &[&'a str]) -> Vec<&'a str> {
    if !enabled(pg) {
        return declared.to_vec();
    }
    let mut out = vec!["postgres"];
    out.extend(declared.iter().filter(|d| **d != "postgres"));
    out
}

fn enabled(pg: &PostgresCluster) -> bool {
    pg.spec.pooler.as_ref().is_some_and(|p| p.enabled)
}

/// Runs the step; the condition to report (`None`: no pooler).
pub(super) async fn ensure(
    pg: &PostgresCluster,
    ctx: &Ctx,
    secrets: &Api<Secret>,
    primary: &str,
    catalog: &Catalog,
    dbs: &[&str],
) -> Option<Condition> {
    if !enabled(pg) {
        return None;
    }
    Some(match apply(pg, ctx, secrets, primary, catalog, dbs).await {
        Ok(msg) => status::cond(pg, "PoolerAuthReady", true, "Ready", msg),
        Err(msg) => status::cond(pg, "PoolerAuthReady", false, "Failed", msg),
    })
}

async fn apply(
    pg: &PostgresCluster,
    ctx: &Ctx,
    secrets: &Api<Secret>,
    primary: &str,
    catalog: &Catalog,
    dbs: &[&str],
) -> Result<String, String> {
    let ns = pg.namespace().unwrap_or_default();
    let name = format!("{}-{}", pg.name_any(), auth::SECRET);
    let secret = secrets
        .get_opt(&name)
        .await
        .map_err(|e| format!("could not read Secret {name}: {e}"))?
        .ok_or_else(|| format!("Secret {name} does not exist yet"))?;
    let password = super::app_secret::key(&secret, "password")
        .filter(|p| !p.is_empty())
        .ok_or_else(|| format!("Secret {name} has no key \"password\""))?;
    let plan = roles::plan_own(&role_spec(), Some(&password), catalog);
    super::round::apply(ctx, &ns, primary, &plan.stmts)
        .await
        .map_err(|e| format!("could not apply role {}: {e}", auth::ROLE))?;
    if plan.action != Action::None {
        let note = match plan.action {
            Action::Create => format!("created the pooler's role {}", auth::ROLE),
            _ => format!(
                "corrected the pooler's role {}: {}",
                auth::ROLE,
                plan.drift.join(", ")
            ),
        };
        status::event(ctx, pg, "PoolerRoleReconciled", note).await;
    }
    let mut failed = vec![];
    let mut installed = vec![];
    for db in served(pg, dbs) {
        let stmts = match auth::plan(db, catalog.database(db)) {
            Ok(s) => s,
            Err(e) => {
                failed.push(format!("database {db:?}: {e}"));
                continue;
            }
        };
        if stmts.is_empty() {
            continue;
        }
        match super::round::apply(ctx, &ns, primary, &stmts).await {
            Ok(()) => installed.push(db.to_string()),
            Err(e) => failed.push(format!("database {db:?}: {e}")),
        }
    }
    if !installed.is_empty() {
        let note = format!(
            "installed the pooler's password lookup in {}",
            installed.join(", ")
        );
        status::event(ctx, pg, "PoolerLookupInstalled", note).await;
    }
    if !failed.is_empty() {
        return Err(failed.join("; "));
    }
    Ok(format!(
        "role {} and the password lookup in every database the pooler serves",
        auth::ROLE
    ))
}
