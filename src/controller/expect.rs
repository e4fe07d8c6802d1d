//! Expectations, as kube-controller-manager's ReplicaSet controller keeps
//! them: instances this manager just created or removed are taken as done
//! until the watch caches catch up, so a reconcile that runs on a cache
//! older than our own last writes neither creates nor removes twice.

use super::plan::{Observed, PodInfo};
use crate::crd::Role;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an unobserved expectation is trusted before the cache wins.
const TTL: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Entry {
    /// instance → what it was created with, when
    created: HashMap<String, (Created, Instant)>,
    removed: HashMap<String, Instant>,
    /// instance → (template hash of the Pod we deleted to restart it, when)
    restarted: HashMap<String, (Option<String>, Instant)>,
}

/// What an instance Pod we created carries, so that until the cache shows
/// it the observation holds it as it is: a new Pod on the current template,
/// not yet ready. Without its template hash the placeholder read as an
/// outdated replica that is down — which a rolling update restarts first —
/// and a round that ran before the Pod watch had shown the Pod deleted it
/// again (found in CI: a new cluster restarted one replica 32 times).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Created {
    pub role: Role,
    /// The Pod's template hash (`pgfleet.io/hash`).
    pub hash: Option<String>,
    /// The version it runs (`pgfleet.io/version`).
    pub version: Option<String>,
}

impl Created {
    /// What `pod`, created with `role`, carries.
    pub fn of(role: Role, pod: &k8s_openapi::api::core::v1::Pod) -> Created {
        let annotation = |k: &str| {
            let a = pod.metadata.annotations.as_ref();
            a.and_then(|a| a.get(k)).cloned()
        };
        Created {
            role,
            hash: annotation(super::build::ANN_HASH),
            version: annotation(super::build::ANN_VERSION),
        }
    }
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.created.is_empty() && self.removed.is_empty() && self.restarted.is_empty()
    }
}

/// Only clusters with a pending expectation have an entry: one that is
/// fulfilled or expired is dropped with its maps (kept, they were half a
/// KiB per managed PostgresCluster; heaptrack, issue 16).
#[derive(Default)]
pub struct Expectations {
    inner: Mutex<HashMap<(String, String), Entry>>,
}

impl Expectations {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Entry>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the cluster's entry — made first when `make`, else only
    /// if there is one — and drops the entry once it is empty.
    fn with(&self, ns: &str, cluster: &str, make: bool, f: impl FnOnce(&mut Entry)) {
        let mut m = self.lock();
        let key = (ns.to_string(), cluster.to_string());
        if !make && !m.contains_key(&key) {
            return;
        }
        let e = m.entry(key.clone()).or_default();
        f(e);
        if e.is_empty() {
            m.remove(&key);
        }
    }

    pub fn created(&self, ns: &str, cluster: &str, instance: &str, what: Created) {
        self.with(ns, cluster, true, |e| {
            e.removed.remove(instance);
            e.created
                .insert(instance.to_string(), (what, Instant::now()));
        });
    }

    pub fn removed(&self, ns: &str, cluster: &str, instance: &str) {
        self.with(ns, cluster, true, |e| {
            e.created.remove(instance);
            e.removed.insert(instance.to_string(), Instant::now());
        });
    }

    /// A Pod deleted to be restarted on a new template (rolling update):
    /// until the cache shows it terminating or replaced, the old Pod must
    /// not be taken as still running and restarted again.
    pub fn restarted(&self, ns: &str, cluster: &str, instance: &str, old_hash: Option<&str>) {
        self.with(ns, cluster, true, |e| {
            e.restarted.insert(
                instance.to_string(),
                (old_hash.map(String::from), Instant::now()),
            );
        });
    }

