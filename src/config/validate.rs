//! Semantic checks over deserialized settings.
//!
//! Pure: takes settings, returns every problem with its key path. Source
//! files, lines and environment variables are attached by `load`, so these
//! checks are testable without any file.

use std::collections::BTreeMap;

use super::bounds;
use super::error::Seg;
use super::selector::{check_label_key, check_label_value, is_dns_label};
use super::values::Checked;
use super::{ClusterEntry, Manager, Settings, Telemetry};

/// A problem at a key path. `echoes_value` marks messages that quote the
/// value, which must be withheld for keys that may hold credentials.
#[derive(Debug)]
pub(crate) struct Problem {
    pub path: Vec<Seg>,
    pub message: String,
    pub echoes_value: bool,
}

pub(crate) fn validate(settings: &Settings) -> Vec<Problem> {
    let mut v = Checker::default();
    v.manager(&settings.manager);
    v.telemetry(&settings.telemetry);
    v.clusters(&settings.clusters);
    if let Some(home) = &settings.manager.control_member
        && !settings.clusters.iter().any(|c| &c.name == home)
    {
        v.err(
            vec![Seg::key("manager"), Seg::key("control_member")],
            "must name one of the [[clusters]] entries",
        );
    }
    v.backups(&settings.backups);
    for (key, entry) in &settings.images.catalog {
        let base = [Seg::key("images"), Seg::key("catalog"), Seg::key(key)];
        for (field, message) in super::catalog::problems(key, entry) {
            v.err(at(&base, field), message);
        }
    }
    for (set, r) in &settings.roles {
        let base = [Seg::key("roles"), Seg::key(set)];
        for (field, message) in r.problems(set) {
            let path = if field.is_empty() {
                base.to_vec()
            } else {
                at(&base, field)
            };
            v.err(path, message);
        }
        v.opt_checked(at(&base, "postgresclusters"), r.postgresclusters.as_ref());
    }
    for (name, rollout) in &settings.rollouts {
        v.rollout(name, rollout, &settings.roles);
        // Rollouts move clusters between catalog entries.
        if let Some(t) = rollout.target_version.parsed()
            && rollout.role_set.is_none()
            && let Err(e) = settings.images.resolve(&t.to_string())
        {
            let msg = e.replace("spec.version: ", "");
            v.err(
                at(&[Seg::key("rollouts"), Seg::key(name)], "target_version"),
                msg,
            );
        }
    }
    v.dr(settings);
    v.checked(
        at(&[Seg::key("tenancy")], "restore_across_namespaces"),
        &settings.tenancy.restore_across_namespaces,
    );
    let tls = [Seg::key("tls")];
    v.checked(
        at(&tls, "server_cert_validity"),
        &settings.tls.server_cert_validity,
    );
    v.checked(
        at(&tls, "server_cert_renew_before"),
        &settings.tls.server_cert_renew_before,
    );
    if let Some(p) = settings.tls.problem() {
        v.err(at(&tls, "server_cert_renew_before"), p);
    }
    v.problems
}

impl Checker {
    /// `[dr.<topology>]`: each topology, then overlaps between them.
    fn dr(&mut self, settings: &Settings) {
        let known: Vec<&str> = settings.clusters.iter().map(|c| c.name.as_str()).collect();
        for (name, t) in &settings.dr {
            let base = [Seg::key("dr"), Seg::key(name)];
            self.checked(at(&base, "failover_after"), &t.failover_after);
            self.checked(at(&base, "max_rpo_lag"), &t.max_rpo_lag);
            for (field, message) in t.problems(name, &known) {
                let path = if field.is_empty() {
                    base.to_vec()
                } else {
                    at(&base, field)
                };
                self.err(path, message);
            }
        }
        for (name, message) in super::dr::overlaps(&settings.dr) {
            self.err(vec![Seg::key("dr"), Seg::key(&name)], message);
        }
    }
}

/// `base` extended by one key.
pub(super) fn at(base: &[Seg], key: &str) -> Vec<Seg> {
    let mut p = base.to_vec();
    p.push(Seg::key(key));
    p
}

pub(super) fn idx(base: &[Seg], key: &str, i: usize) -> Vec<Seg> {
    let mut p = at(base, key);
    p.push(Seg::Index(i));
    p
}

#[derive(Default)]
pub(super) struct Checker {
    problems: Vec<Problem>,
}

impl Checker {
    pub(super) fn err(&mut self, path: Vec<Seg>, message: impl Into<String>) {
        self.problems.push(Problem {
            path,
            message: message.into(),
            echoes_value: false,
        });
    }

