//! What the DR engine tells the member controllers about a PostgresCluster
//! that is part of a topology: which side it is on, and where a replica
//! side streams from. The controllers read it every round; the engine
//! writes it and then touches the PostgresCluster (an annotation) so the
//! change is reconciled at once.
//!
//! Why a shared map and not a spec field: which member is the primary side
//! is the fleet's decision (docs/disaster-recovery.md) and must never be
//! writable by a tenant. The durable copy is the topology's state
//! ConfigMaps in `pgfleet-system` (`state.rs`); this map is rebuilt from
//! them when the manager starts, and until then a topology's clusters are
//! [`Side::Unknown`], which the controllers leave alone.

use std::collections::HashMap;
use std::sync::RwLock;

/// Where a primary side can be reached from other member clusters (its
/// `<name>-dr` LoadBalancer Service).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Side {
    /// Not read yet: nothing that depends on the side may change.
    Unknown,
    /// Takes writes; the other members stream from it. Its primary fences
    /// itself after `fence_after_secs` without contact (the watchdog), and
    /// with `synchronous_with` its commits wait for one of those sides.
    Primary {
        topology: String,
        epoch: u64,
        fence_after_secs: u64,
        synchronous_with: Vec<String>,
    },
    /// A replica cluster: its designated primary streams from `source`,
    /// and calls itself `dr-<member>` there.
    Replica {
        topology: String,
        epoch: u64,
        source: Endpoint,
        member: String,
    },
}

impl Side {
    /// The ConfigMap's `replica-source` line ("HOST PORT MEMBER") for a
    /// replica side. Host and member are checked to be plain tokens (an
    /// address and a DNS label): the instance script splits on spaces.
    pub fn replica_source(&self) -> Option<String> {
        let Side::Replica { source, member, .. } = self else {
            return None;
        };
        let plain = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'))
        };
        (plain(&source.host) && plain(member))
            .then(|| format!("{} {} {member}\n", source.host, source.port))
    }

    /// The files the ConfigMap carries for this side (docs/instance-contract.md).
    pub fn files(&self) -> std::collections::BTreeMap<String, String> {
        let mut out = std::collections::BTreeMap::new();
        if let Some(src) = self.replica_source() {
            out.insert("replica-source".to_string(), src);
        }
        if let Side::Primary {
            fence_after_secs, ..
        } = self
        {
            out.insert("dr-watchdog".to_string(), format!("{fence_after_secs}\n"));
        }
        out
    }

    /// `synchronous_standby_names` for a synchronous primary side.
    pub fn synchronous_names(&self) -> Option<String> {
        let Side::Primary {
            synchronous_with, ..
        } = self
        else {
            return None;
        };
        if synchronous_with.is_empty() {
            return None;
        }
        let names: Vec<String> = synchronous_with
            .iter()
            .map(|m| format!("\"dr-{m}\""))
            .collect();
        Some(format!("ANY 1 ({})", names.join(", ")))
    }

    pub fn topology(&self) -> Option<&str> {
        match self {
            Side::Unknown => None,
            Side::Primary { topology, .. } | Side::Replica { topology, .. } => Some(topology),
        }
    }
}

/// `(member, namespace, name)`.
type Key = (String, String, String);

/// Every PostgresCluster of every configured topology, with its side.
#[derive(Default)]
pub struct Registry {
    sides: RwLock<HashMap<Key, Side>>,
    /// Why a replica side is not promoted although its primary side is
    /// lost (a condition on its PostgresCluster).
    notices: RwLock<HashMap<Key, String>>,
    /// Primaries the engine is fencing, demoting or rewinding, with the
    /// instant the mark lapses: the controller must not fail over around
    /// them (see [`Registry::engine_holds`]).
    held: RwLock<HashMap<Key, (String, std::time::Instant)>>,
}

impl Registry {
    /// Every `(member, namespace, name)` of the configured topologies,
    /// [`Side::Unknown`] until the engine has read their state.
    pub fn from_config(
        topologies: &std::collections::BTreeMap<String, crate::config::dr::Topology>,
    ) -> Self {
        let sides = topologies
            .values()
            .flat_map(|t| {
                t.members.iter().map(|m| {
                    (
                        (m.clone(), t.namespace.clone(), t.name.clone()),
                        Side::Unknown,
                    )
                })
            })
            .collect();
        Self {
            sides: RwLock::new(sides),
            notices: RwLock::default(),
            held: RwLock::default(),
        }
    }

    /// None: the PostgresCluster is in no topology.
    pub fn side(&self, member: &str, ns: &str, name: &str) -> Option<Side> {
        let key = (member.to_string(), ns.to_string(), name.to_string());
        self.sides
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()
    }

    pub fn notice(&self, member: &str, ns: &str, name: &str) -> Option<String> {
        let key = (member.to_string(), ns.to_string(), name.to_string());
        let notices = self.notices.read().unwrap_or_else(|e| e.into_inner());
        notices.get(&key).cloned()
    }

    /// Sets or clears the notice; true when it changed.
    pub fn set_notice(&self, member: &str, ns: &str, name: &str, why: Option<String>) -> bool {
        let key = (member.to_string(), ns.to_string(), name.to_string());
        let mut notices = self.notices.write().unwrap_or_else(|e| e.into_inner());
        match why {
            Some(w) => notices.insert(key, w.clone()).as_ref() != Some(&w),
            None => notices.remove(&key).is_some(),
        }
    }

