//! SQL text built from tenant input: identifiers and literals quoted the
//! way PostgreSQL reads them, names checked before they are used, and
//! passwords turned into SCRAM-SHA-256 verifiers so that the plaintext
//! never reaches the instance (nor its server log, which prints the text
//! of a failing statement with `log_min_error_statement`).

use base64::Engine as _;
use ring::{digest, hmac, pbkdf2};
use std::num::NonZeroU32;

/// PostgreSQL's NAMEDATALEN - 1: longer names are silently truncated, so
/// two different spec names could become one role.
pub const MAX_NAME_BYTES: usize = 63;

/// `"name"` with `"` doubled: any text without NUL is a valid quoted
/// identifier (the name is checked by [`name_refusal`] first).
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'text'` with `'` doubled (standard_conforming_strings is on since
/// PostgreSQL 9.1, so a backslash is an ordinary character). NUL cannot
/// be in a literal: it is removed (callers check text they keep first).
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\0', "").replace('\'', "''"))
}

/// Why `name` cannot be a role, database, schema or extension name pgfleet
/// manages, or `None`. Any other text is allowed and always quoted.
pub fn name_refusal(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is empty".into());
    }
    if name.len() > MAX_NAME_BYTES {
        return Some(format!(
            "is {} bytes long; PostgreSQL keeps at most {MAX_NAME_BYTES}",
            name.len()
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Some(format!(
            "contains a control character ({})",
            c.escape_unicode()
        ));
    }
    if name.trim() != name {
        return Some("starts or ends with white space".into());
    }
    None
}

/// PgBouncer's own login (controller::pooler::auth): LOGIN and EXECUTE on
/// the password lookup, nothing else.
pub const POOLER_ROLE: &str = "pgfleet_pooler";

/// Roles pgfleet itself depends on, or PostgreSQL reserves: a spec may not
/// manage (alter, drop, take over) them.
pub fn reserved_role(name: &str) -> Option<&'static str> {
    if name == "postgres" {
        return Some("is the superuser pgfleet manages the instance with");
    }
    if name == "replicator" {
        return Some("is pgfleet's replication role");
    }
    if name == POOLER_ROLE {
        return Some("is the pooler's login role, managed by pgfleet");
    }
    if name.starts_with("pg_") {
        return Some("starts with pg_, which PostgreSQL reserves for its own roles");
    }
    if name == "public" || name == "none" || name == "current_user" || name == "session_user" {
        return Some("is a reserved word for roles");
    }
    None
}

/// Databases a spec may not manage.
pub fn reserved_database(name: &str) -> Option<&'static str> {
    match name {
        "postgres" => Some("is the database pgfleet manages the instance through"),
        "template0" | "template1" => Some("is a template database"),
        _ => None,
    }
}

/// PBKDF2 rounds PostgreSQL uses by default (`scram_iterations`).
const SCRAM_ITERATIONS: u32 = 4096;

/// The SCRAM-SHA-256 verifier PostgreSQL stores for `password` with
/// `salt` (what `ALTER ROLE … PASSWORD` accepts as is, RFC 5802/7677).
/// The password is used as UTF-8 without SASLprep, like libpq does for
/// passwords that are not valid SASLprep input; generated passwords are
/// ASCII, for which both agree.
pub fn scram_verifier(password: &str, salt: &[u8]) -> String {
    let mut salted = [0u8; 32];
    let rounds = NonZeroU32::new(SCRAM_ITERATIONS).unwrap_or(NonZeroU32::MIN);
    pbkdf2::derive(
        pbkdf2::PBKDF2_HMAC_SHA256,
        rounds,
        salt,
        password.as_bytes(),
        &mut salted,
    );
    let key = hmac::Key::new(hmac::HMAC_SHA256, &salted);
    let client_key = hmac::sign(&key, b"Client Key");
    let stored_key = digest::digest(&digest::SHA256, client_key.as_ref());
    let server_key = hmac::sign(&key, b"Server Key");
    let b64 = base64::engine::general_purpose::STANDARD;
    format!(
        "SCRAM-SHA-256${SCRAM_ITERATIONS}:{}${}:{}",
        b64.encode(salt),
        b64.encode(stored_key.as_ref()),
        b64.encode(server_key.as_ref())
    )
}