    /// The observation with pending expectations applied; fulfilled or
    /// expired ones are dropped.
    pub fn adjust(&self, ns: &str, cluster: &str, mut obs: Observed) -> Observed {
        self.with(ns, cluster, false, |e| {
            e.created
                .retain(|name, (_, at)| at.elapsed() < TTL && !obs.pods.contains_key(name));
            e.removed.retain(|name, at| {
                at.elapsed() < TTL
                    && (obs.pods.get(name).is_some_and(|p| !p.deleting) || obs.pvcs.contains(name))
            });
            e.restarted.retain(|name, (hash, at)| {
                at.elapsed() < TTL
                    && obs
                        .pods
                        .get(name)
                        .is_some_and(|p| !p.deleting && p.hash == *hash)
            });
            for name in e.restarted.keys() {
                if let Some(p) = obs.pods.get_mut(name) {
                    p.deleting = true;
                }
            }
            for (name, (what, _)) in &e.created {
                obs.pvcs.insert(name.clone());
                obs.pods.insert(
                    name.clone(),
                    PodInfo {
                        name: name.clone(),
                        role: Some(what.role),
                        hash: what.hash.clone(),
                        version: what.version.clone(),
                        ..Default::default()
                    },
                );
            }
            for name in e.removed.keys() {
                obs.pods.remove(name);
                obs.pvcs.remove(name);
            }
        });
        obs
    }

    /// Forgets a deleted PostgresCluster.
    pub fn forget(&self, ns: &str, cluster: &str) {
        self.lock().remove(&(ns.to_string(), cluster.to_string()));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn pending_writes_shape_the_observation_until_seen() {
        let x = Expectations::default();
        let mut obs = Observed::default();
        obs.pods.insert(
            "pg-3".into(),
            PodInfo {
                name: "pg-3".into(),
                ..Default::default()
            },
        );
        obs.pvcs.insert("pg-3".into());
        let what = Created {
            role: Role::Replica,
            hash: Some("h1".into()),
            version: Some("15.18".into()),
        };
        x.created("ns", "pg", "pg-2", what);
        x.removed("ns", "pg", "pg-3");
        let seen = x.adjust("ns", "pg", obs.clone());
        assert!(seen.pods.contains_key("pg-2") && seen.pvcs.contains("pg-2"));
        // Held as created: on its template, not ready yet.
        let p = &seen.pods["pg-2"];
        assert_eq!(
            (p.role, p.hash.as_deref(), p.version.as_deref(), p.ready),
            (Some(Role::Replica), Some("h1"), Some("15.18"), false)
        );
        assert!(!seen.pods.contains_key("pg-3") && !seen.pvcs.contains("pg-3"));
        // Once the cache shows both, the expectations are gone.
        let mut caught_up = Observed::default();
        caught_up.pods.insert(
            "pg-2".into(),
            PodInfo {
                name: "pg-2".into(),
                ..Default::default()
            },
        );
        let seen = x.adjust("ns", "pg", caught_up);
        assert!(seen.pods.contains_key("pg-2") && !seen.pvcs.contains("pg-2"));
        // Nothing is kept for a cluster with nothing pending.
        assert!(x.lock().is_empty());
        x.adjust("ns", "other", Observed::default());
        assert!(x.lock().is_empty());
    }

    #[test]
    fn a_created_pod_is_held_with_what_it_carries() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pg-2", "annotations": {
                "pgfleet.io/hash": "h2", "pgfleet.io/version": "16.4", "other": "x"}}
        }))
        .unwrap();
        let what = Created::of(Role::Replica, &pod);
        assert_eq!(what.hash.as_deref(), Some("h2"));
        assert_eq!(what.version.as_deref(), Some("16.4"));
        assert_eq!(what.role, Role::Replica);
    }

    #[test]
    fn a_restarted_pod_reads_as_terminating_until_the_cache_moves_on() {
        let x = Expectations::default();
        let pod = |hash: &str, deleting: bool| {
            let mut obs = Observed::default();
            obs.pods.insert(
                "pg-1".into(),
                PodInfo {
                    name: "pg-1".into(),
                    hash: Some(hash.into()),
                    deleting,
                    ..Default::default()
                },
            );
            obs
        };
        x.restarted("ns", "pg", "pg-1", Some("old"));
        // A stale cache still shows the old Pod running.
        assert!(x.adjust("ns", "pg", pod("old", false)).pods["pg-1"].deleting);
        // The replacement on the new template is what it is.
        assert!(!x.adjust("ns", "pg", pod("new", false)).pods["pg-1"].deleting);
        // And the expectation is gone: an old-template Pod counts again.
        assert!(!x.adjust("ns", "pg", pod("old", false)).pods["pg-1"].deleting);
    }
}
