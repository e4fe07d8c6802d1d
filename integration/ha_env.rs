//! The HA tests' world: three emulated member clusters (an external
//! `pgfleet::sim`, virtual runtime) shared by in-process managers that each
//! have their own identity and state directory, plus a TCP proxy on
//! loopback that a test can cut to take one manager off one cluster.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, PostParams};
use pgfleet::crd::PostgresCluster;
use pgfleet::manager::Manager;
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

pub use crate::common::fleet;

/// Short, so takeovers happen within seconds; the other timings follow
/// client-go's proportions (renew deadline < duration, retry < deadline).
pub const LEASE: Duration = Duration::from_secs(3);
pub const MEMBERS: [&str; 3] = ["a", "b", "c"];
const NS: &str = "shop";

/// How long a change of ownership may take: a lease duration plus renew
/// rounds, with a wide margin for a loaded machine. Never asserted as a speed.
pub fn takeover_patience() -> Duration {
    LEASE * 20
}

pub struct Env {
    pub sim: pgfleet::sim::Sim,
    pub dir: PathBuf,
    clients: BTreeMap<String, Client>,
    /// Last: the members stop before their directory goes.
    _cleanup: pgfleet::testkit::dirs::RemoveOnDrop,
}

impl Env {
    pub async fn start(tag: &str) -> Env {
        fleet::init_tracing();
        let dir = fleet::temp_dir(tag);
        let mut opts = pgfleet::emulated::sim_options(dir.join("sim"), 0);
        opts.names = MEMBERS.iter().map(|s| s.to_string()).collect();
        opts.runtime = pgfleet::emulated::virtual_runtime();
        opts.persist = false;
        opts.admin = false;
        let sim = pgfleet::sim::start(&opts).await.unwrap();
        let mut clients = BTreeMap::new();
        for c in &sim.clusters {
            clients.insert(c.name.clone(), fleet::client_from(&c.kubeconfig).await);
        }
        let _cleanup = pgfleet::testkit::dirs::RemoveOnDrop(dir.clone());
        Env {
            sim,
            dir,
            clients,
            _cleanup,
        }
    }

    pub fn client(&self, member: &str) -> Client {
        self.clients[member].clone()
    }

    /// A manager named `identity` over all members; `via` replaces the
    /// kubeconfig of some members (e.g. one that goes through a proxy).
    pub async fn manager(&self, identity: &str, via: &BTreeMap<String, PathBuf>) -> Manager {
        self.manager_with(identity, via, "").await
    }

    /// [`Env::manager`] with more TOML (e.g. a `[rollouts.r]`) appended.
    pub async fn manager_with(
        &self,
        identity: &str,
        via: &BTreeMap<String, PathBuf>,
        extra: &str,
    ) -> Manager {
        let mut toml = format!(
            "[manager]\nidentity = \"{identity}\"\nstate_dir = \"{}\"\n\
             probe_interval = \"500ms\"\nprobe_timeout = \"500ms\"\nprobe_failure_threshold = 2\n\
             qps = 500.0\nburst = 1000\n\
             lease_duration = \"{}s\"\nrenew_deadline = \"2s\"\nretry_period = \"500ms\"\n",
            self.dir.join(identity).display(),
            LEASE.as_secs()
        );
        for c in &self.sim.clusters {
            let kc = via.get(&c.name).unwrap_or(&c.kubeconfig);
            toml.push_str(&format!(
                "\n[[clusters]]\nname = \"{}\"\nkubeconfig = \"{}\"\nlabels = {{ env = \"test\" }}\n",
                c.name,
                kc.display()
            ));
        }
        toml.push_str(extra);
        let settings = pgfleet::config::load_str(&toml, "test")
            .unwrap_or_else(|e| panic!("test config is invalid:\n{e}\n{toml}"));
        pgfleet::manager::start(&settings, false).await.unwrap()
    }

    /// A copy of `member`'s kubeconfig that reaches it through `proxy`.
    pub fn kubeconfig_via(&self, member: &str, proxy: SocketAddr) -> PathBuf {
        let c = self.sim.get(member).unwrap();
        let text = std::fs::read_to_string(&c.kubeconfig).unwrap();
        let text = text.replace(
            &format!("server: https://{}", c.addr),
            &format!("server: https://{proxy}"),
        );
        assert!(
            text.contains(&proxy.to_string()),
            "kubeconfig not rewritten"
        );
        let path = self.dir.join(format!("{member}-via-proxy.yaml"));
        pgfleet::sim::write_private(&path, text.as_bytes()).unwrap();
        path
    }

