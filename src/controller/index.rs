//! A compact cache of the children of every PostgresCluster in one member
//! cluster, fed by kube-runtime watchers (metadata-only where metadata is
//! enough). Reconcile reads its observation from here instead of listing, and
//! every child change triggers a reconcile of its owner on the right shard.
//! Only what reconcile reads is kept (a few strings per child), which is what
//! keeps the manager small per managed PostgresCluster.

use super::build::{
    ANN_CONFIG, ANN_HASH, ANN_VERSION, LABEL_CLUSTER, LABEL_KIND, LABEL_MANAGED_BY, LABEL_ROLE,
};
use super::index_wire::{SlimClaim, SlimMeta, SlimPod};
use super::plan::{ClaimInfo, Observed, PodInfo};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

type Key = (String, String);

#[derive(Default)]
pub struct ChildIndex {
    /// Boxed: the table keeps room for up to twice its entries, and an
    /// observation is ~300 bytes inline; a box is 8.
    map: RwLock<HashMap<Key, Box<Observed>>>,
    /// One bit per child kind whose first full list has arrived. Until all
    /// are in, an empty observation means "not known yet", not "missing":
    /// reconcile waits rather than create children that already exist.
    synced: std::sync::atomic::AtomicU8,
}

/// Every kind's bit in `synced`.
const ALL_KINDS: u8 = 0b11_1111;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Pod,
    Pvc,
    Service,
    Secret,
    ConfigMap,
    Pdb,
}

