//! The output of `pgfleet config check [FILE]`.

use std::fmt::Write as _;
use std::path::Path;

use super::env::process_env;
use super::load::load_detailed;
use super::{ClusterSource, Repository, Settings};

/// Exit code when the configuration is valid.
pub const EXIT_OK: i32 = 0;
/// Exit code when the configuration has problems (2, like a usage error).
pub const EXIT_INVALID: i32 = 2;

/// Loads the configuration as `pgfleet run` would (same file resolution,
/// same `PGFLEET_*` variables) and returns the text to print and the exit
/// code: a short summary and 0, or every problem and 2. Starts nothing.
/// Every member's kubeconfig is loaded too (no request is made), so a
/// missing, garbage or placeholder file is reported here rather than left
/// for `pgfleet run` to find. Loading one is the fleet's business (a layer
/// above configuration), so the caller passes `check`, normally
/// `fleet::check_kubeconfig`.
pub fn check_report(path: Option<&Path>, check: KubeconfigCheck) -> (String, i32) {
    check_report_with_env(path, process_env(), check)
}

/// Whether a client can be built from a kubeconfig file and context
/// (`insecure`: skip TLS verification); the reason when not.
pub type KubeconfigCheck = fn(&Path, Option<&str>, bool) -> Result<(), String>;

/// [`check_report`] with an explicit environment.
pub(crate) fn check_report_with_env(
    path: Option<&Path>,
    env: Vec<(String, String)>,
    check: KubeconfigCheck,
) -> (String, i32) {
    let (origin, result) = load_detailed(path, env);
    match result {
        Ok(settings) => {
            let problems = kubeconfig_problems(&settings, check);
            if problems.is_empty() {
                (format!("{origin}: OK\n{}", settings.summary()), EXIT_OK)
            } else {
                let n = problems.len();
                let noun = if n == 1 { "problem" } else { "problems" };
                (
                    format!(
                        "{}\n{origin}: {n} {noun} found; nothing was started",
                        problems.join("\n")
                    ),
                    EXIT_INVALID,
                )
            }
        }
        Err(errors) => {
            let n = errors.len();
            let noun = if n == 1 { "problem" } else { "problems" };
            (
                format!("{errors}\n{origin}: {n} {noun} found; nothing was started"),
                EXIT_INVALID,
            )
        }
    }
}

/// One line per member whose kubeconfig cannot be used: the key, the
/// member, the file and the reason (never the file's content).
fn kubeconfig_problems(settings: &Settings, check: KubeconfigCheck) -> Vec<String> {
    let mut out = vec![];
    for (i, c) in settings.clusters.iter().enumerate() {
        if let ClusterSource::Kubeconfig { path, context } = c.source()
            && let Err(reason) = check(path, context, c.insecure_skip_tls_verify)
        {
            out.push(format!(
                "clusters[{i}].kubeconfig (member cluster {}): {reason}",
                c.name
            ));
        }
    }
    out
}

impl Settings {
    /// A few lines describing what this configuration will manage. Never
    /// includes credentials.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let names: Vec<&str> = self.clusters.iter().map(|c| c.name.as_str()).collect();
        let embedded = self
            .clusters
            .iter()
            .filter(|c| matches!(c.source(), ClusterSource::Embedded))
            .count();
        let _ = writeln!(
            out,
            "  {} member cluster{} ({} embedded, {} kubeconfig): {}",
            names.len(),
            if names.len() == 1 { "" } else { "s" },
            embedded,
            names.len() - embedded,
            names.join(", ")
        );
        let repo = match self.backup_repository() {
            Repository::S3(s3) => format!("s3 bucket {}", s3.bucket),
            Repository::Filesystem { path } => format!("filesystem {}", path.display()),
        };
        let _ = writeln!(
            out,
            "  backups: default schedule \"{}\", {} override(s), repository {repo}",
            self.backups.default_schedule,
            self.backups.overrides.len()
        );
        if self.rollouts.is_empty() {
            let _ = writeln!(out, "  rollouts: none");
        }
        for (name, r) in &self.rollouts {
            let stages: Vec<&str> = r.stages.iter().map(|s| s.name.as_str()).collect();
            let target = match (&r.role_set, r.generation) {
                (Some(set), Some(g)) => format!("role set {set} generation {g}"),
                _ => r.target_version.to_string(),
            };
            let _ = writeln!(
                out,
                "  rollout {name}: to {target} in {} stage(s): {}",
                stages.len(),
                stages.join(" → ")
            );
        }
        for (name, set) in &self.roles {
            let _ = writeln!(
                out,
                "  role set {name}: role {:?} on PostgresClusters {:?}, password from Secret {}/{} (password-<N>)",
                set.role,
                set.postgresclusters
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                set.password_secret_namespace,
                set.password_secret
            );
        }
        let _ = write!(
            out,
            "  manager: listen {} ({}), API token {}",
            self.manager.listen,
            if self.manager.tls_cert_file.is_some() {
                "https"
            } else {
                "plain http, loopback only"
            },
            if self.manager.api_token.is_some() || self.manager.api_token_file.is_some() {
                "configured"
            } else {
                "not configured (state-changing API calls are refused)"
            }
        );
        out
    }
}
