//! Backups from a standby. pgBackRest takes them with `--backup-standby`:
//! the standby copies the data files, and pgBackRest on the standby drives
//! the primary (start/stop backup, a few files) through the primary's
//! pgBackRest TLS server. Every instance runs that server (port
//! [`PORT`]); the standby reaches the primary through the `-rw` Service.
//!
//! Both ends prove who they are with one certificate per PostgresCluster,
//! issued by a CA made for that cluster alone and kept in the Secret
//! `<cluster>-backup-tls` (`ca.crt`, `tls.crt`, `tls.key`). The CA's key is
//! thrown away once the certificate is signed, so nothing can issue another
//! one: a leaked certificate reaches this cluster's pgBackRest and nothing
//! else. Deleting the Secret makes a new pair; instances pick it up when they
//! restart.

use crate::platform::objects;
use k8s_openapi::api::core::v1::{Pod, SecretVolumeSource, Volume};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// pgBackRest's TLS server port (its default).
pub const PORT: u16 = 8432;
/// Where instances see the Secret.
pub const MOUNT: &str = "/etc/pgfleet/backup-tls";
/// The client CN the servers accept (`tls-server-auth=pgfleet=db`).
pub const CLIENT_CN: &str = "pgfleet";

pub fn secret_name(cluster: &str) -> String {
    format!("{cluster}-backup-tls")
}

/// The names a standby may use for the primary: the `-rw` Service, short
/// and qualified (pgBackRest checks the name it connected to).
fn names(cluster: &str, ns: &str) -> Vec<String> {
    let rw = format!("{cluster}-rw");
    vec![
        rw.clone(),
        format!("{rw}.{ns}"),
        format!("{rw}.{ns}.svc"),
        format!("{rw}.{ns}.svc.cluster.local"),
    ]
}

/// PEM (CA certificate, certificate, key) for one PostgresCluster.
pub fn issue(cluster: &str, ns: &str) -> anyhow::Result<(String, String, String)> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(
        DnType::CommonName,
        format!("pgfleet backup CA {ns}/{cluster}"),
    );
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut ca);
    let ca_key = KeyPair::generate()?;
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf = CertificateParams::new(names(cluster, ns))?;
    leaf.distinguished_name.push(DnType::CommonName, CLIENT_CN);
    leaf.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    set_validity(&mut leaf);
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok((ca_pem, cert.pem(), key.serialize_pem()))
}

/// Valid from yesterday (clock skew between the manager and the pods) for
/// ten years.
fn set_validity(p: &mut CertificateParams) {
    use chrono::Datelike;
    let from = chrono::Utc::now().date_naive() - chrono::Days::new(1);
    // Day 28 at most: every month has it, in every year.
    let ymd = |y: i32| rcgen::date_time_ymd(y, from.month() as u8, from.day().min(28) as u8);
    p.not_before = ymd(from.year());
    p.not_after = ymd(from.year() + 10);
}

/// Mounts the Secret into an instance Pod and tells the instance script
/// where it is (`PGFLEET_BACKUP_TLS`): it then runs the TLS server, and
/// `backup … --standby` can use it. Not part of the template hash: pods made
/// before it keep running, and backups of their cluster stay on the primary
/// until they are replaced.
pub fn mount(mut pod: Pod, cluster: &str) -> Pod {
    let name = "backup-tls";
    let Some(spec) = pod.spec.as_mut() else {
        return pod;
    };
    if let Some(c) = spec.containers.first_mut() {
        c.env
            .get_or_insert_with(Vec::new)
            .push(objects::env_value("PGFLEET_BACKUP_TLS", MOUNT));
        c.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(objects::mount(name, MOUNT, true));
        c.ports
            .get_or_insert_with(Vec::new)
            .push(objects::container_port("pgbackrest", i32::from(PORT)));
    }
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret_name(cluster)),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    });
    pod
}

/// Whether a Pod was built with the server (see [`mount`]).
pub fn serves(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers.iter().any(|c| {
            c.env
                .iter()
                .flatten()
                .any(|e| e.name == "PGFLEET_BACKUP_TLS")
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_cluster_gets_its_own_pair() {
        let (ca, cert, key) = issue("orders", "shop").expect("issue");
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"), "{cert}");
        assert!(key.contains("PRIVATE KEY"));
        let (ca2, _, key2) = issue("orders", "shop").expect("issue");
        assert_ne!((ca, key), (ca2, key2));
        assert!(names("orders", "shop").contains(&"orders-rw.shop.svc".to_string()));
    }

    #[test]
    fn mounting_adds_the_volume_env_and_port() {
        let pod = json!({"spec": {"containers": [{"name": "postgres", "env": [], "volumeMounts": []}], "volumes": []}});
        let pod = mount(serde_json::from_value(pod).expect("pod"), "orders");
        assert!(serves(&pod));
        let pod = serde_json::to_value(pod).expect("json");
        assert_eq!(
            pod["spec"]["volumes"][0]["secret"]["secretName"],
            "orders-backup-tls"
        );
        assert_eq!(pod["spec"]["containers"][0]["env"][0]["value"], MOUNT);
        assert_eq!(
            pod["spec"]["containers"][0]["ports"][0]["containerPort"],
            PORT
        );
    }
}
