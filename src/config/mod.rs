//! Fleet settings: `config/fleet.toml` merged with `PGFLEET_*` environment
//! variables (see `docs/configuration.md` for every key).
//!
//! Loading never stops at the first problem: unknown keys, bad durations,
//! cron expressions, enums and selectors, duplicate names and the like are
//! all collected into [`ConfigErrors`], each naming its key path and the line
//! (or environment variable) it came from, because an operator fixing a
//! config wants the whole list at once. An invalid config refuses to start.
//!
//! Layout: this file holds the manager, telemetry and cluster sections and
//! the public API; [`backups`] and [`rollouts`] hold their sections;
//! [`values`], [`choices`], [`selector`] and [`window`] hold the leniently
//! parsed value types; `load` (with `env`) merges the sources, `validate`
//! and `validate_ops` check meaning, `lines` maps key paths to lines, `schema`
//! knows the valid keys for "did you mean" hints and `report` prints
//! `pgfleet config check`.

pub mod api_edge;
pub mod backups;
mod bounds;
pub mod catalog;
pub mod choices;
pub mod dr;
mod env;
mod error;
pub mod images;
mod lines;
mod load;
mod report;
pub mod roles;
pub mod rollouts;
mod schema;
pub mod selector;
pub mod tenancy;
pub mod tls;
mod validate;
mod validate_ops;
pub mod values;
pub mod window;

#[cfg(test)]
mod tests_errors;
#[cfg(test)]
mod tests_load;
#[cfg(test)]
mod tests_values;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use backups::{
    BackupOverride, Backups, Drills, FilesystemRepository, Repository, RepositoryConfig, Retention,
    S3Repository,
};
pub use choices::{
    CrossNamespaceRestore, EmbeddedRuntime, LogFormat, OnFailure, OtlpProtocol, UnreachablePolicy,
    UriStyle,
};
pub use error::{ConfigError, ConfigErrors, TokenFileError};
pub use load::{DEFAULT_CONFIG_PATH, EMBEDDED_DEFAULTS, load, load_str, load_with_env};
pub use report::{EXIT_INVALID, EXIT_OK, KubeconfigCheck, check_report};
pub use rollouts::{Rollout, Stage};
pub use selector::{LabelSelector, Selector};
pub use tenancy::Tenancy;
pub use values::{Checked, Concurrency, CronSchedule, HumanDuration, PgVersion, Secret};
pub use window::{MaintenanceWindow, Window};

/// The whole fleet configuration.
///
/// Unknown keys are not rejected by serde (`deny_unknown_fields` would stop
/// at the first); `load` collects them through `serde_ignored` instead.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Settings {
    pub manager: Manager,
    pub telemetry: Telemetry,
    pub clusters: Vec<ClusterEntry>,
    pub backups: Backups,
    /// `[images]`: the images a PostgresCluster may run (config::images).
    pub images: images::Images,
    /// Rollouts by name (the `<name>` in `[rollouts.<name>]`).
    pub rollouts: BTreeMap<String, Rollout>,
    /// Fleet role sets by name (`[roles.<set>]`, config::roles).
    pub roles: BTreeMap<String, roles::RoleSet>,
    pub tenancy: Tenancy,
    /// `[tls]`: server certificate validity and renewal (config::tls).
    pub tls: tls::Tls,
    /// Cross-cluster disaster-recovery topologies (`[dr.<name>]`, config::dr).
    pub dr: BTreeMap<String, dr::Topology>,
}

impl Settings {
    /// The member cluster with this name.
    pub fn cluster(&self, name: &str) -> Option<&ClusterEntry> {
        self.clusters.iter().find(|c| c.name == name)
    }

    /// Where backups go; without a configured repository, a filesystem
    /// repository under `<state_dir>/backups` so that the embedded default
    /// setup works with no object store at all.
    pub fn backup_repository(&self) -> Repository {
        self.backups.repository_or_default(&self.manager.state_dir)
    }
}

