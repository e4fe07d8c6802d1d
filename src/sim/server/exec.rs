//! `pods/exec` over WebSocket with the Kubernetes channel protocols
//! (`v5.channel.k8s.io`, `v4.channel.k8s.io`): one byte of channel (0 stdin,
//! 1 stdout, 2 stderr, 3 status, 4 resize, 255 close in v5) before each
//! payload, and a final `Status` on channel 3. Also `pods/log`.

use super::{Ctx, Query};
use crate::error::ApiError;
use crate::json_ptr::Ptr;
use crate::runtime::{ExecOutcome, ExecRequest, LogRequest};
use crate::store::str_at;
use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::{Request, Response, StatusCode, header};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;

const PROTOCOLS: [&str; 4] = [
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "channel.k8s.io",
];

/// The Pod a streaming call goes to, which must exist and be running.
pub(super) fn running_pod(ctx: &Ctx, ns: &str, pod: &str) -> Result<Value, ApiError> {
    let key = crate::resources::ResKey {
        group: String::new(),
        plural: "pods".into(),
    };
    let p = ctx
        .cluster
        .store
        .get(&key, ns, pod)
        .map(|o| o.value())
        .ok_or_else(|| ApiError::not_found("pods", pod))?;
    kubelet_reachable(ctx, &p)?;
    let phase = str_at(&p, "/status/phase");
    if phase != "Running" {
        return Err(ApiError::bad_request(format!(
            "pod {pod} is not running (phase {phase:?})"
        )));
    }
    Ok(p)
}

/// exec, logs and port-forward go through the pod's kubelet: on a node
/// whose kubelet is down they fail as the API server's dial does.
fn kubelet_reachable(ctx: &Ctx, pod: &Value) -> Result<(), ApiError> {
    let node = str_at(pod, "/spec/nodeName");
    if ctx.cluster.nodes.is_down(node) {
        return Err(ApiError::new(
            500,
            "InternalError",
            format!("error dialing backend: dial tcp {node}:10250: connect: no route to host"),
        ));
    }
    Ok(())
}

fn container_of(ctx: &Ctx, ns: &str, pod: &str, q: &Query) -> Result<String, ApiError> {
    let key = crate::resources::ResKey {
        group: String::new(),
        plural: "pods".into(),
    };
    let p = ctx
        .cluster
        .store
        .get(&key, ns, pod)
        .map(|o| o.value())
        .ok_or_else(|| ApiError::not_found("pods", pod))?;
    kubelet_reachable(ctx, &p)?;
    let names: Vec<String> = p
        .ptr("/spec/containers")
        .and_then(Value::as_array)
        .map(|cs| cs.iter().map(|c| str_at(c, "/name").to_string()).collect())
        .unwrap_or_default();
    match q.get("container") {
        Some(c) if names.iter().any(|n| n == c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {pod}"
        ))),
        None => names
            .first()
            .cloned()
            .ok_or_else(|| ApiError::bad_request(format!("pod {pod} has no containers"))),
    }
}

pub async fn exec(
    ctx: Ctx,
    ns: &str,
    pod: &str,
    q: &Query,
    req: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    let runtime = ctx
        .cluster
        .runtime()
        .ok_or_else(|| ApiError::new(500, "InternalError", "no kubelet runtime in this cluster"))?;
    let container = container_of(&ctx, ns, pod, q)?;
    let command = q.all("command");
    if command.is_empty() {
        return Err(ApiError::bad_request("you must specify at least 1 command"));
    }
    let line = command.join(" ");
    let faults = ctx.cluster.faults.get();
    let injected = faults
        .failing_exec
        .into_iter()
        .find(|f| line.contains(f.as_str()))
        .map(|f| (format!("injected failure (faults.failing_exec {f:?})\n"), 1));
    let missing = faults
        .missing_exec
        .into_iter()
        .find(|f| line.contains(f.as_str()))
        .map(|f| (format!("sh: 0: cannot open {f}: No such file\n"), 127));
    let injected = injected.or(missing);
    let hang = faults
        .hanging_exec
        .iter()
        .any(|f| line.contains(f.as_str()));
    ctx.cluster.execs.record(crate::exec_log::ExecRecord {
        namespace: ns.to_string(),
        pod: pod.to_string(),
        container: container.clone(),
        command: line,
    });
    let want_stdin = q.flag("stdin");
    let (mut parts, _) = req.into_parts();
    let ws = WebSocketUpgrade::from_request_parts(&mut parts, &())
        .await
        .map_err(|_| {
            ApiError::bad_request("exec needs a WebSocket upgrade (SPDY is not supported)")
        })?
        .protocols(PROTOCOLS);
    let (ns, pod) = (ns.to_string(), pod.to_string());
    Ok(ws.on_upgrade(move |socket| async move {
        let v5 = socket.protocol().and_then(|p| p.to_str().ok()) == Some(PROTOCOLS[0]);
        session(socket, v5, want_stdin, move |stdin, stdout, stderr| {
            if let Some((msg, code)) = injected {
                return Box::pin(async move {
                    let _ = stderr.send(Bytes::from(msg)).await;
                    ExecOutcome::Exited(code)
                });
            }
            let hold = hang.then(|| stdout.clone());
            let run = runtime.exec(ExecRequest {
                namespace: ns,
                pod,
                container,
                command,
                stdin,
                stdout,
                stderr,
            });
            match hold {
                None => run,
                // Keeps stdout open, so the session sends no status.
                Some(hold) => Box::pin(async move {
                    let outcome = run.await;
                    tokio::time::sleep(crate::faults::HANG).await;
                    drop(hold);
                    outcome
                }),
            }
        })
        .await;
    }))
}

