//! Checks of the HTTP API's edge in `[manager]`: the bearer token is strong
//! (a placeholder or a short word is refused before anything starts), plain
//! HTTP only on loopback, TLS files come in pairs, timeouts and the
//! concurrency limit are sane. Pure: no file is read here (the token file is
//! checked by [`super::Manager::resolve_api_token`] at start-up and on use).

use super::Manager;
use super::error::Seg;
use super::validate::{Checker, at};

/// The shortest token accepted (`openssl rand -hex 32` makes 64 characters).
pub const MIN_TOKEN_LEN: usize = 32;
/// Fewer distinct characters than this is a pattern, not a random token.
const MIN_DISTINCT: usize = 10;
/// Words that mark a token as a placeholder someone forgot to replace.
const PLACEHOLDER_WORDS: [&str; 6] = [
    "placeholder",
    "replace",
    "changeme",
    "change-me",
    "example",
    "xxxxxxxx",
];

/// Why `token` is too weak to guard the fleet's controls, or `None`. The
/// reason never quotes the token.
pub fn token_weakness(token: &str) -> Option<String> {
    let lower = token.to_ascii_lowercase();
    if let Some(w) = PLACEHOLDER_WORDS.iter().find(|w| lower.contains(*w)) {
        return Some(format!(
            "is a placeholder (it contains {w:?}); generate a token with `openssl rand -hex 32`"
        ));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("must not contain whitespace or control characters".into());
    }
    let len = token.chars().count();
    if len < MIN_TOKEN_LEN {
        return Some(format!(
            "is too short ({len} characters, at least {MIN_TOKEN_LEN}); generate a token with `openssl rand -hex 32`"
        ));
    }
    let mut distinct: Vec<char> = token.chars().collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < MIN_DISTINCT {
        return Some(format!(
            "is not random enough (only {} distinct characters); generate a token with `openssl rand -hex 32`",
            distinct.len()
        ));
    }
    None
}

impl Checker {
    pub(super) fn api_edge(&mut self, base: &[Seg], m: &Manager) {
        if let Some(why) = m
            .api_token
            .as_ref()
            .map(|t| t.expose().trim())
            .filter(|t| !t.is_empty())
            .and_then(token_weakness)
        {
            self.err(at(base, "api_token"), why);
        }
        match (&m.tls_cert_file, &m.tls_key_file) {
            (Some(_), None) => self.err(
                at(base, "tls_key_file"),
                "is required with tls_cert_file (the certificate's private key)",
            ),
            (None, Some(_)) => self.err(
                at(base, "tls_cert_file"),
                "is required with tls_key_file (the certificate chain)",
            ),
            _ => {}
        }
        if m.tls_client_ca_file.is_some() && m.tls_cert_file.is_none() {
            self.err(
                at(base, "tls_client_ca_file"),
                "needs TLS: set tls_cert_file and tls_key_file too",
            );
        }
        if let Some(addr) = m.listen.parsed()
            && !addr.ip().is_loopback()
            && m.tls_cert_file.is_none()
        {
            self.err(
                at(base, "listen"),
                format!(
                    "{addr} is not a loopback address, and plain HTTP is served only on loopback: \
                     set tls_cert_file and tls_key_file to serve TLS, or listen on 127.0.0.1 \
                     behind a TLS-terminating proxy"
                ),
            );
        }
        self.duration(
            at(base, "header_read_timeout"),
            &m.header_read_timeout,
            super::bounds::HTTP_TIMEOUT,
        );
        self.duration(
            at(base, "request_timeout"),
            &m.request_timeout,
            super::bounds::HTTP_TIMEOUT,
        );
        if !(1..=10_000).contains(&m.max_concurrent_requests) {
            self.err(
                at(base, "max_concurrent_requests"),
                "must be between 1 and 10000",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weak_tokens_are_named_without_the_token() {
        for t in [
            "PLACEHOLDER-replace-with-output-of-openssl-rand-hex-32",
            "x9y8z7",
            "tok-4pI-canary-7f3c9b1e5d",
            "abababababababababababababababababab",
            "0123456789abcdef 0123456789abcdef0123",
            "changeme-changeme-changeme-changeme-0123456789",
        ] {
            let why = token_weakness(t);
            assert!(why.is_some(), "{t} accepted");
            assert!(!why.unwrap_or_default().contains(t), "{t} echoed");
        }
    }

    #[test]
    fn random_tokens_pass() {
        for t in [
            "5f0c2a9d7e1b4c8f3a6d2e9b1c7f4a0d8e3b6c1f9a2d5e7b0c4f8a3d6e1b9c2f",
            "q7Xk2Lp9Vz4Nw8Rt1Ys6Mh3Jd5Fg0Bc2",
        ] {
            assert_eq!(token_weakness(t), None, "{t}");
        }
    }
}
