//! The controller's own last write to each PostgresCluster, so a reconcile
//! never works from a cached copy older than that write, and reads the
//! object from the API server only when it has nothing newer at hand.
//!
//! Why it matters: the status step applies what it computed from the
//! cached status; from a copy older than our own last write (a failover's
//! intent record, a consumed switchover request) it would undo that
//! write. Reading fresh on every reconcile guaranteed it for one GET per
//! reconcile, the largest share of the manager's requests after the
//! children themselves (issue 16). resourceVersions of one object are etcd
//! revisions, which only grow, so a cached copy whose version is at least
//! the one our write returned has that write in it. While the watch lags
//! behind (a cold start: half of all reconciles), the object our write
//! returned is the newest state we know — what a GET would have answered
//! unless someone wrote in between, and such a write reaches the watch and
//! starts another round like any other change — so the round works from
//! it, stripped like the watch's copies. It is kept only until the watch
//! shows that version ([`Written::caught_up`]); from then on a round works
//! from the cache's newest copy, never from the one it was queued with (a
//! round may wait for a worker for seconds: that copy may predate the
//! write). A version that is not a number (an API server that is not
//! etcd-backed) is never trusted: the GET then stays.

use crate::crd::PostgresCluster;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Our last write to one PostgresCluster.
struct Last {
    /// The resourceVersion it returned ("" when its result is not known).
    version: String,
    /// The object it returned, in the cache's form.
    object: Option<Arc<PostgresCluster>>,
}

pub struct Written {
    /// `namespace/name` → our last write the watch has not shown yet.
    last: Mutex<HashMap<String, Last>>,
    /// The member's PostgresCluster cache (what the watch has shown).
    cache: Store<PostgresCluster>,
}

