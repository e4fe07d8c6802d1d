//! The superuser's password when superuser access is on. A cluster created
//! with `enableSuperuserAccess` off has no `<name>-superuser` Secret and a
//! `postgres` role without a password; turning access on creates the
//! Secret (controller::secrets) and this step gives `postgres` its
//! password, as a SCRAM verifier through exec like every other role. A
//! password that already matches the Secret is left alone, so clusters
//! that always had the Secret are never touched.

use super::status;
use crate::controller::Ctx;
use crate::crd::PostgresCluster;
use crate::postgres::catalog::Catalog;
use crate::postgres::roles;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};

/// Sets the superuser's password from its Secret when it differs; `Err`
/// names what failed (never the password).
pub(super) async fn ensure(
    pg: &PostgresCluster,
    ctx: &Ctx,
    secrets: &Api<Secret>,
    primary: &str,
    catalog: &Catalog,
) -> Result<(), String> {
    if !super::superuser_secret_needed(pg) {
        return Ok(());
    }
    let name = format!("{}-superuser", pg.name_any());
    let Some(secret) = secrets
        .get_opt(&name)
        .await
        .map_err(|e| format!("could not read Secret {name}: {e}"))?
    else {
        return Ok(()); // created by the next reconcile; checked then
    };
    let Some(password) = super::app_secret::key(&secret, "password").filter(|p| !p.is_empty())
    else {
        return Err(format!("Secret {name} has no key \"password\""));
    };
    let Some(stmt) = roles::superuser_password(&password, catalog) else {
        return Ok(());
    };
    let ns = pg.namespace().unwrap_or_default();
    super::round::apply(ctx, &ns, primary, std::slice::from_ref(&stmt))
        .await
        .map_err(|e| format!("could not set the superuser's password: {e}"))?;
    let note = format!("superuser access on: postgres has the password of Secret {name}");
    status::event(ctx, pg, "SuperuserPasswordSet", note).await;
    Ok(())
}
