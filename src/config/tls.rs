//! `[tls]`: the life of the server certificates pgfleet issues for every
//! PostgresCluster (controller::tls). The cluster CA lives ten years; the
//! server certificate is short-lived and renewed with a reload, never a
//! restart, so a short validity costs nothing but a reload now and then.

use serde::Deserialize;

use super::values::HumanDuration;

#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct Tls {
    /// How long a server certificate is valid (default `90d`).
    pub server_cert_validity: HumanDuration,
    /// How long before its end a server certificate is renewed (default
    /// `30d`); must be shorter than the validity.
    pub server_cert_renew_before: HumanDuration,
}

impl Default for Tls {
    fn default() -> Self {
        Self {
            server_cert_validity: HumanDuration::new("90d"),
            server_cert_renew_before: HumanDuration::new("30d"),
        }
    }
}

impl Tls {
    /// How long a server certificate lives (validated: an invalid config
    /// refuses to start).
    pub fn validity(&self) -> std::time::Duration {
        self.server_cert_validity.get()
    }

    /// How long before its end a server certificate is renewed.
    pub fn renew_before(&self) -> std::time::Duration {
        self.server_cert_renew_before.get()
    }

    /// Why the two durations do not fit together, if they do not.
    pub fn problem(&self) -> Option<String> {
        let (v, r) = (
            self.server_cert_validity.parsed()?,
            self.server_cert_renew_before.parsed()?,
        );
        if v.as_secs() < 60 {
            return Some("must be at least 1m".into());
        }
        (r >= v).then(|| {
            "server_cert_renew_before must be shorter than server_cert_validity (or every round renews)".into()
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::load_str;
    use std::time::Duration;

    const MEMBER: &str = "[[clusters]]\nname = \"a\"\nembedded = true\n";

    #[test]
    fn defaults_and_overrides() {
        let s = load_str(MEMBER, "t").unwrap();
        assert_eq!(s.tls.validity(), Duration::from_secs(90 * 86400));
        assert_eq!(s.tls.renew_before(), Duration::from_secs(30 * 86400));
        let s = load_str(
            &format!(
                "{MEMBER}[tls]\nserver_cert_validity = \"2m\"\nserver_cert_renew_before = \"90s\"\n"
            ),
            "t",
        )
        .unwrap();
        assert_eq!(s.tls.validity(), Duration::from_secs(120));
        assert_eq!(s.tls.renew_before(), Duration::from_secs(90));
        let e = load_str(
            &format!(
                "{MEMBER}[tls]\nserver_cert_validity = \"2m\"\nserver_cert_renew_before = \"5m\"\n"
            ),
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("tls.server_cert_renew_before"), "{e}");
        let e = load_str(
            &format!("{MEMBER}[tls]\nserver_cert_validity = \"soon\"\n"),
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("tls.server_cert_validity"), "{e}");
    }
}
