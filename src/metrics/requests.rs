//! `pgfleet_api_requests_total{cluster,verb,resource}`: every request the
//! manager sends to a member's API server, counted where the member's
//! client sends it (`fleet::ratelimit`). What it is for: the request cost
//! of managing a PostgresCluster is the figure a fleet manager scales by
//! (DESIGN §8; `pgfleet bench fleet` prints it per PostgresCluster next to
//! the floor's), and a platform team sees here which resource a member's
//! API server is asked about most. One counter per (cluster, verb,
//! resource): a few dozen per member.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder};
use prometheus_client::metrics::MetricType;
use std::collections::BTreeMap;
use std::sync::Mutex;

pub const NAME: &str = "pgfleet_api_requests";

/// Member cluster, verb, resource.
type Key = (String, &'static str, String);

#[derive(Debug, Default)]
pub struct Store {
    counts: Mutex<BTreeMap<Key, u64>>,
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, u64>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn count(&self, cluster: &str, verb: &'static str, resource: &str) {
        let mut c = self.lock();
        let key = (cluster.to_string(), verb, resource.to_string());
        *c.entry(key).or_insert(0) += 1;
    }

    /// How many requests of `verb` on `resource` went to member `cluster`.
    pub fn of(&self, cluster: &str, verb: &str, resource: &str) -> u64 {
        self.lock()
            .iter()
            .filter(|((c, v, r), _)| c == cluster && *v == verb && r == resource)
            .map(|(_, n)| n)
            .sum()
    }

    /// Every (verb, resource) summed over the member clusters.
    pub fn totals(&self) -> BTreeMap<(&'static str, String), u64> {
        let mut out = BTreeMap::new();
        for ((_, verb, resource), n) in self.lock().iter() {
            *out.entry((*verb, resource.clone())).or_insert(0) += n;
        }
        out
    }
}

impl Collector for Store {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts = self.lock();
        let mut family: MetricEncoder = encoder.encode_descriptor(
            NAME,
            "Requests the manager sent to a member cluster's API server, by verb and resource",
            None,
            MetricType::Counter,
        )?;
        for ((cluster, verb, resource), n) in counts.iter() {
            let labels = [
                ("cluster", cluster.as_str()),
                ("verb", *verb),
                ("resource", resource.as_str()),
            ];
            family
                .encode_family(&labels)?
                .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(n, None)?;
        }
        Ok(())
    }
}

/// The Kubernetes verb and resource of a request, as the API server's
/// audit log names them: `get`/`list`/`watch`/`create`/`update`/`patch`/
/// `delete`/`deletecollection`, and the plural resource with its
/// subresource (`postgresclusters/status`, `pods/exec`). Paths that are no
/// resource (`/version`, discovery) are `get` of `discovery`.
pub fn classify(method: &str, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // After /api/v1 or /apis/<group>/<version>: [namespaces, ns,] resource[, name[, sub]].
    let rest = match segs.as_slice() {
        ["api", _, rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        _ => &[][..],
    };
    let rest = match rest {
        ["namespaces", _, more @ ..] if !more.is_empty() => more,
        other => other,
    };
    let (resource, named) = match rest {
        [] => return ("get", "discovery".to_string()),
        [r] => (r.to_string(), false),
        [r, _] => (r.to_string(), true),
        [r, _, sub, ..] => (format!("{r}/{sub}"), true),
    };
    let watching =
        query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match (method, named) {
        ("GET", _) if watching => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

/// Counts one request to member `cluster`.
pub fn count(cluster: &str, method: &str, path: &str, query: Option<&str>) {
    let (verb, resource) = classify(method, path, query);
    super::get().requests.count(cluster, verb, &resource);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_named_as_the_audit_log_names_them() {
        fn c(m: &str, p: &str, q: Option<&str>) -> String {
            let (v, r) = classify(m, p, q);
            format!("{v} {r}")
        }
        let pgc = "/apis/pgfleet.io/v1/namespaces/shop/postgresclusters";
        assert_eq!(c("GET", pgc, None), "list postgresclusters");
        assert_eq!(
            c("GET", pgc, Some("watch=true&resourceVersion=5")),
            "watch postgresclusters"
        );
        assert_eq!(
            c("GET", &format!("{pgc}/orders"), None),
            "get postgresclusters"
        );
        assert_eq!(
            c("PATCH", &format!("{pgc}/orders/status"), None),
            "patch postgresclusters/status"
        );
        assert_eq!(
            c("POST", "/api/v1/namespaces/shop/pods/orders-1/exec", None),
            "create pods/exec"
        );
        assert_eq!(
            c(
                "POST",
                "/apis/events.k8s.io/v1/namespaces/shop/events",
                None
            ),
            "create events"
        );
        assert_eq!(c("GET", "/api/v1/namespaces", None), "list namespaces");
        assert_eq!(c("GET", "/api/v1/namespaces/shop", None), "get namespaces");
        assert_eq!(c("GET", "/version", None), "get discovery");
        assert_eq!(c("GET", "/apis", None), "get discovery");
        assert_eq!(
            c(
                "DELETE",
                "/api/v1/namespaces/shop/persistentvolumeclaims",
                None
            ),
            "deletecollection persistentvolumeclaims"
        );
    }

    #[test]
    fn totals_sum_over_the_members() {
        let s = Store::default();
        s.count("a", "get", "pods");
        s.count("b", "get", "pods");
        s.count("a", "patch", "pods");
        let t = s.totals();
        assert_eq!(s.of("a", "get", "pods"), 1);
        assert_eq!(s.of("c", "get", "pods"), 0);
        assert_eq!(t[&("get", "pods".to_string())], 2);
        assert_eq!(t[&("patch", "pods".to_string())], 1);
    }
}
