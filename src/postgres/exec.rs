//! Running `pgfleet-instance <verb>` in an instance Pod through pods/exec —
//! the only way the manager talks to an instance (no network access to pods
//! is needed).

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::AttachParams;
use std::time::Duration;
use tokio::io::AsyncReadExt as _;

pub const SCRIPT_PATH: &str = "/etc/pgfleet/config/pgfleet-instance";

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("exec into {pod} failed: {source}")]
    Start { pod: String, source: kube::Error },
    #[error("pgfleet-instance {verb} in {pod} failed: {message}")]
    Verb {
        pod: String,
        verb: String,
        message: String,
    },
    #[error("pgfleet-instance {verb} in {pod} did not finish within {timeout:?}")]
    Timeout {
        pod: String,
        verb: String,
        timeout: Duration,
    },
}

/// Runs one verb (with its arguments) and returns its stdout (one JSON line
/// by contract).
pub async fn run_verb(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    verb: &[&str],
    timeout: Duration,
) -> Result<String, ExecError> {
    let mut argv: Vec<String> = vec!["/bin/sh".into(), SCRIPT_PATH.into()];
    argv.extend(verb.iter().map(|s| s.to_string()));
    let verb = verb.join(" ");
    let verb = verb.as_str();
    let fut = async {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let params = AttachParams::default()
            .container("postgres")
            .stdin(false)
            .stdout(true)
            .stderr(true);
        let mut proc = api
            .exec(pod, argv, &params)
            .await
            .map_err(|source| ExecError::Start {
                pod: pod.to_string(),
                source,
            })?;
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut s) = proc.stdout() {
            let _ = s.read_to_string(&mut out).await;
        }
        if let Some(mut s) = proc.stderr() {
            let _ = s.read_to_string(&mut err).await;
        }
        let status = match proc.take_status() {
            Some(s) => s.await,
            None => None,
        };
        let failed = status.as_ref().and_then(|s| s.status.as_deref()) == Some("Failure");
        if failed {
            let msg = status.and_then(|s| s.message).unwrap_or_default();
            return Err(ExecError::Verb {
                pod: pod.to_string(),
                verb: verb.to_string(),
                message: format!("{msg} {}", err.trim()).trim().to_string(),
            });
        }
        Ok(out)
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| ExecError::Timeout {
            pod: pod.to_string(),
            verb: verb.to_string(),
            timeout,
        })?
}
