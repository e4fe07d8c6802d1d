//! The fleet registry: one kube client per member cluster, each with its own
//! rate limit and connection state (Connecting → Ready ⇄ Unreachable) from
//! periodic probes. Clusters are bulkheads: a slow or unreachable one never
//! delays the others. Credentials are read from kubeconfigs and never logged.

pub mod connect;
pub mod control;
pub mod deadline;
pub mod permissions;
mod probe;
pub mod ratelimit;
pub mod rules_review;
pub mod swap;
pub mod transport;

pub use connect::{check_kubeconfig, client_from_kubeconfig, client_with_deadline};

use crate::config::{ClusterEntry, ClusterSource, Settings};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

#[derive(Debug, Clone, PartialEq)]
pub enum ConnState {
    Connecting,
    Ready,
    Unreachable { reason: String },
}

impl ConnState {
    pub fn label(&self) -> &'static str {
        match self {
            ConnState::Connecting => "Connecting",
            ConnState::Ready => "Ready",
            ConnState::Unreachable { .. } => "Unreachable",
        }
    }
}

/// One member cluster.
pub struct Member {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    kubeconfig: PathBuf,
    context: Option<String>,
    insecure: bool,
    limit: ratelimit::RateLimit,
    request_timeout: Duration,
    /// Stable for the member's lifetime; its backend is swapped on kubeconfig changes.
    client: kube::Client,
    backend: swap::Swappable,
    /// The same member through the control lane ([`control`]): Lease
    /// renewals and probes only, on a connection of their own.
    control: kube::Client,
    control_backend: swap::Swappable,
    /// The runtime the data client was built on (its workers and
    /// connections live there; rebuilding from the lane goes back to it).
    data_runtime: tokio::runtime::Handle,
    state: watch::Sender<ConnState>,
    /// The last check of the manager's permissions in this member.
    permissions: std::sync::Mutex<permissions::Check>,
}

impl Member {
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The runtime of the member's data client and of its controller's
    /// tasks (not the control lane).
    pub fn data_runtime(&self) -> &tokio::runtime::Handle {
        &self.data_runtime
    }

    /// The client for Lease renewals and probes, to be used from tasks on
    /// the control lane only (see [`control`]).
    pub fn control_client(&self) -> kube::Client {
        self.control.clone()
    }

    fn connected(&self) -> bool {
        self.backend.connected() && self.control_backend.connected()
    }

    /// Builds both clients from the kubeconfig: the data client on the data
    /// runtime, the control client on the control lane.
    async fn build_lanes(&self) -> anyhow::Result<(kube::Client, kube::Client)> {
        let source = self.source();
        let data = self
            .data_runtime
            .spawn(source.clone().build())
            .await
            .map_err(|e| anyhow::anyhow!("building the client failed: {e}"))??;
        let control = control::run(source.build()).await??;
        Ok((data, control))
    }

    fn source(&self) -> Source {
        Source {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            insecure: self.insecure,
            limit: self.limit.clone(),
            request_timeout: self.request_timeout,
        }
    }

    pub fn state(&self) -> ConnState {
        self.state.borrow().clone()
    }

    /// The last permission check: what the manager lacks here, by name.
    pub fn permissions(&self) -> permissions::Check {
        self.permissions
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
    }

    /// Checks the manager's permissions in the member and records the
    /// outcome (logged when something is missing).
    async fn check_permissions(&self) -> permissions::Check {
        let check = permissions::check(&self.client()).await;
        if !check.missing.is_empty() {
            tracing::warn!(cluster = %self.name, missing = %check.missing.join(", "), "the manager lacks permissions in this member cluster (deploy/member/rbac.yaml grants them)");
        }
        if let Some(e) = &check.error {
            tracing::warn!(cluster = %self.name, error = %e, "could not check the manager's permissions");
        }
        if let Ok(mut cur) = self.permissions.lock() {
            *cur = check.clone();
        }
        check
    }

    /// When the member last answered a request of the data client.
    pub fn answered(&self) -> swap::Answered {
        self.backend.answered()
    }

    /// When a request of the control lane (Lease renewals, probes) last
    /// succeeded: recent evidence that the member is reachable.
    pub fn control_succeeded(&self) -> swap::Answered {
        self.control_backend.succeeded()
    }

    pub fn watch_state(&self) -> watch::Receiver<ConnState> {
        self.state.subscribe()
    }

    fn set_state(&self, s: ConnState) {
        self.state.send_if_modified(|cur| {
            if *cur == s {
                false
            } else {
                tracing::info!(cluster = %self.name, state = s.label(), "member cluster connection changed");
                *cur = s;
                crate::metrics::cluster_state(&self.name, cur.label());
                true
            }
        });
    }
}

