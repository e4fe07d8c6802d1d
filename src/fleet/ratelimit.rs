//! A client-side QPS/burst limit per member cluster (token bucket), as a tower
//! layer on that cluster's kube client: a busy cluster cannot starve the
//! fleet, and a fleet cannot hammer one API server.

use futures::future::BoxFuture;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tower::{Layer, Service};

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Shared by every request of one cluster.
#[derive(Debug, Clone)]
pub struct RateLimit {
    qps: f64,
    burst: f64,
    bucket: Arc<Mutex<Bucket>>,
    /// The member whose requests are counted (`metrics::requests`).
    member: Option<Arc<str>>,
}

impl RateLimit {
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        RateLimit {
            qps: qps.max(0.1),
            burst,
            bucket: Arc::new(Mutex::new(Bucket {
                tokens: burst,
                last: Instant::now(),
            })),
            member: None,
        }
    }

    /// Also counts every request as member `name`'s
    /// (`pgfleet_api_requests_total`).
    pub fn counting(mut self, name: &str) -> Self {
        self.member = Some(name.into());
        self
    }

    /// How long to wait before the next request may go (reserving its token).
    fn reserve(&self) -> Duration {
        let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        b.tokens = (b.tokens + now.duration_since(b.last).as_secs_f64() * self.qps).min(self.burst);
        b.last = now;
        b.tokens -= 1.0;
        if b.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-b.tokens / self.qps)
        }
    }
}

impl<S> Layer<S> for RateLimit {
    type Service = Limited<S>;
    fn layer(&self, inner: S) -> Limited<S> {
        Limited {
            inner,
            limit: self.clone(),
        }
    }
}

const LEASES: &str = "/apis/coordination.k8s.io/";

/// Requests that skip the limit. Ownership Leases (`ha`): a renewal queued
/// behind a burst of reconcile writes would lose the member exactly when
/// it is busiest. The connectivity probe (`GET /version`): queued behind
/// the same burst it would time out and mark a busy member Unreachable
/// (seen at 10,000 PostgresClusters). Both are a request or two per period.
fn exempt(path: &str) -> bool {
    path.starts_with(LEASES) || path == "/version" || path == "/version/"
}

pub struct Limited<S> {
    inner: S,
    limit: RateLimit,
}

impl<S, B> Service<http::Request<B>> for Limited<S>
where
    S: Service<http::Request<B>> + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if let Some(m) = &self.limit.member {
            let uri = req.uri();
            crate::metrics::requests::count(m, req.method().as_str(), uri.path(), uri.query());
        }
        let wait = if exempt(req.uri().path()) {
            Duration::ZERO
        } else {
            self.limit.reserve()
        };
        // The client's futures send nothing until polled, so holding the
        // future back holds the request back.
        let fut = self.inner.call(req);
        Box::pin(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            fut.await
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn leases_and_the_probe_skip_the_limit_and_nothing_else_does() {
        assert!(exempt("/apis/coordination.k8s.io/v1/namespaces/x/leases/y"));
        assert!(exempt("/version"));
        for p in [
            "/api/v1/pods",
            "/versions",
            "/apis/pgfleet.io/v1/postgresclusters",
        ] {
            assert!(!exempt(p), "{p}");
        }
    }

    /// With the bucket empty, an ordinary request is held back (its first
    /// poll is pending) while the probe goes at once (ready on the first
    /// poll): no clock involved.
    #[tokio::test]
    async fn with_the_bucket_empty_the_probe_does_not_wait() {
        use futures::FutureExt;
        struct Ok;
        impl Service<http::Request<()>> for Ok {
            type Response = ();
            type Error = ();
            type Future = std::future::Ready<Result<(), ()>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ()>> {
                Poll::Ready(Result::Ok(()))
            }
            fn call(&mut self, _: http::Request<()>) -> Self::Future {
                std::future::ready(Result::Ok(()))
            }
        }
        let mut svc = RateLimit::new(0.1, 1).layer(Ok);
        let req = |p: &str| http::Request::get(p).body(()).unwrap();
        svc.call(req("/api/v1/pods")).await.unwrap();
        let queued = svc.call(req("/api/v1/pods")).now_or_never();
        assert!(queued.is_none(), "an ordinary request did not wait");
        let probe = svc.call(req("/version")).now_or_never();
        assert!(probe.is_some(), "the probe waited behind the limit");
    }

    #[test]
    fn burst_then_paced() {
        let rl = RateLimit::new(10.0, 3);
        for _ in 0..3 {
            assert!(rl.reserve().is_zero());
        }
        let w = rl.reserve();
        assert!(
            w > Duration::from_millis(50) && w <= Duration::from_millis(110),
            "{w:?}"
        );
    }
}
