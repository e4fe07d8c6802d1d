//! Building a member cluster's kube client from its kubeconfig, and checking
//! a kubeconfig without connecting (`pgfleet config check`).
//!
//! Errors name the file and say what is wrong with it, never its content (it
//! holds credentials): YAML parse errors, which quote the offending text, are
//! replaced by a fixed sentence.

use super::deadline::{DEFAULT_REQUEST_TIMEOUT, Deadline};
use super::ratelimit;
use anyhow::Context as _;
use std::path::Path;
use std::time::Duration;

/// Connecting to an API server that does not answer the TCP handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Silence on a connection after which it is dropped. Longer than the
/// watches the runtime opens (the server ends them after 290 s; kube's
/// watcher adds its own idle margin) so a quiet watch is never cut, and
/// reset by every write so exec sessions (kube pings them every 60 s) live
/// as long as their callers' deadlines allow.
pub const READ_TIMEOUT: Duration = Duration::from_secs(330);
/// Sending a request body.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Builds a client from a kubeconfig file with the default per-call deadline.
pub async fn client_from_kubeconfig(
    path: &Path,
    context: Option<&str>,
    insecure: bool,
    limit: &ratelimit::RateLimit,
) -> anyhow::Result<kube::Client> {
    client_with_deadline(path, context, insecure, limit, DEFAULT_REQUEST_TIMEOUT).await
}

/// Builds a client from a kubeconfig file; every ordinary call through it
/// fails after `request_timeout` (see [`super::deadline`]).
pub async fn client_with_deadline(
    path: &Path,
    context: Option<&str>,
    insecure: bool,
    limit: &ratelimit::RateLimit,
    request_timeout: Duration,
) -> anyhow::Result<kube::Client> {
    let mut cfg = load_config(path, context).await?;
    cfg.accept_invalid_certs = cfg.accept_invalid_certs || insecure;
    cfg.connect_timeout = Some(CONNECT_TIMEOUT);
    cfg.read_timeout = Some(READ_TIMEOUT);
    cfg.write_timeout = Some(WRITE_TIMEOUT);
    cfg.reset_reader_on_write = true;
    let building = || format!("kubeconfig {}: building the client", path.display());
    if cfg.proxy_url.is_some() {
        // kube's own stack knows proxies (HTTP/1.1, a connection per watch).
        let builder = kube::client::ClientBuilder::try_from(cfg).with_context(building)?;
        Ok(layered(builder, request_timeout, limit))
    } else {
        let builder = super::transport::builder(&cfg).with_context(building)?;
        Ok(layered(builder, request_timeout, limit))
    }
}

/// Our layers over either stack. The deadline sits inside the rate limit:
/// waiting for a token does not count against a call's deadline.
fn layered<S, B>(
    builder: kube::client::ClientBuilder<S>,
    request_timeout: Duration,
    limit: &ratelimit::RateLimit,
) -> kube::Client
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError>,
    B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tower::BoxError>,
{
    builder
        .with_layer(&Deadline(request_timeout))
        .with_layer(limit)
        .build()
}

async fn load_config(path: &Path, context: Option<&str>) -> anyhow::Result<kube::Config> {
    let shown = path.display();
    // Read once ourselves for a precise, content-free reason.
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read kubeconfig {shown}: {}", io_reason(&e)))?;
    if text.trim().is_empty() {
        anyhow::bail!("kubeconfig {shown} is empty");
    }
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|_| {
        anyhow::anyhow!(
            "kubeconfig {shown} is not a valid kubeconfig (YAML with clusters, contexts and users)"
        )
    })?;
    if kc.contexts.is_empty() || kc.clusters.is_empty() {
        anyhow::bail!(
            "kubeconfig {shown} names no {} (still the placeholder? see docs/deploy.md)",
            if kc.contexts.is_empty() {
                "context"
            } else {
                "cluster"
            }
        );
    }
    let opts = kube::config::KubeConfigOptions {
        context: context.map(String::from),
        ..Default::default()
    };
    kube::Config::from_custom_kubeconfig(kc, &opts)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "kubeconfig {shown} is not usable: {}",
                super::redact(&e.to_string())
            )
        })
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        std::io::ErrorKind::InvalidData => "not UTF-8 text".into(),
        _ => super::redact(&e.to_string()),
    }
}

/// Checks that a client can be built from the kubeconfig (no request is
/// made). Runs on a thread and runtime of its own, so synchronous callers
/// (`config check`, itself called from async code) can use it.
pub fn check_kubeconfig(path: &Path, context: Option<&str>, insecure: bool) -> Result<(), String> {
    let (path, context) = (path.to_path_buf(), context.map(String::from));
    let run = move || -> Result<(), String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime to check kubeconfigs: {e}"))?;
        rt.block_on(async {
            let limit = ratelimit::RateLimit::new(1.0, 1);
            client_from_kubeconfig(&path, context.as_deref(), insecure, &limit)
                .await
                .map(drop)
                .map_err(|e| format!("{e:#}"))
        })
    };
    std::thread::spawn(run)
        .join()
        .unwrap_or_else(|_| Err("checking the kubeconfig panicked".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str, content: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("pgfleet-kc-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let p = dir.join(name);
        std::fs::write(&p, content).expect("write");
        p
    }

    #[test]
    fn problems_name_the_file_and_never_the_content() {
        let garbage = tmp("garbage.kubeconfig", "token: s3cr3t-value-xyz ][ {{{\n");
        let e = check_kubeconfig(&garbage, None, false).expect_err("garbage");
        assert!(e.contains("garbage.kubeconfig"), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");

        let missing = garbage.with_file_name("missing.kubeconfig");
        let e = check_kubeconfig(&missing, None, false).expect_err("missing");
        assert!(
            e.contains("missing.kubeconfig") && e.contains("no such file"),
            "{e}"
        );

        let placeholder = tmp(
            "placeholder.kubeconfig",
            "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n",
        );
        let e = check_kubeconfig(&placeholder, None, false).expect_err("placeholder");
        assert!(e.contains("placeholder"), "{e}");
    }

    #[test]
    fn a_complete_kubeconfig_passes() {
        let ok = tmp(
            "ok.kubeconfig",
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context:\n    cluster: k\n    user: u\nusers:\n- name: u\n  user:\n    token: abc\n",
        );
        assert_eq!(check_kubeconfig(&ok, None, false), Ok(()));
        let e = check_kubeconfig(&ok, Some("nope"), false).expect_err("unknown context");
        assert!(e.contains("ok.kubeconfig"), "{e}");
    }
}