/// Keeps only the first line of an error and drops anything that looks like
/// a token, so kubeconfig parse errors cannot leak credentials.
pub(crate) fn redact(s: &str) -> String {
    let first = s.lines().next().unwrap_or_default();
    first
        .split_whitespace()
        .map(|w| {
            if w.len() > 24
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.=".contains(c))
            {
                "<redacted>"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// All member clusters.
pub struct Fleet {
    pub members: Vec<Arc<Member>>,
    /// The probe loops (on the control lane, which outlives any one
    /// manager: they are stopped when the fleet is dropped).
    probes: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for p in self
            .probes
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            p.abort();
        }
    }
}

impl Fleet {
    /// Builds clients for every `[[clusters]]` entry. `embedded` maps the
    /// names of embedded clusters to the kubeconfigs the sim wrote. A member
    /// whose kubeconfig is missing or unusable does not stop the others: it
    /// starts `Unreachable` with the reason, and its probe loop keeps trying
    /// to build its client (a fixed file is picked up).
    pub async fn connect(
        settings: &Settings,
        embedded: &BTreeMap<String, PathBuf>,
    ) -> anyhow::Result<Fleet> {
        let mut members = vec![];
        for entry in &settings.clusters {
            members.push(Arc::new(member(settings, entry, embedded).await?));
        }
        Ok(Fleet {
            members,
            probes: Default::default(),
        })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Member>> {
        self.members.iter().find(|m| m.name == name)
    }

    /// Probes every member periodically (each in its own task).
    pub fn spawn_probes(&self, interval: Duration, timeout: Duration, threshold: u32) {
        let mut probes = self.probes.lock().unwrap_or_else(|e| e.into_inner());
        for m in &self.members {
            let n = self.members.len();
            let probe = probe::probe_loop(m.clone(), interval, timeout, threshold, n);
            probes.push(control::spawn(probe).abort_handle());
        }
    }
}

async fn member(
    settings: &Settings,
    entry: &ClusterEntry,
    embedded: &BTreeMap<String, PathBuf>,
) -> anyhow::Result<Member> {
    let (kubeconfig, context) = match entry.source() {
        ClusterSource::Kubeconfig { path, context } => {
            (path.to_path_buf(), context.map(String::from))
        }
        ClusterSource::Embedded => (
            embedded.get(&entry.name).cloned().ok_or_else(|| {
                anyhow::anyhow!("embedded cluster {} was not started", entry.name)
            })?,
            None,
        ),
    };
    let limit = ratelimit::RateLimit::new(
        entry.effective_qps(&settings.manager),
        entry.effective_burst(&settings.manager),
    )
    .counting(&entry.name);
    let source = Source {
        kubeconfig,
        context,
        insecure: entry.insecure_skip_tls_verify,
        limit,
        request_timeout: settings.manager.api_request_timeout.get(),
    };
    let data_runtime = tokio::runtime::Handle::current();
    let built = match source.clone().build().await {
        Ok(data) => control::run(source.clone().build())
            .await
            .and_then(|c| c)
            .map(|control| (data, control)),
        Err(e) => Err(e),
    };
    let ((client, backend), (control, control_backend), state) = match built {
        Ok((data, control)) => {
            let data = swap::Swappable::new(data);
            // Wrapped on the lane: the wrapper spawns its worker where it is built.
            let control = control::run(async move { swap::Swappable::new(control) }).await?;
            (data, control, ConnState::Connecting)
        }
        Err(e) => {
            let reason = format!("{e:#}");
            tracing::error!(cluster = %entry.name, %reason, "member cluster has no usable kubeconfig; it stays Unreachable until the file is fixed, the others are managed");
            let data = swap::Swappable::unconnected(&entry.name, &reason);
            let (name, why) = (entry.name.clone(), reason.clone());
            let control =
                control::run(async move { swap::Swappable::unconnected(&name, &why) }).await?;
            (data, control, ConnState::Unreachable { reason })
        }
    };
    crate::metrics::cluster_state(&entry.name, state.label());
    Ok(Member {
        name: entry.name.clone(),
        labels: entry.labels.clone(),
        kubeconfig: source.kubeconfig,
        context: source.context,
        insecure: source.insecure,
        limit: source.limit,
        request_timeout: source.request_timeout,
        client,
        backend,
        control,
        control_backend,
        data_runtime,
        state: watch::channel(state).0,
        permissions: Default::default(),
    })
}

/// Where a member's clients come from (cloned into the runtime that builds one).
#[derive(Clone)]
struct Source {
    kubeconfig: PathBuf,
    context: Option<String>,
    insecure: bool,
    limit: ratelimit::RateLimit,
    request_timeout: Duration,
}

impl Source {
    async fn build(self) -> anyhow::Result<kube::Client> {
        client_with_deadline(
            &self.kubeconfig,
            self.context.as_deref(),
            self.insecure,
            &self.limit,
            self.request_timeout,
        )
        .await
    }
}
