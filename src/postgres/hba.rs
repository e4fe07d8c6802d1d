//! `spec.postgresql.pgHba`: extra pg_hba.conf rules from the tenant,
//! checked to be exactly one rule each before they are written in front of
//! pgfleet's own.
//!
//! A line must have the shape of a rule (type, database, user, address for
//! host types, method, `name=value` options). Refused: control characters
//! (a `\r` or `\n` starts another line), a trailing backslash (PostgreSQL
//! 16 joins it with the next line, pgfleet's own), the `include`,
//! `include_if_exists` and `include_dir` directives and `@file` lists
//! (they read files of the server's choosing), unterminated quotes.

/// At most this many extra lines (CRD `maxItems`, checked again here).
pub const MAX_LINES: usize = 64;
/// Longest line (CRD `maxLength`, checked again here).
pub const MAX_LINE_LEN: usize = 512;

const TYPES: &[&str] = &[
    "local",
    "host",
    "hostssl",
    "hostnossl",
    "hostgssenc",
    "hostnogssenc",
];
const METHODS: &[&str] = &[
    "trust",
    "reject",
    "scram-sha-256",
    "md5",
    "password",
    "gss",
    "sspi",
    "ident",
    "peer",
    "ldap",
    "radius",
    "cert",
    "pam",
    "bsd",
];

/// One whitespace-separated field, as PostgreSQL reads it: double quotes
/// group (and `""` inside them is a quote), `#` outside quotes ends the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The text with the quotes removed.
    pub text: String,
    /// Whether any part of it was quoted (quoted keywords are not keywords).
    pub quoted: bool,
}

/// Splits a line into fields the way pg_hba.conf's tokenizer does.
pub fn fields(line: &str) -> Result<Vec<Field>, String> {
    let mut out = vec![];
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ' ' || *c == '\t') {
            chars.next();
        }
        match chars.peek() {
            None | Some('#') => return Ok(out),
            _ => {}
        }
        let mut f = Field {
            text: String::new(),
            quoted: false,
        };
        let mut in_quotes = false;
        while let Some(&c) = chars.peek() {
            if !in_quotes && (c == ' ' || c == '\t' || c == '#') {
                break;
            }
            chars.next();
            if c == '"' {
                if in_quotes && chars.peek() == Some(&'"') {
                    chars.next();
                    f.text.push('"');
                } else {
                    in_quotes = !in_quotes;
                    f.quoted = true;
                }
            } else {
                f.text.push(c);
            }
        }
        if in_quotes {
            return Err("has an unterminated double quote".into());
        }
        out.push(f);
    }
}

/// Why one pg_hba line is refused, or `None`. The reason never repeats
/// the line (it may be long).
pub fn refusal(line: &str) -> Option<String> {
    let len = line.chars().count();
    if len > MAX_LINE_LEN {
        return Some(format!(
            "is {len} characters long, at most {MAX_LINE_LEN} are allowed"
        ));
    }
    if let Some((i, c)) = line
        .char_indices()
        .find(|(_, c)| c.is_control() && *c != '\t')
    {
        return Some(format!(
            "contains a control character ({}) at byte {i}: a rule is one line",
            c.escape_unicode()
        ));
    }
    if line.trim_end().ends_with('\\') {
        return Some("ends with a backslash, which would join it with the next line".into());
    }
    let f = match fields(line) {
        Ok(f) => f,
        Err(e) => return Some(e),
    };
    let Some(kind) = f.first() else {
        return Some("is not a rule (blank or only a comment)".into());
    };
    if !kind.quoted && kind.text.starts_with("include") {
        return Some(format!(
            "`{}` directives are not allowed",
            shorten(&kind.text)
        ));
    }
    if kind.quoted || !TYPES.contains(&kind.text.as_str()) {
        return Some(format!(
            "starts with `{}`, not a connection type ({})",
            shorten(&kind.text),
            TYPES.join(", ")
        ));
    }
    let local = kind.text == "local";
    // type database user [address [mask]] method [options]
    let min = if local { 4 } else { 5 };
    if f.len() < min {
        return Some(format!(
            "has {} fields; a `{}` rule needs at least {min} (type, database, user, {}method)",
            f.len(),
            kind.text,
            if local { "" } else { "address, " }
        ));
    }
    for (what, field) in [("database", &f[1]), ("user", &f[2])] {
        if field.text.split(',').any(|t| t.starts_with('@')) {
            return Some(format!(
                "the {what} field names a file (@...); list the names instead"
            ));
        }
    }
    let mut next = 3;
    if !local {
        let addr = &f[3].text;
        if let Some(e) = address_problem(addr) {
            return Some(e);
        }
        next = 4;
        // An address without a prefix length takes a netmask field.
        if addr.parse::<std::net::IpAddr>().is_ok() {
            match f.get(4).map(|m| m.text.parse::<std::net::IpAddr>()) {
                Some(Ok(_)) => next = 5,
                _ => return Some("an IP address without /prefix needs a netmask field".into()),
            }
        }
    }
    let Some(method) = f.get(next) else {
        return Some("has no authentication method".into());
    };
    if method.quoted || !METHODS.contains(&method.text.as_str()) {
        return Some(format!(
            "`{}` is not an authentication method ({})",
            shorten(&method.text),
            METHODS.join(", ")
        ));
    }
    if let Some(opt) = f[next + 1..].iter().find(|o| !is_option(&o.text)) {
        return Some(format!(
            "option `{}` is not of the form name=value",
            shorten(&opt.text)
        ));
    }
    None
}

