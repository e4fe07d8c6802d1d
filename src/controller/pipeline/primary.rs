//! Step 3, primary: a switchover recorded in the status is resumed, a
//! requested one is started (or refused), a primary on a cordoned node is
//! moved by switchover (`drain`), and a lost primary is failed over. Each of them acts at once and ends the round; otherwise the round
//! goes on, possibly asked to look again soon (a primary not lost yet).

use super::observe::Seen;
use super::validate::Spec;
use crate::controller::Ctx;
use crate::controller::reconcile::Error;
use crate::controller::{drain, failover, switchover};
use crate::crd::PostgresCluster;
use std::time::Duration;
use tracing::Instrument;

pub enum Flow {
    /// Build and apply as usual; look again within this long, if set.
    Continue(Option<Duration>),
    /// The primary step acted; requeue with this action.
    Done(kube::runtime::controller::Action),
}

pub async fn settle(
    pg: &PostgresCluster,
    ctx: &Ctx,
    seen: &Seen,
    spec: &Spec,
) -> Result<Flow, Error> {
    let (obs, owner) = (&seen.obs, &seen.owner);
    if let Some(st) = seen.prev.as_ref()
        && let (Some(cur), Some(target)) = (&st.current_primary, &st.target_primary)
        && cur != target
        && st.switchover.is_some()
    {
        let span =
            crate::telemetry::spans::switchover(&ctx.member, &seen.ns, &seen.name, cur, target);
        let replica_side = crate::controller::dr::is_replica(&seen.dr);
        return switchover::resume(pg, ctx, obs, owner, (cur, target), replica_side)
            .instrument(span)
            .await
            .map(Flow::Done);
    }
    if let Some(action) = switchover::take_request(pg, ctx, obs, owner).await? {
        return Ok(Flow::Done(action));
    }
    let mut within = None;
    if let Some(cur) = seen
        .prev
        .as_ref()
        .and_then(|s| s.current_primary.as_deref())
    {
        match drain::check(pg, ctx, obs, owner, cur).await? {
            drain::Step::Started(action) => return Ok(Flow::Done(action)),
            drain::Step::LookAgain(d) => within = Some(d),
            drain::Step::Nothing => {}
        }
    }
    if crate::controller::dr::fenced_primary(pg, ctx, &seen.ns, &seen.dr, obs).await {
        return Ok(Flow::Continue(Some(Duration::from_secs(2))));
    }
    let delay = spec.valid.failover_delay;
    Ok(
        match failover::execute::check_primary(pg, ctx, obs, owner, delay).await? {
            failover::execute::Flow::Continue => Flow::Continue(within),
            failover::execute::Flow::ContinueWithin(d) => {
                Flow::Continue(Some(within.map_or(d, |w| w.min(d))))
            }
            failover::execute::Flow::Done(action) => Flow::Done(action),
        },
    )
}
