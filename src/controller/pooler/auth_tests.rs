#![allow(clippy::unwrap_used)]

use super::*;
use crate::postgres::catalog::LookupFunction;

/// What `pgfleet-instance catalog` prints for a database after
/// [`install`] ran (copied from PostgreSQL 15).
fn installed() -> PoolerLookup {
    serde_json::from_value(serde_json::json!({
        "schemaOwner": "postgres",
        "schemaGrants": ["postgres:USAGE", "postgres:CREATE", "pgfleet_pooler:USAGE"],
        "functions": [{"owner": "postgres", "securityDefiner": true,
            "config": ["search_path=pg_catalog, pg_temp"],
            "source": SOURCE, "arguments": "username text",
            "result": "TABLE(usename name, passwd text)",
            "grants": ["postgres:EXECUTE", "pgfleet_pooler:EXECUTE"]}]
    }))
    .unwrap()
}

fn db(lookup: Option<PoolerLookup>) -> ActualDatabase {
    ActualDatabase {
        name: "app".into(),
        owner: "app".into(),
        inspected: true,
        pooler_lookup: lookup,
        ..Default::default()
    }
}

#[test]
fn an_installed_lookup_is_left_alone() {
    assert_eq!(drift(Some(&installed())), Ok(vec![]));
    assert_eq!(plan("app", Some(&db(Some(installed())))), Ok(vec![]));
}

#[test]
fn a_missing_or_altered_lookup_is_installed_again() {
    assert_eq!(drift(None), Ok(vec!["schema".to_string()]));
    let mut public = installed();
    public.schema_grants.push("PUBLIC:USAGE".into());
    public.functions[0].grants.push("app:EXECUTE".into());
    public.functions[0].security_definer = false;
    public.functions[0].source = "SELECT 'postgres', 'x'".into();
    assert_eq!(
        drift(Some(&public)).unwrap(),
        [
            "schema grants",
            "security definer",
            "body",
            "function grants"
        ]
    );
    let mut overloaded = installed();
    overloaded.functions.push(LookupFunction::default());
    assert_eq!(drift(Some(&overloaded)).unwrap(), ["function"]);
    let p = plan("app", Some(&db(Some(public)))).unwrap();
    assert!(p.iter().all(|s| s.db.as_deref() == Some("app")));
    assert_eq!(p.first().unwrap().sql, "BEGIN");
    assert_eq!(p.last().unwrap().sql, "COMMIT");
    // Not inspected (created this round) or absent: installed.
    assert_eq!(plan("new", None).unwrap().len(), p.len());
    let mut fresh = db(Some(installed()));
    fresh.inspected = false;
    assert_eq!(plan("app", Some(&fresh)).unwrap().len(), p.len());
}

#[test]
fn a_schema_someone_else_made_is_reported_not_taken() {
    let mut theirs = installed();
    theirs.schema_owner = "app".into();
    let err = plan("app", Some(&db(Some(theirs)))).unwrap_err();
    assert!(err.contains("belongs to \"app\""), "{err}");
}

#[test]
fn the_function_serves_no_superuser_nor_replication_role() {
    let sql = install().join(";\n");
    assert!(sql.contains("NOT s.usesuper AND NOT s.userepl"), "{sql}");
    assert!(sql.contains("SECURITY DEFINER SET search_path = pg_catalog, pg_temp"));
    assert!(sql.contains("REVOKE ALL ON FUNCTION \"pgfleet\".\"pooler_lookup\"(text) FROM PUBLIC"));
    assert!(sql.contains(
        "GRANT EXECUTE ON FUNCTION \"pgfleet\".\"pooler_lookup\"(text) TO \"pgfleet_pooler\""
    ));
    assert!(sql.contains("CREATE SCHEMA IF NOT EXISTS \"pgfleet\" AUTHORIZATION postgres"));
    // The body is one literal: its quotes doubled, nothing else.
    assert!(sql.contains(&literal(SOURCE)));
}

#[test]
fn pgbouncer_trusts_only_a_superusers_schema_and_admits_admins_locally() {
    let q = auth_query();
    assert!(q.starts_with("SELECT usename, passwd FROM pgfleet.pooler_lookup($1) WHERE"));
    assert!(q.ends_with("nspname = 'pgfleet') = 10"));
    let hba = hba();
    let lines: Vec<&str> = hba.lines().collect();
    assert_eq!(lines[0], "local pgbouncer pgfleet_pooler scram-sha-256");
    assert_eq!(lines[1], "local all all reject");
    // Rejections before the line that admits everyone over TLS.
    let admit = lines
        .iter()
        .position(|l| l.starts_with("hostssl all all"))
        .unwrap();
    for l in &lines[..admit] {
        assert!(l.starts_with("local") || l.ends_with("reject"), "{l}");
    }
    assert!(!hba.contains("trust"));
    assert!(
        lines
            .iter()
            .all(|l| !l.starts_with("host ") || l.ends_with("reject"))
    );
}
