//! Kubernetes object names: the DNS rules the API server applies, checked
//! by pgfleet before a name reaches a request.
//!
//! Why here and not only in the API server: kube-core puts a name into the
//! request path as it is, without escaping, so a "name" such as `x?` or
//! `a/../b` taken from a spec field would address a different object (the
//! Secret `x` instead of `x?-superuser`). Every name that comes from tenant
//! input is checked with these functions first; a name that passes contains
//! only `a-z`, `0-9`, `-` and `.`, which need no escaping in a URL path.
//!
//! Pure; messages name the field and the rule and quote at most the first
//! 63 characters of the value, so a huge value is never echoed back.

/// The longest PostgresCluster name pgfleet manages. Its children add
/// suffixes, and the longest name that must stay a 63-character DNS label
/// is the restore drill's pooler-less copy `<name>-drill` plus its
/// `-pooler` Service (`-drill` + `-pooler` = 13 characters): 63 − 13.
/// Instance pods (`<name>-16`, also their hostname) and the `-rw`/`-ro`/`-r`
/// Services fit with room to spare.
pub const MAX_CLUSTER_NAME: usize = 50;

/// The longest name of a restore drill's copy (`<source>-drill`): a copy
/// never gets a drill of its own, so only its `-pooler` Service bounds it.
pub const MAX_DRILL_NAME: usize = 63 - "-pooler".len();

/// The longest DNS-1123 label (namespace names, Service names).
pub const MAX_LABEL: usize = 63;
/// The longest DNS-1123 subdomain (most object names).
pub const MAX_SUBDOMAIN: usize = 253;

/// A name a request may carry. Checked at construction: it is a DNS-1123
/// subdomain, so putting it into a URL path needs no escaping.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectName(String);

impl ObjectName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ObjectName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for ObjectName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Why a name was refused, naming the field it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {shown} {rule}")]
pub struct NameError {
    pub field: String,
    shown: String,
    rule: String,
}

fn refuse(field: &str, value: &str, rule: impl Into<String>) -> NameError {
    NameError {
        field: field.to_string(),
        shown: shown(value),
        rule: rule.into(),
    }
}

/// The value quoted for a message: at most 63 characters, escaped.
pub fn shown(value: &str) -> String {
    let mut s: String = value.chars().take(MAX_LABEL).collect();
    if s.len() < value.len() {
        s.push('…');
    }
    format!("{s:?}")
}

