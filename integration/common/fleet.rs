//! Shared helpers for the controller acceptance tests: a whole pgfleet
//! manager (`manager::start`) with its embedded member clusters in a fresh
//! state directory, kube clients built from the written kubeconfigs (the way
//! a user reaches the clusters), and polling helpers that fail with the last
//! observed state instead of asserting on how fast anything happened.
//!
//! The manager and its settings come from `pgfleet::testkit::fleet`, the
//! same environment `pgfleet bench rollout` measures.
#![allow(dead_code, clippy::unwrap_used)]

use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, Pod, Secret, Service,
};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use pgfleet::crd::PostgresCluster;
use pgfleet::manager::Manager;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::PathBuf;

/// The shared helpers, for tests that `use fleet::*`.
#[allow(unused_imports)]
pub use super::{
    PATIENCE, client_from, client_without_retries, eventually, eventually_within, init_tracing,
    temp_dir,
};
use pgfleet::testkit::fleet as kit;

/// Labels the controller puts on children.
pub const LABEL_CLUSTER: &str = "pgfleet.io/cluster";
pub const LABEL_ROLE: &str = "pgfleet.io/role";

/// The fleet config of a test: embedded (virtual) members with the given
/// names, labelled `env=test, wave=i`, fast probes (so Unreachable/Ready
/// transitions are quick), generous client QPS.
pub fn settings_toml(state_dir: &std::path::Path, members: &[&str]) -> String {
    kit::embedded_toml(state_dir, "virtual", members, kit::MANY_OBJECTS)
}

/// A running manager with its embedded member clusters.
pub struct TestFleet {
    pub mgr: Manager,
    pub dir: PathBuf,
    clients: BTreeMap<String, Client>,
}

impl TestFleet {
    /// Starts a manager over fresh embedded clusters named `members` and
    /// waits until every member serves the PostgresCluster kind.
    pub async fn start(tag: &str, members: &[&str]) -> TestFleet {
        Self::start_with(tag, members, "").await
    }

    /// Like [`TestFleet::start`], with `embedded_extra` added to
    /// `[manager.embedded]` (e.g. `nodes = 3`).
    pub async fn start_with(tag: &str, members: &[&str], embedded_extra: &str) -> TestFleet {
        init_tracing();
        let dir = temp_dir(tag);
        let toml = settings_toml(&dir, members).replacen(
            "[manager.embedded]\n",
            &format!("[manager.embedded]\n{embedded_extra}"),
            1,
        );
        let mgr = kit::start_manager(&toml, PATIENCE)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut clients = BTreeMap::new();
        for c in &mgr.sim.as_ref().expect("embedded clusters").clusters {
            clients.insert(c.name.clone(), client_from(&c.kubeconfig).await);
        }
        TestFleet { mgr, dir, clients }
    }

    /// A client of member `name`, built from its kubeconfig.
    pub fn client(&self, name: &str) -> Client {
        self.clients
            .get(name)
            .unwrap_or_else(|| panic!("no member cluster {name}"))
            .clone()
    }

    pub fn kubeconfig(&self, name: &str) -> PathBuf {
        self.sim_cluster(name).kubeconfig.clone()
    }

    pub fn sim_cluster(&self, name: &str) -> &pgfleet::sim::SimCluster {
        self.mgr
            .sim
            .as_ref()
            .and_then(|s| s.get(name))
            .unwrap_or_else(|| panic!("no embedded cluster {name}"))
    }

    pub fn pgc(&self, member: &str, ns: &str) -> Api<PostgresCluster> {
        Api::namespaced(self.client(member), ns)
    }

    /// PostgresClusters of every namespace of a member.
    pub fn pgc_all(&self, member: &str) -> Api<PostgresCluster> {
        Api::all(self.client(member))
    }

    /// The controller handle of a member (for its reconcile counters).
    pub fn handle(&self, member: &str) -> pgfleet::controller::Handle {
        self.mgr
            .controllers()
            .into_iter()
            .find(|h| h.member.name == member)
            .unwrap_or_else(|| panic!("no controller for {member}"))
    }

