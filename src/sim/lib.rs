//! The embedded Kubernetes (DESIGN §5): N emulated clusters on loopback, each
//! an HTTP API server with its own port, bearer token and kubeconfig, its state
//! persisted in a directory so a restart keeps the objects. Clients reach these
//! clusters only through kubeconfigs and HTTP.
//!
//! This crate (`pgfleet-sim`) knows nothing of what the pods run: the
//! embedding program plugs in a kubelet runtime ([`RuntimeKind::custom`]) and
//! the process runtime's image table ([`SimOptions::images`]). See
//! docs/architecture.md ("Crates") and docs/embedded-kubernetes.md.

pub mod admin;
pub mod audit;
pub mod cluster;
pub mod disruption;
pub mod error;
pub mod events;
pub mod exec_log;
pub mod faults;
pub mod gc;
pub mod history;
pub mod hostexec;
pub mod ipam;
pub mod json_ptr;
pub mod jsonpath;
pub mod kinds;
pub mod lb;
pub mod limit_range;
pub mod names;
pub mod network;
pub mod nodes;
pub mod patch;
pub mod persist;
pub mod pod_security;
pub mod process;
pub mod pvc_protection;
pub mod quantity;
pub mod quota;
pub mod rbac;
pub mod recorder;
pub mod resources;
pub mod runtime;
pub mod scheduler;
pub mod schema;
pub mod selector;
pub mod server;
pub mod storage;
pub mod store;
pub mod stored;
pub mod table;
pub mod tls;
pub mod volume_wait;

