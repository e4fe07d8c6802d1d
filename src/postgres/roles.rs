//! `spec.roles` against what the primary reports: which roles to create,
//! alter or drop, and the SQL that does it. Pure: the controller
//! (controller::access) reads the catalog and the password Secrets, and
//! runs the statements on the primary.
//!
//! Only roles named in the spec are touched; a role created by hand stays.
//! Passwords are sent as SCRAM verifiers (postgres::sql), and only when the
//! stored verifier was not derived from the Secret's password — so an
//! unchanged Secret never rewrites a password, and a password changed by
//! hand (or lost in a restore) is put back.

use super::catalog::{ActualRole, Catalog, verifier_matches};
use super::sql::{ident, literal, name_refusal, reserved_role, scram_verifier_random};
use crate::crd::access::{Ensure, RoleSpec};

/// A statement and the database it runs in (`None`: `postgres`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stmt {
    pub db: Option<String>,
    pub sql: String,
}

impl Stmt {
    pub fn on_postgres(sql: String) -> Stmt {
        Stmt { db: None, sql }
    }
}

/// What is done with one role this round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Already as the spec says (or absent as it says).
    None,
    Create,
    Alter,
    Drop,
    /// The spec may not manage it (reserved or invalid name).
    Refused,
}

impl Action {
    /// The `status.access.roles[].state` of a plan that was carried out.
    pub fn state(self, ensure: Ensure) -> &'static str {
        match (self, ensure) {
            (Action::None, Ensure::Present) => "reconciled",
            (Action::None, Ensure::Absent) => "absent",
            (Action::Create, _) => "created",
            (Action::Alter, _) => "altered",
            (Action::Drop, _) => "dropped",
            (Action::Refused, _) => "refused",
        }
    }
}

/// One role's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolePlan {
    pub name: String,
    pub action: Action,
    /// What differed on the primary (attribute names, `password`, …).
    pub drift: Vec<String>,
    pub stmts: Vec<Stmt>,
    /// Why the role was refused.
    pub refusal: Option<String>,
}

/// Why `spec` cannot be managed, or `None`.
pub fn refusal(spec: &RoleSpec) -> Option<String> {
    if let Some(r) = name_refusal(&spec.name) {
        return Some(format!("role name {}", r));
    }
    if let Some(r) = reserved_role(&spec.name) {
        return Some(format!("role {:?} {r}", spec.name));
    }
    for m in &spec.in_roles {
        if let Some(r) = name_refusal(m) {
            return Some(format!("inRoles entry {r}"));
        }
        if reserved_role(m).is_some_and(|_| !m.starts_with("pg_")) || *m == spec.name {
            return Some(format!("role {:?} may not be a member of {m:?}", spec.name));
        }
    }
    if let Some(v) = &spec.valid_until
        && valid_until(v).is_none()
    {
        return Some(format!(
            "role {:?}: validUntil is not an RFC 3339 time",
            spec.name
        ));
    }
    if spec.comment.as_deref().is_some_and(|c| c.contains('\0')) {
        return Some(format!("role {:?}: comment contains NUL", spec.name));
    }
    None
}

/// `validUntil` as the catalog prints it (UTC, seconds).
pub fn valid_until(v: &str) -> Option<String> {
    let t = chrono::DateTime::parse_from_rfc3339(v).ok()?;
    Some(
        t.with_timezone(&chrono::Utc)
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string(),
    )
}

/// The attributes of `spec` as `(name, wanted, actual)`, in
/// `CREATE ROLE` keyword form.
fn flags(spec: &RoleSpec, actual: Option<&ActualRole>) -> Vec<(&'static str, bool, bool)> {
    let a = |f: fn(&ActualRole) -> bool| actual.map(f).unwrap_or(false);
    vec![
        ("LOGIN", spec.login, a(|r| r.login)),
        ("SUPERUSER", spec.superuser, a(|r| r.superuser)),
        ("CREATEDB", spec.createdb, a(|r| r.createdb)),
        ("CREATEROLE", spec.createrole, a(|r| r.createrole)),
        ("INHERIT", spec.inherit, a(|r| r.inherit)),
        ("REPLICATION", spec.replication, a(|r| r.replication)),
        ("BYPASSRLS", spec.bypassrls, a(|r| r.bypassrls)),
    ]
}

/// The statement giving the superuser `password`, unless its stored
/// verifier was derived from it already. Used when superuser access is
/// turned on for a cluster initialised without a superuser password.
pub fn superuser_password(password: &str, catalog: &Catalog) -> Option<Stmt> {
    let current = catalog.roles.iter().find(|r| r.name == "postgres");
    if current
        .and_then(|r| r.verifier.as_deref())
        .is_some_and(|v| verifier_matches(v, password))
    {
        return None;
    }
    Some(Stmt::on_postgres(format!(
        "ALTER ROLE postgres WITH PASSWORD {}",
        literal(&scram_verifier_random(password))
    )))
}

/// The plan for one declared role. `password` is the Secret's (None: the
/// spec names no Secret, the password is left alone).
pub fn plan(spec: &RoleSpec, password: Option<&str>, catalog: &Catalog) -> RolePlan {
    plan_checked(spec, password, catalog, refusal(spec))
}

