//! Values that go into files with no quoting at all (pgbackrest.conf is
//! `key=value` to the end of the line): they are checked, never escaped.

/// Why `v` cannot be a value in pgbackrest.conf, or `None`: a control
/// character would start a line of its own (another option), and
/// pgBackRest trims surrounding white space, so it would not round-trip.
pub fn ini_refusal(v: &str) -> Option<String> {
    if v.is_empty() {
        return Some("is empty".into());
    }
    if let Some((i, c)) = v.char_indices().find(|(_, c)| c.is_control()) {
        return Some(format!(
            "contains a control character ({}) at byte {i}",
            c.escape_unicode()
        ));
    }
    if v.trim() != v {
        return Some("starts or ends with white space".into());
    }
    None
}

/// What `safe_path` in the instance script accepts: a path that needs no
/// quoting in a shell command nor in a postgresql.conf string (where
/// pgBackRest writes `restore_command` without escaping).
pub fn is_safe_path(p: &str) -> bool {
    !p.is_empty()
        && p.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ini_values() {
        assert_eq!(ini_refusal("/fleet/eu-1/shop/orders"), None);
        assert!(ini_refusal("/a\nrepo1-type=posix").is_some());
        assert!(ini_refusal("/a ").is_some());
        assert!(ini_refusal("").is_some());
        assert!(is_safe_path("/var/lib/postgresql/data/pgdata"));
        assert!(!is_safe_path("x; touch /tmp/pwned #"));
    }
}
