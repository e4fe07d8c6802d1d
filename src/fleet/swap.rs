//! A kube client whose backend can be replaced while it is in use. Every
//! controller, watch and operation of a member holds the same `kube::Client`;
//! when the member's kubeconfig file changes (rotated token, moved server),
//! the registry swaps the backend and the next request — including the
//! reconnect of every watch — uses the new credentials.
//!
//! A member whose kubeconfig could not be loaded starts without a backend:
//! its requests fail at once with [`NotConnected`] (so controllers, watches
//! and dispatchers back off as they do for an unreachable cluster) until a
//! usable kubeconfig is swapped in.

use futures::future::BoxFuture;
use kube::client::Body;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use tower::Service;

/// The error of every request to a member that has no usable kubeconfig.
#[derive(Debug, thiserror::Error)]
#[error("member cluster {member} is not connected: {reason}")]
pub struct NotConnected {
    pub member: String,
    pub reason: String,
}

#[derive(Clone)]
pub struct Swappable {
    current: Arc<RwLock<Backend>>,
}

#[derive(Clone)]
enum Backend {
    Client(kube::Client),
    None { member: String, reason: String },
}

impl Swappable {
    /// A stable client over `backend`, and the handle that swaps it.
    pub fn new(backend: kube::Client) -> (kube::Client, Swappable) {
        let default_ns = backend.default_namespace().to_string();
        let s = Swappable {
            current: Arc::new(RwLock::new(Backend::Client(backend))),
        };
        (kube::Client::new(s.clone(), default_ns), s)
    }

    /// A stable client with no backend yet; `reason` says why.
    pub fn unconnected(member: &str, reason: &str) -> (kube::Client, Swappable) {
        let s = Swappable {
            current: Arc::new(RwLock::new(Backend::None {
                member: member.to_string(),
                reason: reason.to_string(),
            })),
        };
        (kube::Client::new(s.clone(), "default"), s)
    }

    pub fn swap(&self, backend: kube::Client) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Backend::Client(backend);
    }

    /// Whether a backend is in place.
    pub fn connected(&self) -> bool {
        matches!(
            *self.current.read().unwrap_or_else(|e| e.into_inner()),
            Backend::Client(_)
        )
    }
}

impl Service<http::Request<Body>> for Swappable {
    type Response = http::Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let backend = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Box::pin(async move {
            match backend {
                Backend::Client(c) => c.send(req).await,
                Backend::None { member, reason } => {
                    Err(kube::Error::Service(Box::new(NotConnected {
                        member,
                        reason,
                    })))
                }
            }
        })
    }
}
