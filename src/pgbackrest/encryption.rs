//! Per-cluster repository encryption (issue 19, finding 6).
//!
//! Tenants' instance pods hold the object store's keys (the credentials
//! Secret in their namespace), which usually open the whole bucket. So each
//! cluster's repository is encrypted by pgBackRest (`aes-256-cbc`) with a
//! passphrase of its own: with the shared keys a tenant can still list or
//! delete another tenant's files, but not read them.
//!
//! The passphrase lives in the Secret `<name>-backup-encryption` (key
//! `password`), generated once by the manager and reaching pgBackRest only
//! as `PGBACKREST_REPO1_CIPHER_PASS` from a secretKeyRef: never in
//! pgbackrest.conf, a log line or an event. The Secret has no owner: it
//! outlives the cluster, because the backups do (deleting it by hand makes
//! the cluster's backups unreadable for good). A cluster restored from an
//! encrypted source starts with the source's passphrase, read only once the
//! restore passed validation (restore::restored_password, the same gate as
//! the source's passwords). The Secret itself is written by the controller
//! (`controller::repository`), which knows the cluster it belongs to.

use k8s_openapi::api::core::v1::EnvVar;

/// The Secret suffix (`<name>-backup-encryption`).
pub const WHICH: &str = "backup-encryption";
/// The key holding the passphrase.
pub const KEY: &str = "password";

pub fn secret_name(cluster: &str) -> String {
    format!("{cluster}-{WHICH}")
}

/// The container environment carrying the passphrase (by reference).
pub fn env(cluster: &str) -> EnvVar {
    crate::platform::objects::env_secret("PGBACKREST_REPO1_CIPHER_PASS", &secret_name(cluster), KEY)
}

/// A new random passphrase (64 characters from a 62-letter alphabet).
pub fn passphrase() -> String {
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..64)
        .map(|_| CHARS[rand::random_range(0..CHARS.len())] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_passphrase_is_referenced_not_rendered() {
        let e = serde_json::to_value(env("orders")).expect("json");
        assert_eq!(
            e["valueFrom"]["secretKeyRef"]["name"],
            "orders-backup-encryption"
        );
        assert!(e.get("value").is_none());
        let (a, b) = (passphrase(), passphrase());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
