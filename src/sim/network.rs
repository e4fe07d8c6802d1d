//! Whole-cluster network faults: a member cluster cut off from the manager,
//! from other member clusters, or both — the faults cross-cluster disaster
//! recovery must survive (a region losing its links, asymmetric cuts).
//!
//! Two paths exist between the places of a fleet, and each is cut on its own:
//!
//! - **manager ↔ cluster**: the manager reaches a member only through its
//!   API server. With `manager: true` the API server's address in the
//!   cluster's kubeconfig stops listening and every open connection (open
//!   watches, exec sessions) is cut, exactly as the refuse-connections fault
//!   does: clients see `ECONNREFUSED`, not an HTTP error. Tests still need
//!   to look at the cluster, so each cluster also listens on an *observer*
//!   address (`DIR/<cluster>.observer.kubeconfig`, same token) that network
//!   faults never close: it stands for someone inside the cluster's network.
//!   (Only `refuse_connections` — the API server itself down — closes both.)
//! - **cluster ↔ cluster**: member clusters reach each other only through
//!   exposed endpoints, the ingress IPs of Services of type LoadBalancer
//!   (see [`crate::lb`]). With `members`, connections between this
//!   cluster's pods and the named clusters' ingress IPs are cut in both
//!   directions: new ones are reset at once, open ones dropped. The cut is
//!   symmetric by nature (a link is down), so it holds when either side
//!   names the other.
//!
//! A cut changes nothing inside the cluster: its pods, Services, probes and
//! clocks keep running, and traffic between its own pods is untouched — it
//! is a network fault, not a crash. Clearing it restores everything.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::OnceLock;
use tokio::sync::watch;

/// Which member clusters a cluster is cut off from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Peers {
    /// Named clusters of the same sim.
    Some(Vec<String>),
    /// Every other cluster of the sim (`"all"`).
    #[default]
    None,
    All,
}

impl Peers {
    pub fn names(&self, name: &str) -> bool {
        match self {
            Peers::All => true,
            Peers::None => false,
            Peers::Some(v) => v.iter().any(|n| n == name),
        }
    }
}

impl Serialize for Peers {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Peers::All => s.serialize_str("all"),
            Peers::None => Vec::<String>::new().serialize(s),
            Peers::Some(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Peers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Word(String),
            List(Vec<String>),
        }
        match Repr::deserialize(d).map_err(|_| {
            serde::de::Error::custom("members: expected \"all\" or a list of cluster names")
        })? {
            Repr::Word(w) if w == "all" => Ok(Peers::All),
            Repr::Word(w) => Err(serde::de::Error::custom(format!(
                "members: expected \"all\" or a list of cluster names, got {w:?}"
            ))),
            Repr::List(v) if v.is_empty() => Ok(Peers::None),
            Repr::List(v) => Ok(Peers::Some(v)),
        }
    }
}

/// One cluster's network fault (`PUT /clusters/{name}/network`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkFault {
    /// The manager cannot reach this cluster's API server.
    pub manager: bool,
    /// Member clusters whose pods and this cluster's pods cannot reach
    /// each other's exposed endpoints.
    pub members: Peers,
}

impl NetworkFault {
    /// Whether anything is cut.
    pub fn is_cut(&self) -> bool {
        self.manager || self.members != Peers::None
    }

    /// The problems with this fault for cluster `me` of a sim with
    /// `clusters`, each naming its field (empty: fine).
    pub fn problems(&self, me: &str, clusters: &[&str]) -> Vec<String> {
        let Peers::Some(names) = &self.members else {
            return vec![];
        };
        names
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                if n == me {
                    Some(format!(
                        "members[{i}]: {n:?} is this cluster (cut it from the manager with \"manager\": true)"
                    ))
                } else if !clusters.contains(&n.as_str()) {
                    Some(format!(
                        "members[{i}]: {n:?} is not a cluster of this sim (clusters: {})",
                        clusters.join(", ")
                    ))
                } else {
                    None
                }
            })
            .collect()
    }
}

/// Whether traffic between pods of clusters `a` and `b` (faults `fa`, `fb`)
/// is cut: a link is down when either side names the other. Pods of one
/// cluster always reach each other.
pub fn members_cut(a: &str, fa: &NetworkFault, b: &str, fb: &NetworkFault) -> bool {
    a != b && (fa.members.names(b) || fb.members.names(a))
}

/// Bumped whenever a network fault of any cluster of this process changes,
/// so open cross-cluster connections check whether they are now cut.
fn changes() -> &'static watch::Sender<u64> {
    static GEN: OnceLock<watch::Sender<u64>> = OnceLock::new();
    GEN.get_or_init(|| watch::channel(0).0)
}

pub fn subscribe() -> watch::Receiver<u64> {
    changes().subscribe()
}

pub(crate) fn changed() {
    changes().send_modify(|g| *g = g.wrapping_add(1));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<NetworkFault, serde_json::Error> {
        serde_json::from_str(s)
    }

    #[test]
    fn members_are_a_list_or_all() {
        let f = parse(r#"{"manager": true, "members": ["b"]}"#).unwrap();
        assert!(f.manager && f.members == Peers::Some(vec!["b".into()]));
        assert_eq!(parse(r#"{"members": "all"}"#).unwrap().members, Peers::All);
        assert_eq!(parse(r#"{"members": []}"#).unwrap().members, Peers::None);
        assert!(!parse("{}").unwrap().is_cut());
        let e = parse(r#"{"members": "some"}"#).unwrap_err().to_string();
        assert!(e.contains("members"), "{e}");
        let e = parse(r#"{"manger": true}"#).unwrap_err().to_string();
        assert!(e.contains("manger"), "{e}");
        let back = serde_json::to_value(parse(r#"{"members": "all"}"#).unwrap()).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"manager": false, "members": "all"})
        );
    }

    #[test]
    fn unknown_or_own_names_are_problems_naming_the_field() {
        let f = parse(r#"{"members": ["b", "a", "zz"]}"#).unwrap();
        let p = f.problems("a", &["a", "b"]);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].starts_with("members[1]") && p[1].starts_with("members[2]"));
    }

    #[test]
    fn a_cut_holds_when_either_side_names_the_other_and_never_inside_a_cluster() {
        let none = NetworkFault::default();
        let a_cuts_b = parse(r#"{"members": ["b"]}"#).unwrap();
        let all = parse(r#"{"members": "all"}"#).unwrap();
        assert!(members_cut("a", &a_cuts_b, "b", &none));
        assert!(members_cut("b", &none, "a", &a_cuts_b));
        assert!(!members_cut("a", &a_cuts_b, "c", &none));
        assert!(members_cut("c", &none, "a", &all));
        assert!(!members_cut("a", &all, "a", &all));
        // Manager only: members still reach each other.
        let mgr = parse(r#"{"manager": true}"#).unwrap();
        assert!(!members_cut("a", &mgr, "b", &none));
    }
}
