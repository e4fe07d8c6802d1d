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
        }
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
        // Ownership Leases (`ha`) skip the limit: a renewal queued behind a
        // burst of reconcile writes would lose the member exactly when it
        // is busiest, and they are only a request or two per retry period.
        let wait = if req.uri().path().starts_with(LEASES) {
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
mod tests {
    use super::*;

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
