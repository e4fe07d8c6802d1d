//! What a cordoned node means for a cluster, pure: when the primary's node
//! is cordoned (`kubectl cordon`, the first thing `kubectl drain` does), the
//! primary should move before its Pod is evicted. Its disruption budget
//! (`build::pdbs`) refuses that eviction, so the drain waits; a planned
//! switchover to a ready replica on a schedulable node moves the primary
//! without failing a transaction through the pooler, and the old primary,
//! now a replica, may then be evicted.

use crate::controller::plan::Observed;
use crate::crd::Role;
use std::collections::BTreeSet;

/// What to do about the primary's node.
#[derive(Debug, Clone, PartialEq)]
pub enum Drain {
    /// The primary's node is not cordoned (or the primary is not a ready
    /// Pod: failover, not a drain, handles a primary that is gone).
    Stay,
    /// Switch over to the most advanced of these replicas.
    SwitchOver {
        node: String,
        candidates: Vec<String>,
    },
    /// The node is cordoned but no replica can take over: why.
    Stuck { node: String, reason: String },
}

/// Decides for the instance `primary` given the cordoned nodes.
pub fn decide(primary: &str, obs: &Observed, cordoned: &BTreeSet<String>) -> Drain {
    let Some(p) = obs.pods.get(primary) else {
        return Drain::Stay;
    };
    let Some(node) = p.node.as_ref().filter(|n| cordoned.contains(*n)) else {
        return Drain::Stay;
    };
    if !p.ready || p.deleting {
        return Drain::Stay;
    }
    let candidates: Vec<String> = obs
        .pods
        .values()
        .filter(|r| r.name != primary && r.role == Some(Role::Replica))
        .filter(|r| r.ready && !r.deleting)
        .filter(|r| r.node.as_ref().is_some_and(|n| !cordoned.contains(n)))
        .map(|r| r.name.clone())
        .collect();
    if candidates.is_empty() {
        return Drain::Stuck {
            node: node.clone(),
            reason: format!(
                "node {node} of primary {primary} is cordoned and no ready replica runs on a \
                 schedulable node; the primary's disruption budget keeps it until one does"
            ),
        };
    }
    Drain::SwitchOver {
        node: node.clone(),
        candidates,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::controller::plan::PodInfo;

    fn pod(name: &str, role: Role, node: &str, ready: bool) -> PodInfo {
        PodInfo {
            name: name.into(),
            role: Some(role),
            ready,
            node: Some(node.into()),
            ..Default::default()
        }
    }

    fn obs(pods: Vec<PodInfo>) -> Observed {
        let mut o = Observed::default();
        for p in pods {
            o.pods.insert(p.name.clone(), p);
        }
        o
    }

    fn set(nodes: &[&str]) -> BTreeSet<String> {
        nodes.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_cordoned_primary_node_switches_over_to_replicas_elsewhere() {
        let o = obs(vec![
            pod("pg-1", Role::Primary, "n1", true),
            pod("pg-2", Role::Replica, "n2", true),
            pod("pg-3", Role::Replica, "n3", true),
        ]);
        assert_eq!(decide("pg-1", &o, &set(&[])), Drain::Stay);
        assert_eq!(decide("pg-1", &o, &set(&["n2"])), Drain::Stay);
        assert_eq!(
            decide("pg-1", &o, &set(&["n1", "n3"])),
            Drain::SwitchOver {
                node: "n1".into(),
                candidates: vec!["pg-2".into()]
            }
        );
    }

    #[test]
    fn no_ready_replica_on_a_schedulable_node_is_stuck_not_a_switchover() {
        let o = obs(vec![
            pod("pg-1", Role::Primary, "n1", true),
            pod("pg-2", Role::Replica, "n1", true),
            pod("pg-3", Role::Replica, "n3", false),
        ]);
        let Drain::Stuck { node, reason } = decide("pg-1", &o, &set(&["n1"])) else {
            panic!("expected Stuck");
        };
        assert_eq!(node, "n1");
        assert!(reason.contains("pg-1"), "{reason}");
    }

    #[test]
    fn a_primary_that_is_not_ready_is_left_to_failover() {
        let o = obs(vec![
            pod("pg-1", Role::Primary, "n1", false),
            pod("pg-2", Role::Replica, "n2", true),
        ]);
        assert_eq!(decide("pg-1", &o, &set(&["n1"])), Drain::Stay);
        assert_eq!(decide("pg-9", &o, &set(&["n1"])), Drain::Stay);
    }
}
