//! The outbound HTTP client of the CLI (`pgfleet status`, `--server`
//! commands) and of the OTLP trace exporter: reqwest, with
//!
//! - connect, read and overall timeouts, so a silent peer cannot hang a
//!   command or an export;
//! - TLS verification always on (rustls with ring, the provider kube uses,
//!   so no second one is linked): the system's CA certificates plus an
//!   optional private CA bundle (`--ca-file`), and optionally a client
//!   certificate for a manager that requires one;
//! - the usual proxy variables (`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`),
//!   which reqwest reads from the environment.

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How to build a client.
#[derive(Debug, Clone)]
pub struct Options {
    /// PEM CA bundle trusted in addition to the system's.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain and key presented to servers that ask for one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Establishing the TCP connection (and TLS) may take this long.
    pub connect_timeout: Duration,
    /// Each read of the response may wait this long.
    pub read_timeout: Duration,
    /// The whole request, answer included, may take this long.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ca_file: None,
            client_cert: None,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            timeout: Duration::from_secs(60),
        }
    }
}

fn certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading PEM certificates from {}", path.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{} holds no PEM certificate",
        path.display()
    );
    Ok(certs)
}

/// The rustls configuration: system roots + `ca_file`, optional identity.
pub fn tls_config(opts: &Options) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(ca) = &opts.ca_file {
        for c in certs(ca)? {
            roots
                .add(c)
                .with_context(|| format!("a certificate in {} is not a CA", ca.display()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match &opts.client_cert {
        Some((cert, key)) => {
            let chain = certs(cert)?;
            // The parse error is not shown: it could quote key material.
            let key_der = PrivateKeyDer::from_pem_file(key).map_err(|_| {
                anyhow::anyhow!("{} holds no readable PEM private key", key.display())
            })?;
            builder
                .with_client_auth_cert(chain, key_der)
                .with_context(|| format!("the client certificate {}", cert.display()))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A client as `opts` says.
pub fn build(opts: &Options) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls_config(opts)?)
        .connect_timeout(opts.connect_timeout)
        .read_timeout(opts.read_timeout)
        .timeout(opts.timeout)
        .user_agent(concat!("pgfleet/", env!("CARGO_PKG_VERSION")))
        .build()
        .context("building the HTTP client")
}