    /// Reports a failed parse of a [`Checked`] value.
    pub(super) fn checked<T>(&mut self, path: Vec<Seg>, value: &Checked<T>) {
        if let Some(e) = value.error() {
            if value.is_missing() {
                self.err(path, "is required");
            } else {
                let message = e.to_string();
                self.problems.push(Problem {
                    path,
                    message,
                    echoes_value: true,
                });
            }
        }
    }

    pub(super) fn opt_checked<T>(&mut self, path: Vec<Seg>, value: Option<&Checked<T>>) {
        if let Some(v) = value {
            self.checked(path, v);
        }
    }

    pub(super) fn at_least_one(&mut self, path: Vec<Seg>, n: u32) {
        if n == 0 {
            self.err(path, "must be at least 1");
        }
    }

    fn rate(&mut self, base: &[Seg], qps: Option<f64>, burst: Option<u32>) {
        if let Some(q) = qps
            && !(q.is_finite() && q > 0.0)
        {
            self.err(
                at(base, "qps"),
                "must be a number of requests per second above 0",
            );
        }
        if let Some(b) = burst {
            self.at_least_one(at(base, "burst"), b);
        }
    }

    fn manager(&mut self, m: &Manager) {
        let base = [Seg::key("manager")];
        self.checked(at(&base, "listen"), &m.listen);
        if !(1..=1024).contains(&m.shards_per_cluster) {
            self.err(
                at(&base, "shards_per_cluster"),
                "must be between 1 and 1024",
            );
        }
        self.at_least_one(at(&base, "workers_per_cluster"), m.workers_per_cluster);
        if m.state_dir.as_os_str().is_empty() {
            self.err(at(&base, "state_dir"), "must not be empty");
        }
        self.duration(
            at(&base, "probe_interval"),
            &m.probe_interval,
            bounds::PROBE_INTERVAL,
        );
        self.duration(
            at(&base, "probe_timeout"),
            &m.probe_timeout,
            bounds::PROBE_TIMEOUT,
        );
        self.duration(
            at(&base, "api_request_timeout"),
            &m.api_request_timeout,
            bounds::API_REQUEST_TIMEOUT,
        );
        if let (Some(i), Some(t)) = (m.probe_interval.parsed(), m.probe_timeout.parsed())
            && t > i
        {
            self.err(
                at(&base, "probe_timeout"),
                "must not be longer than manager.probe_interval (probes would overlap)",
            );
        }
        self.at_least_one(
            at(&base, "probe_failure_threshold"),
            m.probe_failure_threshold,
        );
        self.rate(&base, Some(m.qps), Some(m.burst));
        if m.api_token
            .as_ref()
            .is_some_and(|t| t.expose().trim().is_empty())
        {
            self.err(
                at(&base, "api_token"),
                "must not be empty (leave the key out instead)",
            );
        }
        if m.api_token.is_some() && m.api_token_file.is_some() {
            self.err(
                at(&base, "api_token_file"),
                "set either api_token or api_token_file, not both",
            );
        }
        self.api_edge(&base, m);
        self.checked(at(&at(&base, "embedded"), "runtime"), &m.embedded.runtime);
        if let Err(e) = pgfleet_sim::nodes::NodeLayout::new(m.embedded.nodes, m.embedded.zones) {
            self.err(at(&at(&base, "embedded"), "nodes"), e);
        }
        self.leases(&base, m);
    }

    /// Client-go's leader-election rules: a holder must give up (renew
    /// deadline) before others may take over (lease duration), and must try
    /// to renew more than once within its deadline.
    fn leases(&mut self, base: &[Seg], m: &Manager) {
        if m.identity.as_ref().is_some_and(|i| i.trim().is_empty()) {
            self.err(
                at(base, "identity"),
                "must not be empty (leave the key out to generate one)",
            );
        }
        self.duration(
            at(base, "lease_duration"),
            &m.lease_duration,
            bounds::LEASE_DURATION,
        );
        self.duration(
            at(base, "renew_deadline"),
            &m.renew_deadline,
            bounds::RENEW_DEADLINE,
        );
        self.duration(
            at(base, "retry_period"),
            &m.retry_period,
            bounds::RETRY_PERIOD,
        );
        let (d, r, p) = (
            m.lease_duration.parsed(),
            m.renew_deadline.parsed(),
            m.retry_period.parsed(),
        );
        if let (Some(d), Some(r)) = (d, r)
            && r >= d
        {
            self.err(
                at(base, "renew_deadline"),
                "must be shorter than manager.lease_duration (a cut-off holder must stop before another replica takes over)",
            );
        }
        if let (Some(r), Some(p)) = (r, p)
            && p >= r
        {
            self.err(
                at(base, "retry_period"),
                "must be shorter than manager.renew_deadline (a holder must get more than one try to renew)",
            );
        }
    }

