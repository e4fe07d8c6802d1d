//! Intent records: merge patches of the status written before (and while)
//! a multi-step operation — failover, switchover, a rolling-update step —
//! runs, so that a manager killed in the middle resumes the same operation.

use super::Ctx;
use super::error::api as api_failure;
use super::reconcile::{Error, FIELD_MANAGER};
use crate::crd::PostgresCluster;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// A merge patch of the status: intent records and their progress.
pub(super) async fn status_patch(
    ctx: &Ctx,
    pg: &PostgresCluster,
    status: serde_json::Value,
) -> Result<(), Error> {
    let (ns, name) = super::build::identity(pg)?;
    let api: Api<PostgresCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let written = api
        .patch_status(&name, &pp, &Patch::Merge(&json!({ "status": status })))
        .await
        .map_err(|source| {
            Error::Primary(api_failure("record", "PostgresCluster", &name, source))
        })?;
    ctx.written.saw(&written);
    Ok(())
}
