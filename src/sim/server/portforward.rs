//! `pods/portforward` as kubectl 1.32 speaks it: SPDY/3.1 streams, either
//! tunnelled through a WebSocket (`SPDY/3.1+portforward.k8s.io`, tried
//! first) or over a plain `Upgrade: SPDY/3.1` (the fallback). Per forwarded
//! connection the client opens an error stream and a data stream carrying
//! the same `requestID` and `port` headers; the data stream's bytes go to
//! a TCP connection the runtime dials inside the Pod, and anything written
//! to the error stream makes the client report (and drop) the forward.

use super::spdy::{self, Frame};
use super::{Ctx, Query};
use crate::error::ApiError;
use crate::runtime::Runtime;
use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::{Request, Response, StatusCode, header};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

const PORTFORWARD: &str = "portforward.k8s.io";
const TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";

/// Where the session's streams lead: a Pod and the runtime that runs it.
#[derive(Clone)]
struct Target {
    runtime: Arc<dyn Runtime>,
    ns: String,
    pod: String,
}

pub async fn portforward(
    ctx: Ctx,
    ns: &str,
    pod: &str,
    _q: &Query,
    mut req: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    let runtime = ctx
        .cluster
        .runtime()
        .ok_or_else(|| ApiError::new(500, "InternalError", "no kubelet runtime in this cluster"))?;
    super::exec::running_pod(&ctx, ns, pod)?;
    let target = Target {
        runtime,
        ns: ns.to_string(),
        pod: pod.to_string(),
    };
    let headers = req.headers();
    let wants = |name: header::HeaderName, what: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|p| p.trim().eq_ignore_ascii_case(what)))
    };
    if wants(header::SEC_WEBSOCKET_PROTOCOL, TUNNEL) {
        let (mut parts, _) = req.into_parts();
        let ws = WebSocketUpgrade::from_request_parts(&mut parts, &())
            .await
            .map_err(|e| ApiError::bad_request(format!("port-forward WebSocket upgrade: {e}")))?
            .protocols([TUNNEL]);
        return Ok(ws.on_upgrade(move |socket| tunnel(socket, target)));
    }
    if !wants(header::UPGRADE, "SPDY/3.1") {
        return Err(ApiError::bad_request(
            "port-forward needs an upgrade to SPDY/3.1 (or a WebSocket with the \
             SPDY/3.1+portforward.k8s.io subprotocol)",
        ));
    }
    if !headers
        .get_all("x-stream-protocol-version")
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains(PORTFORWARD)))
    {
        return Err(ApiError::bad_request(format!(
            "unable to upgrade: no common stream protocol (this server speaks {PORTFORWARD})"
        )));
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => session(TokioIo::new(io), target).await,
            Err(e) => tracing::debug!(error = %e, "port-forward upgrade failed"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .header("X-Stream-Protocol-Version", PORTFORWARD)
        .body(Body::empty())
        .map_err(|e| ApiError::new(500, "InternalError", e.to_string()))
}

/// SPDY bytes in WebSocket binary messages, bridged to a byte stream.
async fn tunnel(socket: WebSocket, target: Target) {
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    let (mut rd, mut wr) = tokio::io::split(theirs);
    let (mut sink, mut source) = socket.split();
    let up = async move {
        while let Some(Ok(msg)) = source.next().await {
            let data = match msg {
                Message::Binary(b) => b,
                Message::Close(_) => break,
                _ => continue,
            };
            if wr.write_all(&data).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0
                || sink
                    .send(Message::Binary(Bytes::copy_from_slice(&buf[..n])))
                    .await
                    .is_err()
            {
                break;
            }
        }
        let _ = sink.close().await;
    };
    tokio::select! {
        _ = session(ours, target) => {}
        _ = async { tokio::join!(up, down) } => {}
    }
}

/// One stream the client opened, until both halves of its request are in.
struct Half {
    kind: String,
    id: u32,
    inbound: Option<mpsc::Receiver<Bytes>>,
}

/// Reads frames, answers SYN_STREAMs and PINGs, routes DATA to the streams
/// and starts one forward per request once its error and data streams exist.
async fn session<S: AsyncRead + AsyncWrite + Send + 'static>(io: S, target: Target) {
    let (mut rd, mut wr) = tokio::io::split(io);
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(256);
    let writer = tokio::spawn(async move {
        while let Some(f) = out_rx.recv().await {
            if wr.write_all(&f).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    let mut s = Session {
        target,
        out: out_tx,
        headers: spdy::Headers::default(),
        streams: HashMap::new(),
        waiting: HashMap::new(),
        forwards: tokio::task::JoinSet::new(),
    };
    loop {
        let go_on = match spdy::read_frame(&mut rd).await {
            Ok(Some(f)) => s.on_frame(f).await,
            Ok(None) => false,
            Err(e) => {
                tracing::debug!(error = %e, "port-forward session ends");
                false
            }
        };
        if !go_on {
            break;
        }
    }
    s.forwards.abort_all();
    drop(s);
    writer.abort();
}

/// The state of one port-forward connection.
struct Session {
    target: Target,
    out: mpsc::Sender<Vec<u8>>,
    headers: spdy::Headers,
    /// Open streams → where their DATA goes.
    streams: HashMap<u32, mpsc::Sender<Bytes>>,
    /// `requestID/port` → the first stream of a request, until its pair comes.
    waiting: HashMap<String, Half>,
    forwards: tokio::task::JoinSet<()>,
}

impl Session {
    /// Handles one frame; false ends the session.
    async fn on_frame(&mut self, frame: Frame) -> bool {
        match frame {
            Frame::Data {
                stream,
                flags,
                data,
            } => {
                if let Some(tx) = self.streams.get(&stream)
                    && !data.is_empty()
                    && tx.send(Bytes::from(data)).await.is_err()
                {
                    self.streams.remove(&stream);
                }
                if flags & spdy::FLAG_FIN != 0 {
                    self.streams.remove(&stream);
                }
                true
            }
            Frame::Control { kind, data } => match kind {
                spdy::SYN_STREAM => self.on_syn_stream(&data).await,
                spdy::PING => self.out.send(spdy::ping_frame(&data)).await.is_ok(),
                spdy::RST_STREAM => {
                    if let Some(id) = spdy::stream_id(&data) {
                        self.streams.remove(&id);
                    }
                    true
                }
                spdy::GOAWAY => false,
                _ => true,
            },
        }
    }

    /// Accepts a stream and, when it completes a request, starts its forward.
    async fn on_syn_stream(&mut self, data: &[u8]) -> bool {
        let Some(id) = spdy::stream_id(data) else {
            return false;
        };
        let h = match self.headers.syn_stream(data) {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!(error = %e, "port-forward: bad SYN_STREAM");
                return false;
            }
        };
        let Ok(reply) = self.headers.syn_reply(id) else {
            return false;
        };
        if self.out.send(reply).await.is_err() {
            return false;
        }
        let (tx, rx) = mpsc::channel(64);
        self.streams.insert(id, tx);
        let get = |k: &str| h.get(k).cloned().unwrap_or_default();
        let (request, port) = (get("requestid"), get("port"));
        let half = Half {
            kind: get("streamtype"),
            id,
            inbound: Some(rx),
        };
        let key = format!("{request}/{port}");
        match self.waiting.remove(&key) {
            Some(other) => {
                let (error, data) = if half.kind == "error" {
                    (half, other)
                } else {
                    (other, half)
                };
                let f = forward(self.target.clone(), port, error.id, data, self.out.clone());
                self.forwards.spawn(f);
            }
            None => {
                self.waiting.insert(key, half);
            }
        }
        true
    }
}

/// Copies one forwarded connection both ways; a dial failure goes to the
/// error stream, which is closed (empty on success) when the copy is done.
async fn forward(
    target: Target,
    port: String,
    error_id: u32,
    mut data: Half,
    out: mpsc::Sender<Vec<u8>>,
) {
    let conn = match port.parse::<u16>() {
        Ok(p) if p > 0 => {
            target
                .runtime
                .port_forward(&target.ns, &target.pod, p)
                .await
        }
        _ => Err(format!("invalid port {port:?} in the port-forward request")),
    };
    let conn = match conn {
        Ok(c) => c,
        Err(msg) => {
            let _ = out
                .send(spdy::data_frame(error_id, true, msg.as_bytes()))
                .await;
            let _ = out.send(spdy::data_frame(data.id, true, &[])).await;
            return;
        }
    };
    let (mut rd, mut wr) = conn.into_split();
    let mut inbound = data.inbound.take();
    let up = async move {
        if let Some(rx) = inbound.as_mut() {
            while let Some(b) = rx.recv().await {
                if wr.write_all(&b).await.is_err() {
                    break;
                }
            }
        }
        let _ = wr.shutdown().await;
    };
    let out2 = out.clone();
    let down = async move {
        let mut buf = vec![0u8; 32 * 1024];
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0
                || out2
                    .send(spdy::data_frame(data.id, false, &buf[..n]))
                    .await
                    .is_err()
            {
                break;
            }
        }
        let _ = out2.send(spdy::data_frame(data.id, true, &[])).await;
    };
    // The Pod closing its side ends the forward, as the kubelet's copy does.
    tokio::select! {
        _ = down => {}
        _ = async { up.await; std::future::pending::<()>().await } => {}
    }
    let _ = out.send(spdy::data_frame(error_id, true, &[])).await;
}