    /// Creates a namespace (idempotent).
    pub async fn namespace(&self, member: &str, ns: &str) {
        let api: Api<Namespace> = Api::all(self.client(member));
        let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("creating namespace {ns} in {member}: {e}"),
        }
    }

    /// Creates a PostgresCluster (and its namespace) from a spec.
    pub async fn create(&self, member: &str, ns: &str, name: &str, spec: Value) -> PostgresCluster {
        self.namespace(member, ns).await;
        let obj = pgc_object(name, spec);
        self.pgc(member, ns)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating PostgresCluster {ns}/{name} in {member}: {e}"))
    }

    /// Merge-patches a PostgresCluster.
    pub async fn patch(&self, member: &str, ns: &str, name: &str, patch: Value) -> PostgresCluster {
        self.pgc(member, ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("patching {ns}/{name} in {member} with {patch}: {e}"))
    }

    /// Waits until the PostgresCluster is Healthy with `size` ready
    /// instances, its status describes the latest generation, and exactly
    /// `size` instance pods exist; returns it.
    pub async fn wait_healthy(
        &self,
        member: &str,
        ns: &str,
        name: &str,
        size: usize,
    ) -> PostgresCluster {
        let api = self.pgc(member, ns);
        let pods: Api<Pod> = Api::namespaced(self.client(member), ns);
        eventually(
            &format!("{member} {ns}/{name} Healthy with {size} ready instances"),
            || {
                let (api, pods) = (api.clone(), pods.clone());
                async move {
                    let pg = api.get(name).await.map_err(|e| e.to_string())?;
                    let st = pg.status.clone().unwrap_or_default();
                    let ready = condition(&pg, "Ready").map(|c| c.status.clone());
                    let n = instance_pods(&pods, name).await.len();
                    let current = st.observed_generation == pg.metadata.generation;
                    if st.phase == Some(pgfleet::crd::Phase::Healthy)
                        && ready.as_deref() == Some("True")
                        && st.ready_instances as usize == size
                        && n == size
                        && current
                    {
                        Ok(pg)
                    } else {
                        Err(format!(
                            "generation {:?}, {n} pods, status {}",
                            pg.metadata.generation,
                            serde_json::to_string(&st).unwrap_or_default()
                        ))
                    }
                }
            },
        )
        .await
    }
}

impl Drop for TestFleet {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A PostgresCluster object from a spec given as JSON.
pub fn pgc_object(name: &str, spec: Value) -> PostgresCluster {
    serde_json::from_value(json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

/// A condition of a PostgresCluster by type.
pub fn condition<'a>(
    pg: &'a PostgresCluster,
    type_: &str,
) -> Option<&'a pgfleet::crd::cluster::Condition> {
    pg.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// Objects of a kind labelled `pgfleet.io/cluster=<cluster>`, by name.
pub async fn children<K>(api: &Api<K>, cluster: &str) -> BTreeMap<String, K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + Debug,
{
    api.list(&ListParams::default().labels(&format!("{LABEL_CLUSTER}={cluster}")))
        .await
        .map(|l| l.items.into_iter().map(|o| (o.name_any(), o)).collect())
        .unwrap_or_default()
}

/// The instance pods of a PostgresCluster (not being deleted), by name.
pub async fn instance_pods(api: &Api<Pod>, cluster: &str) -> BTreeMap<String, Pod> {
    children(api, cluster)
        .await
        .into_iter()
        .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// Names of a PostgresCluster's children of each kind, for messages and
/// comparisons.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChildNames {
    pub pods: Vec<String>,
    pub pvcs: Vec<String>,
    pub services: Vec<String>,
    pub config_maps: Vec<String>,
    pub secrets: Vec<String>,
}

pub async fn child_names(client: &Client, ns: &str, cluster: &str) -> ChildNames {
    async fn names<K>(client: &Client, ns: &str, cluster: &str) -> Vec<String>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + Debug,
    {
        children(&Api::<K>::namespaced(client.clone(), ns), cluster)
            .await
            .into_keys()
            .collect()
    }
    ChildNames {
        pods: names::<Pod>(client, ns, cluster).await,
        pvcs: names::<PersistentVolumeClaim>(client, ns, cluster).await,
        services: names::<Service>(client, ns, cluster).await,
        config_maps: names::<ConfigMap>(client, ns, cluster).await,
        secrets: names::<Secret>(client, ns, cluster).await,
    }
}

/// Whether an equality-based Service selector picks an object with `labels`
/// (every selector pair present; an empty selector picks nothing, as a
/// Service without selector has no endpoints).
pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Names of the pods a Service's selector picks.
pub fn selected(svc: &Service, pods: &BTreeMap<String, Pod>) -> Vec<String> {
    let sel = svc
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default();
    pods.iter()
        .filter(|(_, p)| selects(&sel, p.labels()))
        .map(|(n, _)| n.clone())
        .collect()
}

/// `<cluster>-<n>` for each ordinal.
pub fn instance_names(cluster: &str, ordinals: &[u32]) -> Vec<String> {
    let mut v: Vec<String> = ordinals.iter().map(|o| format!("{cluster}-{o}")).collect();
    v.sort();
    v
}

/// Uids of pods by name.
pub fn uids(pods: &BTreeMap<String, Pod>) -> BTreeMap<String, String> {
    pods.iter()
        .map(|(n, p)| (n.clone(), p.uid().unwrap_or_default()))
        .collect()
}

/// The pods labelled primary.
pub fn primaries(pods: &BTreeMap<String, Pod>) -> Vec<String> {
    pods.iter()
        .filter(|(_, p)| p.labels().get(LABEL_ROLE).map(String::as_str) == Some("primary"))
        .map(|(n, _)| n.clone())
        .collect()
}

/// Events (events.k8s.io/v1) about one object, as (reason, note).
pub async fn events_about(client: &Client, ns: &str, name: &str) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}
