//! The process kubelet runtime (`pgfleet sim --runtime process`): every
//! container is a real local process, run as an unprivileged local user
//! (see [`user_for`]) in a private mount and PID namespace (see [`container`] for how),
//! each Pod has its own loopback address, volumes are directories under the
//! sim directory, and a Service proxy ([`proxy`]) gives every Service a
//! working ClusterIP. Faults for chaos tests: kill -9 a container, freeze and
//! thaw it, partition a Pod (its Service traffic and exec fail) and heal it.
//!
//! Like kubelet, the runtime only watches the store and writes back status:
//! it schedules Pods onto its node, binds PVCs, starts containers, reports
//! probes, and on graceful deletion stops the containers before deleting the
//! Pod object with grace 0.

pub mod capacity;
mod claims;
pub mod container;
pub mod dns;
pub mod endpoints;
pub mod faults;
pub mod host_check;
pub mod images;
pub mod logs;
pub mod netshim;
pub mod origin;
pub mod pod;
pub mod probes;
pub mod proxy;
pub mod sandbox;
pub mod spec;
pub mod usage;
pub mod volumes;

use super::cluster::Cluster;
use super::resources::ResKey;
use super::runtime::{ExecOutcome, ExecRequest, LogRequest, Runtime, UsageReport};
use super::store::{EventType, str_at};
use crate::json_ptr::Ptr;
use bytes::Bytes;
use futures::future::BoxFuture;
use pod::{PodRun, pods_key};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};
use volumes::{PodDirs, RunUser};

/// The node the machine's usage is reported under (the single node of the
/// default layout; with more nodes the scheduler places pods, and the
/// metrics API reports the machine under this name only).
const NODE: &str = "sim-node";

pub struct ProcessRuntime {
    sim_dir: PathBuf,
    /// What images stand for on this machine (`SimOptions::images`).
    images: Arc<[images::ImageRule]>,
    /// `<sim dir>/process/<cluster>`, set when started.
    dir: OnceLock<PathBuf>,
    cluster: OnceLock<Weak<Cluster>>,
    /// `SimOptions::run_as`, looked up: who runs a Pod whose
    /// `runAsUser` names no local user (or that sets none).
    fallback: Result<Option<RunUser>, String>,
    pods: Mutex<HashMap<String, Arc<PodRun>>>,
    /// Claim directory → uid of the claim whose data it holds. A claim
    /// deleted and created again under the same name is a new volume (a new
    /// PersistentVolume on a real cluster): the old data must neither show
    /// up in it nor be removed from under it later.
    claims: Mutex<HashMap<PathBuf, String>>,
    partitioned: Mutex<HashSet<String>>,
    proxy: proxy::Proxy,
    proxy_wake: Notify,
}

/// Runtimes by cluster, so tests and the admin endpoint can reach the fault
/// API through a `Cluster` (the cluster holds its runtime as `dyn Runtime`).
static REGISTRY: Mutex<Vec<(Weak<Cluster>, Weak<ProcessRuntime>)>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn key(plural: &str) -> ResKey {
    ResKey {
        group: String::new(),
        plural: plural.into(),
    }
}

fn id_of(v: &Value) -> String {
    format!(
        "{}/{}",
        str_at(v, "/metadata/namespace"),
        str_at(v, "/metadata/name")
    )
}

impl ProcessRuntime {
    /// A runtime keeping its directories under `sim_dir/process/<cluster>`,
    /// running images as the table `images` says, and Pods whose
    /// `runAsUser` has no local user as the local user `run_as`.
    pub fn new(sim_dir: &Path, images: &[images::ImageRule], run_as: Option<&str>) -> Self {
        ProcessRuntime {
            sim_dir: sim_dir.to_path_buf(),
            images: images.into(),
            dir: OnceLock::new(),
            cluster: OnceLock::new(),
            fallback: run_as
                .map(volumes::lookup_user)
                .transpose()
                .map_err(|e| format!("SimOptions::run_as: {e:#}")),
            pods: Mutex::new(HashMap::new()),
            claims: Mutex::new(HashMap::new()),
            partitioned: Mutex::new(HashSet::new()),
            proxy: proxy::Proxy::default(),
            proxy_wake: Notify::new(),
        }
    }

