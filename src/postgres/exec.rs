//! Running `pgfleet-instance <verb>` in an instance Pod through pods/exec —
//! the only way the manager talks to an instance (no network access to pods
//! is needed).
//!
//! kube buffers each output channel in a small pipe: a reader that waits for
//! stdout to end before it looks at stderr leaves a chatty verb blocked on a
//! full stderr pipe until its deadline. Both channels are therefore read at
//! the same time, and only a bounded prefix of each is kept (the rest is
//! drained), so a verb can neither stall nor flood the manager's memory.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::AttachParams;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _};

pub const SCRIPT_PATH: &str = "/etc/pgfleet/config/pgfleet-instance";
/// Most of a verb's stdout that is kept (one JSON line by contract).
pub const STDOUT_CAP: usize = 1024 * 1024;
/// Most of a verb's stderr that is kept (it only feeds error messages).
pub const STDERR_CAP: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("exec into {pod} failed: {source}")]
    Start { pod: String, source: kube::Error },
    #[error("{verb} in {pod} failed: {message}")]
    Verb {
        pod: String,
        verb: String,
        message: String,
        /// The command's exit code when the kubelet reported one (126/127:
        /// the image cannot run it, see `controller::blocked`).
        exit_code: Option<i32>,
    },
    #[error("{verb} in {pod} did not finish within {timeout:?}")]
    Timeout {
        pod: String,
        verb: String,
        timeout: Duration,
    },
}

/// What was read from one output channel.
#[derive(Debug, Default, PartialEq)]
pub struct Captured {
    /// At most the cap's worth of the stream's first bytes.
    pub kept: Vec<u8>,
    /// Bytes read and dropped past the cap.
    pub dropped: u64,
}

impl Captured {
    /// The kept bytes as text, saying how much was cut.
    pub fn text(&self) -> String {
        let mut s = String::from_utf8_lossy(&self.kept).into_owned();
        if self.dropped > 0 {
            s.push_str(&format!(" […{} more bytes not kept]", self.dropped));
        }
        s
    }
}

/// Reads `r` to its end, keeping at most `cap` bytes and draining the rest
/// so the writer never blocks on a full pipe. A read error ends the stream
/// (what was kept is returned).
pub async fn read_capped<R: AsyncRead + Unpin>(mut r: R, cap: usize) -> Captured {
    let mut out = Captured::default();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => {
                let room = cap.saturating_sub(out.kept.len());
                let take = n.min(room);
                out.kept.extend_from_slice(&buf[..take]);
                out.dropped = out.dropped.saturating_add((n - take) as u64);
            }
        }
    }
}

/// A channel the session does not have reads as empty.
async fn read_opt<R: AsyncRead + Unpin>(r: Option<R>, cap: usize) -> Captured {
    match r {
        Some(r) => read_capped(r, cap).await,
        None => Captured::default(),
    }
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
    let what = format!("pgfleet-instance {}", verb.join(" "));
    run_command(client, ns, pod, "postgres", argv, &what, timeout).await
}

/// Runs one verb with `input` on its stdin (closed after it): how SQL that
/// may carry credentials reaches an instance, never through the argv (the
/// API server's audit log records an exec's command).
pub async fn run_verb_stdin(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    verb: &[&str],
    input: String,
    timeout: Duration,
) -> Result<String, ExecError> {
    let mut argv: Vec<String> = vec!["/bin/sh".into(), SCRIPT_PATH.into()];
    argv.extend(verb.iter().map(|s| s.to_string()));
    let what = format!("pgfleet-instance {}", verb.join(" "));
    exec(
        client,
        ns,
        pod,
        "postgres",
        argv,
        Some(input),
        &what,
        timeout,
    )
    .await
}

/// Runs `argv` in `container` of `pod` and returns its (capped) stdout;
/// `what` names the command in errors (never the argv, which may be long).
/// The whole exchange — connecting, running, reading — is under `timeout`;
/// when it passes, the session is dropped (kube aborts it).
pub async fn run_command(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    container: &str,
    argv: Vec<String>,
    what: &str,
    timeout: Duration,
) -> Result<String, ExecError> {
    exec(client, ns, pod, container, argv, None, what, timeout).await
}