/// What a round works from.
pub enum Latest {
    /// This copy: the cache's newest, holding our last write, or the
    /// object that write returned.
    Use(Arc<PostgresCluster>),
    /// Neither is known to be current: read the object fresh.
    Read,
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

fn number(version: Option<&str>) -> Option<u64> {
    version.and_then(|v| v.parse().ok())
}

impl Written {
    pub fn new(cache: Store<PostgresCluster>) -> Self {
        Written {
            last: Mutex::default(),
            cache,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Last>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records what a write returned.
    pub fn saw(&self, obj: &PostgresCluster) {
        let (Some(ns), Some(version)) = (obj.namespace(), obj.resource_version()) else {
            return;
        };
        let mut object = obj.clone();
        super::strip(&mut object);
        let last = Last {
            version,
            object: Some(Arc::new(object)),
        };
        self.lock().insert(key(&ns, &obj.name_any()), last);
    }

    /// Records a write whose result is not at hand: the next reconcile
    /// reads fresh.
    pub fn unknown(&self, ns: &str, name: &str) {
        let last = Last {
            version: String::new(),
            object: None,
        };
        self.lock().insert(key(ns, name), last);
    }

    /// What a round over `dispatched` (the cache's copy when the round was
    /// queued, possibly long before a worker took it) works from: the
    /// cache's newest copy if it holds our last write (nothing written
    /// since this process started counts as holding it: the caches were
    /// listed after any earlier process's writes), else the object that
    /// write returned.
    pub fn latest(&self, dispatched: Arc<PostgresCluster>) -> Latest {
        let k = key(
            &dispatched.namespace().unwrap_or_default(),
            &dispatched.name_any(),
        );
        // Under the lock: `caught_up` drops an entry only after the cache
        // shows its write, so a copy read here while the entry is gone
        // holds that write.
        let mut last = self.lock();
        let current = self
            .cache
            .get(&ObjectRef::from_obj(&*dispatched))
            .unwrap_or(dispatched);
        let Some(ours) = last.get(&k) else {
            return Latest::Use(current);
        };
        let seen = number(current.resource_version().as_deref());
        match (seen, number(Some(ours.version.as_str()))) {
            (Some(c), Some(w)) if c >= w => {
                last.remove(&k);
                Latest::Use(current)
            }
            (Some(_), Some(_)) => match &ours.object {
                Some(o) => Latest::Use(o.clone()),
                None => Latest::Read,
            },
            _ => Latest::Read,
        }
    }

    /// The watch shows `seen` (already in the cache): our last write kept
    /// for it is no longer needed once that copy holds it.
    pub fn caught_up(&self, seen: &PostgresCluster) {
        let k = key(&seen.namespace().unwrap_or_default(), &seen.name_any());
        let mut last = self.lock();
        let Some(ours) = last.get(&k) else {
            return;
        };
        let (c, w) = (
            number(seen.resource_version().as_deref()),
            number(Some(ours.version.as_str())),
        );
        if let (Some(c), Some(w)) = (c, w)
            && c >= w
        {
            last.remove(&k);
        }
    }

    pub fn forget(&self, ns: &str, name: &str) {
        self.lock().remove(&key(ns, name));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kube::runtime::{reflector, watcher};

    fn pgc(rv: &str) -> Arc<PostgresCluster> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
                "metadata": {"name": "db", "namespace": "ns", "resourceVersion": rv,
                    "managedFields": [{"manager": "pgfleet", "operation": "Apply"}],
                    "annotations": {"pgfleet.io/paused": "false", "tenant.example/x": "y"}},
                "spec": {}
            }))
            .unwrap(),
        )
    }

    fn version(l: Latest) -> Option<String> {
        match l {
            Latest::Use(o) => o.resource_version(),
            Latest::Read => None,
        }
    }

    /// A cache, the Written over it, and a way to show the watch's events.
    fn fixture() -> (Written, impl FnMut(&str)) {
        let (store, mut writer) = reflector::store();
        let w = Written::new(store);
        let show = move |rv: &str| {
            writer.apply_watcher_event(&watcher::Event::Apply((*pgc(rv)).clone()));
        };
        (w, show)
    }

    #[test]
    fn a_cache_older_than_our_write_gives_way_to_what_the_write_returned() {
        let (w, mut show) = fixture();
        assert_eq!(
            version(w.latest(pgc("5"))).as_deref(),
            Some("5"),
            "nothing written"
        );
        show("11");
        w.saw(&pgc("12"));
        let Latest::Use(o) = w.latest(pgc("11")) else {
            panic!("the cache lags our write")
        };
        assert_eq!(o.resource_version().as_deref(), Some("12"));
        // Kept in the cache's form.
        assert!(o.managed_fields().is_empty());
        assert_eq!(o.annotations().len(), 1, "only pgfleet's own annotations");
        // Numeric, not lexical: "100" is newer than "12".
        show("100");
        assert_eq!(version(w.latest(pgc("11"))).as_deref(), Some("100"));
        // A version that is no number is never trusted.
        show("abc");
        w.saw(&pgc("12"));
        assert!(matches!(w.latest(pgc("abc")), Latest::Read));
        // A write whose result is unknown: read fresh.
        show("100");
        w.unknown("ns", "db");
        assert!(matches!(w.latest(pgc("100")), Latest::Read));
        w.forget("ns", "db");
        assert_eq!(version(w.latest(pgc("1"))).as_deref(), Some("100"));
    }

    /// A round queued with an old copy, taken by a worker after the watch
    /// showed our write (and dropped what we kept), works from the cache's
    /// newest copy, never from the old one.
    #[test]
    fn a_round_queued_before_the_watch_caught_up_sees_the_newest_copy() {
        let (w, mut show) = fixture();
        show("10");
        let queued = w.cache.get(&ObjectRef::from_obj(&*pgc("10"))).unwrap();
        w.saw(&pgc("20"));
        show("19");
        w.caught_up(&pgc("19"));
        assert_eq!(version(w.latest(queued.clone())).as_deref(), Some("20"));
        show("20");
        w.caught_up(&pgc("20"));
        assert!(w.lock().is_empty());
        assert_eq!(version(w.latest(queued)).as_deref(), Some("20"));
    }
}
