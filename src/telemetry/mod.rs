//! Logging (and, later, OpenTelemetry export). Logs go to stderr so command
//! output on stdout stays machine-readable.

use tracing_subscriber::EnvFilter;

/// Installs the log subscriber; `RUST_LOG` (or `PGFLEET_LOG`) overrides the
/// default level `info`.
pub fn init_logging() {
    let filter = std::env::var("PGFLEET_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new("info,kube_runtime=warn,kube_client=warn,hyper=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