    /// The process runtime running `c`'s pods, if it has one.
    pub fn for_cluster(c: &Cluster) -> Option<Arc<ProcessRuntime>> {
        let mut reg = lock(&REGISTRY);
        reg.retain(|(c, r)| c.strong_count() > 0 && r.strong_count() > 0);
        reg.iter()
            .find(|(w, _)| std::ptr::eq(w.as_ptr(), c))
            .and_then(|(_, r)| r.upgrade())
    }

    fn dir(&self) -> PathBuf {
        self.dir
            .get()
            .cloned()
            .unwrap_or_else(|| self.sim_dir.join("process"))
    }

    fn cluster(&self) -> Option<Arc<Cluster>> {
        self.cluster.get()?.upgrade()
    }

    fn pod_dirs(&self, pod: &Value) -> PodDirs {
        let uid: String = str_at(pod, "/metadata/uid").chars().take(8).collect();
        PodDirs {
            root: self.dir().join("pods").join(format!(
                "{}_{}_{uid}",
                str_at(pod, "/metadata/namespace"),
                str_at(pod, "/metadata/name")
            )),
            pvc_root: self.dir().join("pvc"),
        }
    }

    /// Who runs `pod`'s containers. Like kubelet, the uid comes from the
    /// Pod: `securityContext.runAsUser` of the Pod, else of its first
    /// container that sets one. That uid's local user runs them; a uid with
    /// no local user (images bring their own /etc/passwd, this machine has
    /// one) or a Pod without a uid runs as `SimOptions::run_as`. Never root:
    /// these are real processes on this machine.
    fn user_for(&self, pod: &Value) -> Result<RunUser, String> {
        let fallback = || match &self.fallback {
            Ok(Some(u)) => Ok(u.clone()),
            Ok(None) => Err("it has no local user and SimOptions::run_as is unset".to_string()),
            Err(e) => Err(e.clone()),
        };
        let user = match spec::run_as_uid(pod) {
            Some(uid) => match volumes::lookup_uid(uid).map_err(|e| format!("{e:#}"))? {
                Some(u) => Ok(u),
                None => fallback().map_err(|e| format!("runAsUser {uid}: {e}")),
            },
            None => fallback().map_err(|e| format!("no runAsUser: {e}")),
        }?;
        match user.uid {
            0 => Err("the process runtime never runs containers as root".into()),
            _ => Ok(user),
        }
    }

    /// The running Pod `ns/name`.
    pub fn pod(&self, ns: &str, name: &str) -> Option<Arc<PodRun>> {
        lock(&self.pods).get(&format!("{ns}/{name}")).cloned()
    }

    fn on_event(self: &Arc<Self>, c: &Arc<Cluster>, k: &ResKey, kind: EventType, v: &Value) {
        if !k.group.is_empty() {
            return;
        }
        match k.plural.as_str() {
            "pods" => {
                self.on_pod(c, kind, v);
                self.proxy_wake.notify_one();
            }
            "services" => self.proxy_wake.notify_one(),
            "persistentvolumeclaims" => self.on_pvc(c, kind, v),
            "configmaps" | "secrets" => {
                let ns = str_at(v, "/metadata/namespace");
                for p in lock(&self.pods).values().filter(|p| p.ns == ns) {
                    p.refresh(c);
                }
            }
            _ => {}
        }
    }

