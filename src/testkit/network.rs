//! Whole-cluster network faults for the cross-cluster tests and benchmarks
//! (issue 15): cut a member cluster off from the manager, from other
//! members, or both, and heal it — the same faults the sim's admin endpoint
//! sets (`PUT /clusters/{name}/network`, see `pgfleet_sim::network`). And
//! the observer client, which still reaches a cluster the manager cannot.

use super::{Error, Result, clients};
use crate::sim::Sim;
use crate::sim::network::{NetworkFault, Peers};

/// Sets `cluster`'s network fault; an unknown cluster or member name is an
/// error naming it.
pub fn cut(sim: &Sim, cluster: &str, fault: NetworkFault) -> Result<()> {
    sim.set_network(cluster, fault)
        .map_err(|e| Error::Unexpected(format!("network fault on {cluster}: {e}")))
}

/// Cuts `cluster` off from the manager only (its members still reach it).
pub fn cut_manager(sim: &Sim, cluster: &str) -> Result<()> {
    cut(
        sim,
        cluster,
        NetworkFault {
            manager: true,
            members: Peers::None,
        },
    )
}

/// Cuts `cluster` off from the manager and from every other member.
pub fn isolate(sim: &Sim, cluster: &str) -> Result<()> {
    cut(
        sim,
        cluster,
        NetworkFault {
            manager: true,
            members: Peers::All,
        },
    )
}

/// Cuts the links between `cluster` and `members` only (the manager still
/// reaches everyone).
pub fn cut_members(sim: &Sim, cluster: &str, members: &[&str]) -> Result<()> {
    cut(
        sim,
        cluster,
        NetworkFault {
            manager: false,
            members: Peers::Some(members.iter().map(|m| m.to_string()).collect()),
        },
    )
}

/// Clears `cluster`'s network fault.
pub fn heal(sim: &Sim, cluster: &str) -> Result<()> {
    cut(sim, cluster, NetworkFault::default())
}

/// A client of `cluster` through its observer address, which network
/// faults never close (built from `DIR/<cluster>.observer.kubeconfig`).
pub async fn observer_client(sim: &Sim, cluster: &str) -> Result<kube::Client> {
    let c = sim
        .get(cluster)
        .ok_or_else(|| Error::Unexpected(format!("no cluster {cluster} in the sim")))?;
    clients::client_from(&c.observer_kubeconfig).await
}
