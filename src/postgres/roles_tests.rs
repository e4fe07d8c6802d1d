#![allow(clippy::unwrap_used)]

use super::*;
use crate::postgres::sql::scram_verifier;

fn spec(v: serde_json::Value) -> RoleSpec {
    serde_json::from_value(v).unwrap()
}

fn actual(name: &str) -> ActualRole {
    ActualRole {
        name: name.into(),
        inherit: true,
        login: true,
        connection_limit: -1,
        ..Default::default()
    }
}

fn catalog(roles: Vec<ActualRole>) -> Catalog {
    Catalog {
        contract: 1,
        roles,
        ..Default::default()
    }
}

#[test]
fn a_missing_role_is_created_with_every_attribute() {
    let s = spec(
        serde_json::json!({"name": "app", "login": true, "createdb": true,
        "connectionLimit": 10, "validUntil": "2030-01-01T01:00:00+01:00",
        "inRoles": ["readers"], "comment": "the app's"}),
    );
    let p = plan(&s, Some("pw"), &catalog(vec![]));
    assert_eq!(p.action, Action::Create);
    let sql: Vec<&str> = p.stmts.iter().map(|s| s.sql.as_str()).collect();
    assert!(sql[0].starts_with("CREATE ROLE \"app\" WITH LOGIN NOSUPERUSER CREATEDB NOCREATEROLE INHERIT NOREPLICATION NOBYPASSRLS CONNECTION LIMIT 10 VALID UNTIL '2030-01-01T00:00:00Z' PASSWORD 'SCRAM-SHA-256$4096:"), "{}", sql[0]);
    assert!(!sql[0].contains("'pw'"), "the plaintext never goes out");
    assert_eq!(sql[1], "GRANT \"readers\" TO \"app\"");
    assert_eq!(sql[2], "COMMENT ON ROLE \"app\" IS 'the app''s'");
}

#[test]
fn a_role_as_declared_needs_nothing() {
    let s = spec(serde_json::json!({"name": "app", "login": true, "passwordSecret": "s"}));
    let mut a = actual("app");
    a.verifier = Some(scram_verifier("pw", &[3u8; 16]));
    let p = plan(&s, Some("pw"), &catalog(vec![a]));
    assert_eq!((p.action, p.stmts.len()), (Action::None, 0), "{p:?}");
    assert_eq!(p.action.state(Ensure::Present), "reconciled");
}

/// A role altered by hand is drift: every difference named, one ALTER.
#[test]
fn drift_is_named_and_corrected() {
    let s = spec(serde_json::json!({"name": "app", "login": true, "inRoles": ["a"]}));
    let mut a = actual("app");
    a.superuser = true;
    a.connection_limit = 3;
    a.valid_until = Some("2020-01-01T00:00:00Z".into());
    a.member_of = vec!["b".into()];
    a.comment = Some("by hand".into());
    let p = plan(&s, None, &catalog(vec![a]));
    assert_eq!(p.action, Action::Alter);
    assert_eq!(
        p.drift,
        [
            "superuser",
            "connectionLimit",
            "validUntil",
            "inRoles",
            "comment"
        ]
    );
    let sql: Vec<&str> = p.stmts.iter().map(|s| s.sql.as_str()).collect();
    assert_eq!(
        sql,
        [
            "ALTER ROLE \"app\" WITH NOSUPERUSER CONNECTION LIMIT -1 VALID UNTIL 'infinity'",
            "GRANT \"a\" TO \"app\"",
            "REVOKE \"b\" FROM \"app\"",
            "COMMENT ON ROLE \"app\" IS NULL",
        ]
    );
}

#[test]
fn a_changed_password_is_set_again() {
    let s = spec(serde_json::json!({"name": "app", "login": true, "passwordSecret": "s"}));
    let mut a = actual("app");
    a.verifier = Some(scram_verifier("old", &[3u8; 16]));
    let p = plan(&s, Some("new"), &catalog(vec![a]));
    assert_eq!(p.drift, ["password"]);
    assert!(
        p.stmts[0]
            .sql
            .starts_with("ALTER ROLE \"app\" WITH PASSWORD 'SCRAM-SHA-256$")
    );
}

#[test]
fn absent_roles_are_dropped_once() {
    let s = spec(serde_json::json!({"name": "old", "ensure": "absent"}));
    let p = plan(&s, None, &catalog(vec![actual("old")]));
    assert_eq!(p.action, Action::Drop);
    assert_eq!(p.stmts[0].sql, "DROP ROLE IF EXISTS \"old\"");
    let p = plan(&s, None, &catalog(vec![]));
    assert_eq!(
        (p.action, p.action.state(Ensure::Absent)),
        (Action::None, "absent")
    );
}

