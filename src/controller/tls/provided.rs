//! Certificates the tenant provides (`spec.tls`): read from their Secrets
//! and checked before a server is given them. A certificate that would
//! break clients or replication (wrong names, another CA, a key that is
//! not its own, expired) is refused with the reason, and the servers keep
//! the certificate they have.

use super::issue::Pair;
use crate::crd::tls::TlsSpec;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A checked certificate and the CA it chains to.
#[derive(Debug)]
pub struct Provided {
    pub pair: Pair,
    pub ca: String,
}

/// The names clients and replicas dial (every one must verify).
pub fn required_names(cluster: &str, ns: &str, pooler: bool) -> Vec<String> {
    let mut v = vec![
        format!("{cluster}-rw"),
        format!("{cluster}-rw.{ns}.svc"),
        format!("{cluster}-ro.{ns}.svc"),
    ];
    if pooler {
        v.push(format!("{cluster}-pooler.{ns}.svc"));
    }
    v
}

/// Why `cert` (PEM chain), `key` and `ca` cannot serve `names` at `now`,
/// or nothing. Never quotes the key.
pub fn check(
    cert: &str,
    key: &str,
    ca: &str,
    names: &[String],
    now: SystemTime,
) -> Result<(), String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls.crt is not PEM certificates: {e}"))?;
    let Some((leaf, intermediates)) = chain.split_first() else {
        return Err("tls.crt holds no certificate".into());
    };
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
        .map_err(|_| "tls.key is not a PEM private key".to_string())?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("tls.key: {e}"))?;
    match rustls::sign::CertifiedKey::new(chain.clone(), signer).keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(_) => return Err("tls.key is not the key of the certificate in tls.crt".into()),
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        let c = c.map_err(|e| format!("ca.crt is not PEM certificates: {e}"))?;
        roots.add(c).map_err(|e| format!("ca.crt: {e}"))?;
    }
    if roots.is_empty() {
        return Err("ca.crt holds no certificate".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| format!("ca.crt: {e}"))?;
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let at = UnixTime::since_unix_epoch(Duration::from_secs(secs));
    for n in names {
        let name = ServerName::try_from(n.clone()).map_err(|e| format!("{n}: {e}"))?;
        verifier
            .verify_server_cert(leaf, intermediates, &name, &[], at)
            .map_err(|e| format!("the certificate does not verify for {n}: {e}"))?;
    }
    Ok(())
}

fn text(s: &Secret, key: &str) -> Option<String> {
    String::from_utf8(s.data.as_ref()?.get(key)?.0.clone()).ok()
}

/// Reads and checks `spec.tls`. The outer error is an API failure; the
/// inner one why the certificate is not used (for the condition).
pub async fn read(
    api: &Api<Secret>,
    spec: &TlsSpec,
    names: &[String],
    now: SystemTime,
) -> Result<Result<Provided, String>, kube::Error> {
    let server = &spec.server_secret;
    let Some(s) = api.get_opt(server).await? else {
        return Ok(Err(format!(
            "spec.tls.serverSecret: Secret {server} not found"
        )));
    };
    let (Some(cert), Some(key)) = (text(&s, "tls.crt"), text(&s, "tls.key")) else {
        return Ok(Err(format!(
            "spec.tls.serverSecret: Secret {server} needs tls.crt and tls.key"
        )));
    };
    let ca = match &spec.ca_secret {
        None => text(&s, "ca.crt").ok_or(format!(
            "spec.tls.serverSecret: Secret {server} has no ca.crt (or set spec.tls.caSecret)"
        )),
        Some(n) => match api.get_opt(n).await? {
            None => Err(format!("spec.tls.caSecret: Secret {n} not found")),
            Some(c) => {
                text(&c, "ca.crt").ok_or(format!("spec.tls.caSecret: Secret {n} has no ca.crt"))
            }
        },
    };
    let ca = match ca {
        Ok(ca) => ca,
        Err(e) => return Ok(Err(e)),
    };
    Ok(check(&cert, &key, &ca, names, now)
        .map(|()| Provided {
            pair: Pair { cert, key },
            ca,
        })
        .map_err(|e| format!("spec.tls: {e}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::issue;
    use super::*;

    #[test]
    fn a_good_certificate_passes_and_each_defect_is_named() {
        let now = SystemTime::now();
        let ca = issue::ca("orders", "shop", now).unwrap();
        let (pair, _) =
            issue::server("orders", "shop", &ca.key, now, Duration::from_secs(3600)).unwrap();
        let names = required_names("orders", "shop", true);
        check(&pair.cert, &pair.key, &ca.cert, &names, now).unwrap();
        // Another cluster's names.
        let e = check(
            &pair.cert,
            &pair.key,
            &ca.cert,
            &required_names("billing", "shop", false),
            now,
        )
        .unwrap_err();
        assert!(e.contains("billing-rw"), "{e}");
        // Another CA.
        let other = issue::ca("orders", "shop", now).unwrap();
        assert!(check(&pair.cert, &pair.key, &other.cert, &names, now).is_err());
        // A key that is not the certificate's.
        let (second, _) =
            issue::server("orders", "shop", &ca.key, now, Duration::from_secs(3600)).unwrap();
        let e = check(&pair.cert, &second.key, &ca.cert, &names, now).unwrap_err();
        assert!(e.contains("not the key"), "{e}");
        assert!(!e.contains("PRIVATE"), "{e}");
        // Expired.
        let later = now + Duration::from_secs(7200);
        assert!(check(&pair.cert, &pair.key, &ca.cert, &names, later).is_err());
        // Not PEM.
        assert!(check("junk", &pair.key, &ca.cert, &names, now).is_err());
        assert!(check(&pair.cert, "junk", &ca.cert, &names, now).is_err());
    }
}