/// `[manager]`: the pgfleet process itself.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct Manager {
    /// HTTP API, metrics and dashboard address.
    pub listen: Checked<SocketAddr>,
    /// Shard controllers per member cluster: one watch, objects handed out
    /// by `hash(namespace/name) mod S` (`controller/shards.rs`).
    pub shards_per_cluster: u32,
    /// Concurrent reconciles per member cluster (shared by its shards).
    pub workers_per_cluster: u32,
    /// Reconciles running at once across the whole fleet (0: no bound).
    /// An admission is given back when the member has been silent for 2 s
    /// (it cannot hold the others back) and after 10 s at most
    /// (`controller::admission`).
    pub reconciles_in_flight: u32,
    /// Where embedded clusters keep their state and kubeconfigs.
    pub state_dir: PathBuf,
    /// How often each member cluster's API server is probed.
    pub probe_interval: HumanDuration,
    /// How long one probe may take before it counts as failed.
    pub probe_timeout: HumanDuration,
    /// Deadline of one ordinary API call to a member cluster (watches, logs
    /// and exec sessions excepted): a member that stops answering fails the
    /// calls made to it instead of holding them.
    pub api_request_timeout: HumanDuration,
    /// Consecutive failed probes before a cluster is marked Unreachable.
    pub probe_failure_threshold: u32,
    /// Default client-side request rate per member cluster (requests/s).
    pub qps: f64,
    /// Default request burst per member cluster.
    pub burst: u32,
    /// Bearer token for state-changing HTTP API calls.
    pub api_token: Option<Secret>,
    /// File holding the bearer token (kept out of the config file).
    pub api_token_file: Option<PathBuf>,
    /// PEM certificate chain the HTTP API serves (TLS); re-read when it changes.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`; re-read when it changes.
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA bundle: when set, every API client must present a certificate it signed.
    pub tls_client_ca_file: Option<PathBuf>,
    /// How long a client may take to send a request's headers.
    pub header_read_timeout: HumanDuration,
    /// How long one API request (body included) may take.
    pub request_timeout: HumanDuration,
    /// API requests served at once; more are answered 503 at once.
    pub max_concurrent_requests: u32,
    /// This replica's name in the ownership Leases; generated once and kept
    /// in `state_dir` when unset (see `ha::identity`).
    pub identity: Option<String>,
    /// How long a Lease holds without renewal before another replica may take it.
    pub lease_duration: HumanDuration,
    /// How long the holder keeps acting without a successful renewal; shorter
    /// than `lease_duration`, so it stops before anyone else can start.
    pub renew_deadline: HumanDuration,
    /// How often Leases are renewed or tried.
    pub retry_period: HumanDuration,
    /// The member cluster whose `pgfleet-system` namespace holds the rollout
    /// controls (the only copy read); unset: the lowest-named cluster. See
    /// `rollout::control` for why one home.
    pub control_member: Option<String>,
    pub embedded: Embedded,
}

impl Default for Manager {
    fn default() -> Self {
        Self {
            listen: Checked::new("127.0.0.1:8080"),
            shards_per_cluster: 4,
            workers_per_cluster: 8,
            reconciles_in_flight: 64,
            state_dir: PathBuf::from(".pgfleet"),
            probe_interval: Checked::new("5s"),
            probe_timeout: Checked::new("2s"),
            api_request_timeout: Checked::new("30s"),
            probe_failure_threshold: 3,
            qps: 50.0,
            burst: 100,
            api_token: None,
            api_token_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_client_ca_file: None,
            header_read_timeout: Checked::new("10s"),
            request_timeout: Checked::new("60s"),
            max_concurrent_requests: 64,
            identity: None,
            lease_duration: Checked::new("15s"),
            renew_deadline: Checked::new("10s"),
            retry_period: Checked::new("2s"),
            control_member: None,
            embedded: Embedded::default(),
        }
    }
}

