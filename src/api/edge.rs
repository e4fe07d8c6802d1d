//! The API server's own edges: how connections are accepted and how long
//! and how many requests may run.
//!
//! - A client gets `manager.header_read_timeout` to send its request's
//!   headers (and, with TLS, to finish the handshake); a half-sent request
//!   is closed instead of holding a connection and a task forever.
//! - A request (its body included) gets `manager.request_timeout`: a JSON
//!   503 when it runs out.
//! - At most `manager.max_concurrent_requests` requests run at once; one
//!   more is answered 503 with `Retry-After` at once instead of queueing
//!   without bound. `/healthz` and `/readyz` are exempt (cheap, and a kubelet
//!   must not restart a busy manager), and connections are capped at four
//!   times the request limit (more wait in the listen backlog).
//! - TLS natively when `manager.tls_cert_file` is set (`tls.rs`); plain
//!   HTTP only on a loopback address (config validation refuses anything
//!   else).

use super::error::ApiError;
use super::tls;
use crate::config::Manager;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Request limits the middleware enforces.
#[derive(Debug)]
pub struct Limits {
    requests: Arc<Semaphore>,
    request_timeout: Duration,
}

impl Limits {
    pub fn of(m: &Manager) -> Limits {
        Limits {
            requests: Arc::new(Semaphore::new(m.max_concurrent_requests.max(1) as usize)),
            request_timeout: m
                .request_timeout
                .parsed()
                .copied()
                .unwrap_or(Duration::from_secs(60)),
        }
    }
}

/// Whether a path skips the concurrency limit (probes).
fn exempt(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz")
}

/// The middleware: concurrency limit, then the request timeout.
pub async fn limit(State(limits): State<Arc<Limits>>, req: Request, next: Next) -> Response {
    if exempt(req.uri().path()) {
        return next.run(req).await;
    }
    let Ok(_permit) = limits.requests.clone().try_acquire_owned() else {
        let mut resp = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many concurrent requests (manager.max_concurrent_requests); retry shortly",
        )
        .into_response();
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return resp;
    };
    match tokio::time::timeout(limits.request_timeout, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the request did not finish within manager.request_timeout ({})",
                humantime::format_duration(limits.request_timeout)
            ),
        )
        .into_response(),
    }
}

/// How connections are accepted.
#[derive(Clone)]
pub struct Edge {
    tls: Option<tokio_rustls::TlsAcceptor>,
    header_read_timeout: Duration,
    connections: usize,
}

impl std::fmt::Debug for Edge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Edge")
            .field("tls", &self.tls.is_some())
            .field("header_read_timeout", &self.header_read_timeout)
            .finish()
    }
}

impl Edge {
    /// Loads the TLS files now, so a broken certificate stops `pgfleet run`
    /// before anything else starts.
    pub fn of(m: &Manager) -> Result<Edge, tls::TlsError> {
        let tls = match (&m.tls_cert_file, &m.tls_key_file) {
            (Some(c), Some(k)) => Some(tokio_rustls::TlsAcceptor::from(tls::server_config(
                c,
                k,
                m.tls_client_ca_file.as_deref(),
            )?)),
            _ => None,
        };
        Ok(Edge {
            tls,
            header_read_timeout: m
                .header_read_timeout
                .parsed()
                .copied()
                .unwrap_or(Duration::from_secs(10)),
            connections: (m.max_concurrent_requests.max(16) as usize).saturating_mul(4),
        })
    }

    /// `https` or `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// Accepts connections until the task is dropped.
    pub async fn serve(self, listener: TcpListener, app: Router) {
        let slots = Arc::new(Semaphore::new(self.connections));
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors and the like: back off, go on.
                    tracing::warn!(error = %e, "accepting an API connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (edge, app) = (self.clone(), app.clone());
            tokio::spawn(async move {
                edge.connection(stream, app).await;
                drop(slot);
            });
        }
    }

    async fn connection(&self, stream: TcpStream, app: Router) {
        match &self.tls {
            Some(acceptor) => {
                let accepted =
                    tokio::time::timeout(self.header_read_timeout, acceptor.accept(stream)).await;
                match accepted {
                    Ok(Ok(tls)) => self.http(tls, app).await,
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake with an API client"),
                    Err(_) => tracing::debug!("TLS handshake with an API client timed out"),
                }
            }
            None => self.http(stream, app).await,
        }
    }

    async fn http<IO>(&self, io: IO, app: Router)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = TowerToHyperService::new(app);
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "API connection ended");
        }
    }
}
