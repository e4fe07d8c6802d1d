//! The kubelet side of an emulated cluster, pluggable so the same API server
//! runs pods as in-memory models (virtual), as real local processes (process),
//! or as plain host commands (the test runtime that proves the exec and log
//! plumbing).

use super::cluster::Cluster;
use bytes::Bytes;
use futures::future::BoxFuture;
use std::sync::Arc;
use tokio::sync::mpsc;

/// One `pods/exec` call.
pub struct ExecRequest {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub command: Vec<String>,
    /// None when the client did not ask for stdin.
    pub stdin: Option<mpsc::Receiver<Bytes>>,
    pub stdout: mpsc::Sender<Bytes>,
    pub stderr: mpsc::Sender<Bytes>,
}

/// How an exec ended.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecOutcome {
    Exited(i32),
    /// The call could not run (pod missing, container unknown, partitioned).
    Failed(String),
}

/// One `pods/log` call.
pub struct LogRequest {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub follow: bool,
    pub tail_lines: Option<usize>,
}

/// What one container (or the node) uses, as the metrics API reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerUsage {
    pub name: String,
    pub cpu_nanocores: u64,
    pub memory_bytes: u64,
}

/// One sampling of the runtime's containers for `metrics.k8s.io`.
#[derive(Debug, Clone, Default)]
pub struct UsageReport {
    /// How long CPU was measured.
    pub window: std::time::Duration,
    /// (namespace, pod) → its running containers.
    pub pods: std::collections::HashMap<(String, String), Vec<ContainerUsage>>,
    /// The node's usage (the whole machine).
    pub node: Option<ContainerUsage>,
}

pub trait Runtime: Send + Sync {
    /// Starts the runtime's own loops (it watches pods through the store, the
    /// way a kubelet watches the API server).
    fn start(self: Arc<Self>, cluster: Arc<Cluster>);
    fn exec(&self, req: ExecRequest) -> BoxFuture<'static, ExecOutcome>;
    /// Log bytes; a follow stream ends when the container stops.
    fn logs(&self, req: LogRequest) -> BoxFuture<'static, Result<mpsc::Receiver<Bytes>, String>>;
    /// Resource usage of the running containers; `None` for runtimes that
    /// run no processes (the metrics API then reports zeros).
    /// The kubelet of `node` stopped or came back
    /// ([`crate::nodes::NodeState::is_down`]): a runtime that runs processes
    /// kills the node's pods, or starts them again.
    fn node_changed(&self, _cluster: &Arc<Cluster>, _node: &str) {}
    /// The kubelet's NodeExpandVolume for a mounted claim grown to `bytes`:
    /// a runtime whose volumes have a real size grows the file system; the
    /// claim's new capacity shows only once this succeeded.
    fn expand_volume(&self, _namespace: &str, _claim: &str, _bytes: u64) -> Result<(), String> {
        Ok(())
    }
    fn usage(&self) -> BoxFuture<'static, Option<UsageReport>> {
        Box::pin(async { None })
    }
    /// A TCP connection to `port` inside the Pod (`pods/portforward`), as a
    /// kubelet dials it in the Pod's network namespace.
    fn port_forward(
        &self,
        namespace: &str,
        pod: &str,
        port: u16,
    ) -> BoxFuture<'static, Result<tokio::net::TcpStream, String>> {
        let msg = format!(
            "pod {namespace}/{pod}: port-forward to port {port} needs the process runtime \
             (this runtime runs no network servers)"
        );
        Box::pin(async move { Err(msg) })
    }
}