impl Manager {
    /// The validated listen address.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
            .parsed()
            .copied()
            .unwrap_or(values::DEFAULT_LISTEN)
    }

    /// The API token from `api_token` or, read now, from `api_token_file`
    /// (surrounding whitespace trimmed). Reading happens at use, not at load,
    /// so a rotated token file is picked up without a config reload; a weak
    /// or placeholder token in the file is an error like an unreadable one
    /// (`pgfleet run` refuses to start with it).
    pub fn resolve_api_token(&self) -> Result<Option<Secret>, TokenFileError> {
        if let Some(token) = &self.api_token {
            return Ok(Some(token.clone()));
        }
        let Some(path) = &self.api_token_file else {
            return Ok(None);
        };
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
            path: shown.clone(),
            source,
        })?;
        let token = text.trim();
        if token.is_empty() {
            return Err(TokenFileError::Empty { path: shown });
        }
        if let Some(why) = api_edge::token_weakness(token) {
            return Err(TokenFileError::Weak { path: shown, why });
        }
        Ok(Some(Secret::new(token)))
    }
}

/// `[manager.embedded]`: member clusters declared with `embedded = true`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct Embedded {
    pub runtime: Checked<EmbeddedRuntime>,
    /// Nodes per embedded cluster (fresh clusters only), 1..=64.
    pub nodes: usize,
    /// Zones those nodes are spread over, 1..=nodes (at most 26).
    pub zones: usize,
}

impl Default for Embedded {
    fn default() -> Self {
        Self {
            runtime: Checked::new("virtual"),
            nodes: 1,
            zones: 1,
        }
    }
}

/// `[telemetry]`: logs and OTLP traces.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct Telemetry {
    /// OTLP collector URL; traces are off when unset.
    pub otlp_endpoint: Option<String>,
    pub protocol: Checked<OtlpProtocol>,
    /// Fraction of root traces kept, 0.0..=1.0.
    pub sampling_ratio: f64,
    pub log_format: Checked<LogFormat>,
    /// A tracing filter such as `info` or `info,pgfleet::controller=debug`.
    pub log_level: String,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            protocol: Checked::new("http/protobuf"),
            sampling_ratio: 1.0,
            log_format: Checked::new("text"),
            log_level: "info".into(),
        }
    }
}

/// One `[[clusters]]` entry: a member Kubernetes cluster.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct ClusterEntry {
    /// Unique DNS-1123 label; appears in metrics, traces and the API.
    pub name: String,
    /// Path to a kubeconfig file (exclusive with `embedded`).
    pub kubeconfig: Option<PathBuf>,
    /// Run this cluster inside pgfleet's embedded Kubernetes.
    pub embedded: bool,
    /// Kubeconfig context; the file's current context when unset.
    pub context: Option<String>,
    /// Labels that rollout stages, backup overrides and drills select on.
    #[serde(deserialize_with = "values::lenient_string_map")]
    pub labels: BTreeMap<String, String>,
    /// Skip TLS verification for this cluster only (test clusters).
    pub insecure_skip_tls_verify: bool,
    /// Overrides `manager.qps` for this cluster.
    pub qps: Option<f64>,
    /// Overrides `manager.burst` for this cluster.
    pub burst: Option<u32>,
    /// When disruptive work (rollout restarts) may happen, in UTC.
    pub maintenance_window: Option<Window>,
}

/// How pgfleet reaches a member cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterSource<'a> {
    Kubeconfig {
        path: &'a Path,
        context: Option<&'a str>,
    },
    /// Started by pgfleet; its kubeconfig is written under `manager.state_dir`.
    Embedded,
}

impl ClusterEntry {
    /// The validated connection source (exactly one is set after `load`).
    pub fn source(&self) -> ClusterSource<'_> {
        match &self.kubeconfig {
            Some(path) if !self.embedded => ClusterSource::Kubeconfig {
                path,
                context: self.context.as_deref(),
            },
            _ => ClusterSource::Embedded,
        }
    }

    pub fn effective_qps(&self, manager: &Manager) -> f64 {
        self.qps.unwrap_or(manager.qps)
    }

    pub fn effective_burst(&self, manager: &Manager) -> u32 {
        self.burst.unwrap_or(manager.burst)
    }

    /// The parsed maintenance window, if the cluster has one.
    pub fn window(&self) -> Option<&MaintenanceWindow> {
        self.maintenance_window.as_ref().and_then(Checked::parsed)
    }

    /// Whether disruptive work may start at `at`: always, without a window.
    pub fn maintenance_allowed(&self, at: std::time::SystemTime) -> bool {
        self.window().is_none_or(|w| w.contains(at))
    }
}
