//! One PostgresCluster watch per member cluster, its objects handed to the
//! shard controllers by hash on this side.
//!
//! The shards were one watch each, selected by a `pgfleet.io/shard` label a
//! labeller task stamped on every new PostgresCluster. At the fleet's
//! shapes that cost more than it split: per member four watch streams (each
//! with kube's 8 KiB line buffer and its own watch state) plus the
//! labeller's metadata watch, and one PATCH of every new PostgresCluster
//! before any shard could see it (a request and a round of latency per new
//! cluster; a tenant's object is changed for the manager's bookkeeping).
//! A shard is a function of `namespace/name`, so the manager can compute it
//! from the object it already has: one watch, one cache, S controllers fed
//! from it (client-side filtering, as the fleet-scale issue proposed).
//!
//! What the shards still give: each has its own kube-runtime Controller
//! (queue, scheduler, `workers_per_cluster` concurrency bound), and every
//! object always goes to the same one, so one object is never reconciled
//! twice at the same time. The shard number is still written into the
//! children's labels (`pgfleet.io/shard`, the anti-affinity terms), with
//! the same hash, so no running Pod changes.

use super::cached::CachedCluster;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use futures::{Stream, StreamExt};
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

/// The stable shard of a PostgresCluster (FNV-1a of `namespace/name`).
pub fn shard_of(ns: &str, name: &str, shards: u32) -> u32 {
    let key = ns.bytes().chain(std::iter::once(b'/')).chain(name.bytes());
    crate::platform::hash::fnv1a32(key) % shards.max(1)
}

/// The shard of a reference (a cluster-scoped reference has no namespace;
/// PostgresClusters always have one).
pub fn shard_of_ref(r: &ObjectRef<CachedCluster>, shards: u32) -> usize {
    shard_of(r.namespace.as_deref().unwrap_or_default(), &r.name, shards) as usize
}

/// A member's shard channels: a reference sent here reaches the
/// controller of its shard (the watch's objects, child changes).
pub struct Router(Vec<UnboundedSender<ObjectRef<CachedCluster>>>);

/// What a shard controller reconciles: the references routed to it.
pub type Triggers = UnboundedReceiver<ObjectRef<CachedCluster>>;

impl Router {
    /// A router over `shards` (at least one) channels, and their receiving
    /// ends in shard order, one for each shard's controller.
    pub fn new(shards: u32) -> (Router, Vec<Triggers>) {
        let (senders, receivers) = (0..shards.max(1)).map(|_| unbounded()).unzip();
        (Router(senders), receivers)
    }

    /// Hands `r` to its shard. A shard whose controller has stopped (the
    /// member's controllers are being dropped) has nothing to do with it.
    pub fn send(&self, r: ObjectRef<CachedCluster>) {
        let _ = self.0[shard_of_ref(&r, self.0.len() as u32)].unbounded_send(r);
    }
}

/// Sends every object the member's watch reports to its shard's controller
/// (`trigger` routes a reference to its shard); runs as long as the watch.
/// Watch failures are retried by the watcher's backoff; they are logged
/// here because nothing else sees them.
pub async fn route<S>(stream: S, trigger: impl Fn(ObjectRef<CachedCluster>) + Send, member: String)
where
    S: Stream<Item = Result<CachedCluster, watcher::Error>> + Send,
{
    futures::pin_mut!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(pg) => trigger(ObjectRef::from_obj(&pg)),
            Err(e) => {
                tracing::debug!(cluster = %member, error = %e, "PostgresCluster watch");
            }
        }
    }
}

/// One shard's Controller over the member's shared cache: it reconciles
/// what `triggers` names (its objects from the watch, child changes from
/// the index) with at most `workers` at once. Its own object stream never
/// yields: the watch is read once, by [`route`].
pub fn controller(
    cache: Store<CachedCluster>,
    triggers: Triggers,
    workers: u32,
) -> Controller<CachedCluster> {
    let none = futures::stream::pending::<Result<CachedCluster, watcher::Error>>();
    Controller::for_stream(none, cache)
        .with_config(ControllerConfig::default().concurrency(workers.max(1) as u16))
        .reconcile_on(triggers)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn pgc(ns: &str, name: &str) -> CachedCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
            "metadata": {"name": name, "namespace": ns},
            "spec": {}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn every_object_goes_to_its_own_shard_and_a_failure_stops_nothing() {
        let seen = Arc::new(Mutex::new(vec![]));
        let items = vec![
            Ok(pgc("shop", "orders")),
            Err(watcher::Error::NoResourceVersion),
            Ok(pgc("ns", "pg-1")),
            Ok(pgc("shop", "orders")),
        ];
        let sink = seen.clone();
        let trigger = move |r: ObjectRef<CachedCluster>| {
            sink.lock().unwrap().push((shard_of_ref(&r, 4), r.name));
        };
        route(futures::stream::iter(items), trigger, "east".into()).await;
        let want = vec![
            (3, "orders".to_string()),
            (shard_of("ns", "pg-1", 4) as usize, "pg-1".to_string()),
            (3, "orders".to_string()),
        ];
        assert_eq!(*seen.lock().unwrap(), want);
    }

    #[test]
    fn shards_are_stable_and_spread() {
        assert_eq!(shard_of("shop", "orders", 4), shard_of("shop", "orders", 4));
        // Pinned: shards are in the labels of running Pods (FNV-1a 32 of
        // `shop/orders` is 0x6fa9003b); a change would roll every cluster.
        assert_eq!(shard_of("shop", "orders", 4), 3);
        assert_eq!(shard_of("shop", "orders", 7), 4);
        let mut counts = [0; 4];
        for i in 0..400 {
            counts[shard_of("ns", &format!("pg-{i}"), 4) as usize] += 1;
        }
        assert!(counts.iter().all(|c| *c > 60), "{counts:?}");
        let r = ObjectRef::<CachedCluster>::new("orders").within("shop");
        assert_eq!(shard_of_ref(&r, 4), 3);
    }

    #[test]
    fn the_router_hands_a_reference_to_its_shard_s_channel() {
        let (router, mut shards) = Router::new(4);
        assert_eq!(shards.len(), 4);
        router.send(ObjectRef::new("orders").within("shop"));
        let got: Vec<usize> = shards
            .iter_mut()
            .enumerate()
            .filter_map(|(i, rx)| rx.try_recv().ok().map(|_| i))
            .collect();
        assert_eq!(got, vec![3]);
        assert_eq!(Router::new(0).1.len(), 1, "at least one shard");
    }
}
