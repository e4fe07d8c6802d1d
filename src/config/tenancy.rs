//! `[tenancy]`: what the platform team allows tenants (the teams owning
//! namespaces of the member clusters) to do across namespace boundaries.

use serde::Deserialize;

use super::choices::CrossNamespaceRestore;
use super::values::Checked;

/// Fleet-wide tenancy policy. The default keeps every namespace to itself:
/// a PostgresCluster may restore from a source in another namespace or
/// another member cluster only when that source consents (its annotation
/// `pgfleet.io/restore-allowed-namespaces`, docs/backups.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct Tenancy {
    /// `consent` (default): a cross-namespace or cross-member restore needs
    /// the source's annotation. `allow`: any restore source in the fleet is
    /// allowed (one trusted team, no tenants).
    pub restore_across_namespaces: Checked<CrossNamespaceRestore>,
}

impl Default for Tenancy {
    fn default() -> Self {
        Self {
            restore_across_namespaces: Checked::new("consent"),
        }
    }
}

impl Tenancy {
    /// The validated policy (the default when the value did not parse; an
    /// invalid config refuses to start anyway).
    pub fn restore_policy(&self) -> CrossNamespaceRestore {
        self.restore_across_namespaces.get()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::{CrossNamespaceRestore, load_str};

    const MEMBER: &str = "[[clusters]]\nname = \"a\"\nembedded = true\n";

    #[test]
    fn consent_by_default_allow_by_choice_and_typos_reported() {
        let s = load_str(MEMBER, "t").unwrap();
        assert_eq!(s.tenancy.restore_policy(), CrossNamespaceRestore::Consent);
        let s = load_str(
            &format!("{MEMBER}[tenancy]\nrestore_across_namespaces = \"allow\"\n"),
            "t",
        )
        .unwrap();
        assert_eq!(s.tenancy.restore_policy(), CrossNamespaceRestore::Allow);
        let e = load_str(
            &format!("{MEMBER}[tenancy]\nrestore_across_namespaces = \"always\"\n"),
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("tenancy.restore_across_namespaces") && e.contains("\"consent\""),
            "{e}"
        );
        let e = load_str(
            &format!("{MEMBER}[tenancy]\nrestore_across_namespace = \"allow\"\n"),
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("restore_across_namespaces"), "{e}");
    }
}
