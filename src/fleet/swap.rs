//! A kube client whose backend can be replaced while it is in use. Every
//! controller, watch and operation of a member holds the same `kube::Client`;
//! when the member's kubeconfig file changes (rotated token, moved server),
//! the registry swaps the backend and the next request — including the
//! reconnect of every watch — uses the new credentials.

use futures::future::BoxFuture;
use kube::client::Body;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use tower::Service;

#[derive(Clone)]
pub struct Swappable {
    current: Arc<RwLock<kube::Client>>,
}

impl Swappable {
    /// A stable client over `backend`, and the handle that swaps it.
    pub fn new(backend: kube::Client) -> (kube::Client, Swappable) {
        let default_ns = backend.default_namespace().to_string();
        let s = Swappable {
            current: Arc::new(RwLock::new(backend)),
        };
        (kube::Client::new(s.clone(), default_ns), s)
    }

    pub fn swap(&self, backend: kube::Client) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = backend;
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
        Box::pin(async move { backend.send(req).await })
    }
}