    fn on_pod(self: &Arc<Self>, c: &Arc<Cluster>, kind: EventType, v: &Value) {
        let id = id_of(v);
        let uid = str_at(v, "/metadata/uid");
        let deleting = v.ptr("/metadata/deletionTimestamp").is_some();
        let known = self.pod(
            str_at(v, "/metadata/namespace"),
            str_at(v, "/metadata/name"),
        );
        let node = str_at(v, "/spec/nodeName");
        if kind != EventType::Deleted && (node.is_empty() || c.nodes.is_down(node)) {
            // Not bound yet (the scheduler binds), or its node's kubelet is down.
            return;
        }
        if kind == EventType::Deleted {
            if let Some(p) = known.filter(|p| p.uid == uid) {
                // Removed without a graceful stop (force delete): kill now.
                for ct in p.containers() {
                    let _ = ct.signal_all("KILL");
                }
                p.stop(Duration::ZERO);
                lock(&self.pods).remove(&id);
            }
            return;
        }
        if let Some(p) = known {
            if p.uid == uid {
                if deleting {
                    let grace = v
                        .ptr("/metadata/deletionGracePeriodSeconds")
                        .and_then(Value::as_u64)
                        .unwrap_or(30);
                    p.stop(Duration::from_secs(grace));
                } else {
                    p.update(c, v);
                }
                return;
            }
            p.stop(Duration::ZERO);
            lock(&self.pods).remove(&id);
        }
        if deleting {
            // Not running here (e.g. left over from before a restart).
            let run = PodRun::new(
                v,
                String::new(),
                self.pod_dirs(v),
                self.user_for(v).unwrap_or_else(|_| placeholder_user()),
                self.images.clone(),
            );
            run.stop(Duration::ZERO);
            tokio::spawn(run.run(Arc::downgrade(c)));
            return;
        }
        if matches!(str_at(v, "/status/phase"), "Succeeded" | "Failed") {
            return;
        }
        let user = match self.user_for(v) {
            Ok(u) => u,
            Err(e) => {
                tracing::error!(pod = %id, error = %e, "the process runtime cannot run this pod");
                return;
            }
        };
        if let Some(why) = crate::volume_wait::blocked(c, v) {
            crate::volume_wait::hold(c, v, &why);
            return;
        }
        let ip = match str_at(v, "/status/podIP") {
            "" => free_pod_ip(c, v),
            ip => {
                c.ipam.reserve(ip);
                ip.to_string()
            }
        };
        let run = PodRun::new(v, ip, self.pod_dirs(v), user, self.images.clone());
        lock(&self.pods).insert(id, run.clone());
        let me = self.clone();
        let weak = Arc::downgrade(c);
        tokio::spawn(async move {
            run.clone().run(weak.clone()).await;
            let mut pods = lock(&me.pods);
            if pods.get(&run.id()).is_some_and(|p| Arc::ptr_eq(p, &run)) {
                pods.remove(&run.id());
            }
            drop(pods);
            if let Some(c) = weak.upgrade() {
                c.ipam.release(&run.ip);
            }
        });
    }

    /// Proxy and /etc/hosts follow Services, Pods and partitions.
    async fn sync_loop(self: Arc<Self>) {
        loop {
            self.proxy_wake.notified().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
            let Some(c) = self.cluster() else { return };
            let parted = lock(&self.partitioned).clone();
            self.proxy.sync(&c, &parted);
            let services = service_names(&c);
            let pods: Vec<_> = lock(&self.pods).values().cloned().collect();
            for p in pods {
                let hosts = dns::hosts_content(&p.view(), &services);
                if p.dirs.hosts().exists()
                    && let Err(e) = dns::write_hosts(&p.dirs.hosts(), &hosts)
                {
                    tracing::warn!(pod = %p.id(), error = %format!("{e:#}"), "updating /etc/hosts");
                }
            }
        }
    }

    /// The Pods a Service forwards to now.
    pub fn service_backends(&self, ns: &str, name: &str) -> Vec<String> {
        self.proxy
            .backends(ns, name)
            .into_iter()
            .map(|b| b.pod)
            .collect()
    }
}

