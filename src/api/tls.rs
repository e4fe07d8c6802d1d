//! TLS for the HTTP API (rustls, ring). The certificate and key come from
//! files (`manager.tls_cert_file`, `tls_key_file`, e.g. a mounted
//! `kubernetes.io/tls` Secret) and are reloaded when either file changes:
//! every handshake compares their modification times with the loaded pair,
//! so a renewed certificate takes effect without a restart. A pair that does
//! not load keeps the previous one (and says so in the log); at start-up it
//! is an error. With `tls_client_ca_file`, every client must present a
//! certificate signed by that CA (mutual TLS).

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// A TLS file that cannot be used; names the key and the file, never content.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("manager.{key} {path}: {why}")]
    File {
        key: &'static str,
        path: String,
        why: String,
    },
    #[error("the TLS configuration of the HTTP API is invalid: {0}")]
    Config(String),
}

fn file_err(key: &'static str, path: &Path, why: impl ToString) -> TlsError {
    TlsError::File {
        key,
        path: path.display().to_string(),
        why: why.to_string(),
    }
}

/// Every certificate of a PEM file (at least one).
pub fn read_certs(
    key: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(key, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(key, path, e))?;
    if certs.is_empty() {
        return Err(file_err(key, path, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load_pair(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = read_certs("tls_cert_file", cert)?;
    // The key's parse error is not shown: it could quote key material.
    let der = PrivateKeyDer::from_pem_file(key)
        .map_err(|_| file_err("tls_key_file", key, "holds no readable PEM private key"))?;
    let ck = CertifiedKey::from_der(chain, der, &provider()).map_err(|e| {
        file_err(
            "tls_key_file",
            key,
            format!("does not fit the certificate: {e}"),
        )
    })?;
    Ok(Arc::new(ck))
}

type Stamp = (Option<SystemTime>, Option<SystemTime>);

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (m(cert), m(key))
}

/// Serves the pair from the files, reloaded when their mtimes change.
#[derive(Debug)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    loaded: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

impl ReloadingCert {
    /// Loads the pair now: a broken pair is a start-up error.
    pub fn new(cert: &Path, key: &Path) -> Result<ReloadingCert, TlsError> {
        let s = stamp(cert, key);
        let ck = load_pair(cert, key)?;
        Ok(ReloadingCert {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            loaded: Mutex::new((s, ck)),
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        let now = stamp(&self.cert, &self.key);
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if loaded.0 != now {
            match load_pair(&self.cert, &self.key) {
                Ok(ck) => {
                    tracing::info!(cert = %self.cert.display(), "reloaded the API's TLS certificate");
                    *loaded = (now, ck);
                }
                Err(e) => {
                    // Tried again at the next change; the old pair serves meanwhile.
                    tracing::warn!(error = %e, "keeping the previous TLS certificate");
                    loaded.0 = now;
                }
            }
        }
        loaded.1.clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The server configuration: HTTP/1.1, the reloading pair, and client
/// certificates required when `client_ca` is set.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let resolver = Arc::new(ReloadingCert::new(cert, key)?);
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in read_certs("tls_client_ca_file", ca)? {
                roots
                    .add(c)
                    .map_err(|e| file_err("tls_client_ca_file", ca, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| file_err("tls_client_ca_file", ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
