//! Logs and OpenTelemetry traces. Logs go to stderr so command output on
//! stdout stays machine-readable.
//!
//! Two ways in: every command but `pgfleet run` calls [`init_logging`] from
//! `main.rs` (text logs, level from the environment). `pgfleet run` installs
//! nothing until its settings are loaded, then calls [`init`], which sets up
//! the `[telemetry]` section: filter, text or JSON lines carrying the trace
//! id, and the OTLP exporter. Installing once, late, instead of swapping a
//! reload layer keeps tracing-opentelemetry's span-context lookups working
//! (they cannot see through `reload::Layer`). Anything a `run` logs before
//! its settings are read goes to stderr with `eprintln!`.
//!
//! The span model is in `docs/observability.md`; the spans themselves are
//! made in [`spans`] and in `rollout::trace` (a rollout owns its trace).

pub mod export;
pub mod format;
pub mod propagation;
pub mod spans;

use crate::config::Telemetry;
use crate::config::choices::LogFormat;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Crates whose info logs are noise for an operator.
const QUIET: &str = "kube_runtime=warn,kube_client=warn,hyper=warn,hyper_util=warn,opentelemetry=warn,opentelemetry_sdk=warn";

/// True once traces are exported: span helpers skip work (such as storing
/// a rollout's trace context) that would be wasted otherwise.
static TRACING: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (an OTLP endpoint is configured).
pub fn tracing_enabled() -> bool {
    TRACING.load(Ordering::Relaxed)
}

/// `PGFLEET_LOG`, else `RUST_LOG`, else `level` plus the quiet defaults.
fn filter(level: &str) -> EnvFilter {
    std::env::var("PGFLEET_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| {
            let quiet = if level.contains("kube") || level.contains("hyper") {
                String::new()
            } else {
                format!(",{QUIET}")
            };
            EnvFilter::try_new(format!("{level}{quiet}"))
                .unwrap_or_else(|_| EnvFilter::new(format!("info{quiet}")))
        })
}

/// Installs the log subscriber for commands other than `run`; `PGFLEET_LOG`
/// (or `RUST_LOG`) overrides the default level `info`.
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter("info"))
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Keeps the trace pipeline alive; [`Guard::shutdown`] (or drop) flushes
/// the spans still queued.
pub struct Guard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Guard {
    /// Flushes and stops the exporter off the async threads (the exporter's
    /// requests run on this runtime, so blocking a worker could stall them).
    pub async fn shutdown(mut self) {
        if let Some(p) = self.provider.take() {
            let _ = tokio::task::spawn_blocking(move || {
                if let Err(e) = p.shutdown() {
                    eprintln!("pgfleet: flushing traces failed: {e}");
                }
            })
            .await;
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

/// Installs logs and traces per `[telemetry]` (see the module docs). Must be
/// called inside the tokio runtime: the exporter sends from it.
pub fn init(t: &Telemetry) -> anyhow::Result<Guard> {
    let (otel, provider) = match &t.otlp_endpoint {
        Some(endpoint) => {
            let (tracer, provider) = export::pipeline(endpoint, t.sampling_ratio)?;
            // Spans follow their own filter, not `log_level`: quieting the
            // logs must not cut traces. pgfleet's spans are all at info;
            // the kube client's per-request spans (debug) stay out.
            let spans = tracing_subscriber::filter::Targets::new()
                .with_target("pgfleet", tracing::Level::INFO);
            let layer = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_level(true)
                .with_threads(false)
                .with_filter(spans);
            (Some(layer), Some(provider))
        }
        None => (None, None),
    };
    let fmt = match t.log_format.get() {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .event_format(format::Text::new())
            .with_filter(filter(&t.log_level))
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .event_format(format::Json)
            .with_filter(filter(&t.log_level))
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))?;
    TRACING.store(provider.is_some(), Ordering::Relaxed);
    Ok(Guard { provider })
}

#[cfg(test)]
mod tests;
