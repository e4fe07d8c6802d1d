//! Property tests: random strings thrown at every renderer and validator
//! that takes tenant input (postgresql.conf, pg_hba.conf,
//! messages that repeat tenant text). Each either refuses the input or
//! renders it so that no line break escapes and the field reads back as
//! what was given.
#![allow(clippy::unwrap_used)]

use super::{hba, params, shown};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Strings rich in what breaks configuration files: quotes, backslashes,
/// line breaks, comment and separator characters, NUL, non-ASCII.
pub(crate) fn nasty() -> impl Strategy<Value = String> {
    let unit = prop_oneof![
        4 => proptest::char::range('a', 'z').prop_map(String::from),
        1 => proptest::char::range('0', '9').prop_map(String::from),
        6 => prop::sample::select(vec![
            " ", "\t", "\n", "\r", "\0", "'", "''", "\"", "\\", "\\'", "#", "=", ":", ",", "/",
            ".", "@", "-", "%", "$", "`", ";", "\u{1}", "\u{7f}", "\u{85}", "é", "\u{2028}",
            "include ", "host ", "all ", "0.0.0.0/0 ", "trust",
        ])
        .prop_map(String::from),
    ];
    prop::collection::vec(unit, 0..24).prop_map(|v| v.concat())
}

/// PostgreSQL's reading of one `name = 'value'` line (guc-file.l and
/// GUC_scanstr): `''` is a quote, backslash escapes b f n r t, up to three
/// octal digits, or the next character itself.
fn parse_conf_line(line: &str) -> Option<(String, String)> {
    let (name, rest) = line.split_once(" = ")?;
    let body = rest.strip_prefix('\'')?.strip_suffix('\'')?;
    let mut out = String::new();
    let mut it = body.chars().peekable();
    while let Some(c) = it.next() {
        match c {
            '\'' => {
                // Only a doubled quote may appear inside.
                if it.next()? != '\'' {
                    return None;
                }
                out.push('\'');
            }
            '\\' => match it.next()? {
                'b' => out.push('\u{8}'),
                'f' => out.push('\u{c}'),
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                't' => out.push('\t'),
                d @ '0'..='7' => {
                    let mut v = d.to_digit(8)?;
                    for _ in 0..2 {
                        match it.peek().and_then(|c| c.to_digit(8)) {
                            Some(n) => {
                                v = v * 8 + n;
                                it.next();
                            }
                            None => break,
                        }
                    }
                    out.push(char::from_u32(v)?);
                }
                other => out.push(other),
            },
            c if c == '\n' || c == '\r' => return None,
            c => out.push(c),
        }
    }
    Some((name.to_string(), out))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn postgresql_conf_values_stay_on_their_line_and_read_back(
        entries in prop::collection::btree_map(
            prop_oneof![nasty(), prop::sample::select(params::TENANT_PARAMETERS).prop_map(String::from)],
            nasty(),
            0..6,
        )
    ) {
        let conf = params::render_postgresql_conf(&entries);
        let lines: Vec<&str> = conf.lines().skip(1).collect();
        prop_assert_eq!(conf.matches('\n').count(), lines.len() + 1);
        prop_assert!(!conf.contains('\r'));
        let mut back = BTreeMap::new();
        for l in &lines {
            let (k, v) = parse_conf_line(l).ok_or_else(|| TestCaseError::fail(format!("unparsable line {l:?}")))?;
            back.insert(k, v);
        }
        let expected: BTreeMap<String, String> = entries
            .iter()
            .filter(|(k, _)| back.contains_key(*k))
            .map(|(k, v)| (k.clone(), v.replace('\0', "")))
            .collect();
        prop_assert_eq!(&back, &expected);
        // Every allowlisted name is rendered.
        for k in entries.keys().filter(|k| params::tenant_may_set(k)) {
            prop_assert!(back.contains_key(k));
        }
    }

    #[test]
    fn parameter_validation_refuses_line_breaks_and_never_echoes(
        name in prop_oneof![nasty(), prop::sample::select(params::TENANT_PARAMETERS).prop_map(String::from)],
        value in nasty(),
    ) {
        match params::refusal(&name, &value) {
            None => {
                prop_assert!(params::tenant_may_set(&name));
                prop_assert!(!value.chars().any(char::is_control));
            }
            Some(why) => prop_assert!(why.len() < 200 && !why.contains('\n')),
        }
    }

    #[test]
    fn pg_hba_lines_are_one_rule_or_refused(lines in prop::collection::vec(nasty(), 0..5)) {
        let hba_conf = hba::render_pg_hba(&[], &lines);
        // Header, the TLS rule, one line per spec line (a rule or a
        // comment), three own.
        prop_assert_eq!(hba_conf.lines().count(), 2 + lines.len() + 3);
        prop_assert!(!hba_conf.contains('\r'));
        prop_assert_eq!(hba_conf.lines().nth(1), Some("hostnossl all all all reject"));
        prop_assert!(hba_conf.ends_with("hostssl all all all scram-sha-256\n"));
        for (i, l) in lines.iter().enumerate() {
            let rendered = hba_conf.lines().nth(2 + i).unwrap();
            match hba::refusal(l) {
                None => {
                    prop_assert_eq!(rendered, l.as_str());
                    prop_assert!(!l.trim_end().ends_with('\\'));
                    let f = hba::fields(l).unwrap();
                    prop_assert!(!f[0].text.starts_with("include"));
                }
                Some(why) => {
                    prop_assert!(rendered.starts_with('#'));
                    prop_assert!(why.len() < 300 && !why.contains('\n'), "{}", why);
                }
            }
        }
    }

    #[test]
    fn well_formed_pg_hba_rules_are_accepted(
        kind in prop::sample::select(vec!["host", "hostssl", "hostnossl"]),
        db in prop::sample::select(vec!["all", "app", "\"my db\"", "app,other", "replication"]),
        user in prop::sample::select(vec!["all", "alice", "+group", "\"bob smith\""]),
        addr in prop::sample::select(vec!["10.0.0.0/8", "::1/128", "samenet", ".example.com", "192.168.0.1 255.255.255.255"]),
        method in prop::sample::select(vec!["scram-sha-256", "md5", "reject", "cert"]),
    ) {
        let line = format!("{kind} {db} {user} {addr} {method}");
        prop_assert_eq!(hba::refusal(&line), None, "{}", line);
    }

    #[test]
    fn shown_text_is_short_and_one_line(s in nasty(), pad in 0usize..200) {
        let long = format!("{s}{}", "x".repeat(pad));
        let out = shown(&long);
        prop_assert!(out.chars().count() <= 4 * params::SHOWN_CHARS + 32, "{}", out);
        prop_assert!(!out.chars().any(char::is_control), "{:?}", out);
    }
}
