//! Who may change state: a bearer token from `manager.api_token` or
//! `manager.api_token_file`. The decision is pure (header + configured token
//! → verdict) so it is unit-tested without a server; the comparison takes
//! the same time wherever the first differing byte is, so the token cannot
//! be guessed byte by byte from response times.

use crate::config::{Secret, TokenFileError};

/// The outcome of checking a state-changing request.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// No or wrong token (401).
    Unauthorized(&'static str),
    /// No token is configured, so nothing may change (403).
    WritesDisabled,
    /// The token file cannot be read (503); names the file, never content.
    Unavailable(String),
}

/// Checks the `Authorization` header against the configured token.
pub fn check(header: Option<&str>, configured: Result<Option<Secret>, TokenFileError>) -> Verdict {
    let token = match configured {
        Ok(Some(t)) => t,
        Ok(None) => return Verdict::WritesDisabled,
        Err(e) => return Verdict::Unavailable(e.to_string()),
    };
    let Some(header) = header else {
        return Verdict::Unauthorized("missing Authorization: Bearer <token> header");
    };
    let Some(given) = bearer(header) else {
        return Verdict::Unauthorized("the Authorization header is not \"Bearer <token>\"");
    };
    if constant_time_eq(given.as_bytes(), token.expose().as_bytes()) {
        Verdict::Allowed
    } else {
        Verdict::Unauthorized("wrong bearer token")
    }
}

/// The token of a `Bearer <token>` header (scheme case-insensitive).
fn bearer(header: &str) -> Option<&str> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    let token = rest.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Equal in time independent of where the inputs differ (the length is not
/// secret-dependent in a useful way: it is checked after the full scan).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    diff == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn tok(s: &str) -> Result<Option<Secret>, TokenFileError> {
        Ok(Some(Secret::new(s)))
    }

    #[test]
    fn right_token_passes() {
        assert_eq!(
            check(Some("Bearer s3cret"), tok("s3cret")),
            Verdict::Allowed
        );
        assert_eq!(
            check(Some("bearer  s3cret "), tok("s3cret")),
            Verdict::Allowed
        );
    }

    #[test]
    fn wrong_missing_or_malformed_tokens_are_unauthorized() {
        for h in [
            None,
            Some("Bearer s3cre"),
            Some("Bearer s3cret2"),
            Some("Basic s3cret"),
            Some("s3cret"),
            Some("Bearer "),
        ] {
            assert!(
                matches!(check(h, tok("s3cret")), Verdict::Unauthorized(_)),
                "{h:?}"
            );
        }
    }

    #[test]
    fn no_token_configured_disables_writes() {
        assert_eq!(check(Some("Bearer x"), Ok(None)), Verdict::WritesDisabled);
    }

    #[test]
    fn unreadable_token_file_names_the_file_only() {
        let err = TokenFileError::Empty {
            path: "/etc/pgfleet/token".into(),
        };
        match check(Some("Bearer x"), Err(err)) {
            Verdict::Unavailable(m) => assert!(m.contains("/etc/pgfleet/token")),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn constant_time_eq_matches_eq() {
        for (a, b) in [
            ("", ""),
            ("a", ""),
            ("abc", "abc"),
            ("abc", "abd"),
            ("ab", "abc"),
        ] {
            assert_eq!(
                constant_time_eq(a.as_bytes(), b.as_bytes()),
                a == b,
                "{a} {b}"
            );
        }
    }
}
