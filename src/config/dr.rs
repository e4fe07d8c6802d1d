//! `[dr.<topology>]`: one PostgreSQL database kept in two or more member
//! clusters, one of them the primary side, the others replica clusters
//! that stream from it (docs/disaster-recovery.md).
//!
//! Why the topology lives here and not in a PostgresCluster field: a
//! replica cluster reads every byte of its source, so declaring one is a
//! cross-cluster (and potentially cross-tenant) data grant. Every spec
//! field is tenant input; only the platform team writes this file. The
//! tenant creates the PostgresCluster on the first member; pgfleet creates
//! and owns its copies in the others.

use serde::Deserialize;
use std::time::Duration;

use super::values::HumanDuration;

/// One topology.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct Topology {
    /// The PostgresCluster's namespace, the same in every member (required).
    pub namespace: String,
    /// The PostgresCluster's name, the same in every member (required).
    pub name: String,
    /// The member clusters holding a copy, at least two; the first is the
    /// primary side until a switchover or failover moves it (required).
    pub members: Vec<String>,
    /// How long the primary side must be unreachable from both the manager
    /// and the replica side before the replica side is promoted.
    pub failover_after: HumanDuration,
    /// Automatic failover at all (`false`: only `pgfleet dr promote`).
    pub automatic_failover: bool,
    /// The most WAL (bytes) an automatic promotion may lose: with a larger
    /// last measured lag nobody is promoted automatically.
    pub max_rpo_bytes: u64,
    /// The oldest unreplicated WAL an automatic promotion may lose.
    pub max_rpo_lag: HumanDuration,
    /// Commits on the primary side wait for the replica side
    /// (`synchronous_standby_names`): RPO 0 at the cost of a cross-cluster
    /// round trip per commit, and writes stop while the link is cut.
    pub synchronous: bool,
}

impl Default for Topology {
    fn default() -> Self {
        Self {
            namespace: String::new(),
            name: String::new(),
            members: Vec::new(),
            failover_after: HumanDuration::new("30s"),
            automatic_failover: true,
            max_rpo_bytes: 16 * 1024 * 1024,
            max_rpo_lag: HumanDuration::new("30s"),
            synchronous: false,
        }
    }
}

/// The shortest `failover_after`: the primary side must be able to fence
/// itself in half of it, with heartbeats several times within that half.
pub const MIN_FAILOVER_AFTER: Duration = Duration::from_secs(6);

impl Topology {
    pub fn failover_after(&self) -> Duration {
        self.failover_after
            .parsed()
            .copied()
            .unwrap_or(Duration::from_secs(30))
    }

    /// How long a primary that hears neither the manager nor any replica
    /// side keeps taking writes: half of `failover_after`, so it has
    /// stopped well before anyone else may be promoted (the safety
    /// argument in docs/disaster-recovery.md).
    pub fn fence_after(&self) -> Duration {
        self.failover_after() / 2
    }

    /// How often the manager tells the primary side it is still there: a
    /// few times per fence window, so one lost heartbeat fences nobody.
    pub fn heartbeat_every(&self) -> Duration {
        self.fence_after() / 4
    }

    pub fn max_rpo_lag(&self) -> Duration {
        self.max_rpo_lag
            .parsed()
            .copied()
            .unwrap_or(Duration::from_secs(30))
    }

    /// Problems with this topology: `(key, message)`; `known` are the
    /// configured member clusters.
    pub(crate) fn problems(&self, topology: &str, known: &[&str]) -> Vec<(&'static str, String)> {
        let mut out = vec![];
        if !super::selector::is_dns_label(topology) || topology.len() > 40 {
            out.push((
                "",
                format!(
                    "topology name {topology:?} must be a DNS-1123 label of at most 40 characters"
                ),
            ));
        }
        for (key, value) in [("namespace", &self.namespace), ("name", &self.name)] {
            if !super::selector::is_dns_label(value) {
                out.push((
                    key,
                    format!("{value:?} must be a DNS-1123 label (required)"),
                ));
            }
        }
        if self.members.len() < 2 {
            out.push((
                "members",
                "needs at least two member clusters (the first is the primary side)".into(),
            ));
        }
        for (i, m) in self.members.iter().enumerate() {
            if !known.contains(&m.as_str()) {
                out.push(("members", format!("{m:?} is not one of the [[clusters]]")));
            }
            if self.members[..i].contains(m) {
                out.push(("members", format!("{m:?} is listed twice")));
            }
        }
        if let Some(d) = self.failover_after.parsed()
            && *d < MIN_FAILOVER_AFTER
        {
            out.push((
                "failover_after",
                format!(
                    "must be at least {}s: the primary side fences itself within half of it",
                    MIN_FAILOVER_AFTER.as_secs()
                ),
            ));
        }
        out
    }
}

/// Problems across topologies: one PostgresCluster in two topologies
/// would have two sources.
pub(crate) fn overlaps(
    all: &std::collections::BTreeMap<String, Topology>,
) -> Vec<(String, String)> {
    let mut out = vec![];
    let mut seen: Vec<(&str, &str, &str)> = vec![];
    for (name, t) in all {
        if let Some((other, _, _)) = seen
            .iter()
            .find(|(_, ns, n)| *ns == t.namespace && *n == t.name)
        {
            out.push((
                name.clone(),
                format!(
                    "{}/{} is already in topology {other:?}: a PostgresCluster belongs to one topology",
                    t.namespace, t.name
                ),
            ));
        } else {
            seen.push((name, &t.namespace, &t.name));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn topo(members: &[&str]) -> Topology {
        Topology {
            namespace: "shop".into(),
            name: "orders".into(),
            members: members.iter().map(|s| s.to_string()).collect(),
            ..Topology::default()
        }
    }

    #[test]
    fn a_good_topology_has_no_problems_and_fences_in_half_the_failover_time() {
        let t = topo(&["a", "b"]);
        assert!(t.problems("orders", &["a", "b"]).is_empty());
        assert_eq!(t.failover_after(), Duration::from_secs(30));
        assert_eq!(t.fence_after(), Duration::from_secs(15));
        assert!(t.heartbeat_every() * 3 < t.fence_after());
    }

    #[test]
    fn members_must_be_known_distinct_and_at_least_two() {
        let p = topo(&["a"]).problems("x", &["a", "b"]);
        assert!(p.iter().any(|(k, m)| *k == "members" && m.contains("two")));
        let p = topo(&["a", "c", "a"]).problems("x", &["a", "b"]);
        assert!(p.iter().any(|(_, m)| m.contains("\"c\" is not")));
        assert!(p.iter().any(|(_, m)| m.contains("twice")));
    }

    #[test]
    fn a_short_failover_time_and_bad_names_are_refused() {
        let mut t = topo(&["a", "b"]);
        t.failover_after = HumanDuration::new("2s");
        t.namespace = "Shop!".into();
        let p = t.problems("Bad_Name", &["a", "b"]);
        assert!(p.iter().any(|(k, _)| *k == "failover_after"));
        assert!(p.iter().any(|(k, _)| *k == "namespace"));
        assert!(p.iter().any(|(k, _)| k.is_empty()));
    }

    #[test]
    fn one_cluster_in_two_topologies_is_refused() {
        let all = [("one", topo(&["a", "b"])), ("two", topo(&["b", "a"]))]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let p = overlaps(&all);
        assert_eq!(p.len(), 1);
        assert!(p[0].1.contains("topology \"one\""));
    }
}