async fn session<F>(socket: WebSocket, v5: bool, want_stdin: bool, start: F)
where
    F: FnOnce(
        Option<mpsc::Receiver<Bytes>>,
        mpsc::Sender<Bytes>,
        mpsc::Sender<Bytes>,
    ) -> futures::future::BoxFuture<'static, ExecOutcome>,
{
    let (mut sink, mut source) = socket.split();
    let (in_tx, in_rx) = mpsc::channel::<Bytes>(64);
    let (out_tx, mut out_rx) = mpsc::channel::<Bytes>(64);
    let (err_tx, mut err_rx) = mpsc::channel::<Bytes>(64);
    let run = tokio::spawn(start(want_stdin.then_some(in_rx), out_tx, err_tx));
    // Client frames: stdin data, and in v5 the close signal for stdin.
    let reader = tokio::spawn(async move {
        let mut in_tx = Some(in_tx);
        while let Some(Ok(msg)) = source.next().await {
            let data = match msg {
                Message::Binary(b) => b,
                Message::Text(t) => Bytes::from(t.as_str().as_bytes().to_vec()),
                Message::Close(_) => break,
                _ => continue,
            };
            match data.first() {
                Some(0) if data.len() > 1 => {
                    if let Some(tx) = &in_tx
                        && tx.send(data.slice(1..)).await.is_err()
                    {
                        in_tx = None;
                    }
                }
                Some(255) if v5 && data.get(1) == Some(&0) => in_tx = None,
                _ => {}
            }
        }
    });
    let mut out_open = true;
    let mut err_open = true;
    while out_open || err_open {
        tokio::select! {
            b = out_rx.recv(), if out_open => match b {
                Some(b) => { if sink.send(frame(1, &b)).await.is_err() { break; } }
                None => out_open = false,
            },
            b = err_rx.recv(), if err_open => match b {
                Some(b) => { if sink.send(frame(2, &b)).await.is_err() { break; } }
                None => err_open = false,
            },
        }
    }
    let outcome = run
        .await
        .unwrap_or_else(|e| ExecOutcome::Failed(format!("exec task failed: {e}")));
    let status = match outcome {
        ExecOutcome::Exited(0) => json!({"metadata": {}, "status": "Success"}),
        ExecOutcome::Exited(code) => json!({
            "metadata": {}, "status": "Failure",
            "message": format!("command terminated with non-zero exit code: error executing command, exit status {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}
        }),
        ExecOutcome::Failed(msg) => {
            json!({"metadata": {}, "status": "Failure", "message": msg, "reason": "InternalError"})
        }
    };
    let _ = sink.send(frame(3, status.to_string().as_bytes())).await;
    let _ = sink
        .send(Message::Close(Some(axum::extract::ws::CloseFrame {
            code: 1000,
            reason: "".into(),
        })))
        .await;
    reader.abort();
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut b = Vec::with_capacity(data.len() + 1);
    b.push(channel);
    b.extend_from_slice(data);
    Message::Binary(Bytes::from(b))
}

pub async fn logs(ctx: Ctx, ns: &str, pod: &str, q: &Query) -> Result<Response<Body>, ApiError> {
    let runtime = ctx
        .cluster
        .runtime()
        .ok_or_else(|| ApiError::new(500, "InternalError", "no kubelet runtime in this cluster"))?;
    let container = container_of(&ctx, ns, pod, q)?;
    let rx = runtime
        .logs(LogRequest {
            namespace: ns.to_string(),
            pod: pod.to_string(),
            container,
            follow: q.flag("follow"),
            tail_lines: q.int("tailLines").map(|n| n.max(0) as usize),
        })
        .await
        .map_err(ApiError::bad_request)?;
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    let mut r = Response::new(Body::from_stream(stream));
    *r.status_mut() = StatusCode::OK;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    Ok(r)
}