/// A verifier with a fresh random salt.
pub fn scram_verifier_random(password: &str) -> String {
    let salt: [u8; 16] = rand::random();
    scram_verifier(password, &salt)
}

/// What `status.access.roles[].passwordHash` keeps: enough to notice a
/// changed Secret, useless to recover the password (salted with the role,
/// truncated).
pub fn password_fingerprint(role: &str, password: &str) -> String {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(b"pgfleet-password\0");
    ctx.update(role.as_bytes());
    ctx.update(b"\0");
    ctx.update(password.as_bytes());
    ctx.finish()
        .as_ref()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A random password of 32 letters and digits (no look-alikes), safe in a
/// URI, a .pgpass line and a shell word without escaping.
pub fn random_password() -> String {
    const CHARS: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789";
    (0..32)
        .map(|_| CHARS[rand::random_range(0..CHARS.len())] as char)
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_and_literals_are_quoted() {
        assert_eq!(ident("app"), "\"app\"");
        assert_eq!(
            ident("x\"; DROP TABLE t; --"),
            "\"x\"\"; DROP TABLE t; --\""
        );
        assert_eq!(literal("it's"), "'it''s'");
        assert_eq!(literal("a\\'b"), "'a\\''b'");
        assert_eq!(literal("a\0b"), "'ab'");
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(name_refusal("app"), None);
        assert_eq!(name_refusal("Mixed Case-ünïcode\"'"), None);
        assert!(name_refusal("").is_some());
        assert!(name_refusal("a\nb").is_some());
        assert!(name_refusal(" a").is_some());
        assert!(name_refusal(&"x".repeat(64)).is_some());
        // 63 bytes of multi-byte characters are fine, 64 are not.
        assert!(name_refusal(&"é".repeat(32)).is_some());
        assert!(reserved_role("postgres").is_some());
        assert!(reserved_role("replicator").is_some());
        assert!(reserved_role("pgfleet_pooler").is_some());
        assert!(reserved_role("pg_monitor").is_some());
        assert!(reserved_role("app").is_none());
        assert!(reserved_database("template1").is_some());
    }

    /// The verifier has PostgreSQL's shape (that PostgreSQL accepts it and
    /// a client logs in with the password is proven by the integration
    /// test `access`); same salt, same verifier.
    #[test]
    fn scram_verifier_has_postgres_shape() {
        let salt = [7u8; 16];
        let v = scram_verifier("pencil", &salt);
        let rest = v.strip_prefix("SCRAM-SHA-256$4096:").unwrap();
        let (salt_b64, keys) = rest.split_once('$').unwrap();
        assert_eq!(salt_b64, "BwcHBwcHBwcHBwcHBwcHBw==");
        let (stored, server) = keys.split_once(':').unwrap();
        assert_eq!((stored.len(), server.len()), (44, 44));
        assert_eq!(v, scram_verifier("pencil", &salt));
        assert_ne!(v, scram_verifier("pencil2", &salt));
        assert_ne!(
            scram_verifier_random("pencil"),
            scram_verifier_random("pencil")
        );
    }

    #[test]
    fn fingerprints_differ_by_role_and_password() {
        let a = password_fingerprint("app", "secret");
        assert_eq!(a.len(), 16);
        assert_ne!(a, password_fingerprint("app", "secret2"));
        assert_ne!(a, password_fingerprint("app2", "secret"));
        assert_eq!(a, password_fingerprint("app", "secret"));
        let p = random_password();
        assert_eq!(p.len(), 32);
        assert!(p.chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
