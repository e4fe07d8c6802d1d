//! The controller's part of cross-cluster disaster recovery
//! (docs/disaster-recovery.md): a PostgresCluster in a `[dr.<topology>]`
//! is exposed to the other members (`<name>-dr`, a LoadBalancer Service on
//! its primary), and on a replica side its ConfigMap names the source its
//! designated primary streams from (`replica-source`). Which side a
//! cluster is on is decided by the DR engine (`crate::dr`) and read from
//! the [`registry::Registry`].

pub mod registry;

use kube::runtime::controller::Action;
use registry::Side;
use std::collections::BTreeMap;
use std::time::Duration;

/// A cluster of a topology whose state is not read yet waits: building its
/// children now could drop a replica side's source (and a restart would
/// then make it a second primary).
pub fn hold(side: &Option<Side>) -> Option<Action> {
    matches!(side, Some(Side::Unknown)).then(|| Action::requeue(Duration::from_secs(1)))
}

pub fn is_replica(side: &Option<Side>) -> bool {
    matches!(side, Some(Side::Replica { .. }))
}

/// Where the cluster's pooler sends clients: a replica side's to the
/// primary side's address, every other to its own `-rw` (in plain text
/// when the image's PostgreSQL has no SSL: `server_tls`).
pub fn pooler_upstream(
    o: &crate::controller::build::Owner,
    side: &Option<Side>,
    server_tls: bool,
) -> crate::controller::pooler::Upstream {
    use crate::controller::pooler::Upstream;
    match side {
        Some(Side::Replica { source, .. }) => Upstream::remote(&source.host, source.port),
        _ if !server_tls => Upstream::own_plain(o),
        _ => Upstream::own(o),
    }
}

/// In a topology, a primary that is not ready because the DR watchdog
/// fenced it is the DR engine's to unfence or demote: an in-cluster
/// failover would promote a replica behind its back — a second writer in
/// the topology while this side's configuration has not followed the
/// promotion elsewhere. Nor one the engine demoted that is still
/// rewinding onto the new primary side's timeline (slow on a loaded
/// machine): its replicas hold the lost side's last WAL too and could not
/// follow as designated primary. One status exec, only while the primary
/// is not ready, and none when the engine marked the primary as its own
/// ([`registry::Registry::hold`]): that exec is what times out on a
/// loaded machine.
pub async fn fenced_primary(
    pg: &crate::crd::PostgresCluster,
    ctx: &crate::controller::Ctx,
    ns: &str,
    side: &Option<Side>,
    obs: &crate::controller::plan::Observed,
) -> bool {
    if side.is_none() {
        return false;
    }
    let Some(current) = pg.status.as_ref().and_then(|s| s.current_primary.clone()) else {
        return false;
    };
    let name = pg.metadata.name.as_deref().unwrap_or_default();
    let Some(p) = obs.pods.get(&current).filter(|p| !p.deleting) else {
        return false;
    };
    if p.ready {
        // Back as Kubernetes sees it: the engine's mark has done its job.
        ctx.dr.release(&ctx.member, ns, name, &p.name);
        return false;
    }
    let held = ctx.dr.engine_holds(&ctx.member, ns, name, &p.name);
    // An instance that answers as up while its Pod is not Ready yet is
    // coming back (the readiness probe runs later): its readiness changed
    // long ago, when it was fenced, so failing over now would be at once.
    let fenced = held
        || crate::controller::instance::report(ctx, ns, &p.name)
            .await
            .is_some_and(|r| r.fenced || r.rewinding || r.ready);
    if fenced {
        tracing::info!(cluster = %ctx.member, pod = %p.name, engine = held, "primary fenced by the DR watchdog, demoted or rewinding by the DR engine, or coming back: no in-cluster failover");
    }
    fenced
}

/// Parameters every member of a topology runs with (unless the spec sets
/// them): the primary side keeps 1 GB of WAL for a replica side that
/// falls behind (it uses no slot, so a lost side cannot fill the disk),
/// and standbys report every second, so the primary side's watchdog and
/// the lag the manager records are never more than a second old.
pub fn parameters(params: &mut BTreeMap<String, String>) {
    for (k, v) in [
        ("wal_keep_size", "1GB"),
        ("wal_receiver_status_interval", "1s"),
    ] {
        params.entry(k.to_string()).or_insert_with(|| v.to_string());
    }
}