use anyhow::Context;
use cluster::{Cluster, WriteOpts};
pub use process::images::{BinDir, ImageMatch, ImageRule};
use serde_json::json;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Builds the runtime of one emulated cluster (each cluster gets its own;
/// the argument is the sim directory).
pub type RuntimeFactory = Arc<dyn Fn(&Path) -> Arc<dyn runtime::Runtime> + Send + Sync>;

/// Which kubelet runtime runs the pods of the emulated clusters.
#[derive(Clone)]
pub enum RuntimeKind {
    /// Pods are scheduled nowhere and never run (API server only).
    None,
    /// Pods become Ready at once; exec runs commands on this host.
    Host,
    /// Each container is a real local process with its own loopback address;
    /// Services get a working ClusterIP proxy.
    Process,
    /// A runtime the embedding program supplies through the [`runtime::Runtime`]
    /// trait (pgfleet plugs in its in-memory PostgreSQL model this way), so the
    /// emulator itself knows nothing of what the pods run.
    Custom {
        /// Shown in logs and `Debug` output.
        name: String,
        factory: RuntimeFactory,
    },
}

impl RuntimeKind {
    /// A runtime supplied by the embedding program, built once per cluster.
    pub fn custom(
        name: &str,
        factory: impl Fn(&Path) -> Arc<dyn runtime::Runtime> + Send + Sync + 'static,
    ) -> Self {
        RuntimeKind::Custom {
            name: name.to_string(),
            factory: Arc::new(factory),
        }
    }
}

impl std::fmt::Debug for RuntimeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuntimeKind::None => f.write_str("None"),
            RuntimeKind::Host => f.write_str("Host"),
            RuntimeKind::Process => f.write_str("Process"),
            RuntimeKind::Custom { name, .. } => write!(f, "Custom({name})"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SimOptions {
    pub dir: PathBuf,
    pub names: Vec<String>,
    pub runtime: RuntimeKind,
    /// Write state to `dir` so a restart keeps the objects.
    pub persist: bool,
    /// Watch events kept for resuming watches.
    pub history: usize,
    /// Serve the admin (fault injection) endpoint.
    pub admin: bool,
    /// What images stand for on this machine, for the process runtime
    /// (first match wins; pgfleet supplies its PostgreSQL and PgBouncer
    /// rules). Empty: every container must give its command.
    pub images: Vec<ImageRule>,
    /// The local user the process runtime runs a container as when its
    /// Pod's `securityContext.runAsUser` names no user of this machine (or
    /// it sets none). `None`: such Pods do not start. pgfleet sets it to
    /// `postgres`, whose uid differs from machine to machine.
    pub run_as: Option<String>,
    /// The nodes a fresh cluster gets (`pgfleet sim --nodes N --zones Z`);
    /// one node, `sim-node`, by default.
    pub nodes: nodes::NodeLayout,
}

impl SimOptions {
    pub fn new(dir: impl Into<PathBuf>, n: usize) -> Self {
        SimOptions {
            dir: dir.into(),
            names: (1..=n).map(|i| format!("sim-{i}")).collect(),
            runtime: RuntimeKind::Host,
            persist: true,
            history: 100_000,
            admin: true,
            images: vec![],
            run_as: None,
            nodes: nodes::NodeLayout::default(),
        }
    }
}

/// One running emulated cluster.
pub struct SimCluster {
    pub name: String,
    pub cluster: Arc<Cluster>,
    pub addr: SocketAddr,
    pub token: String,
    pub kubeconfig: PathBuf,
    /// The API server's observer address: the same API and token, never
    /// closed by a network fault (see [`network`]), for tests and people
    /// watching a cluster that is cut off from the manager.
    pub observer_addr: SocketAddr,
    /// `DIR/<cluster>.observer.kubeconfig`, pointing at `observer_addr`.
    pub observer_kubeconfig: PathBuf,
}

/// A set of running emulated clusters.
pub struct Sim {
    pub clusters: Vec<SimCluster>,
    pub admin_addr: Option<SocketAddr>,
    pub dir: PathBuf,
}

impl Sim {
    pub fn get(&self, name: &str) -> Option<&SimCluster> {
        self.clusters.iter().find(|c| c.name == name)
    }

    /// Sets cluster `name`'s network fault (see [`network`]) after checking
    /// it names only other clusters of this sim; the error names the field.
    /// (The admin endpoint makes the same check over its own cluster map.)
    pub fn set_network(&self, name: &str, fault: network::NetworkFault) -> Result<(), String> {
        let c = self
            .get(name)
            .ok_or_else(|| format!("no cluster {name:?} in this sim"))?;
        let names: Vec<&str> = self.clusters.iter().map(|c| c.name.as_str()).collect();
        let problems = fault.problems(name, &names);
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        c.cluster.faults.set_network(fault);
        Ok(())
    }
}

/// Starts the clusters; each listens on 127.0.0.1 (the port it had before when
/// `dir` holds state from an earlier run).
pub async fn start(opts: &SimOptions) -> anyhow::Result<Sim> {
    std::fs::create_dir_all(&opts.dir)
        .with_context(|| format!("creating the sim directory {}", opts.dir.display()))?;
    // Runtimes bind-mount volume directories from here inside containers
    // that have another working directory: the path must be absolute.
    let mut abs = opts.clone();
    abs.dir = std::path::absolute(&opts.dir)
        .with_context(|| format!("resolving {}", opts.dir.display()))?;
    let opts = &abs;
    let tls = tls::load_or_create(&opts.dir)?;
    let mut clusters = vec![];
    for (i, name) in opts.names.iter().enumerate() {
        clusters.push(start_one(opts, i, name, &tls).await?);
    }
    let admin_addr = if opts.admin {
        Some(admin::serve(&clusters).await?)
    } else {
        None
    };
    let info = json!({
        "admin": admin_addr.map(|a| format!("http://{a}")),
        "clusters": clusters.iter().map(|c| json!({"name": c.name, "server": format!("https://{}", c.addr), "kubeconfig": c.kubeconfig})).collect::<Vec<_>>(),
    });
    write_private(
        &opts.dir.join("sim.json"),
        &serde_json::to_vec_pretty(&info)?,
    )?;
    Ok(Sim {
        clusters,
        admin_addr,
        dir: opts.dir.clone(),
    })
}

async fn start_one(
    opts: &SimOptions,
    index: usize,
    name: &str,
    tls: &tls::SimTls,
) -> anyhow::Result<SimCluster> {
    let cluster = Cluster::new(name, ipam::Ipam::for_cluster(index), opts.history);
    let _ = cluster.ca_pem.set(tls.ca_pem.clone());
    let state_path = opts.dir.join(format!("{name}.state.json"));
    let restored = if opts.persist {
        persist::load(&cluster, &state_path)?
    } else {
        None
    };
    let (port, token) = match restored {
        Some(r) => (r.port, r.token),
        None => {
            bootstrap(&cluster, &opts.nodes);
            (0, random_token())
        }
    };
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
        Ok(l) => l,
        Err(_) if port != 0 => tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?,
        Err(e) => return Err(e).context("binding a loopback port"),
    };
    let addr = listener.local_addr()?;
    let kubeconfig = opts.dir.join(format!("{name}.kubeconfig"));
    write_private(
        &kubeconfig,
        kubeconfig_yaml(name, addr, &token, &tls.ca_pem).as_bytes(),
    )?;
    let observer = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .context("binding the observer port")?;
    let observer_addr = observer.local_addr()?;
    let observer_kubeconfig = opts.dir.join(format!("{name}.observer.kubeconfig"));
    write_private(
        &observer_kubeconfig,
        kubeconfig_yaml(name, observer_addr, &token, &tls.ca_pem).as_bytes(),
    )?;
    cluster.nodes.set_layout(opts.nodes.clone());
    if let Some(rt) = runtime_for(opts) {
        *cluster.runtime.write().unwrap_or_else(|e| e.into_inner()) = Some(rt.clone());
        rt.start(cluster.clone());
        // Without a kubelet runtime pods are scheduled nowhere, as before.
        scheduler::start(&cluster);
        nodes::lifecycle::start(&cluster);
    }
    tokio::spawn(gc::run(Arc::downgrade(&cluster)));
    lb::start(&cluster);
    if opts.persist {
        tokio::spawn(persist::run(
            Arc::downgrade(&cluster),
            state_path,
            addr.port(),
            token.clone(),
        ));
    }
    let ctx = server::Ctx {
        cluster: cluster.clone(),
        token: Arc::new(token.clone()),
        tls: tokio_rustls::TlsAcceptor::from(tls.server.clone()),
    };
    tokio::spawn(server::serve(ctx.clone(), listener, false));
    tokio::spawn(server::serve(ctx, observer, true));
    Ok(SimCluster {
        name: name.to_string(),
        cluster,
        addr,
        token,
        kubeconfig,
        observer_addr,
        observer_kubeconfig,
    })
}

fn runtime_for(opts: &SimOptions) -> Option<Arc<dyn runtime::Runtime>> {
    let dir = &opts.dir;
    match &opts.runtime {
        RuntimeKind::None => None,
        RuntimeKind::Host => Some(Arc::new(hostexec::HostRuntime)),
        RuntimeKind::Process => Some(Arc::new(process::ProcessRuntime::new(
            dir,
            &opts.images,
            opts.run_as.as_deref(),
        ))),
        RuntimeKind::Custom { factory, .. } => Some(factory(dir)),
    }
}

/// The objects a fresh cluster has: the standard namespaces, the default
/// StorageClass and the nodes.
fn bootstrap(c: &Arc<Cluster>, layout: &nodes::NodeLayout) {
    let opts = WriteOpts {
        field_manager: "kube-apiserver".into(),
        ..Default::default()
    };
    let reg = c.registry().clone();
    if let Some(ns) = reg.get("", "v1", "namespaces") {
        for n in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let _ = c.create(ns, "", json!({"metadata": {"name": n}}), &opts);
        }
    }
    if let Some(sc) = reg.get("storage.k8s.io", "v1", "storageclasses") {
        let _ = c.create(sc, "", storage::default_class(), &opts);
    }
    drop(reg);
    nodes::bootstrap(c, layout);
}

fn random_token() -> String {
    let a: u128 = rand::random();
    let b: u128 = rand::random();
    format!("{a:032x}{b:032x}")
}

pub fn kubeconfig_yaml(name: &str, addr: SocketAddr, token: &str, ca_pem: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: https://{addr}\n    certificate-authority-data: {ca}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\n    namespace: default\ncurrent-context: {name}\nusers:\n- name: {name}\n  user:\n    token: {token}\n"
    )
}

/// Writes a file readable only by its owner (kubeconfigs hold tokens).
pub fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(data)?;
    f.sync_all().ok();
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
