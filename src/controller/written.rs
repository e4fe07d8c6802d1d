//! The resourceVersion of the controller's own last write to each
//! PostgresCluster, so a reconcile reads the object fresh only when its
//! cached copy may lag behind that write.
//!
//! Why it matters: the status step applies what it computed from the
//! cached status; from a copy older than our own last write (a failover's
//! intent record, a consumed switchover request) it would undo that
//! write. Reading fresh on every reconcile guaranteed it for one GET per
//! reconcile, the largest share of the manager's requests after the
//! children themselves (issue 16). Now the GET is made only when the cache
//! is behind: resourceVersions of one object are etcd revisions, which
//! only grow, so a cached copy whose version is at least the one our write
//! returned has that write in it. A version that is not a number (an API
//! server that is not etcd-backed) is never trusted: the GET then stays.

use crate::crd::PostgresCluster;
use kube::ResourceExt;
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Default)]
pub struct Written {
    /// `namespace/name` → the resourceVersion our last write returned.
    last: Mutex<HashMap<String, String>>,
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

impl Written {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records what a write returned.
    pub fn saw(&self, obj: &PostgresCluster) {
        let (Some(ns), Some(rv)) = (obj.namespace(), obj.resource_version()) else {
            return;
        };
        self.lock().insert(key(&ns, &obj.name_any()), rv);
    }

    /// Records a write whose result is not at hand: the next reconcile
    /// reads fresh.
    pub fn unknown(&self, ns: &str, name: &str) {
        self.lock().insert(key(ns, name), String::new());
    }

    /// Whether `cached` holds our last write to it (nothing written since
    /// this process started counts as holding it: the caches were listed
    /// after any earlier process's writes).
    pub fn holds_ours(&self, cached: &PostgresCluster) -> bool {
        let ns = cached.namespace().unwrap_or_default();
        let last = self.lock();
        let Some(written) = last.get(&key(&ns, &cached.name_any())) else {
            return true;
        };
        let parse = |s: &str| s.parse::<u64>().ok();
        match (
            cached.resource_version().as_deref().and_then(parse),
            parse(written),
        ) {
            (Some(c), Some(w)) => c >= w,
            _ => false,
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

    fn pgc(rv: &str) -> PostgresCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
            "metadata": {"name": "db", "namespace": "ns", "resourceVersion": rv},
            "spec": {}
        }))
        .unwrap()
    }

    #[test]
    fn a_cache_older_than_our_write_is_read_fresh() {
        let w = Written::default();
        assert!(w.holds_ours(&pgc("5")), "nothing written yet");
        w.saw(&pgc("12"));
        assert!(!w.holds_ours(&pgc("11")));
        assert!(w.holds_ours(&pgc("12")));
        // Numeric, not lexical: "100" is newer than "12".
        assert!(w.holds_ours(&pgc("100")));
        // A version that is no number is never trusted.
        assert!(!w.holds_ours(&pgc("abc")));
        w.unknown("ns", "db");
        assert!(!w.holds_ours(&pgc("100")));
        w.forget("ns", "db");
        assert!(w.holds_ours(&pgc("1")));
    }
}
