//! The reconcile of one PostgresCluster, as six steps that run top to
//! bottom (docs/architecture.md, "The reconcile pipeline"):
//!
//! 1. **observe** — the children as the watch caches (and our own recent
//!    writes) show them, plus the previous status;
//! 2. **validate** — the spec, its admission (name, restore source, image
//!    policy), into a typed result: an invalid spec touches nothing that
//!    runs, it only says why;
//! 3. **primary** — a recorded or requested switchover, or a failover of a
//!    lost primary: these act at once and end the round;
//! 4. **build** — first the inputs every child refers to and that only I/O
//!    can give (credentials Secrets, the backup repository), then, pure,
//!    the [`desired::Desired`] children;
//! 5. **apply** — one applier, in a documented order (`apply.rs`), ending
//!    with at most one rolling-update step;
//! 6. **status** — what the round saw and did, and when to look again.
//!
//! Every action is recorded as an Event.

mod apply;
mod desired;
mod inputs;
mod observe;
mod primary;
mod status;
mod validate;

use super::Ctx;
use super::reconcile::Error;
use crate::crd::PostgresCluster;
use kube::runtime::controller::Action;
use std::sync::Arc;

/// One reconcile of an existing (not deleted) PostgresCluster.
pub async fn run(pg: Arc<PostgresCluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let mut seen = observe::observe(&pg, &ctx)?;
    if let Some(action) = crate::controller::dr::hold(&seen.dr) {
        return Ok(action);
    }
    let spec = match validate::check(&pg, &ctx, &seen).await? {
        validate::Checked::Valid(spec) => spec,
        validate::Checked::Invalid(invalid) => {
            return status::invalid(&pg, &ctx, &seen, invalid).await;
        }
    };
    let upgrade = crate::controller::major_upgrade::execute::round(
        &pg,
        &ctx,
        &seen.ns,
        &seen.obs,
        &seen.owner,
    )
    .await?;
    if let Some(action) = upgrade.done {
        return Ok(action);
    }
    hide(&mut seen.obs, &upgrade.hide);
    let (pg, spec) = builds_for(pg, spec, upgrade.builds_for);
    let pg = blue_green_shape(pg, upgrade.wal_logical, &upgrade.hba);
    let pg = config_only(pg, upgrade.wal_logical_config_only);
    let within = match upgrade.hold_primary {
        true => Some(std::time::Duration::from_secs(2)),
        false => match primary::settle(&pg, &ctx, &seen, &spec).await? {
            primary::Flow::Done(action) => return Ok(action),
            primary::Flow::Continue(within) => within,
        },
    };
    let inputs = inputs::prepare(&pg, &ctx, &seen, &spec).await?;
    let mut desired = desired::build(&sized(pg.clone(), &seen), &seen, &inputs)?;
    if let Some(g) = upgrade.green {
        let green = desired::green(&g, &seen, &inputs, &desired.config.hash);
        desired.instances.push(green);
    }
    desired.notices.extend(upgrade.notices);
    if let Some(why) = &inputs.tls.problem {
        let n = ("TLSCertificateInvalid", "ProvidedCertificateRejected", why);
        desired.notices.push((n.0, n.1, why.clone()));
    }
    desired.major_upgrade = upgrade.record;
    if let Some(why) = ctx.dr.notice(&ctx.member, &seen.ns, &seen.name) {
        let n = ("DisasterRecoveryBlocked", "PromotionBlocked", why);
        desired.notices.push(n);
    }
    let applied = apply::apply(&pg, &ctx, &seen, &desired).await?;
    let storage = storage(&pg, &ctx, &seen, desired.primary.as_deref()).await;
    desired.notices.extend(storage.notices);
    desired.storage = Some(storage.status);
    // Roles, databases, the app Secret on the primary (never fails the round).
    // (Not on a replica side: its designated primary is read-only, and its
    // roles are the primary side's, streamed.)
    let access = match crate::controller::dr::is_replica(&seen.dr) {
        true => super::access::Step::default(),
        false => super::access::run(&pg, &ctx, &seen.obs, desired.primary.as_deref()).await,
    };
    desired.access = access.status;
    // A renewed server certificate: every server reloads it.
    let reload = match &inputs.tls.pending {
        Some(fp) => super::tls::reload(&pg, &ctx, &seen.obs, &seen.owner, fp).await,
        None => None,
    };
    let within = [
        within,
        access.within,
        reload,
        inputs.tls.within,
        storage.within,
        upgrade.within,
    ]
    .into_iter()
    .flatten()
    .min();
    status::finish(&pg, &ctx, &seen, &desired, applied, within).await
}

