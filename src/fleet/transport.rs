//! The HTTP transport to a member cluster's API server: **one HTTP/2
//! connection carries every request and watch**, and a separate HTTP/1.1
//! client carries the requests that upgrade their connection (exec, attach,
//! port-forward), which HTTP/2 cannot do.
//!
//! Why: kube's default client offers no ALPN and speaks HTTP/1.1 only, so
//! every open watch holds a TCP+TLS connection of its own — a dozen per member
//! (PostgresCluster shards and child kinds) plus an idle pool, on the manager
//! and on the API server alike. At 1,000 members that is more descriptors than
//! a process is given, and ~13 KiB of buffers per connection. client-go does
//! what this module does: HTTP/2 for everything, an HTTP/1.1 round tripper
//! beside it for upgrades. A server or proxy that does not offer `h2` in ALPN,
//! or a plain `http://` URL, gets HTTP/1.1 from the same client, as before.
//!
//! The layers above the connection are kube's own (base URI, the server-retry
//! policy, authentication, extra headers), so requests look exactly as they
//! did through `kube::client::ClientBuilder::try_from(config)`; proxies in the
//! kubeconfig keep that builder (see [`super::connect`]).

use http::{Request, Response};
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::{Client, ResponseFuture, connect::HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ClientBuilder, ConfigExt as _, retry::RetryPolicy};
use std::task::{Context, Poll};
use std::time::Duration;
use tower::util::BoxService;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt as _, retry::RetryLayer};

/// Interval of HTTP/2 PINGs while a request or watch is open: a dead peer
/// (a dropped NAT entry, a killed API server) is noticed within interval +
/// timeout instead of at the read timeout, and every stream on the
/// connection fails over to a new one at once.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(20);
/// Connection-level flow-control window. Every watch shares it: a generous
/// one keeps a burst on one stream (a relist of thousands of objects) from
/// stalling the others while the consumer catches up. It is credit, not a
/// buffer allocated up front.
const CONNECTION_WINDOW: u32 = 16 << 20;

/// How long a connection without streams stays pooled. The member's main
/// connection always carries watches, so this only closes spares: first
/// requests racing each other may each dial before ALPN says `h2`; the
/// losers are given up, but one that finishes after the winner was pooled
/// is pooled too.
const SPARE_IDLE: Duration = Duration::from_secs(30);

/// The stack under kube's `Client`, type-erased.
pub type Stack = BoxService<Request<Body>, Response<hyper::body::Incoming>, BoxError>;

type Connector = TimeoutConnector<HttpsConnector<HttpConnector>>;

/// Routes upgrade requests to the HTTP/1.1 client, the rest to the
/// multiplexed one.
#[derive(Clone)]
struct Transport {
    multiplexed: Client<Connector, Body>,
    upgrades: Client<Connector, Body>,
}

/// kube sends `Connection: Upgrade` and `Upgrade: websocket` for exec, attach
/// and port-forward; both headers are forbidden in HTTP/2.
fn is_upgrade<B>(req: &Request<B>) -> bool {
    req.headers().contains_key(http::header::UPGRADE)
}

impl Service<Request<Body>> for Transport {
    type Response = Response<hyper::body::Incoming>;
    type Error = hyper_util::client::legacy::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // hyper-util's client is always ready; it queues in `request`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if is_upgrade(&req) {
            self.upgrades.request(req)
        } else {
            self.multiplexed.request(req)
        }
    }
}

/// TLS sessions kept per member for resumption (`builder`).
const TLS_SESSIONS: usize = 8;

/// A kube client builder over the multiplexed transport, with kube's
/// request layers; the caller adds its own (deadline, rate limit) on top.
/// Connect, read and write timeouts come from `config` (kube's fields).
pub fn builder(config: &kube::Config) -> anyhow::Result<ClientBuilder<Stack>> {
    // Parsed once (the CA, the client identity): both connectors share it.
    let mut tls = config.rustls_client_config()?;
    // A member is one API server name (a few servers behind it at most);
    // rustls' default session cache is sized for a browser (256 sessions,
    // ~14 KB allocated up front per member: 14 MB at a thousand members).
    tls.resumption = rustls::client::Resumption::in_memory_sessions(TLS_SESSIONS);
    let multiplexed = {
        let connector = connector(config, tls.clone(), true)?;
        let mut b = Client::builder(TokioExecutor::new());
        b.timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(SPARE_IDLE)
            .http2_keep_alive_interval(PING_INTERVAL)
            .http2_keep_alive_timeout(PING_TIMEOUT)
            .http2_initial_connection_window_size(CONNECTION_WINDOW);
        b.build(connector)
    };
    let upgrades = {
        let connector = connector(config, tls, false)?;
        Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .build(connector)
    };
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(Transport {
            multiplexed,
            upgrades,
        })
        .boxed();
    Ok(ClientBuilder::new(
        service,
        config.default_namespace.clone(),
    ))
}

/// TCP (no Nagle: requests are small and latency-bound) → TLS with the
/// kubeconfig's CA, client identity and server name → kube's timeouts.
/// `h2` offers HTTP/2 in ALPN; without it the connection stays HTTP/1.1
/// (upgrades need that).
fn connector(
    config: &kube::Config,
    tls_config: rustls::ClientConfig,
    h2: bool,
) -> anyhow::Result<Connector> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let mut tls = HttpsConnectorBuilder::new()
        .with_tls_config(tls_config)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = name
            .clone()
            .try_into()
            .map_err(|_| anyhow::anyhow!("tls-server-name {name:?} is not a valid DNS name"))?;
        tls = tls.with_server_name_resolver(FixedServerNameResolver::new(name));
    }
    let https = if h2 {
        tls.enable_all_versions().wrap_connector(tcp)
    } else {
        tls.enable_http1().wrap_connector(tcp)
    };
    let mut timed = TimeoutConnector::new(https);
    timed.set_connect_timeout(config.connect_timeout);
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);
    timed.set_reset_reader_on_write(config.reset_reader_on_write);
    Ok(timed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_upgrade_requests_take_the_http1_client() {
        let exec = Request::get("/api/v1/namespaces/a/pods/p/exec")
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .body(())
            .expect("request");
        assert!(is_upgrade(&exec));
        let watch = Request::get("/api/v1/pods?watch=true")
            .body(())
            .expect("request");
        assert!(!is_upgrade(&watch));
    }
}
