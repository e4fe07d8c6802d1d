use super::*;

fn source<'a>(db: &'a str) -> Source<'a> {
    Source {
        host: "10.0.0.5",
        database: db,
        passfile: "/var/lib/postgresql/pgpass",
        ca_file: "/etc/pgfleet/tls/ca.crt",
    }
}

#[test]
fn verify_full_whenever_green_has_ssl_and_plain_text_only_without() {
    assert_eq!(transport(true), Transport::VerifyFull);
    assert_eq!(transport(false), Transport::PlainTextScoped);
    let tls = conninfo(&source("app"), Transport::VerifyFull);
    assert!(
        tls.contains("sslmode=verify-full sslrootcert='/etc/pgfleet/tls/ca.crt'"),
        "{tls}"
    );
    let plain = conninfo(&source("app"), Transport::PlainTextScoped);
    assert!(plain.ends_with("sslmode=disable"), "{plain}");
    // No password in the connection string (it is stored in the catalog).
    for c in [tls, plain] {
        assert!(!c.contains("password"), "{c}");
        assert!(c.contains("user=pgfleet_bluegreen passfile="), "{c}");
    }
}

#[test]
fn a_hostile_database_name_stays_one_quoted_value() {
    let db = "x' host=evil.example sslmode=disable \\";
    let sql = create_subscription(&source(db), Transport::VerifyFull);
    // The conninfo is one SQL literal: every ' in it doubled.
    let start = sql.find("CONNECTION '").unwrap_or(0) + "CONNECTION ".len();
    let end = sql.find(" PUBLICATION").unwrap_or(0);
    let lit = &sql[start..end];
    let inner = &lit[1..lit.len() - 1];
    assert!(!inner.replace("''", "").contains('\''), "{lit}");
    // And inside, libpq reads the name back as one dbname value.
    let info = inner.replace("''", "'");
    let at = info.find("dbname=").unwrap_or(0) + "dbname=".len();
    assert!(
        info[at..].starts_with("'x\\' host=evil.example sslmode=disable \\\\'"),
        "{info}"
    );
    assert!(info.contains("sslmode=verify-full"), "{info}");
}

#[test]
fn slot_names_are_per_database_and_valid_slot_names() {
    let a = subscription_name("app");
    let b = subscription_name("App");
    assert_ne!(a, b);
    for n in [a, b, subscription_name("\"; DROP TABLE x; --")] {
        assert!(n.starts_with(SLOT_PREFIX) && n.len() <= 63, "{n}");
        assert!(
            n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{n}"
        );
    }
    assert!(drop_subscription("app").contains("IF EXISTS"));
    assert!(subscription_exists("it's").contains("'pgfleet_bg_"));
}

#[test]
fn the_plain_text_rule_names_only_the_role_and_green_addresses() {
    let rules = plain_text_rules(&["127.0.1.7".into(), "fd00::7".into()]).unwrap_or_default();
    assert_eq!(
        rules,
        [
            "host all pgfleet_bluegreen 127.0.1.7/32 scram-sha-256",
            "host all pgfleet_bluegreen fd00::7/128 scram-sha-256",
        ]
    );
    for r in &rules {
        assert!(crate::postgres::hba::refusal(r).is_none(), "{r}");
    }
    for bad in ["0.0.0.0/0", "all", "127.0.1.7 trust\nhost all all all", ""] {
        assert!(plain_text_rules(&[bad.into()]).is_err(), "{bad:?}");
    }
}

#[test]
fn lsns_are_checked_before_they_reach_sql() {
    assert_eq!(lsn(" 16/B374D848\n"), Some("16/B374D848"));
    for bad in ["", "16", "0/", "/0", "0/123456789", "0/1'; DROP", "g/1"] {
        assert_eq!(lsn(bad), None, "{bad:?}");
    }
    assert!(confirmed(SLOT_PREFIX, "0/3000060", 2).starts_with("SELECT to_json(count(*) = 2 AND"));
}

#[test]
fn sequences_are_read_as_json_and_set_with_quoted_names() {
    let json = r#"[["public","orders_id_seq",11000,true],["we|ird","s\"q\n'x",null,false]]"#;
    let seqs = parse_sequences(json).unwrap_or_default();
    assert_eq!(seqs.len(), 2);
    assert_eq!(seqs[1].name, "s\"q\n'x");
    let sql = sync_sequences(&seqs);
    assert_eq!(
        sql, "SELECT setval('\"public\".\"orders_id_seq\"'::regclass, 11000, true);\n",
        "a sequence blue never used is left alone"
    );
    let one = vec![Sequence {
        schema: "we|ird".into(),
        name: "s\"q'x".into(),
        last_value: Some(7),
    }];
    assert_eq!(
        sync_sequences(&one),
        "SELECT setval('\"we|ird\".\"s\"\"q''x\"'::regclass, 7, true);\n"
    );
    assert!(parse_sequences("not json").is_err());
    assert_eq!(parse_sequences("[]"), Ok(vec![]));
}

#[test]
fn the_publication_is_created_once() {
    let sql = create_publication();
    assert!(sql.contains("IF NOT EXISTS"), "{sql}");
    assert!(sql.contains("FOR ALL TABLES"), "{sql}");
    assert!(drop_publication().contains("IF EXISTS"));
}

#[test]
fn freeze_and_thaw_are_single_statements_ending_with_the_lsn() {
    // ALTER SYSTEM refuses the implicit transaction of a multi-statement
    // string: one statement per psql -c.
    for s in FREEZE_BLUE.iter().chain(THAW_BLUE.iter()) {
        assert!(!s.contains(';'), "{s}");
    }
    assert_eq!(FREEZE_BLUE[3], "SELECT pg_current_wal_lsn()");
    assert!(
        FREEZE_BLUE[2].contains("'client backend'"),
        "walsenders stay"
    );
}
