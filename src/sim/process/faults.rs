//! Faults for chaos tests and demos (kill -9, freeze/thaw, partition/heal),
//! and the `pods/exec` plumbing that partitions cut off.

use super::ProcessRuntime;
use super::pod::PodRun;
use crate::runtime::{ExecOutcome, ExecRequest};
use anyhow::Context;
use bytes::Bytes;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

impl ProcessRuntime {
    fn pod_or_err(&self, ns: &str, name: &str) -> anyhow::Result<Arc<PodRun>> {
        self.pod(ns, name)
            .with_context(|| format!("pod {ns}/{name} is not running on this runtime"))
    }

    /// Fault: kill -9 the container (all its processes); it restarts per policy.
    /// An empty `container` means every container of the Pod.
    pub fn kill_container(&self, ns: &str, pod: &str, container: &str) -> anyhow::Result<()> {
        let p = self.pod_or_err(ns, pod)?;
        let cs: Vec<_> = p
            .containers()
            .into_iter()
            .filter(|c| container.is_empty() || c.spec.name == container)
            .collect();
        anyhow::ensure!(
            !cs.is_empty(),
            "pod {ns}/{pod} has no container {container:?}"
        );
        for ct in cs {
            ct.signal_all("KILL")?;
        }
        Ok(())
    }

    fn signal_pod(&self, ns: &str, pod: &str, sig: &str) -> anyhow::Result<()> {
        let p = self.pod_or_err(ns, pod)?;
        for ct in p.containers() {
            ct.signal_all(sig)?;
        }
        Ok(())
    }

    /// Fault: SIGSTOP every process of the Pod (probes start failing).
    pub fn freeze(&self, ns: &str, pod: &str) -> anyhow::Result<()> {
        self.signal_pod(ns, pod, "STOP")
    }

    /// Undoes [`freeze`](Self::freeze) with SIGCONT.
    pub fn thaw(&self, ns: &str, pod: &str) -> anyhow::Result<()> {
        self.signal_pod(ns, pod, "CONT")
    }

    /// Fault: the Pod gets no Service traffic (open connections are closed)
    /// and `pods/exec` into it fails, until [`heal`](Self::heal).
    /// Its Ready condition also turns False, as the node controller does
    /// for pods on a node it cannot reach.
    pub fn partition(&self, ns: &str, pod: &str) {
        super::lock(&self.partitioned).insert(format!("{ns}/{pod}"));
        if let Some(p) = self.pod(ns, pod) {
            p.set_unreachable(true);
        }
        self.proxy_wake.notify_one();
    }

    pub fn heal(&self, ns: &str, pod: &str) {
        super::lock(&self.partitioned).remove(&format!("{ns}/{pod}"));
        if let Some(p) = self.pod(ns, pod) {
            p.set_unreachable(false);
        }
        self.proxy_wake.notify_one();
    }

    pub fn is_partitioned(&self, ns: &str, pod: &str) -> bool {
        super::lock(&self.partitioned).contains(&format!("{ns}/{pod}"))
    }

    /// Host pid of a running container's PID 1 (empty name: the first container).
    pub fn container_pid(&self, ns: &str, pod: &str, container: &str) -> Option<u32> {
        self.pod(ns, pod)?.container(container)?.state().pid
    }
}

/// Runs an exec command, wiring stdin/stdout/stderr to the request.
pub async fn run_exec(mut cmd: tokio::process::Command, req: ExecRequest) -> ExecOutcome {
    cmd.stdin(if req.stdin.is_some() {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    })
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return ExecOutcome::Failed(format!("starting nsenter: {e}")),
    };
    if let (Some(mut rx), Some(mut sin)) = (req.stdin, child.stdin.take()) {
        tokio::spawn(async move {
            while let Some(b) = rx.recv().await {
                if sin.write_all(&b).await.is_err() {
                    break;
                }
            }
        });
    }
    async fn pump(r: Option<impl tokio::io::AsyncRead + Unpin>, tx: mpsc::Sender<Bytes>) {
        let Some(mut r) = r else { return };
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = r.read(&mut buf).await {
            if n == 0 || tx.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                break;
            }
        }
    }
    let (out, err) = (child.stdout.take(), child.stderr.take());
    tokio::join!(pump(out, req.stdout), pump(err, req.stderr));
    match child.wait().await {
        Ok(st) => {
            use std::os::unix::process::ExitStatusExt;
            ExecOutcome::Exited(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(9)))
        }
        Err(e) => ExecOutcome::Failed(format!("waiting for the command: {e}")),
    }
}
