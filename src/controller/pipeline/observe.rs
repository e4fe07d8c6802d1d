//! Step 1, observe: what the reconcile starts from. Reads only memory (the
//! child index, adjusted by our own recent writes); no API call.

use crate::controller::Ctx;
use crate::controller::build::Owner;
use crate::controller::plan::Observed;
use crate::controller::reconcile::Error;
use crate::crd::PostgresCluster;
use crate::crd::cluster::PostgresClusterStatus;
use kube::ResourceExt;

/// The cluster as this round sees it.
pub struct Seen {
    pub ns: String,
    pub name: String,
    pub owner: Owner,
    /// The status at the start of the round (read fresh by `reconcile`).
    pub prev: Option<PostgresClusterStatus>,
    /// The round's timestamp (RFC 3339), for status conditions.
    pub now: String,
    pub obs: Observed,
    /// A restore drill's throwaway copy (`platform::labels::DRILL_OF`).
    pub is_drill: bool,
    /// Its side in a disaster-recovery topology (None: in none).
    pub dr: Option<crate::controller::dr::registry::Side>,
}

pub fn observe(pg: &PostgresCluster, ctx: &Ctx) -> Result<Seen, Error> {
    let (ns, name) = crate::controller::build::identity(pg)?;
    let owner = Owner::of(pg, crate::controller::shard_of(&ns, &name, ctx.shards))?;
    let obs = ctx.expect.adjust(&ns, &name, ctx.index.get(&ns, &name));
    Ok(Seen {
        owner,
        prev: pg.status.clone(),
        now: crate::platform::time::now_rfc3339(),
        obs,
        is_drill: pg.labels().contains_key(crate::platform::labels::DRILL_OF),
        dr: ctx.dr.side(&ctx.member, &ns, &name),
        ns,
        name,
    })
}