fn edge(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` of any length.
fn label_text(s: &str) -> bool {
    let b = s.as_bytes();
    b.first().is_some_and(|c| edge(*c))
        && b.last().is_some_and(|c| edge(*c))
        && b.iter().all(|c| edge(*c) || *c == b'-')
}

/// A DNS-1123 label (RFC 1123): namespaces, member cluster names.
pub fn dns1123_label(field: &str, value: &str) -> Result<(), NameError> {
    if value.len() > MAX_LABEL {
        return Err(refuse(
            field,
            value,
            format!("is {} characters long; at most {MAX_LABEL}", value.len()),
        ));
    }
    if !label_text(value) {
        return Err(refuse(
            field,
            value,
            "is not a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a letter or digit)",
        ));
    }
    Ok(())
}

/// A DNS-1035 label (RFC 1035): a DNS-1123 label starting with a letter;
/// what Service names must be.
pub fn dns1035_label(field: &str, value: &str) -> Result<(), NameError> {
    dns1123_label(field, value)?;
    if !value.as_bytes().first().is_some_and(u8::is_ascii_lowercase) {
        return Err(refuse(
            field,
            value,
            "must start with a lowercase letter (it names Services, which are DNS-1035 labels)",
        ));
    }
    Ok(())
}

/// A DNS-1123 subdomain: what most object names (Secrets, custom
/// resources) must be.
pub fn dns1123_subdomain(field: &str, value: &str) -> Result<(), NameError> {
    if value.len() > MAX_SUBDOMAIN {
        return Err(refuse(
            field,
            value,
            format!(
                "is {} characters long; at most {MAX_SUBDOMAIN}",
                value.len()
            ),
        ));
    }
    if !value.split('.').all(label_text) {
        return Err(refuse(
            field,
            value,
            "is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', each part starting and ending with a letter or digit)",
        ));
    }
    Ok(())
}

/// An object name fit for a request path (see the module doc).
pub fn validated_name(field: &str, value: &str) -> Result<ObjectName, NameError> {
    dns1123_subdomain(field, value)?;
    Ok(ObjectName(value.to_string()))
}

/// A namespace fit for a request path.
pub fn validated_namespace(field: &str, value: &str) -> Result<ObjectName, NameError> {
    dns1123_label(field, value)?;
    Ok(ObjectName(value.to_string()))
}

/// A PostgresCluster's own name: a DNS-1035 label short enough that every
/// child name derived from it stays valid (see [`MAX_CLUSTER_NAME`]). The
/// API server only holds it to the looser subdomain rule, so without this
/// check a long name would be accepted and then fail on every child.
pub fn cluster_name(value: &str, is_drill: bool) -> Result<(), NameError> {
    let field = "metadata.name";
    let max = if is_drill {
        MAX_DRILL_NAME
    } else {
        MAX_CLUSTER_NAME
    };
    if value.len() > max {
        return Err(refuse(
            field,
            value,
            format!(
                "is {} characters long; a PostgresCluster name may have at most {max}, so that \
                 its Services (<name>-pooler), pods (<name>-<n>) and restore drill (<name>-drill) \
                 stay 63-character DNS labels",
                value.len()
            ),
        ));
    }
    dns1035_label(field, value)
}

/// Whether `value` is a pgBackRest backup label: `YYYYMMDD-HHMMSSF`, or a
/// differential/incremental one `…F_YYYYMMDD-HHMMSS{D,I}`.
pub fn is_pgbackrest_label(value: &str) -> bool {
    fn stamp(s: &str) -> bool {
        let b = s.as_bytes();
        b.len() == 15
            && b[8] == b'-'
            && b.iter()
                .enumerate()
                .all(|(i, c)| i == 8 || c.is_ascii_digit())
    }
    let (full, rest) = match value.split_once('_') {
        Some((f, r)) => (f, Some(r)),
        None => (value, None),
    };
    let full_ok = full.strip_suffix('F').is_some_and(stamp);
    match rest {
        None => full_ok,
        Some(r) => {
            full_ok
                && (r.strip_suffix('D').is_some_and(stamp)
                    || r.strip_suffix('I').is_some_and(stamp))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for ok in ["a", "db", "team-1", "0db", &"a".repeat(63)] {
            assert!(dns1123_label("f", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a.b",
            "x?",
            "a/b",
            "a b",
            "é",
            &"a".repeat(64),
        ] {
            assert!(dns1123_label("f", bad).is_err(), "{bad}");
        }
        assert!(dns1035_label("f", "0db").is_err());
        assert!(dns1035_label("f", "db0").is_ok());
    }

    #[test]
    fn subdomains() {
        for ok in ["a", "a.b", "my-secret.v1", &"a".repeat(253)] {
            assert!(dns1123_subdomain("f", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "a..b",
            "a.",
            "x?",
            "x?a=b",
            "a/../b",
            "%2F",
            "a#b",
            "a\nb",
            &"a".repeat(254),
        ] {
            assert!(dns1123_subdomain("f", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn messages_name_the_field_and_quote_a_bounded_value() {
        let long = "x".repeat(5_000_000);
        let e = dns1123_subdomain("spec.bootstrap.fromBackup.cluster", &long).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("spec.bootstrap.fromBackup.cluster: "),
            "{msg}"
        );
        assert!(msg.len() < 300, "{}", msg.len());
        let e = dns1123_label("f", "a\"\nb").unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn cluster_names_leave_room_for_their_children() {
        let longest = "a".repeat(MAX_CLUSTER_NAME);
        assert!(cluster_name(&longest, false).is_ok());
        // Every derived name is still a valid label.
        for child in [
            format!("{longest}-pooler"),
            format!("{longest}-drill-pooler"),
            format!("{longest}-16"),
            format!("{longest}-drill-rw"),
        ] {
            assert!(dns1035_label("child", &child).is_ok(), "{child}");
        }
        let e = cluster_name(&"a".repeat(70), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("70 characters") && e.contains("at most 50"),
            "{e}"
        );
        assert!(cluster_name(&format!("{longest}-drill"), true).is_ok());
        assert!(cluster_name("1db", false).is_err());
        assert!(cluster_name("a.b", false).is_err());
    }

    #[test]
    fn pgbackrest_labels() {
        for ok in [
            "20261203-021712F",
            "20261203-021712F_20261203-031712D",
            "20261203-021712F_20261203-031712I",
        ] {
            assert!(is_pgbackrest_label(ok), "{ok}");
        }
        for bad in [
            "",
            "src-full",
            "20261203-021712",
            "20261203-021712F_",
            "20261203-021712F_20261203-031712F",
            "20261203x021712F",
            "20261203-021712F?",
        ] {
            assert!(!is_pgbackrest_label(bad), "{bad}");
        }
    }

    #[test]
    fn validated_names_need_no_escaping() {
        let n = validated_name("f", "orders-superuser").unwrap();
        assert_eq!(n.as_str(), "orders-superuser");
        assert!(validated_name("f", "x?").is_err());
        assert!(validated_namespace("f", "a.b").is_err());
    }
}
