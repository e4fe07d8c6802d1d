//! The "host" runtime: pods become Running and Ready at once and `exec` runs
//! the command as a plain process on this machine. It proves the exec and log
//! plumbing end to end (kubectl exec, kube-rs `AttachedProcess`) without the
//! virtual or process runtimes.

use super::cluster::{Cluster, DeleteOpts, Sub, WriteOpts};
use super::resources::ResKey;
use super::runtime::{ExecOutcome, ExecRequest, LogRequest, Runtime};
use super::store::{EventType, str_at};
use crate::json_ptr::Ptr;
use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

pub struct HostRuntime;

fn pods() -> ResKey {
    ResKey {
        group: String::new(),
        plural: "pods".into(),
    }
}

/// Marks a pod the scheduler bound as running and ready; deletes it when it
/// is being deleted (termination is instant here). Pods not bound yet, or
/// on a node whose kubelet is down, are left alone (`_node` is kept for
/// callers; the scheduler picks the node now).
pub fn settle_pod(c: &Cluster, v: &Value, _node: &str) {
    let node = str_at(v, "/spec/nodeName");
    if node.is_empty() || c.nodes.is_down(node) {
        return;
    }
    let Some(rt) = c.type_of(&pods()) else { return };
    let ns = str_at(v, "/metadata/namespace").to_string();
    let name = str_at(v, "/metadata/name").to_string();
    if v.ptr("/metadata/deletionTimestamp").is_some() {
        let _ = c.delete(
            &rt,
            &ns,
            &name,
            &DeleteOpts {
                grace_period: Some(0),
                ..Default::default()
            },
        );
        return;
    }
    let opts = WriteOpts {
        field_manager: "kubelet".into(),
        ..Default::default()
    };
    // Running and Ready: nothing to report. (Ready=False on a Running pod
    // is the node controller's mark while the kubelet was down.)
    let ready = v
        .ptr("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| str_at(c, "/type") == "Ready" && str_at(c, "/status") == "True")
        });
    if str_at(v, "/status/phase") == "Running" && ready {
        return;
    }
    if let Some(why) = super::volume_wait::blocked(c, v) {
        super::volume_wait::hold(c, v, &why);
        return;
    }
    let ip = match str_at(v, "/status/podIP") {
        "" => c.ipam.pod_ip(),
        known => known.to_string(),
    };
    let now = super::cluster::now_rfc3339();
    let statuses: Vec<Value> = v
        .ptr("/spec/containers")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .map(|ct| json!({"name": str_at(ct, "/name"), "image": str_at(ct, "/image"), "ready": true,
                    "started": true, "restartCount": 0, "state": {"running": {"startedAt": now}}}))
                .collect()
        })
        .unwrap_or_default();
    let _ = c.write(&rt, &ns, &name, Sub::Status, &opts, false, |cur| {
        let mut v = cur.cloned().unwrap_or_default();
        v["status"] = json!({
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1", "startTime": now,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "True", "lastTransitionTime": now},
            ],
            "containerStatuses": statuses,
        });
        Ok(v)
    });
}

/// Leaves a pod Pending the way a kubelet does when its image cannot be
/// pulled (written once; later events for the pod change nothing).
pub fn hold_image_pull(c: &Cluster, v: &Value) {
    if str_at(v, "/spec/nodeName").is_empty() {
        return;
    }
    if str_at(v, "/status/phase") == "Pending"
        && v.ptr("/status/containerStatuses/0/state/waiting").is_some()
    {
        return;
    }
    let Some(rt) = c.type_of(&pods()) else { return };
    let ns = str_at(v, "/metadata/namespace").to_string();
    let name = str_at(v, "/metadata/name").to_string();
    let image = str_at(v, "/spec/containers/0/image").to_string();
    let now = super::cluster::now_rfc3339();
    let opts = WriteOpts {
        field_manager: "kubelet".into(),
        ..Default::default()
    };
    let _ = c.write(&rt, &ns, &name, Sub::Status, &opts, false, |cur| {
        let mut v = cur.cloned().unwrap_or_default();
        v["status"] = json!({
            "phase": "Pending", "hostIP": "127.0.0.1", "startTime": now,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": now},
            ],
            "containerStatuses": [{"name": str_at(&v, "/spec/containers/0/name"), "image": image, "ready": false,
                "started": false, "restartCount": 0, "imageID": "",
                "state": {"waiting": {"reason": "ImagePullBackOff",
                    "message": format!("Back-off pulling image \"{image}\": not found in the registry")}}}],
        });
        Ok(v)
    });
}