/// The plan for a role pgfleet itself declares under a reserved name (the
/// pooler's login, controller::pooler::auth): the same comparison, without
/// the refusal a spec would get for the name.
pub fn plan_own(spec: &RoleSpec, password: Option<&str>, catalog: &Catalog) -> RolePlan {
    plan_checked(spec, password, catalog, None)
}

fn plan_checked(
    spec: &RoleSpec,
    password: Option<&str>,
    catalog: &Catalog,
    refusal: Option<String>,
) -> RolePlan {
    let mut p = RolePlan {
        name: spec.name.clone(),
        action: Action::None,
        drift: vec![],
        stmts: vec![],
        refusal,
    };
    if p.refusal.is_some() {
        p.action = Action::Refused;
        return p;
    }
    let actual = catalog.role(&spec.name);
    let name = ident(&spec.name);
    match (spec.ensure, actual) {
        (Ensure::Absent, None) => p,
        (Ensure::Absent, Some(_)) => {
            p.action = Action::Drop;
            p.stmts
                .push(Stmt::on_postgres(format!("DROP ROLE IF EXISTS {name}")));
            p
        }
        (Ensure::Present, None) => {
            p.action = Action::Create;
            let mut sql = format!("CREATE ROLE {name} WITH");
            for (kw, want, _) in flags(spec, None) {
                sql.push_str(&format!(" {}{kw}", if want { "" } else { "NO" }));
            }
            sql.push_str(&format!(" CONNECTION LIMIT {}", spec.connection_limit));
            if let Some(v) = spec.valid_until.as_deref().and_then(valid_until) {
                sql.push_str(&format!(" VALID UNTIL {}", literal(&v)));
            }
            if let Some(pw) = password {
                sql.push_str(&format!(
                    " PASSWORD {}",
                    literal(&scram_verifier_random(pw))
                ));
            }
            p.stmts.push(Stmt::on_postgres(sql));
            p.stmts.extend(memberships(spec, None));
            if let Some(c) = &spec.comment {
                p.stmts.push(comment(&name, Some(c)));
            }
            p
        }
        (Ensure::Present, Some(a)) => {
            alter(spec, password, a, &mut p);
            p
        }
    }
}

/// Statements bringing an existing role to the spec; each difference is
/// named in `drift`.
fn alter(spec: &RoleSpec, password: Option<&str>, a: &ActualRole, p: &mut RolePlan) {
    let name = ident(&spec.name);
    let mut attrs = String::new();
    for (kw, want, have) in flags(spec, Some(a)) {
        if want != have {
            p.drift.push(kw.to_lowercase());
            attrs.push_str(&format!(" {}{kw}", if want { "" } else { "NO" }));
        }
    }
    if spec.connection_limit != a.connection_limit {
        p.drift.push("connectionLimit".into());
        attrs.push_str(&format!(" CONNECTION LIMIT {}", spec.connection_limit));
    }
    let want_until = spec.valid_until.as_deref().and_then(valid_until);
    if want_until != a.valid_until {
        p.drift.push("validUntil".into());
        let v = want_until.unwrap_or_else(|| "infinity".into());
        attrs.push_str(&format!(" VALID UNTIL {}", literal(&v)));
    }
    if let Some(pw) = password
        && !a
            .verifier
            .as_deref()
            .is_some_and(|v| verifier_matches(v, pw))
    {
        p.drift.push("password".into());
        attrs.push_str(&format!(
            " PASSWORD {}",
            literal(&scram_verifier_random(pw))
        ));
    }
    if !attrs.is_empty() {
        p.stmts
            .push(Stmt::on_postgres(format!("ALTER ROLE {name} WITH{attrs}")));
    }
    let grants = memberships(spec, Some(a));
    if !grants.is_empty() {
        p.drift.push("inRoles".into());
        p.stmts.extend(grants);
    }
    if spec.comment.as_deref().filter(|c| !c.is_empty()) != a.comment.as_deref() {
        p.drift.push("comment".into());
        p.stmts.push(comment(&name, spec.comment.as_deref()));
    }
    if !p.stmts.is_empty() {
        p.action = Action::Alter;
    }
}

/// GRANT for memberships the spec lists and the role lacks, REVOKE for
/// those it has and the spec does not list.
fn memberships(spec: &RoleSpec, actual: Option<&ActualRole>) -> Vec<Stmt> {
    let have: &[String] = actual.map(|a| a.member_of.as_slice()).unwrap_or(&[]);
    let name = ident(&spec.name);
    let mut out = vec![];
    for m in spec.in_roles.iter().filter(|m| !have.contains(m)) {
        out.push(Stmt::on_postgres(format!("GRANT {} TO {name}", ident(m))));
    }
    for m in have.iter().filter(|m| !spec.in_roles.contains(m)) {
        out.push(Stmt::on_postgres(format!(
            "REVOKE {} FROM {name}",
            ident(m)
        )));
    }
    out
}

fn comment(name: &str, text: Option<&str>) -> Stmt {
    let v = match text.filter(|t| !t.is_empty()) {
        Some(t) => literal(t),
        None => "NULL".into(),
    };
    Stmt::on_postgres(format!("COMMENT ON ROLE {name} IS {v}"))
}

/// Names declared twice (the first wins; the rest are refused).
pub fn duplicates(specs: &[RoleSpec]) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    specs
        .iter()
        .filter(|s| !seen.insert(s.name.as_str()))
        .map(|s| s.name.clone())
        .collect()
}

#[cfg(test)]
#[path = "roles_tests.rs"]
mod tests;