impl ChildIndex {
    /// Whether every child watch has delivered its first full list.
    pub fn synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::Acquire) == ALL_KINDS
    }

    fn mark_synced(&self, kind: Kind) {
        self.synced
            .fetch_or(1 << kind as u8, std::sync::atomic::Ordering::AcqRel);
    }

    pub fn get(&self, ns: &str, cluster: &str) -> Observed {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(ns.to_string(), cluster.to_string()))
            .map(|o| Observed::clone(o))
            .unwrap_or_default()
    }

    fn edit(&self, key: Key, f: impl FnOnce(&mut Observed)) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let o = map.entry(key.clone()).or_default();
        f(o);
        // Nothing left (the children of a deleted cluster are gone, or a
        // late event named an owner already dropped): keep no entry, so
        // deleted clusters cost no memory.
        if **o == Observed::default() {
            map.remove(&key);
        }
    }

    /// Records a child from its metadata (and, for pods, readiness). An
    /// object without a name or namespace (never one the API server sends)
    /// is not recorded under "": it is nobody's child.
    fn record(&self, kind: Kind, meta: &ObjectMeta, pod: Option<Live>) -> Option<Key> {
        let key = owner_key(meta)?;
        let name = meta.name.clone()?;
        let ann = |k: &str| meta.annotations.as_ref().and_then(|a| a.get(k)).cloned();
        self.edit(key.clone(), |o| match kind {
            Kind::Pod
                if meta
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_KIND))
                    .map(String::as_str)
                    == Some("pooler") =>
            {
                o.pooler_pods.insert(
                    name.clone(),
                    PodInfo {
                        name,
                        ready: pod.as_ref().is_some_and(|p| p.ready),
                        deleting: meta.deletion_timestamp.is_some(),
                        hash: ann(ANN_HASH),
                        ..Default::default()
                    },
                );
            }
            Kind::ConfigMap if name.ends_with("-pooler") => o.pooler_config_hash = ann(ANN_HASH),
            Kind::Pod => {
                o.pods.insert(
                    name.clone(),
                    PodInfo {
                        name,
                        role: meta
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(LABEL_ROLE))
                            .map(|r| crate::crd::Role::from_label(r)),
                        ready: pod.as_ref().is_some_and(|p| p.ready),
                        ready_changed: pod.as_ref().and_then(|p| p.since.clone()),
                        node: pod.as_ref().and_then(|p| p.node.clone()),
                        waiting: pod.and_then(|p| p.waiting),
                        deleting: meta.deletion_timestamp.is_some(),
                        hash: ann(ANN_HASH),
                        version: ann(ANN_VERSION),
                        config: ann(ANN_CONFIG),
                    },
                );
            }
            // A terminating claim is as good as gone: its replica is rebuilt.
            Kind::Pvc if meta.deletion_timestamp.is_some() => {
                o.pvcs.remove(&name);
                o.claims.remove(&name);
            }
            Kind::Pvc => {
                if let Some(c) = pod.and_then(|p| p.claim) {
                    o.claims.insert(name.clone(), c);
                }
                o.pvcs.insert(name);
            }
            Kind::Service => {
                o.services.insert(name, ann(ANN_HASH).unwrap_or_default());
            }
            Kind::Secret => {
                if name == super::tls::server_secret(&key.1) {
                    o.server_tls = Some(super::tls::observed_meta(&ann));
                }
                if name == super::access::app_secret_name(&key.1) {
                    o.app_secret_rv = meta.resource_version.clone();
                }
                o.secrets.insert(name);
            }
            Kind::ConfigMap => {
                o.config_hash = ann(ANN_HASH);
            }
            Kind::Pdb => {
                o.pdbs.insert(name, ann(ANN_HASH).unwrap_or_default());
            }
        });
        Some(key)
    }

    fn forget(&self, kind: Kind, meta: &ObjectMeta) -> Option<Key> {
        let key = owner_key(meta)?;
        let name = meta.name.clone()?;
        self.edit(key.clone(), |o| match kind {
            Kind::Pod => {
                o.pods.remove(&name);
                o.pooler_pods.remove(&name);
            }
            Kind::ConfigMap if name.ends_with("-pooler") => o.pooler_config_hash = None,
            Kind::Pvc => {
                o.pvcs.remove(&name);
                o.claims.remove(&name);
            }
            Kind::Service => {
                o.services.remove(&name);
            }
            Kind::Secret => {
                if name == super::tls::server_secret(&key.1) {
                    o.server_tls = None;
                }
                if name == super::access::app_secret_name(&key.1) {
                    o.app_secret_rv = None;
                }
                o.secrets.remove(&name);
            }
            Kind::ConfigMap => {
                o.config_hash = None;
            }
            Kind::Pdb => {
                o.pdbs.remove(&name);
            }
        });
        Some(key)
    }

    /// The clusters with an instance on `node` (a cordon concerns them).
    pub fn owners_on_node(&self, node: &str) -> Vec<(String, String)> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, o)| o.pods.values().any(|p| p.node.as_deref() == Some(node)))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The children of `kind` the index holds that a re-list did not
    /// show (`seen`), by owner and name. ConfigMaps are held as hashes, one
    /// per role (`record`): an owner's configuration is gone when the
    /// re-list showed none in that role, and is named for `forget` by
    /// that role.
    fn gone(&self, kind: Kind, seen: &HashSet<(Key, String)>) -> Vec<(Key, String)> {
        let pooler = |name: &str| name.ends_with("-pooler");
        let roles: HashSet<(&Key, bool)> = match kind {
            Kind::ConfigMap => seen.iter().map(|(k, n)| (k, pooler(n))).collect(),
            _ => HashSet::new(),
        };
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let mut out = vec![];
        for (key, o) in map.iter() {
            let mut names: Vec<&String> = vec![];
            let mut synthesized = vec![];
            match kind {
                Kind::Pod => names.extend(o.pods.keys().chain(o.pooler_pods.keys())),
                Kind::Pvc => names.extend(o.pvcs.iter()),
                Kind::Service => names.extend(o.services.keys()),
                Kind::Secret => names.extend(o.secrets.iter()),
                Kind::Pdb => names.extend(o.pdbs.keys()),
                Kind::ConfigMap => {
                    if o.config_hash.is_some() && !roles.contains(&(key, false)) {
                        synthesized.push(format!("{}-config", key.1));
                    }
                    if o.pooler_config_hash.is_some() && !roles.contains(&(key, true)) {
                        synthesized.push(format!("{}-pooler", key.1));
                    }
                }
            }
            let unseen = names
                .into_iter()
                .filter(|n| !seen.contains(&(key.clone(), (*n).clone())))
                .cloned();
            out.extend(unseen.chain(synthesized).map(|n| (key.clone(), n)));
        }
        out
    }

    /// Drops an owner's entry (after its deletion).
    pub fn remove_owner(&self, ns: &str, cluster: &str) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(ns.to_string(), cluster.to_string()));
    }

    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The metadata `forget` reads, for a child known only by owner and name.
fn child_meta(key: &Key, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(key.0.clone()),
        labels: Some([(LABEL_CLUSTER.to_string(), key.1.clone())].into()),
        ..Default::default()
    }
}

fn owner_key(meta: &ObjectMeta) -> Option<Key> {
    let cluster = meta.labels.as_ref()?.get(LABEL_CLUSTER)?.clone();
    Some((meta.namespace.clone()?, cluster))
}

/// The few facts of a child's spec and status that reconcile reads (a
/// pod's readiness and node, a claim's size).
#[derive(Debug, Clone, Default)]
pub(super) struct Live {
    /// A claim's size and resize state (claims only).
    claim: Option<ClaimInfo>,
    ready: bool,
    /// Since when the Ready condition has that value.
    since: Option<String>,
    /// Why a container waits instead of running (image pull, crash loop).
    waiting: Option<String>,
    /// The node it was scheduled to.
    node: Option<String>,
}

