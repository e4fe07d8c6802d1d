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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tower::Service;

/// When the member last answered a request (any response, errors
/// included): whether work on it is progressing, which the fleet's
/// admission of reconciles asks (`controller::admission`). The same clock
/// also keeps the last success (a 2xx answer), which tells the probe the
/// member is reachable without asking it again. Stored as milliseconds
/// since [`epoch`] plus one; 0 is "never".
#[derive(Clone, Debug)]
pub struct Answered(Arc<AtomicU64>);

/// The origin of [`Answered`]'s clock (milliseconds since the first use).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Default for Answered {
    /// Counts as just answered: a member is given the benefit of the
    /// doubt until it has had time to answer.
    fn default() -> Self {
        let a = Answered::never();
        a.mark();
        a
    }
}

impl Answered {
    /// Not answered yet: [`Answered::ago`] is `Duration::MAX` until marked.
    pub fn never() -> Self {
        Answered(Arc::new(AtomicU64::new(0)))
    }

    pub fn mark(&self) {
        let ms = epoch().elapsed().as_millis() as u64;
        self.0.fetch_max(ms.saturating_add(1), Ordering::Relaxed);
    }

    /// How long ago the last answer came (`Duration::MAX`: never).
    pub fn ago(&self) -> Duration {
        match self.0.load(Ordering::Relaxed) {
            0 => Duration::MAX,
            at => epoch()
                .elapsed()
                .saturating_sub(Duration::from_millis(at - 1)),
        }
    }
}

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
    answered: Answered,
    /// The last 2xx answer; never until one came.
    succeeded: Answered,
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
            answered: Answered::default(),
            succeeded: Answered::never(),
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
            answered: Answered::default(),
            succeeded: Answered::never(),
        };
        (kube::Client::new(s.clone(), "default"), s)
    }

    pub fn swap(&self, backend: kube::Client) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Backend::Client(backend);
    }

    /// When a request through this client last got a response.
    pub fn answered(&self) -> Answered {
        self.answered.clone()
    }

    /// When a request through this client last succeeded (a 2xx answer).
    pub fn succeeded(&self) -> Answered {
        self.succeeded.clone()
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
        let (answered, succeeded) = (self.answered.clone(), self.succeeded.clone());
        Box::pin(async move {
            match backend {
                Backend::Client(c) => {
                    let r = c.send(req).await;
                    // A response of any status is an answer (`send` fails
                    // only without one: no connection, a missed deadline).
                    if let Ok(resp) = &r {
                        answered.mark();
                        if resp.status().is_success() {
                            succeeded.mark();
                        }
                    }
                    r
                }
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
