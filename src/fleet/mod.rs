//! The fleet registry: one kube client per member cluster, each with its own
//! rate limit and connection state (Connecting → Ready ⇄ Unreachable) from
//! periodic probes. Clusters are bulkheads: a slow or unreachable one never
//! delays the others. Credentials are read from kubeconfigs and never logged.

pub mod ratelimit;
pub mod swap;

use crate::config::{ClusterEntry, ClusterSource, Settings};
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
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
    /// Stable for the member's lifetime; its backend is swapped on kubeconfig changes.
    client: kube::Client,
    backend: swap::Swappable,
    state: watch::Sender<ConnState>,
}

impl Member {
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    pub fn state(&self) -> ConnState {
        self.state.borrow().clone()
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
                crate::metrics::cluster_state(&self.name, cur);
                true
            }
        });
    }
}

/// Builds a client from a kubeconfig file. Errors name the file, never its
/// content (it holds credentials).
pub async fn client_from_kubeconfig(
    path: &Path,
    context: Option<&str>,
    insecure: bool,
    limit: &ratelimit::RateLimit,
) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .map_err(|_| anyhow::anyhow!("cannot read kubeconfig {}", path.display()))?;
    let opts = kube::config::KubeConfigOptions {
        context: context.map(String::from),
        ..Default::default()
    };
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &opts)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "kubeconfig {} is not usable: {}",
                path.display(),
                redact(&e.to_string())
            )
        })?;
    cfg.connect_timeout = Some(Duration::from_secs(5));
    cfg.accept_invalid_certs = cfg.accept_invalid_certs || insecure;
    let builder = kube::client::ClientBuilder::try_from(cfg).context("building the kube client")?;
    Ok(builder.with_layer(limit).build())
}

/// Keeps only the first line of an error and drops anything that looks like
/// a token, so kubeconfig parse errors cannot leak credentials.
fn redact(s: &str) -> String {
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
    /// names of embedded clusters to the kubeconfigs the sim wrote.
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
    );
    let client = client_from_kubeconfig(
        &kubeconfig,
        context.as_deref(),
        entry.insecure_skip_tls_verify,
        &limit,
    )
    .await
    .with_context(|| format!("member cluster {}", entry.name))?;
    let (client, backend) = swap::Swappable::new(client);
    crate::metrics::cluster_state(&entry.name, &ConnState::Connecting);
    Ok(Member {
        name: entry.name.clone(),
        labels: entry.labels.clone(),
        kubeconfig,
        context,
        insecure: entry.insecure_skip_tls_verify,
        limit,
        client,
        backend,
        state: watch::channel(ConnState::Connecting).0,
    })
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Marks a member Ready on a successful probe and Unreachable after
/// `threshold` failures in a row; rebuilds the client when the kubeconfig
/// file changes (rotated credentials, moved server).
async fn probe_loop(m: Arc<Member>, interval: Duration, timeout: Duration, threshold: u32) {
    let mut failures = 0u32;
    let mut seen = mtime(&m.kubeconfig);
    loop {
        let now = mtime(&m.kubeconfig);
        if now != seen {
            seen = now;
            match client_from_kubeconfig(&m.kubeconfig, m.context.as_deref(), m.insecure, &m.limit)
                .await
            {
                Ok(c) => {
                    m.backend.swap(c);
                    tracing::info!(cluster = %m.name, "kubeconfig changed; client rebuilt");
                }
                Err(e) => {
                    tracing::warn!(cluster = %m.name, error = %format!("{e:#}"), "kubeconfig changed but is not usable")
                }
            }
        }
        let client = m.client();
        match tokio::time::timeout(timeout, client.apiserver_version()).await {
            Ok(Ok(_)) => {
                failures = 0;
                m.set_state(ConnState::Ready);
            }
            outcome => {
                failures += 1;
                let reason = match outcome {
                    Ok(Err(e)) => redact(&e.to_string()),
                    _ => format!("no answer within {timeout:?}"),
                };
                if failures >= threshold {
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