fn is_option(o: &str) -> bool {
    o.split_once('=').is_some_and(|(k, _)| {
        !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Why a host rule's address field is not one: `all`, `samehost`,
/// `samenet`, an IP address (with /prefix, or a mask field after it) or a
/// host name (`.suffix` matches a domain).
fn address_problem(a: &str) -> Option<String> {
    if matches!(a, "all" | "samehost" | "samenet") {
        return None;
    }
    if let Some((ip, len)) = a.split_once('/') {
        let max = match ip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(_)) => 32,
            Ok(std::net::IpAddr::V6(_)) => 128,
            Err(_) => return Some(format!("`{}` is not an address", shorten(a))),
        };
        return match len.parse::<u8>() {
            Ok(n) if n <= max => None,
            _ => Some(format!("`{}` has an invalid prefix length", shorten(a))),
        };
    }
    if a.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    let host = a.strip_prefix('.').unwrap_or(a);
    let ok = !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    (!ok).then(|| format!("`{}` is not an address or host name", shorten(a)))
}

/// The first 64 characters of tenant text shown in a message.
fn shorten(s: &str) -> String {
    crate::postgres::shown(s)
}

/// pg_hba.conf: pgfleet's own plain-text exceptions (`plain`: a blue/green
/// upgrade's role from green's address, for the upgrade only), then
/// plain-text TCP refused (no spec line can let it in: TLS is not
/// optional), then the spec's lines, then pgfleet's own, which
/// accept TCP only over TLS. The local socket lives in the Pod's own
/// `/tmp` (an emptyDir); only `pgfleet-instance` through exec reaches it.
/// A line that is not a single rule is replaced by a comment (validation
/// has already made the cluster `Invalid` for it; the file must stay one
/// rule a line). An instance without a mounted certificate (a Pod made
/// before TLS) turns the `hostssl` rules into `host` itself
/// (`instance.sh`, `configure`) until it is replaced.
pub fn render_pg_hba(plain: &[String], extra: &[String]) -> String {
    let mut out = String::from(
        "# Rendered by pgfleet; spec.postgresql.pgHba lines come after the TLS rule.\n",
    );
    for l in plain.iter().filter(|l| refusal(l).is_none()) {
        out.push_str(l);
        out.push('\n');
    }
    out.push_str("hostnossl all all all reject\n");
    for (i, l) in extra.iter().enumerate() {
        if refusal(l).is_none() {
            out.push_str(l);
        } else {
            out.push_str(&format!("# spec.postgresql.pgHba[{i}] refused"));
        }
        out.push('\n');
    }
    out.push_str(
        "local all all trust\n\
         hostssl replication replicator all scram-sha-256\n\
         hostssl all all all scram-sha-256\n",
    );
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rules_pass() {
        for l in [
            "host all all 10.0.0.0/8 scram-sha-256",
            "hostssl app \"my user\" 192.168.1.1 255.255.255.255 md5",
            "local all all peer map=admins",
            "host all all .example.com scram-sha-256 # comment",
            "host\tall\tall\tsamenet\treject",
            "host all all ::1/128 trust",
        ] {
            assert_eq!(refusal(l), None, "{l}");
        }
    }

    #[test]
    fn injections_are_refused() {
        for l in [
            "host all all 0.0.0.0/0 trust\rlocal all all trust",
            "host all all 0.0.0.0/0 trust\nlocal all all trust",
            "include /etc/passwd",
            "include_if_exists other.conf",
            "include_dir conf.d",
            "host all all 0.0.0.0/0 trust \\",
            "host @/etc/passwd all 0.0.0.0/0 trust",
            "host all all 0.0.0.0/0",
            "host all all 1.2.3.4 trust",
            "host \"all all 0.0.0.0/0 trust",
            "",
            "# only a comment",
            "hosts all all 0.0.0.0/0 trust",
            "host all all 0.0.0.0/40 trust",
            "host all all 0.0.0.0/0 trust badoption",
        ] {
            assert!(refusal(l).is_some(), "{l:?} must be refused");
        }
    }

    #[test]
    fn refused_lines_become_comments() {
        let hba = render_pg_hba(&[], &["include x".into(), "host all all all md5".into()]);
        assert!(hba.contains("# spec.postgresql.pgHba[0] refused\nhost all all all md5\n"));
        // Plain text is refused before any spec line; pgfleet's rules are TLS only.
        let first = hba.lines().find(|l| !l.starts_with('#')).unwrap();
        assert_eq!(first, "hostnossl all all all reject");
        assert!(
            !hba.lines()
                .any(|l| l.starts_with("host ") && !l.contains("md5"))
        );
    }
}
