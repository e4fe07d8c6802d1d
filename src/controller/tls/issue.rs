//! Certificates for PostgreSQL's own TLS (pure: no I/O, the clock passed
//! in). One CA per PostgresCluster, made once and kept for ten years (the
//! certificate applications trust, so it must not move under them); a
//! server certificate signed by it with a short life, renewed well before
//! it ends (`[tls]` in the fleet TOML). The CA is re-created from its key
//! and its fixed subject when a renewal signs: its certificate never needs
//! parsing, and the new server certificate chains to the one clients hold.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the cluster CA is valid (ten years; renewing it is a manual
/// step, docs/security.md).
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Certificates start this long before they are issued (clock skew between
/// the manager and the pods).
const SKEW: Duration = Duration::from_secs(3600);

/// The Services a server certificate names, by suffix of the cluster name.
const SERVICES: [&str; 4] = ["rw", "ro", "r", "pooler"];

/// PEM certificate and key.
#[derive(Clone)]
pub struct Pair {
    pub cert: String,
    pub key: String,
}

/// Keys never reach a log line, even through `{:?}`.
impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair").field("key", &"<redacted>").finish()
    }
}

/// Every name a client may use for one of the cluster's Services: short,
/// `.ns`, `.ns.svc`, `.ns.svc.cluster.local` (libpq's `verify-full` checks
/// the name the client dialled against these).
pub fn names(cluster: &str, ns: &str) -> Vec<String> {
    SERVICES
        .iter()
        .flat_map(|s| {
            let svc = format!("{cluster}-{s}");
            [
                svc.clone(),
                format!("{svc}.{ns}"),
                format!("{svc}.{ns}.svc"),
                format!("{svc}.{ns}.svc.cluster.local"),
            ]
        })
        .collect()
}

/// rcgen's time type from a system time (whole seconds).
fn stamp(t: SystemTime) -> anyhow::Result<time::OffsetDateTime> {
    let secs = t.duration_since(UNIX_EPOCH)?.as_secs();
    Ok(time::OffsetDateTime::from_unix_timestamp(i64::try_from(
        secs,
    )?)?)
}

fn ca_params(cluster: &str, ns: &str, now: SystemTime) -> anyhow::Result<CertificateParams> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, format!("pgfleet CA {ns}/{cluster}"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = stamp(now - SKEW)?;
    ca.not_after = stamp(now + CA_VALIDITY)?;
    Ok(ca)
}

/// A new CA for one cluster.
pub fn ca(cluster: &str, ns: &str, now: SystemTime) -> anyhow::Result<Pair> {
    let key = KeyPair::generate()?;
    let cert = ca_params(cluster, ns, now)?.self_signed(&key)?;
    Ok(Pair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// A server certificate for every Service name of the cluster, signed by
/// the CA whose key is `ca_key`, valid from `now` for `validity`. Returns
/// it with the moment it stops being valid.
pub fn server(
    cluster: &str,
    ns: &str,
    ca_key: &str,
    now: SystemTime,
    validity: Duration,
) -> anyhow::Result<(Pair, SystemTime)> {
    let ca_key = KeyPair::from_pem(ca_key)?;
    let issuer = Issuer::new(ca_params(cluster, ns, now)?, ca_key);
    let mut leaf = CertificateParams::new(names(cluster, ns))?;
    leaf.distinguished_name
        .push(DnType::CommonName, format!("{cluster}-rw"));
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let not_after = now + validity;
    leaf.not_before = stamp(now - SKEW)?;
    leaf.not_after = stamp(not_after)?;
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok((
        Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        },
        not_after,
    ))
}

/// Whether a certificate valid until `not_after` is renewed now: within
/// `renew_before` of its end, or when its end is unknown.
pub fn renewal_due(not_after: Option<SystemTime>, now: SystemTime, renew_before: Duration) -> bool {
    not_after.is_none_or(|t| now + renew_before >= t)
}

/// When to look again: at the moment renewal becomes due (at least a
/// second from now).
pub fn next_check(not_after: SystemTime, now: SystemTime, renew_before: Duration) -> Duration {
    not_after
        .checked_sub(renew_before)
        .and_then(|due| due.duration_since(now).ok())
        .unwrap_or_default()
        .max(Duration::from_secs(1))
}

/// The SHA-256 of a certificate followed by its key, hex: what the
/// instances wait to see mounted before they reload (`sha256sum` of
/// `tls.crt` and `tls.key` concatenated). A digest, never the key.
pub fn fingerprint(p: &Pair) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(p.cert.as_bytes());
    ctx.update(p.key.as_bytes());
    ctx.finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn verify(ca: &str, cert: &str, name: &str, now: SystemTime) -> Result<(), String> {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let v = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            provider,
        )
        .build()
        .unwrap();
        let leaf = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
        let secs = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
        v.verify_server_cert(
            &leaf,
            &[],
            &ServerName::try_from(name.to_string()).unwrap(),
            &[],
            UnixTime::since_unix_epoch(Duration::from_secs(secs)),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_renewed_certificate_chains_to_the_ca_clients_hold() {
        let t0 = SystemTime::now();
        let ca = ca("orders", "shop", t0).unwrap();
        let (first, end) = server("orders", "shop", &ca.key, t0, Duration::from_secs(600)).unwrap();
        assert_eq!(end, t0 + Duration::from_secs(600));
        // Signed later, from the CA key alone.
        let t1 = t0 + Duration::from_secs(300);
        let (second, _) = server("orders", "shop", &ca.key, t1, Duration::from_secs(600)).unwrap();
        for n in [
            "orders-rw",
            "orders-ro.shop",
            "orders-r.shop.svc",
            "orders-pooler.shop.svc.cluster.local",
        ] {
            verify(&ca.cert, &first.cert, n, t0).unwrap();
            verify(&ca.cert, &second.cert, n, t1).unwrap();
        }
        assert!(verify(&ca.cert, &first.cert, "other-rw.shop.svc", t0).is_err());
        // Expired after its validity.
        assert!(
            verify(
                &ca.cert,
                &first.cert,
                "orders-rw",
                t0 + Duration::from_secs(700)
            )
            .is_err()
        );
        // Another cluster's CA does not vouch for it.
        let other = super::ca("orders", "shop", t0).unwrap();
        assert!(verify(&other.cert, &first.cert, "orders-rw", t0).is_err());
        assert_ne!(fingerprint(&first), fingerprint(&second));
        assert!(!format!("{first:?}").contains("PRIVATE"));
    }

    #[test]
    fn renewal_is_due_within_renew_before() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let end = t + Duration::from_secs(100);
        assert!(!renewal_due(Some(end), t, Duration::from_secs(50)));
        assert!(renewal_due(
            Some(end),
            t + Duration::from_secs(50),
            Duration::from_secs(50)
        ));
        assert!(renewal_due(None, t, Duration::from_secs(50)));
        assert_eq!(
            next_check(end, t, Duration::from_secs(50)),
            Duration::from_secs(50)
        );
        assert_eq!(
            next_check(end, t + Duration::from_secs(99), Duration::from_secs(50)),
            Duration::from_secs(1)
        );
    }
}