fn pod_ready(p: &SlimPod) -> Live {
    let status = p.status.as_ref();
    let cond = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    let waiting = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
        .find(|w| {
            w.reason
                .as_deref()
                .is_some_and(|r| r != "ContainerCreating")
        })
        .map(|w| {
            format!(
                "{}: {}",
                w.reason.as_deref().unwrap_or_default(),
                w.message.as_deref().unwrap_or_default()
            )
        });
    Live {
        ready: cond.is_some_and(|c| c.status == "True"),
        since: cond
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0.to_string()),
        waiting,
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        claim: None,
    }
}

fn claim_info(c: &SlimClaim) -> ClaimInfo {
    let storage = |m: Option<&std::collections::BTreeMap<String, String>>| {
        m.and_then(|m| m.get("storage")).cloned()
    };
    let status = c.status.as_ref();
    ClaimInfo {
        request: storage(
            c.spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref()),
        ),
        capacity: storage(status.and_then(|s| s.capacity.as_ref())),
        resize_pending: status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "FileSystemResizePending")),
    }
}

/// Where child changes are sent: the owner's reference (the controller mod
/// routes it to the owner's shard).
pub type Trigger = std::sync::Arc<dyn Fn(ObjectRef<super::cached::CachedCluster>) + Send + Sync>;

fn selector() -> watcher::Config {
    watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}=pgfleet,{LABEL_CLUSTER}"))
}

/// Runs one watch per child kind until the client's cluster goes away.
pub async fn run(client: kube::Client, index: std::sync::Arc<ChildIndex>, trigger: Trigger) {
    let pods = {
        let (index, trigger) = (index.clone(), trigger.clone());
        let stream =
            watcher::watcher(Api::<SlimPod>::all(client.clone()), selector()).default_backoff();
        feed(stream, index, trigger, Kind::Pod, |p: &SlimPod| {
            (p.meta().clone(), Some(pod_ready(p)))
        })
    };
    // Claims with their size and resize state: expansion reads them.
    let claims = {
        let (index, trigger) = (index.clone(), trigger.clone());
        let api = Api::<SlimClaim>::all(client.clone());
        let stream = watcher::watcher(api, selector()).default_backoff();
        feed(stream, index, trigger, Kind::Pvc, |c: &SlimClaim| {
            let live = Live {
                claim: Some(claim_info(c)),
                ..Default::default()
            };
            (c.meta().clone(), Some(live))
        })
    };
    macro_rules! meta_feed {
        ($k:ty, $kind:expr) => {{
            let stream = watcher::watcher(Api::<SlimMeta<$k>>::all(client.clone()), selector())
                .default_backoff();
            feed(
                stream,
                index.clone(),
                trigger.clone(),
                $kind,
                |m: &SlimMeta<$k>| (m.metadata.clone(), None),
            )
        }};
    }
    tokio::join!(
        pods,
        claims,
        meta_feed!(Service, Kind::Service),
        meta_feed!(Secret, Kind::Secret),
        meta_feed!(ConfigMap, Kind::ConfigMap),
        meta_feed!(PodDisruptionBudget, Kind::Pdb),
    );
}

