//! The fleet registry: one kube client per member cluster, each with its own
//! rate limit and connection state (Connecting → Ready ⇄ Unreachable) from
//! periodic probes. Clusters are bulkheads: a slow or unreachable one never
//! delays the others. Credentials are read from kubeconfigs and never logged.

pub mod connect;
pub mod deadline;
pub mod permissions;
pub mod ratelimit;
pub mod swap;
pub mod transport;

pub use connect::{check_kubeconfig, client_from_kubeconfig, client_with_deadline};

use crate::config::{ClusterEntry, ClusterSource, Settings};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
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
    state: watch::Sender<ConnState>,
    /// The last check of the manager's permissions in this member.
    permissions: std::sync::Mutex<permissions::Check>,
}

impl Member {
    pub fn client(&self) -> kube::Client {
        self.client.clone()
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
        Ok(Fleet { members })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Member>> {
        self.members.iter().find(|m| m.name == name)
    }

    /// Probes every member periodically (each in its own task).
    pub fn spawn_probes(&self, interval: Duration, timeout: Duration, threshold: u32) {
        for m in &self.members {
            tokio::spawn(probe_loop(m.clone(), interval, timeout, threshold));
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
    let request_timeout = settings.manager.api_request_timeout.get();
    let built = client_with_deadline(
        &kubeconfig,
        context.as_deref(),
        entry.insecure_skip_tls_verify,
        &limit,
        request_timeout,
    )
    .await;
    let (client, backend, state) = match built {
        Ok(c) => {
            let (client, backend) = swap::Swappable::new(c);
            (client, backend, ConnState::Connecting)
        }
        Err(e) => {
            let reason = format!("{e:#}");
            tracing::error!(cluster = %entry.name, %reason, "member cluster has no usable kubeconfig; it stays Unreachable until the file is fixed, the others are managed");
            let (client, backend) = swap::Swappable::unconnected(&entry.name, &reason);
            (client, backend, ConnState::Unreachable { reason })
        }
    };
    crate::metrics::cluster_state(&entry.name, state.label());
    Ok(Member {
        name: entry.name.clone(),
        labels: entry.labels.clone(),
        kubeconfig,
        context,
        insecure: entry.insecure_skip_tls_verify,
        limit,
        request_timeout,
        client,
        backend,
        state: watch::channel(state).0,
        permissions: Default::default(),
    })
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Marks a member Ready on a successful probe and Unreachable after
/// `threshold` failures in a row; rebuilds the client when the kubeconfig
/// file changes (rotated credentials, moved server), and — while the member
/// has no usable client — retries building it with backoff.
async fn probe_loop(m: Arc<Member>, interval: Duration, timeout: Duration, threshold: u32) {
    let mut failures = 0u32;
    let mut seen = mtime(&m.kubeconfig);
    let mut retry = Backoff::new();
    let mut checks = permissions::Schedule::new();
    loop {
        let now = mtime(&m.kubeconfig);
        let connected = m.backend.connected();
        if now != seen || (!connected && retry.due()) {
            seen = now;
            rebuild(&m, connected, &mut retry).await;
            checks.now();
        }
        if !m.backend.connected() {
            tokio::time::sleep(interval.min(Duration::from_secs(1))).await;
            continue;
        }
        let client = m.client();
        match tokio::time::timeout(timeout, client.apiserver_version()).await {
            Ok(Ok(_)) => {
                failures = 0;
                m.set_state(ConnState::Ready);
                if checks.due() {
                    let check = m.check_permissions().await;
                    checks.done(&check);
                }
            }
            outcome => {
                failures = failures.saturating_add(1);
                let reason = match outcome {
                    Ok(Err(e)) => redact(&e.to_string()),
                    _ => format!("no answer within {timeout:?}"),
                };
                if failures >= threshold {
                    checks.now();
                    m.set_state(ConnState::Unreachable { reason });
                }
            }
        }
        // Probe faster while not Ready, so recovery is noticed quickly.
        let wait = if matches!(m.state(), ConnState::Ready) {
            interval
        } else {
            interval.min(Duration::from_secs(1))
        };
        tokio::time::sleep(wait).await;
    }
}

/// Builds the member's client from its kubeconfig again and swaps it in.
async fn rebuild(m: &Member, connected: bool, retry: &mut Backoff) {
    match client_with_deadline(
        &m.kubeconfig,
        m.context.as_deref(),
        m.insecure,
        &m.limit,
        m.request_timeout,
    )
    .await
    {
        Ok(c) => {
            m.backend.swap(c);
            retry.reset();
            tracing::info!(cluster = %m.name, "kubeconfig loaded; client rebuilt");
            if !connected {
                m.set_state(ConnState::Connecting);
            }
        }
        Err(e) => {
            let reason = format!("{e:#}");
            if connected {
                // The old client keeps working until the file is fixed.
                tracing::warn!(cluster = %m.name, error = %reason, "kubeconfig changed but is not usable");
            } else {
                retry.failed();
                m.set_state(ConnState::Unreachable { reason });
            }
        }
    }
}

/// When to try building a missing client again: 1 s, doubling to 60 s.
struct Backoff {
    wait: Duration,
    next: Instant,
}

impl Backoff {
    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(60);

    fn new() -> Self {
        Backoff {
            wait: Self::FIRST,
            next: Instant::now(),
        }
    }

    fn due(&self) -> bool {
        Instant::now() >= self.next
    }

    fn failed(&mut self) {
        self.next = Instant::now() + self.wait;
        self.wait = (self.wait * 2).min(Self::MAX);
    }

    fn reset(&mut self) {
        self.wait = Self::FIRST;
    }
}
