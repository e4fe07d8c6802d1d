//! TLS for the emulated API servers. Real clients (client-go, so kubectl)
//! never send a bearer token over plain HTTP, so every emulated cluster serves
//! HTTPS with a certificate from a CA kept in the sim directory; kubeconfigs
//! carry that CA, exactly as with a real cluster. The CA survives restarts so
//! written kubeconfigs stay valid.

use anyhow::Context;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use std::path::Path;
use std::sync::Arc;

/// The CA certificate (PEM, for kubeconfigs) and a server config for loopback.
pub struct SimTls {
    pub ca_pem: String,
    pub server: Arc<rustls::ServerConfig>,
}

fn ca_params() -> anyhow::Result<CertificateParams> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name
        .push(DnType::CommonName, "pgfleet-sim CA");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.not_before = rcgen::date_time_ymd(2024, 1, 1);
    p.not_after = rcgen::date_time_ymd(2099, 1, 1);
    Ok(p)
}

/// Loads the CA from `dir` (creating it on first use) and issues a server
/// certificate for 127.0.0.1 and localhost.
pub fn load_or_create(dir: &Path) -> anyhow::Result<SimTls> {
    let key_path = dir.join("ca.key");
    let crt_path = dir.join("ca.crt");
    let (ca_key, ca_pem) = match (
        std::fs::read_to_string(&key_path),
        std::fs::read_to_string(&crt_path),
    ) {
        (Ok(k), Ok(c)) => (KeyPair::from_pem(&k).context("ca.key is not a PEM key")?, c),
        _ => {
            let key = KeyPair::generate()?;
            let cert = ca_params()?.self_signed(&key)?;
            super::write_private(&key_path, key.serialize_pem().as_bytes())?;
            super::write_private(&crt_path, cert.pem().as_bytes())?;
            (key, cert.pem())
        }
    };
    let issuer = Issuer::new(ca_params()?, ca_key);
    let mut leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
    leaf.distinguished_name
        .push(DnType::CommonName, "pgfleet-sim apiserver");
    leaf.not_before = rcgen::date_time_ymd(2024, 1, 1);
    leaf.not_after = rcgen::date_time_ymd(2099, 1, 1);
    let leaf_key = KeyPair::generate()?;
    let cert = leaf.signed_by(&leaf_key, &issuer)?;
    let key_der = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der())
        .map_err(|e| anyhow::anyhow!("server key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key_der)?;
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(SimTls {
        ca_pem,
        server: Arc::new(server),
    })
}