    /// The Lease in `member` as the cluster has it: (holder, transitions).
    pub async fn lease(&self, member: &str) -> Result<(Option<String>, i32), String> {
        let api: Api<Lease> = Api::namespaced(self.client(member), "pgfleet-system");
        let l = api
            .get_opt("pgfleet-manager")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no lease yet")?;
        let spec = l.spec.unwrap_or_default();
        Ok((spec.holder_identity, spec.lease_transitions.unwrap_or(0)))
    }

    /// Waits until the API servers serve the PostgresCluster kind (the
    /// managers install the CRDs).
    pub async fn crds_served(&self) {
        for m in MEMBERS {
            let api: Api<PostgresCluster> = Api::all(self.client(m));
            fleet::eventually(&format!("the CRD served in {m}"), || {
                let api = api.clone();
                async move {
                    api.list(&Default::default())
                        .await
                        .map_err(|e| e.to_string())
                }
            })
            .await;
        }
    }

    pub async fn create_pgc(&self, member: &str, name: &str) {
        self.create_pgc_at(member, name, "15.20").await;
    }

    pub async fn create_pgc_at(&self, member: &str, name: &str, version: &str) {
        let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client(member));
        let obj = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
        match ns.create(&PostParams::default(), &obj).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("namespace in {member}: {e}"),
        }
        let pg: PostgresCluster = serde_json::from_value(json!({
            "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"clusterSize": 1, "version": version, "storage": {"size": "1Gi"}}}))
        .unwrap();
        Api::<PostgresCluster>::namespaced(self.client(member), NS)
            .create(&PostParams::default(), &pg)
            .await
            .unwrap();
    }

    /// Every PostgresCluster of the test namespace, over all members.
    pub async fn all_pgcs(&self) -> Result<Vec<(String, PostgresCluster)>, String> {
        let mut out = vec![];
        for m in MEMBERS {
            let api: Api<PostgresCluster> = Api::namespaced(self.client(m), NS);
            for pg in api
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?
            {
                out.push((m.to_string(), pg));
            }
        }
        Ok(out)
    }

    pub async fn healthy(&self, member: &str, name: &str) -> Result<(), String> {
        let api: Api<PostgresCluster> = Api::namespaced(self.client(member), NS);
        let pg = api.get(name).await.map_err(|e| e.to_string())?;
        let phase = pg.status.and_then(|s| s.phase);
        if phase == Some(pgfleet::crd::Phase::Healthy) {
            Ok(())
        } else {
            Err(format!("{member}/{name} phase {phase:?}"))
        }
    }
}

/// Which manager owns each member in its own view: `Ok` only when exactly
/// one of `mgrs` claims every member and the Lease in the cluster names it.
pub async fn settled(
    env: &Env,
    mgrs: &[(&str, &Manager)],
) -> Result<BTreeMap<String, String>, String> {
    let mut owners = BTreeMap::new();
    for m in MEMBERS {
        let claim: Vec<&str> = mgrs
            .iter()
            .filter(|(_, mgr)| mgr.ha.ownership.owns(m))
            .map(|(id, _)| *id)
            .collect();
        let (holder, _) = env.lease(m).await?;
        match claim.as_slice() {
            [one] if holder.as_deref() == Some(*one) => {
                owners.insert(m.to_string(), one.to_string());
            }
            _ => {
                return Err(format!(
                    "{m}: claimed by {claim:?}, lease holder {holder:?}"
                ));
            }
        }
    }
    Ok(owners)
}

/// A TCP proxy on loopback that can be cut: open connections are dropped
/// and new ones are closed as soon as they are accepted.
pub struct Proxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (c, k) = (cut.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                // Checked under the lock `cut` takes: no connection slips
                // through between the flag and the drain.
                let mut conns = k.lock().unwrap();
                if c.load(Ordering::SeqCst) {
                    drop(down);
                    continue;
                }
                let h = tokio::spawn(async move {
                    if let Ok(mut up) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
                conns.push(h.abort_handle());
            }
        });
        Proxy {
            addr,
            cut,
            conns,
            accept,
        }
    }

    pub fn cut(&self) {
        let mut conns = self.conns.lock().unwrap();
        self.cut.store(true, Ordering::SeqCst);
        for h in conns.drain(..) {
            h.abort();
        }
    }

    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