#[test]
fn reserved_and_invalid_roles_are_refused() {
    for (v, why) in [
        (serde_json::json!({"name": "postgres"}), "superuser"),
        (serde_json::json!({"name": "replicator"}), "replication"),
        (serde_json::json!({"name": "pg_monitor"}), "pg_"),
        (serde_json::json!({"name": "a\nb"}), "control"),
        (serde_json::json!({"name": "x".repeat(64)}), "63"),
        (
            serde_json::json!({"name": "a", "inRoles": ["postgres"]}),
            "member",
        ),
        (
            serde_json::json!({"name": "a", "validUntil": "tomorrow"}),
            "RFC 3339",
        ),
    ] {
        let p = plan(&spec(v), None, &catalog(vec![actual("postgres")]));
        assert_eq!(p.action, Action::Refused);
        assert!(p.stmts.is_empty());
        assert!(p.refusal.as_deref().unwrap().contains(why), "{p:?}");
    }
}

/// Hostile names are quoted, never interpreted: each statement is one
/// statement with the name as one identifier.
#[test]
fn hostile_names_stay_identifiers() {
    let evil = "x\"; DROP DATABASE app; --";
    let s = spec(
        serde_json::json!({"name": evil, "inRoles": ["r'\"; SELECT 1"],
        "comment": "'; DROP ROLE app; --"}),
    );
    let p = plan(&s, Some("p'w\\"), &catalog(vec![]));
    assert_eq!(p.action, Action::Create);
    assert!(
        p.stmts[0]
            .sql
            .starts_with("CREATE ROLE \"x\"\"; DROP DATABASE app; --\" WITH")
    );
    assert_eq!(
        p.stmts[1].sql,
        "GRANT \"r'\"\"; SELECT 1\" TO \"x\"\"; DROP DATABASE app; --\""
    );
    assert_eq!(
        p.stmts[2].sql,
        "COMMENT ON ROLE \"x\"\"; DROP DATABASE app; --\" IS '''; DROP ROLE app; --'"
    );
    for st in &p.stmts {
        assert_eq!(unquoted_semicolons(&st.sql), 0, "{}", st.sql);
    }
}

/// Semicolons outside quotes ('…' and "…" with doubled quotes).
fn unquoted_semicolons(sql: &str) -> usize {
    let (mut n, mut q) = (0, None::<char>);
    for c in sql.chars() {
        match (q, c) {
            (None, '\'' | '"') => q = Some(c),
            (Some(open), c) if c == open => q = None,
            (None, ';') => n += 1,
            _ => {}
        }
    }
    n
}

#[test]
fn duplicates_are_found() {
    let s = vec![
        spec(serde_json::json!({"name": "a"})),
        spec(serde_json::json!({"name": "b"})),
        spec(serde_json::json!({"name": "a"})),
    ];
    assert_eq!(duplicates(&s), ["a"]);
}

#[test]
fn the_superuser_gets_the_secret_password_only_when_it_differs() {
    use crate::postgres::catalog::{ActualRole, Catalog};
    let pw = "Su-pw-1";
    let none = Catalog {
        roles: vec![ActualRole {
            name: "postgres".into(),
            superuser: true,
            ..Default::default()
        }],
        ..Default::default()
    };
    let s = super::superuser_password(pw, &none).expect("no password yet: set it");
    assert!(
        s.sql
            .starts_with("ALTER ROLE postgres WITH PASSWORD 'SCRAM-SHA-256$")
    );
    assert!(!s.sql.contains(pw));
    let verifier = crate::postgres::sql::scram_verifier_random(pw);
    let mut same = none.clone();
    same.roles[0].verifier = Some(verifier);
    assert!(super::superuser_password(pw, &same).is_none());
}

/// The pooler's role: a spec may not declare it nor join it; pgfleet's own
/// plan for it is the usual comparison (a membership added by hand is
/// revoked, the password set as a verifier).
#[test]
fn the_pooler_role_is_pgfleets_alone() {
    let mine = spec(serde_json::json!({"name": "pgfleet_pooler", "login": true, "inherit": false}));
    assert_eq!(plan(&mine, None, &catalog(vec![])).action, Action::Refused);
    let joins = spec(serde_json::json!({"name": "x", "inRoles": ["pgfleet_pooler"]}));
    assert_eq!(plan(&joins, None, &catalog(vec![])).action, Action::Refused);
    let reads = spec(serde_json::json!({"name": "x", "inRoles": ["pg_read_all_data"]}));
    assert_eq!(plan(&reads, None, &catalog(vec![])).action, Action::Create);
    let mut have = actual("pgfleet_pooler");
    have.inherit = false;
    have.member_of = vec!["pg_read_all_data".into()];
    let p = plan_own(&mine, Some("pw"), &catalog(vec![have]));
    assert_eq!(p.action, Action::Alter);
    assert_eq!(p.drift, ["password", "inRoles"]);
    assert!(
        p.stmts
            .iter()
            .any(|s| s.sql == "REVOKE \"pg_read_all_data\" FROM \"pgfleet_pooler\"")
    );
    assert!(p.stmts.iter().all(|s| !s.sql.contains("'pw'")));
}