#[allow(clippy::too_many_arguments)]
async fn exec(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    container: &str,
    argv: Vec<String>,
    input: Option<String>,
    what: &str,
    timeout: Duration,
) -> Result<String, ExecError> {
    let fut = async {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let params = AttachParams::default()
            .container(container)
            .stdin(input.is_some())
            .stdout(true)
            .stderr(true);
        let mut proc = api
            .exec(pod, argv, &params)
            .await
            .map_err(|source| ExecError::Start {
                pod: pod.to_string(),
                source,
            })?;
        let stdin = proc.stdin();
        // Written while the output is read (no verb can block the other
        // side), then closed (dropped) so the verb sees EOF; a write error
        // shows as the verb's own failure.
        let write = async move {
            if let (Some(text), Some(mut w)) = (input, stdin) {
                use tokio::io::AsyncWriteExt as _;
                let _ = w.write_all(text.as_bytes()).await;
                let _ = w.shutdown().await;
            }
        };
        let (_, out, err) = tokio::join!(
            write,
            read_opt(proc.stdout(), STDOUT_CAP),
            read_opt(proc.stderr(), STDERR_CAP)
        );
        let status = match proc.take_status() {
            Some(s) => s.await,
            None => None,
        };
        let failed = status.as_ref().and_then(|s| s.status.as_deref()) == Some("Failure");
        if failed {
            let exit_code = status.as_ref().and_then(exit_code);
            let msg = status.and_then(|s| s.message).unwrap_or_default();
            return Err(ExecError::Verb {
                pod: pod.to_string(),
                verb: what.to_string(),
                message: format!("{msg} {}", err.text().trim()).trim().to_string(),
                exit_code,
            });
        }
        Ok(out.text())
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| ExecError::Timeout {
            pod: pod.to_string(),
            verb: what.to_string(),
            timeout,
        })?
}

/// The exit code a failed exec's Status carries (`details.causes` with
/// reason `ExitCode`, as the kubelet reports it).
fn exit_code(s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Status) -> Option<i32> {
    s.details
        .as_ref()?
        .causes
        .as_ref()?
        .iter()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message.as_deref()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    /// A writer that emits far more than a pipe holds on both channels
    /// finishes when both are read together, and only the caps are kept.
    #[tokio::test]
    async fn chatty_streams_are_read_together_and_capped() {
        let (out_r, mut out_w) = tokio::io::simplex(1024);
        let (err_r, mut err_w) = tokio::io::simplex(1024);
        let writer = tokio::spawn(async move {
            // stderr first: a sequential reader of stdout would deadlock here.
            for _ in 0..200 {
                err_w.write_all(&[b'e'; 1024]).await.ok();
            }
            err_w.shutdown().await.ok();
            for _ in 0..64 {
                out_w.write_all(&[b'o'; 1024]).await.ok();
            }
            out_w.shutdown().await.ok();
        });
        let (out, err) = tokio::join!(read_capped(out_r, 10_000), read_capped(err_r, 4096));
        writer.await.ok();
        assert_eq!(out.kept.len(), 10_000);
        assert_eq!(out.dropped, 64 * 1024 - 10_000);
        assert_eq!(err.kept.len(), 4096);
        assert_eq!(err.dropped, 200 * 1024 - 4096);
        assert!(err.text().contains("more bytes not kept"));
    }

    #[tokio::test]
    async fn short_output_is_kept_whole() {
        let (r, mut w) = tokio::io::simplex(64);
        tokio::spawn(async move {
            w.write_all(b"{\"ok\":true}\n").await.ok();
            w.shutdown().await.ok();
        });
        let c = read_capped(r, STDOUT_CAP).await;
        assert_eq!(c.text(), "{\"ok\":true}\n");
        assert_eq!(c.dropped, 0);
    }
}