/// The storage step (`controller::storage`): expansion and auto-grow.
async fn storage(
    pg: &PostgresCluster,
    ctx: &super::Ctx,
    seen: &observe::Seen,
    primary: Option<&str>,
) -> super::storage::Outcome {
    let round = super::storage::Round {
        pg,
        ctx,
        ns: &seen.ns,
        cluster: &seen.name,
        obs: &seen.obs,
        prev: seen.prev.as_ref(),
        primary,
    };
    super::storage::run(&round).await
}

/// The cluster as the later steps build it, size-wise: new claims get the
/// size the existing ones are brought to (auto-grow may have raised it
/// beyond `spec.storage.size`). Only this in-memory copy changes.
fn sized(pg: Arc<PostgresCluster>, seen: &observe::Seen) -> Arc<PostgresCluster> {
    let grown = seen
        .prev
        .as_ref()
        .and_then(|s| s.storage.as_ref())
        .and_then(|s| s.grown_to.as_deref());
    let size = super::storage::new_claim_size(&pg.spec.storage.size, grown, &seen.obs);
    if size == pg.spec.storage.size {
        return pg;
    }
    let mut copy = (*pg).clone();
    copy.spec.storage.size = size;
    Arc::new(copy)
}

/// The version and image the round builds for: `spec.version`'s, or the
/// one a major upgrade holds (`major_upgrade::decide`: the old version until
/// its instances stop, then the new one).
fn builds_for(
    pg: Arc<PostgresCluster>,
    mut spec: Box<validate::Spec>,
    hold: Option<(String, crate::controller::image_policy::Effective)>,
) -> (Arc<PostgresCluster>, Box<validate::Spec>) {
    let Some((version, run)) = hold else {
        let pg = with_image(pg, &spec.run.image);
        return (pg, spec);
    };
    let mut copy = (*pg).clone();
    copy.spec.version = version;
    copy.spec.image = None;
    spec.run = run;
    let pg = with_image(Arc::new(copy), &spec.run.image);
    (pg, spec)
}

/// Leaves the other side of a blue/green upgrade out of the round: the
/// plan, the Services' labels, failover and the status see one side.
fn hide(obs: &mut crate::controller::plan::Observed, names: &[String]) {
    for n in names {
        obs.pods.remove(n);
        obs.pvcs.remove(n);
        obs.claims.remove(n);
        obs.hidden.insert(n.clone());
    }
}

/// The cluster as a blue/green upgrade builds it: `wal_level = logical`
/// (blue publishes; the rolling update restarts it for that) and the
/// upgrade role's plain-text pg_hba rules. Only this in-memory
/// copy changes.
fn blue_green_shape(
    pg: Arc<PostgresCluster>,
    logical: bool,
    hba: &[String],
) -> Arc<PostgresCluster> {
    if !logical && hba.is_empty() {
        return pg;
    }
    let mut copy = (*pg).clone();
    if logical {
        let p = &mut copy.spec.postgresql.parameters;
        p.insert("wal_level".into(), "logical".into());
    }
    copy.spec.postgresql.plain_text_hba = hba.to_vec();
    Arc::new(copy)
}

/// `wal_level = logical` in the configuration only (green, which started
/// with it, while blue follows it: no restart).
fn config_only(pg: Arc<PostgresCluster>, logical: bool) -> Arc<PostgresCluster> {
    if !logical {
        return pg;
    }
    let mut copy = (*pg).clone();
    let p = &mut copy.spec.postgresql.config_only;
    p.insert("wal_level".into(), "logical".into());
    Arc::new(copy)
}

/// The cluster as the later steps build it: with the image it runs
/// (`spec.image`, else the image catalog's for `spec.version`) in
/// `spec.image`, so `build::image` needs no catalog. Only this in-memory
/// copy changes; the stored object keeps what the tenant wrote.
fn with_image(pg: Arc<PostgresCluster>, image: &str) -> Arc<PostgresCluster> {
    if crate::controller::build::image(&pg) == image {
        return pg;
    }
    let mut copy = (*pg).clone();
    copy.spec.image = Some(image.to_string());
    Arc::new(copy)
}