impl Runtime for HostRuntime {
    fn start(self: Arc<Self>, cluster: Arc<Cluster>) {
        let weak = Arc::downgrade(&cluster);
        let (_, mut rx) = cluster.store.subscribe();
        let (existing, _) = cluster.store.list(&pods(), None, None);
        drop(cluster);
        tokio::spawn(async move {
            if let Some(c) = weak.upgrade() {
                for p in existing {
                    settle_pod(&c, &p.value(), "sim-node");
                }
            }
            loop {
                match rx.recv().await {
                    Ok(ev) => {
                        let Some(c) = weak.upgrade() else { return };
                        if ev.key == pods() && ev.kind != EventType::Deleted {
                            settle_pod(&c, &ev.obj.value(), "sim-node");
                        }
                    }
                    // Fell behind the live channel: settle every pod again.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        let Some(c) = weak.upgrade() else { return };
                        let (all, _) = c.store.list(&pods(), None, None);
                        for p in all {
                            settle_pod(&c, &p.value(), "sim-node");
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }

    /// A kubelet that comes back finishes what happened meanwhile (pods
    /// deleted while it was down go now).
    fn node_changed(&self, c: &Arc<Cluster>, node: &str) {
        if !c.nodes.is_down(node) {
            for p in crate::nodes::pods_on(c, node) {
                settle_pod(c, &p, node);
            }
        }
    }

    fn exec(&self, req: ExecRequest) -> BoxFuture<'static, ExecOutcome> {
        Box::pin(async move {
            let Some((prog, args)) = req.command.split_first() else {
                return ExecOutcome::Failed("empty command".into());
            };
            let mut cmd = tokio::process::Command::new(prog);
            cmd.args(args)
                .env("POD_NAME", &req.pod)
                .env("POD_NAMESPACE", &req.namespace)
                .stdin(if req.stdin.is_some() {
                    std::process::Stdio::piped()
                } else {
                    std::process::Stdio::null()
                })
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true);
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    // The shell's convention, as a container runtime reports it:
                    // 127 for a command that is not there, 126 for one that cannot run.
                    let code = if e.kind() == std::io::ErrorKind::NotFound {
                        127
                    } else {
                        126
                    };
                    let _ = req
                        .stderr
                        .send(Bytes::from(format!(
                            "exec: \"{prog}\": {e} (runtime \"host\" runs commands on this machine)\n"
                        )))
                        .await;
                    return ExecOutcome::Exited(code);
                }
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
            let pump = |r: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>,
                        tx: mpsc::Sender<Bytes>| async move {
                let Some(mut r) = r else { return };
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n) = r.read(&mut buf).await {
                    if n == 0 || tx.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                        break;
                    }
                }
            };
            let out = child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>);
            let err = child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>);
            tokio::join!(pump(out, req.stdout), pump(err, req.stderr));
            match child.wait().await {
                Ok(st) => ExecOutcome::Exited(st.code().unwrap_or(137)),
                Err(e) => ExecOutcome::Failed(format!("waiting for {prog}: {e}")),
            }
        })
    }

    fn logs(&self, req: LogRequest) -> BoxFuture<'static, Result<mpsc::Receiver<Bytes>, String>> {
        Box::pin(async move {
            let (tx, rx) = mpsc::channel(4);
            let line = format!(
                "{}/{} container {} started\n",
                req.namespace, req.pod, req.container
            );
            let _ = tx.send(Bytes::from(line)).await;
            Ok(rx)
        })
    }
}