/// A new pod address whose declared container ports are free. Another
/// process (a second sim, a test running in parallel) may already use the
/// same loopback range; an address taken there stays reserved here.
fn free_pod_ip(c: &Cluster, pod: &Value) -> String {
    let ports: Vec<u16> = proxy::pod_ports(pod)
        .into_values()
        .chain(
            pod.ptr("/spec/containers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .flat_map(|ct| {
                    ct.get("ports")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                })
                .filter_map(|p| u16::try_from(p.get("containerPort")?.as_u64()?).ok()),
        )
        .collect();
    for _ in 0..64 {
        let ip = c.ipam.pod_ip();
        if ports
            .iter()
            .all(|p| std::net::TcpListener::bind((ip.as_str(), *p)).is_ok())
        {
            return ip;
        }
    }
    c.ipam.pod_ip()
}

fn placeholder_user() -> RunUser {
    RunUser {
        name: "nobody".into(),
        uid: 65534,
        gid: 65534,
        home: "/".into(),
    }
}

/// (namespace, name, clusterIP) of every Service with an address.
pub fn service_names(c: &Cluster) -> Vec<(String, String, String)> {
    let (services, _) = c.store.list(&key("services"), None, None);
    services
        .iter()
        .filter_map(|s| {
            let v = s.value();
            let ip = str_at(&v, "/spec/clusterIP");
            (!ip.is_empty() && ip != "None").then(|| {
                (
                    s.namespace().to_string(),
                    s.name().to_string(),
                    ip.to_string(),
                )
            })
        })
        .collect()
}

/// The runtime is gone (its cluster and tasks dropped): so are the
/// in-memory volumes of its enforced claims.
impl Drop for ProcessRuntime {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.get() {
            capacity::release_under(dir);
        }
    }
}

