//! How PgBouncer logs clients in without the superuser (CloudNativePG's
//! `cnpg_pooler_pgbouncer`, pure):
//!
//! - its own role, [`ROLE`] (`pgfleet_pooler`): LOGIN and nothing else,
//!   password generated into Secret `<name>-pooler-auth`, the only entry of
//!   PgBouncer's userlist;
//! - a `SECURITY DEFINER` function `pgfleet.pooler_lookup(text)`, owned by
//!   `postgres`, `search_path` pinned, EXECUTE only for the pooler role,
//!   that returns the stored SCRAM verifier of a role **that is neither a
//!   superuser nor a replication role** — so `postgres` and `replicator`
//!   can never log in through the pooler, whatever their password;
//! - PgBouncer's `auth_query` calls it. PgBouncer 1.18 has no
//!   `auth_dbname`: the query runs in the database the client asked for,
//!   so the function lives in every database the pooler serves (`postgres`,
//!   the application database, each `spec.databases` entry), installed when
//!   the database is created and checked at every access round
//!   (controller::access::pooler).
//!
//! Schema `pgfleet` belongs to `postgres`, which alone may create in it: a
//! database owner (who owns schema `public`) could otherwise replace the
//! lookup with one returning a verifier of their choosing for any role and
//! be handed that role's pooled server connections. A `pgfleet` schema
//! someone else made first is reported, never taken over, and the
//! `auth_query` itself only trusts a schema owned by the bootstrap
//! superuser (OID 10), so nothing in such a database logs in through the
//! pooler.

use crate::postgres::catalog::{ActualDatabase, PoolerLookup};
use crate::postgres::roles::Stmt;
use crate::postgres::sql::{ident, literal};

pub use crate::postgres::sql::POOLER_ROLE as ROLE;
/// The schema holding the lookup.
pub const SCHEMA: &str = "pgfleet";
pub const FUNCTION: &str = "pooler_lookup";
/// `<name>-pooler-auth`: the pooler role's password.
pub const SECRET: &str = "pooler-auth";

/// The lookup's body: the verifier of a role that may use the pooler.
const SOURCE: &str = "SELECT s.usename, s.passwd FROM pg_catalog.pg_shadow s \
WHERE s.usename = $1 AND NOT s.usesuper AND NOT s.userepl";
/// Its pinned search_path (as `proconfig` shows it).
const SEARCH_PATH: &str = "search_path=pg_catalog, pg_temp";
const ARGUMENTS: &str = "username text";
const RESULT: &str = "TABLE(usename name, passwd text)";

/// PgBouncer's `auth_query`: the lookup, trusted only when its schema
/// belongs to the bootstrap superuser (see the module doc).
pub fn auth_query() -> String {
    format!(
        "SELECT usename, passwd FROM {SCHEMA}.{FUNCTION}($1) WHERE \
(SELECT nspowner FROM pg_catalog.pg_namespace WHERE nspname = '{SCHEMA}') = 10"
    )
}

/// PgBouncer's `auth_hba_file`: the admin console only over the local
/// socket and only for the pooler role (the manager PAUSEs and RESUMEs
/// through exec), the pooler role never from the network, everyone else
/// over TLS with SCRAM. PgBouncer rejects what no line matches.
pub fn hba() -> String {
    let mut out = format!("local pgbouncer {ROLE} scram-sha-256\nlocal all all reject\n");
    for net in ["0.0.0.0/0", "::/0"] {
        out.push_str(&format!("host all {ROLE} {net} reject\n"));
        out.push_str(&format!("host pgbouncer all {net} reject\n"));
    }
    for net in ["0.0.0.0/0", "::/0"] {
        out.push_str(&format!("hostssl all all {net} scram-sha-256\n"));
    }
    out
}

/// Grants as the catalog prints them, sorted.
fn sorted(grants: &[String]) -> Vec<String> {
    let mut g = grants.to_vec();
    g.sort();
    g.dedup();
    g
}

