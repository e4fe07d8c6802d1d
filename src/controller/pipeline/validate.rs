//! Step 2, validate: the spec (`controller::validate`, pure), and for a
//! cluster without volumes its admission (name fits its children, restore
//! source authorized), then the image policy. The result is typed: what was
//! parsed here (durations) is used as is by the later steps.

use super::observe::Seen;
use crate::controller::Ctx;
use crate::controller::image_policy::Effective;
use crate::controller::reconcile::Error;
use crate::controller::restore::Authorized;
use crate::controller::validate::{Valid, validate};
use crate::crd::PostgresCluster;

/// A spec the reconcile may act on.
pub struct Spec {
    pub valid: Valid,
    /// The restore source, authorized (only while the cluster has no volume).
    pub restore: Option<Authorized>,
    /// The image `spec.version` runs as (catalog or allowed `spec.image`).
    pub run: Effective,
}

/// Why the spec cannot be acted on.
pub struct Invalid {
    /// Every problem, joined.
    pub reason: String,
    /// The refusal may change without a spec change (consent given later,
    /// a backup completing): look again after a while.
    pub ask_again: bool,
}

pub enum Checked {
    Valid(Box<Spec>),
    Invalid(Invalid),
}

pub async fn check(pg: &PostgresCluster, ctx: &Ctx, seen: &Seen) -> Result<Checked, Error> {
    let (valid, mut errs) = match validate(&pg.spec) {
        Ok(v) => (Some(v), vec![]),
        Err(errs) => (None, errs),
    };
    let (restore, ask_again) = match seen.obs.pvcs.is_empty() {
        true => {
            crate::controller::restore::admit_new(ctx, pg, &seen.ns, seen.is_drill, &mut errs)
                .await?
        }
        false => (None, false),
    };
    let run = crate::controller::image_policy::resolve(&ctx.images, &pg.spec)
        .map_err(|e| errs.push(e))
        .ok();
    Ok(match (valid, run) {
        (Some(valid), Some(run)) if errs.is_empty() => Checked::Valid(Box::new(Spec {
            valid,
            restore,
            run,
        })),
        _ => Checked::Invalid(Invalid {
            reason: errs.join("; "),
            ask_again,
        }),
    })
}