impl Runtime for ProcessRuntime {
    fn start(self: Arc<Self>, cluster: Arc<Cluster>) {
        let _ = self
            .dir
            .set(self.sim_dir.join("process").join(&cluster.name));
        let _ = self.cluster.set(Arc::downgrade(&cluster));
        lock(&REGISTRY).push((Arc::downgrade(&cluster), Arc::downgrade(&self)));
        if let Err(e) = &self.fallback {
            tracing::error!(error = %e, "the process runtime cannot run pods");
        }
        let weak = Arc::downgrade(&cluster);
        let (_, mut rx) = cluster.store.subscribe();
        let kinds = [key("persistentvolumeclaims"), key("services"), pods_key()];
        let mut existing = vec![];
        for k in &kinds {
            let (items, _) = cluster.store.list(k, None, None);
            existing.extend(items.into_iter().map(|o| (k.clone(), o)));
        }
        drop(cluster);
        tokio::spawn(self.clone().sync_loop());
        tokio::spawn(async move {
            if let Some(c) = weak.upgrade() {
                for (k, o) in existing {
                    self.on_event(&c, &k, EventType::Added, &o.value());
                }
            }
            loop {
                match rx.recv().await {
                    Ok(ev) => {
                        let Some(c) = weak.upgrade() else { return };
                        // Only the kinds it acts on are parsed.
                        if ev.key.group.is_empty()
                            && matches!(
                                ev.key.plural.as_str(),
                                "pods"
                                    | "services"
                                    | "persistentvolumeclaims"
                                    | "configmaps"
                                    | "secrets"
                            )
                        {
                            self.on_event(&c, &ev.key, ev.kind, &ev.obj.value());
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        let Some(c) = weak.upgrade() else { return };
                        // Gone while it lagged: deleted, or deleted and
                        // created again under the same name (another uid),
                        // which the current state alone cannot tell.
                        let (pods, _) = c.store.list(&pods_key(), None, None);
                        let live: HashMap<String, String> = pods
                            .iter()
                            .map(|p| {
                                (
                                    format!("{}/{}", p.namespace(), p.name()),
                                    p.uid().to_string(),
                                )
                            })
                            .collect();
                        let gone: Vec<_> = lock(&self.pods)
                            .iter()
                            .filter(|(id, p)| live.get(*id) != Some(&p.uid))
                            .map(|(_, p)| p.view())
                            .collect();
                        for v in gone {
                            self.on_event(&c, &pods_key(), EventType::Deleted, &v);
                        }
                        for k in &kinds {
                            let (items, _) = c.store.list(k, None, None);
                            for o in items {
                                self.on_event(&c, k, EventType::Modified, &o.value());
                            }
                        }
                    }
                    Err(_) => {
                        // The cluster is gone: so are its in-memory volumes.
                        capacity::release_under(&self.dir());
                        return;
                    }
                }
            }
        });
    }

    /// The kubelet's file system expansion: an enforced claim's tmpfs
    /// grows to `bytes`, online.
    fn expand_volume(&self, ns: &str, claim: &str, bytes: u64) -> Result<(), String> {
        capacity::grow(&self.dir().join("pvc").join(ns).join(claim), bytes)
    }

    fn exec(&self, req: ExecRequest) -> BoxFuture<'static, ExecOutcome> {
        let entry = if self.is_partitioned(&req.namespace, &req.pod) {
            Err(format!(
                "pod {}/{} is unreachable (partitioned)",
                req.namespace, req.pod
            ))
        } else {
            self.pod(&req.namespace, &req.pod)
                .ok_or_else(|| format!("pod {}/{} is not running", req.namespace, req.pod))
                .and_then(|p| {
                    p.container(&req.container)
                        .ok_or_else(|| format!("container {:?} not found", req.container))
                })
                .and_then(|c| {
                    c.entry()
                        .ok_or_else(|| format!("container {} is not running", c.spec.name))
                })
        };
        Box::pin(async move {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => return ExecOutcome::Failed(e),
            };
            if req.command.is_empty() {
                return ExecOutcome::Failed("empty command".into());
            }
            faults::run_exec(entry.command(&req.command), req).await
        })
    }

    fn port_forward(
        &self,
        namespace: &str,
        pod: &str,
        port: u16,
    ) -> BoxFuture<'static, Result<tokio::net::TcpStream, String>> {
        let ip = if self.is_partitioned(namespace, pod) {
            Err(format!(
                "pod {namespace}/{pod} is unreachable (partitioned)"
            ))
        } else {
            self.pod(namespace, pod)
                .map(|p| p.ip.clone())
                .ok_or_else(|| format!("pod {namespace}/{pod} is not running"))
        };
        let what = format!("{namespace}/{pod}");
        Box::pin(async move {
            let ip = ip?;
            tokio::net::TcpStream::connect((ip.as_str(), port))
                .await
                .map_err(|e| format!("failed to connect to port {port} of pod {what} ({ip}): {e}"))
        })
    }

    fn node_changed(&self, c: &Arc<Cluster>, node: &str) {
        let Some(me) = ProcessRuntime::for_cluster(c) else {
            return;
        };
        if c.nodes.is_down(node) {
            let lost: Vec<Arc<PodRun>> = lock(&me.pods)
                .values()
                .filter(|p| str_at(&p.view(), "/spec/nodeName") == node)
                .cloned()
                .collect();
            for p in lost {
                tracing::info!(pod = %p.id(), node, "node lost: killing the pod's processes");
                p.lose_node();
                lock(&me.pods).remove(&p.id());
            }
        } else {
            for pod in crate::nodes::pods_on(c, node) {
                me.on_pod(c, EventType::Modified, &pod);
            }
        }
        me.proxy_wake.notify_one();
    }

    fn usage(&self) -> BoxFuture<'static, Option<UsageReport>> {
        let me = lock(&REGISTRY)
            .iter()
            .find_map(|(_, r)| r.upgrade().filter(|r| std::ptr::eq(Arc::as_ptr(r), self)));
        Box::pin(async move { Some(me?.sample_usage().await) })
    }

    fn logs(&self, req: LogRequest) -> BoxFuture<'static, Result<mpsc::Receiver<Bytes>, String>> {
        let found = self
            .pod(&req.namespace, &req.pod)
            .ok_or_else(|| format!("pod {}/{} is not running", req.namespace, req.pod))
            .and_then(|p| {
                p.container(&req.container)
                    .ok_or_else(|| format!("container {:?} not found", req.container))
            });
        Box::pin(async move {
            let ct = found?;
            let running = ct.state().pid.is_some();
            Ok(ct.log.reader(req.tail_lines, req.follow, running))
        })
    }
}