/// What differs from the lookup pgfleet installs in this database (empty:
/// nothing), or why it is not installed there (a `pgfleet` schema of
/// someone else's).
pub fn drift(l: Option<&PoolerLookup>) -> Result<Vec<String>, String> {
    let Some(l) = l else {
        return Ok(vec!["schema".into()]);
    };
    if l.schema_owner != "postgres" {
        return Err(format!(
            "schema {SCHEMA} belongs to {:?}, not postgres: the pooler's lookup is not installed there and the pooler logs nobody in to it",
            l.schema_owner
        ));
    }
    let mut out = vec![];
    let schema_grants = [
        format!("{ROLE}:USAGE"),
        "postgres:CREATE".into(),
        "postgres:USAGE".into(),
    ];
    if sorted(&l.schema_grants) != schema_grants {
        out.push("schema grants".into());
    }
    let [f] = l.functions.as_slice() else {
        out.push("function".into());
        return Ok(out);
    };
    let fn_grants = [format!("{ROLE}:EXECUTE"), "postgres:EXECUTE".into()];
    let checks = [
        ("owner", f.owner == "postgres"),
        ("security definer", f.security_definer),
        ("search_path", f.config == [SEARCH_PATH]),
        ("body", f.source == SOURCE),
        ("signature", f.arguments == ARGUMENTS && f.result == RESULT),
        ("function grants", sorted(&f.grants) == fn_grants),
    ];
    out.extend(
        checks
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(n, _)| n.to_string()),
    );
    Ok(out)
}

/// The statements for one database the pooler serves: none when the
/// lookup is as installed; the whole installation, in one transaction,
/// when anything differs or the database was not inspected (just created).
pub fn plan(db: &str, actual: Option<&ActualDatabase>) -> Result<Vec<Stmt>, String> {
    if let Some(a) = actual.filter(|a| a.inspected)
        && drift(a.pooler_lookup.as_ref())?.is_empty()
    {
        return Ok(vec![]);
    }
    Ok(install()
        .into_iter()
        .map(|sql| Stmt {
            db: Some(db.to_string()),
            sql,
        })
        .collect())
}

/// Creates or repairs schema and function: grants to anyone but the owner
/// revoked, every `pooler_lookup` overload dropped and the one function
/// created again (so its grants are exactly the two).
fn install() -> Vec<String> {
    let (s, f, role) = (ident(SCHEMA), ident(FUNCTION), ident(ROLE));
    let lit_s = literal(SCHEMA);
    let lit_f = literal(FUNCTION);
    vec![
        "BEGIN".into(),
        format!("CREATE SCHEMA IF NOT EXISTS {s} AUTHORIZATION postgres"),
        format!(
            "DO $pgfleet$DECLARE r record; BEGIN FOR r IN SELECT DISTINCT a.grantee \
FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a \
WHERE n.nspname = {lit_s} AND a.grantee <> n.nspowner LOOP \
IF r.grantee = 0 THEN EXECUTE 'REVOKE ALL ON SCHEMA {s} FROM PUBLIC'; \
ELSE EXECUTE pg_catalog.format('REVOKE ALL ON SCHEMA {s} FROM %I', pg_catalog.pg_get_userbyid(r.grantee)); \
END IF; END LOOP; END$pgfleet$"
        ),
        format!("REVOKE ALL ON SCHEMA {s} FROM PUBLIC"),
        format!("GRANT USAGE ON SCHEMA {s} TO {role}"),
        format!(
            "DO $pgfleet$DECLARE f regprocedure; BEGIN FOR f IN SELECT p.oid::regprocedure \
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
WHERE n.nspname = {lit_s} AND p.proname = {lit_f} LOOP \
EXECUTE 'DROP FUNCTION ' || f::text; END LOOP; END$pgfleet$"
        ),
        format!(
            "CREATE FUNCTION {s}.{f}({ARGUMENTS}) RETURNS {RESULT} LANGUAGE sql STABLE \
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS {}",
            literal(SOURCE)
        ),
        format!("ALTER FUNCTION {s}.{f}(text) OWNER TO postgres"),
        format!("REVOKE ALL ON FUNCTION {s}.{f}(text) FROM PUBLIC"),
        format!("GRANT EXECUTE ON FUNCTION {s}.{f}(text) TO {role}"),
        "COMMIT".into(),
    ]
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
