//! The OTLP/HTTP (protobuf) trace exporter.
//!
//! The SDK's batch processor exports from its own thread, while the HTTP
//! client (`crate::http_client`: reqwest with connect/read timeouts, verified
//! TLS on ring, the proxy variables) runs on tokio. [`Client`] bridges the
//! two: it hands each request to the manager's tokio runtime and waits for
//! the answer. OTLP over gRPC would pull in tonic and a second protobuf
//! service stack for the same spans, so config validation rejects
//! `protocol = "grpc"`.

use bytes::Bytes;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// How long one export may take before it is dropped.
const TIMEOUT: Duration = Duration::from_secs(10);

/// An HTTP client for the exporter that runs its requests on tokio.
#[derive(Clone)]
pub struct Client {
    inner: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("pgfleet::telemetry::export::Client")
    }
}

impl Client {
    /// Must be called inside the tokio runtime the requests will run on.
    pub fn new() -> anyhow::Result<Client> {
        let opts = crate::http_client::Options {
            connect_timeout: Duration::from_secs(5),
            read_timeout: TIMEOUT,
            timeout: TIMEOUT,
            ..Default::default()
        };
        Ok(Client {
            inner: crate::http_client::build(&opts)?,
            runtime: tokio::runtime::Handle::try_current()
                .map_err(|_| anyhow::anyhow!("the trace exporter needs the tokio runtime"))?,
        })
    }

    async fn send(
        inner: reqwest::Client,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let mut req = inner
            .request(parts.method, parts.uri.to_string())
            .body(body);
        for (name, value) in &parts.headers {
            req = req.header(name, value);
        }
        let resp = req.send().await?;
        let mut out = Response::builder().status(resp.status());
        for (name, value) in resp.headers() {
            out = out.header(name, value);
        }
        let body = resp.bytes().await?;
        Ok(out.body(body)?)
    }
}

impl HttpClient for Client {
    // The desugared form of opentelemetry-http's `#[async_trait]` method.
    fn send_bytes<'life0, 'async_trait>(
        &'life0 self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let task = self.runtime.spawn(Self::send(self.inner.clone(), request));
        Box::pin(async move { task.await.map_err(|e| Box::new(e) as HttpError)? })
    }
}

/// The traces URL: a collector base URL gets the standard `/v1/traces`
/// path (like `OTEL_EXPORTER_OTLP_ENDPOINT`); a URL with a path is kept.
pub fn traces_url(endpoint: &str) -> String {
    let trimmed = endpoint.trim_end_matches('/');
    let after_scheme = trimmed.split_once("://").map_or(trimmed, |(_, rest)| rest);
    if after_scheme.contains('/') {
        trimmed.to_string()
    } else {
        format!("{trimmed}/v1/traces")
    }
}

/// The tracer provider (batching, parent-based ratio sampling) and the
/// tracer the tracing layer records into.
pub fn pipeline(endpoint: &str, ratio: f64) -> anyhow::Result<(SdkTracer, SdkTracerProvider)> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(traces_url(endpoint))
        .with_timeout(TIMEOUT)
        .with_http_client(Client::new()?)
        .build()
        // The endpoint is never echoed: collector URLs may carry credentials.
        .map_err(|e| {
            let msg = e.to_string().replace(endpoint, "<telemetry.otlp_endpoint>");
            anyhow::anyhow!("the OTLP trace exporter cannot start: {msg}")
        })?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("pgfleet")
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            ratio,
        ))))
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("pgfleet");
    super::spans::set_tracer(tracer.clone());
    Ok((tracer, provider))
}