    /// Marks `pod` as the engine's to bring back for `for_` (a fenced
    /// primary it has seen, one it is demoting or rewinding). Why a mark
    /// and not only the controller's own status exec: on a loaded machine
    /// that exec times out, and an in-cluster failover then promotes a
    /// standby of the lost side behind the engine's back, which makes the
    /// side re-clone instead of rewind. The mark lapses on its own so a
    /// manager that stopped caring (topology removed) blocks nothing.
    pub fn hold(&self, member: &str, ns: &str, name: &str, pod: &str, for_: std::time::Duration) {
        let key = (member.to_string(), ns.to_string(), name.to_string());
        let until = std::time::Instant::now() + for_;
        let mut held = self.held.write().unwrap_or_else(|e| e.into_inner());
        let keep = held.get(&key).is_some_and(|(p, u)| p == pod && *u > until);
        if !keep {
            held.insert(key, (pod.to_string(), until));
        }
    }

    /// Drops the mark on `pod` (its Pod is Ready again), so a later real
    /// failure is failed over without waiting for the mark to lapse.
    pub fn release(&self, member: &str, ns: &str, name: &str, pod: &str) {
        let key = (member.to_string(), ns.to_string(), name.to_string());
        let mut held = self.held.write().unwrap_or_else(|e| e.into_inner());
        if held.get(&key).is_some_and(|(p, _)| p == pod) {
            held.remove(&key);
        }
    }

    /// Whether the engine holds `pod` (marked and not lapsed).
    pub fn engine_holds(&self, member: &str, ns: &str, name: &str, pod: &str) -> bool {
        let key = (member.to_string(), ns.to_string(), name.to_string());
        let held = self.held.read().unwrap_or_else(|e| e.into_inner());
        held.get(&key)
            .is_some_and(|(p, until)| p == pod && *until > std::time::Instant::now())
    }

    /// Sets a side; only for clusters the configuration lists.
    pub fn set(&self, member: &str, ns: &str, name: &str, side: Side) {
        let key = (member.to_string(), ns.to_string(), name.to_string());
        let mut sides = self.sides.write().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = sides.get_mut(&key) {
            *s = side;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn replica(host: &str, member: &str) -> Side {
        Side::Replica {
            topology: "t".into(),
            epoch: 1,
            source: Endpoint {
                host: host.into(),
                port: 5432,
            },
            member: member.into(),
        }
    }

    #[test]
    fn only_a_replica_side_with_plain_tokens_gets_a_source_line() {
        assert_eq!(
            replica("127.200.0.7", "member-2")
                .replica_source()
                .as_deref(),
            Some("127.200.0.7 5432 member-2\n")
        );
        assert_eq!(replica("a b", "m").replica_source(), None);
        assert_eq!(replica("h", "m\nx").replica_source(), None);
        let p = Side::Primary {
            topology: "t".into(),
            epoch: 1,
            fence_after_secs: 15,
            synchronous_with: vec!["member-2".into()],
        };
        assert_eq!(p.replica_source(), None);
        assert_eq!(p.files()["dr-watchdog"], "15\n");
        assert_eq!(
            p.synchronous_names().as_deref(),
            Some("ANY 1 (\"dr-member-2\")")
        );
        assert_eq!(replica("h", "m").files().len(), 1);
    }

    #[test]
    fn unlisted_clusters_are_in_no_topology_and_cannot_be_set() {
        let mut cfg = std::collections::BTreeMap::new();
        cfg.insert(
            "t".to_string(),
            crate::config::dr::Topology {
                namespace: "ns".into(),
                name: "db".into(),
                members: vec!["a".into(), "b".into()],
                ..Default::default()
            },
        );
        let r = Registry::from_config(&cfg);
        assert_eq!(r.side("a", "ns", "db"), Some(Side::Unknown));
        assert_eq!(r.side("c", "ns", "db"), None);
        r.set("c", "ns", "db", replica("h", "c"));
        assert_eq!(r.side("c", "ns", "db"), None);
        r.set("b", "ns", "db", replica("h", "b"));
        assert_eq!(r.side("b", "ns", "db"), Some(replica("h", "b")));
    }

    #[test]
    fn an_engine_hold_names_one_pod_and_lapses() {
        let r = Registry::default();
        let long = std::time::Duration::from_secs(600);
        r.hold("a", "ns", "db", "db-1", long);
        assert!(r.engine_holds("a", "ns", "db", "db-1"));
        assert!(!r.engine_holds("a", "ns", "db", "db-2"));
        assert!(!r.engine_holds("b", "ns", "db", "db-1"));
        // A shorter mark does not shorten a longer one.
        r.hold("a", "ns", "db", "db-1", std::time::Duration::ZERO);
        assert!(r.engine_holds("a", "ns", "db", "db-1"));
        r.release("a", "ns", "db", "db-2");
        assert!(r.engine_holds("a", "ns", "db", "db-1"));
        r.release("a", "ns", "db", "db-1");
        assert!(!r.engine_holds("a", "ns", "db", "db-1"));
        r.hold("a", "ns", "db", "db-1", long);
        // Another pod replaces it; a lapsed mark holds nothing.
        r.hold("a", "ns", "db", "db-2", std::time::Duration::ZERO);
        assert!(!r.engine_holds("a", "ns", "db", "db-2"));
        assert!(!r.engine_holds("a", "ns", "db", "db-1"));
    }
}