    fn telemetry(&mut self, t: &Telemetry) {
        let base = [Seg::key("telemetry")];
        if let Some(url) = &t.otlp_endpoint
            && !is_http_url(url)
        {
            // Not echoed: collector URLs sometimes carry credentials.
            self.err(
                at(&base, "otlp_endpoint"),
                "must be an http:// or https:// URL",
            );
        }
        self.checked(at(&base, "protocol"), &t.protocol);
        if t.protocol.parsed() == Some(&super::choices::OtlpProtocol::Grpc) {
            // Supporting it would link tonic, a second RPC stack, for the
            // same spans (docs/observability.md).
            self.err(
                at(&base, "protocol"),
                "\"grpc\" is not supported by this build: use \"http/protobuf\" (the collector's OTLP/HTTP port, usually 4318)",
            );
        }
        if !(0.0..=1.0).contains(&t.sampling_ratio) {
            self.err(at(&base, "sampling_ratio"), "must be between 0.0 and 1.0");
        }
        self.checked(at(&base, "log_format"), &t.log_format);
        if let Err(e) = check_log_level(&t.log_level) {
            self.err(at(&base, "log_level"), e);
        }
    }

    fn clusters(&mut self, clusters: &[ClusterEntry]) {
        if clusters.is_empty() {
            self.err(
                vec![Seg::key("clusters")],
                "at least one [[clusters]] entry is required (see config/fleet.toml for embedded ones)",
            );
        }
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, c) in clusters.iter().enumerate() {
            let base = idx(&[], "clusters", i);
            self.name(at(&base, "name"), &c.name, "cluster");
            if !c.name.is_empty() {
                if let Some(first) = seen.get(c.name.as_str()) {
                    let msg = format!(
                        "duplicate cluster name {:?} (already used by clusters[{first}])",
                        c.name
                    );
                    self.err(at(&base, "name"), msg);
                } else {
                    seen.insert(&c.name, i);
                }
            }
            match (&c.kubeconfig, c.embedded) {
                (Some(_), true) => self.err(
                    base.clone(),
                    "sets both kubeconfig and embedded = true; choose exactly one",
                ),
                (None, false) => self.err(
                    base.clone(),
                    "needs exactly one of kubeconfig = \"<path>\" or embedded = true",
                ),
                (Some(p), false) if p.as_os_str().is_empty() => {
                    self.err(at(&base, "kubeconfig"), "must not be empty")
                }
                _ => {}
            }
            if c.embedded && c.context.is_some() {
                self.err(
                    at(&base, "context"),
                    "only applies to clusters with a kubeconfig",
                );
            }
            for (k, v) in &c.labels {
                let path = at(&at(&base, "labels"), k);
                if let Err(e) = check_label_key(k).and_then(|()| check_label_value(v)) {
                    self.err(path, e);
                }
            }
            self.rate(&base, c.qps, c.burst);
            self.opt_checked(
                at(&base, "maintenance_window"),
                c.maintenance_window.as_ref(),
            );
        }
    }

    /// Names that become parts of Kubernetes object names and label values.
    pub(super) fn name(&mut self, path: Vec<Seg>, name: &str, what: &str) {
        if name.is_empty() {
            self.err(path, "is required");
        } else if !is_dns_label(name) {
            self.err(
                path,
                format!(
                    "{what} name {name:?} must be a DNS-1123 label (lowercase letters, digits \
                     and '-', at most 63 characters, starting and ending with a letter or digit)"
                ),
            );
        }
    }
}

pub(super) fn is_http_url(url: &str) -> bool {
    ["http://", "https://"].iter().any(|scheme| {
        url.strip_prefix(scheme)
            .is_some_and(|rest| !rest.is_empty())
    })
}

pub(super) fn is_bucket_name(b: &str) -> bool {
    (3..=63).contains(&b.len()) && b.split('.').all(is_dns_label)
}

/// Checks a tracing filter: every `level` or `target=level` directive must
/// name a real level. A bare unknown word would be taken as a target and
/// silently drop all other logs, so it is rejected.
fn check_log_level(filter: &str) -> Result<(), String> {
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    let is_level = |s: &str| LEVELS.contains(&s.trim().to_ascii_lowercase().as_str());
    if filter.trim().is_empty() {
        return Err("must not be empty (e.g. \"info\")".into());
    }
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if directive.contains('[') {
            continue; // span filters: left to the tracing subscriber
        }
        let level = directive.rsplit_once('=').map_or(directive, |(_, l)| l);
        if !is_level(level) {
            return Err(format!(
                "{directive:?}: unknown level {level:?} (expected trace, debug, info, warn, error \
                 or off; use target=level for one module)"
            ));
        }
    }
    Ok(())
}