async fn feed<S, T>(
    stream: S,
    index: std::sync::Arc<ChildIndex>,
    trigger: Trigger,
    kind: Kind,
    meta_of: impl Fn(&T) -> (ObjectMeta, Option<Live>),
) where
    S: futures::Stream<Item = Result<Event<T>, watcher::Error>>,
{
    futures::pin_mut!(stream);
    // Children seen during a re-list; what the index holds and the re-list
    // did not show is gone. (A set of every child kept beside the index
    // for this was a sixth of the manager's memory per PostgresCluster.)
    let mut relist: Option<HashSet<(Key, String)>> = None;
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::debug!(error = %e, ?kind, "child watch error (retrying with backoff)");
                continue;
            }
        };
        let fire = |key: Option<Key>| {
            if let Some((ns, name)) = key {
                trigger(ObjectRef::new(&name).within(&ns));
            }
        };
        match ev {
            Event::Init => relist = Some(HashSet::new()),
            Event::InitApply(o) | Event::Apply(o) => {
                let (meta, ready) = meta_of(&o);
                let key = index.record(kind, &meta, ready);
                if let (Some(k), Some(name), Some(seen)) = (&key, &meta.name, relist.as_mut()) {
                    seen.insert((k.clone(), name.clone()));
                }
                fire(key);
            }
            Event::Delete(o) => {
                let (meta, _) = meta_of(&o);
                fire(index.forget(kind, &meta));
            }
            Event::InitDone => {
                index.mark_synced(kind);
                if let Some(seen) = relist.take() {
                    for (key, name) in index.gone(kind, &seen) {
                        fire(index.forget(kind, &child_meta(&key, name)));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::cached::CachedCluster;

    fn meta(name: &str, cluster: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            labels: Some([(LABEL_CLUSTER.to_string(), cluster.to_string())].into()),
            ..Default::default()
        }
    }

    #[test]
    fn owners_without_children_cost_no_entry() {
        let idx = ChildIndex::default();
        idx.record(
            Kind::Pod,
            &meta("pg-1", "pg"),
            Some(Live {
                ready: true,
                ..Default::default()
            }),
        );
        idx.record(Kind::Pvc, &meta("pg-1", "pg"), None);
        assert_eq!(idx.len(), 1);
        assert!(idx.get("shop", "pg").pods.contains_key("pg-1"));
        idx.remove_owner("shop", "pg");
        // Children deleted after their owner (garbage collection).
        idx.forget(Kind::Pod, &meta("pg-1", "pg"));
        idx.forget(Kind::Pvc, &meta("pg-1", "pg"));
        assert!(idx.is_empty());
        idx.record(Kind::Pvc, &meta("pg-1", "pg"), None);
        idx.forget(Kind::Pvc, &meta("pg-1", "pg"));
        assert!(idx.is_empty());
    }

    #[test]
    fn a_child_without_name_or_namespace_is_nobodys() {
        let idx = ChildIndex::default();
        let mut nameless = meta("pg-1", "pg");
        nameless.name = None;
        assert_eq!(idx.record(Kind::Pvc, &nameless, None), None);
        let mut homeless = meta("pg-1", "pg");
        homeless.namespace = None;
        assert_eq!(idx.record(Kind::Pvc, &homeless, None), None);
        // Not recorded as ("", "pg") or under the name "".
        assert!(idx.is_empty());
    }

    /// A re-list after a dropped watch: what the index held and the new
    /// list does not show is forgotten (and its owner told), ConfigMaps by
    /// their role; what it shows stays.
    #[tokio::test]
    async fn a_relist_forgets_exactly_what_it_no_longer_shows() {
        let idx = std::sync::Arc::new(ChildIndex::default());
        let fired = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
        let trigger: Trigger = {
            let fired = fired.clone();
            std::sync::Arc::new(move |r: ObjectRef<CachedCluster>| {
                fired.lock().unwrap_or_else(|e| e.into_inner()).push(r.name)
            })
        };
        let cm = |name: &str, cluster: &str| {
            let mut m = meta(name, cluster);
            m.annotations = Some([(ANN_HASH.to_string(), "h".to_string())].into());
            m
        };
        let run = |kind: Kind, events: Vec<Event<ObjectMeta>>| {
            let (idx, trigger) = (idx.clone(), trigger.clone());
            let stream = futures::stream::iter(events.into_iter().map(Ok::<_, watcher::Error>));
            feed(stream, idx, trigger, kind, |m: &ObjectMeta| {
                (m.clone(), None)
            })
        };
        let list = |objs: Vec<ObjectMeta>| {
            let mut ev = vec![Event::Init];
            ev.extend(objs.into_iter().map(Event::InitApply));
            ev.push(Event::InitDone);
            ev
        };
        run(
            Kind::Secret,
            list(vec![meta("a-app", "a"), meta("b-app", "b")]),
        )
        .await;
        run(
            Kind::ConfigMap,
            list(vec![
                cm("a-config", "a"),
                cm("a-pooler", "a"),
                cm("b-config", "b"),
            ]),
        )
        .await;
        assert!(idx.get("shop", "b").secrets.contains("b-app"));
        fired.lock().unwrap_or_else(|e| e.into_inner()).clear();
        // The watch dropped; meanwhile b's Secret and a's pooler went.
        run(Kind::Secret, list(vec![meta("a-app", "a")])).await;
        // Nothing of b was listed: only forgetting its Secret told it.
        let told = fired.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert!(told.contains(&"b".to_string()), "{told:?}");
        run(
            Kind::ConfigMap,
            list(vec![cm("a-config", "a"), cm("b-config", "b")]),
        )
        .await;
        let (a, b) = (idx.get("shop", "a"), idx.get("shop", "b"));
        assert!(a.secrets.contains("a-app") && a.config_hash.is_some());
        assert!(a.pooler_config_hash.is_none());
        assert!(b.secrets.is_empty() && b.config_hash.is_some());
        let fired = fired.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // Every applied object fires too; the two forgotten ones did.
        assert!(fired.contains(&"b".to_string()) && fired.contains(&"a".to_string()));
    }
}
