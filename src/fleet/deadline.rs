//! A deadline on every short API call of a member cluster's client. Without
//! one, a member whose API server accepts a connection but answers slowly (or
//! never) holds whichever controller, backup or rollout step asked — the
//! bulkhead between members only helps if calls end.
//!
//! The deadline covers the wait for the response head; the body of a large
//! LIST is covered by the client's read timeout (a stalled stream). Watches,
//! log follows and exec/attach/port-forward sessions are long-lived by design
//! and are left to their own limits (the watcher's idle timeout, the exec
//! deadlines of the callers).

use futures::future::BoxFuture;
use std::task::{Context, Poll};
use std::time::Duration;
use tower::{BoxError, Layer, Service};

/// Default for `manager.api_request_timeout`.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The error a call gets when its deadline passes; it names the operation
/// (method and path, never the query string or body).
#[derive(Debug, thiserror::Error)]
#[error("{method} {path} got no answer within {after:?}")]
pub struct RequestTimeout {
    pub method: String,
    pub path: String,
    pub after: Duration,
}

/// Whether a request opens a stream that legitimately stays open for long.
pub fn is_long_lived(method: &http::Method, uri: &http::Uri, upgrade: bool) -> bool {
    if upgrade {
        return true;
    }
    let path = uri.path();
    if ["/exec", "/attach", "/portforward", "/proxy"]
        .iter()
        .any(|s| path.ends_with(s))
    {
        return true;
    }
    *method == http::Method::GET
        && uri.query().is_some_and(|q| {
            q.split('&')
                .any(|kv| matches!(kv, "watch=true" | "watch=1" | "follow=true" | "follow=1"))
        })
}

/// Whether `e` (anywhere in its source chain) is a missed deadline.
pub fn is_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<RequestTimeout>() {
            return true;
        }
        cur = err.source();
    }
    false
}

#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub Duration);

impl<S> Layer<S> for Deadline {
    type Service = WithDeadline<S>;
    fn layer(&self, inner: S) -> WithDeadline<S> {
        WithDeadline {
            inner,
            after: self.0,
        }
    }
}

pub struct WithDeadline<S> {
    inner: S,
    after: Duration,
}

impl<S, B, R> Service<http::Request<B>> for WithDeadline<S>
where
    S: Service<http::Request<B>, Response = R> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Send + 'static,
{
    type Response = R;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<R, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let upgrade = req.headers().contains_key(http::header::UPGRADE);
        let long = is_long_lived(req.method(), req.uri(), upgrade);
        let (method, path) = (req.method().to_string(), req.uri().path().to_string());
        let after = self.after;
        let fut = self.inner.call(req);
        Box::pin(async move {
            if long {
                return fut.await.map_err(Into::into);
            }
            // The timer starts when the request is first polled, i.e. after
            // any rate-limit wait of the layers outside this one.
            match tokio::time::timeout(after, fut).await {
                Ok(r) => r.map_err(Into::into),
                Err(_) => Err(Box::new(RequestTimeout {
                    method,
                    path,
                    after,
                }) as BoxError),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn uri(s: &str) -> http::Uri {
        s.parse().expect("uri")
    }

    #[test]
    fn watches_logs_and_sessions_are_long_lived() {
        let g = Method::GET;
        assert!(is_long_lived(
            &g,
            &uri("/api/v1/pods?watch=true&resourceVersion=1"),
            false
        ));
        assert!(is_long_lived(
            &g,
            &uri("/api/v1/namespaces/a/pods/p/log?follow=true"),
            false
        ));
        assert!(is_long_lived(
            &g,
            &uri("/api/v1/namespaces/a/pods/p/exec?command=x"),
            false
        ));
        assert!(is_long_lived(&g, &uri("/anything"), true));
    }

    #[test]
    fn ordinary_calls_have_a_deadline() {
        let g = Method::GET;
        assert!(!is_long_lived(
            &g,
            &uri("/api/v1/namespaces/a/pods/p"),
            false
        ));
        assert!(!is_long_lived(
            &g,
            &uri("/api/v1/pods?labelSelector=watch%3Dtrue"),
            false
        ));
        assert!(!is_long_lived(
            &g,
            &uri("/api/v1/namespaces/a/pods/p/log?tailLines=10"),
            false
        ));
        assert!(!is_long_lived(
            &Method::PATCH,
            &uri("/apis/pgfleet.io/v1/x?fieldManager=p"),
            false
        ));
    }

    /// A backend that never answers.
    struct Silent;
    impl Service<http::Request<()>> for Silent {
        type Response = http::Response<()>;
        type Error = std::io::Error;
        type Future = futures::future::Pending<Result<http::Response<()>, std::io::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            futures::future::pending()
        }
    }

    #[tokio::test]
    async fn a_silent_backend_gets_a_named_timeout() {
        let mut svc = Deadline(Duration::from_millis(50)).layer(Silent);
        let req = http::Request::get("/api/v1/namespaces/a/pods/p?x=secret")
            .body(())
            .expect("request");
        let err = Service::call(&mut svc, req).await.expect_err("times out");
        assert!(is_timeout(err.as_ref()));
        let msg = err.to_string();
        assert!(msg.contains("GET /api/v1/namespaces/a/pods/p"), "{msg}");
        assert!(!msg.contains("secret"), "{msg}");
    }
}
