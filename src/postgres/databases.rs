//! `spec.databases` (and the initdb application database) against what the
//! primary reports: CREATE/ALTER/DROP DATABASE, and inside each database
//! the schemas and extensions it must have. Pure, like `roles`.
//!
//! Schemas and extensions are only ever created (or an extension updated
//! to the version asked for), never dropped: that would destroy data. An
//! extension the image does not offer is reported, and the rest of the
//! database is still reconciled — the spec waits for a fixed image instead
//! of failing the reconcile in a loop.

use super::catalog::Catalog;
use super::roles::{Action, Stmt};
use super::sql::{ident, literal, name_refusal, reserved_database};
use crate::crd::access::{DatabaseSpec, Ensure};

/// One database's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabasePlan {
    pub name: String,
    pub action: Action,
    /// Statements in `postgres` (CREATE/ALTER/DROP DATABASE), then in the
    /// database itself (schemas, extensions).
    pub stmts: Vec<Stmt>,
    pub refusal: Option<String>,
    /// Extensions the image does not offer (in the version asked for).
    pub unavailable: Vec<String>,
}

/// Options only the initdb application database has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateOptions {
    pub encoding: Option<String>,
    pub locale: Option<String>,
}

/// Why `spec` cannot be managed, or `None`.
pub fn refusal(spec: &DatabaseSpec, opts: &CreateOptions) -> Option<String> {
    if let Some(r) = name_refusal(&spec.name) {
        return Some(format!("database name {r}"));
    }
    if let Some(r) = reserved_database(&spec.name) {
        return Some(format!("database {:?} {r}", spec.name));
    }
    let named = spec.owner.iter().map(|o| ("owner", o));
    let named = named
        .chain(spec.schemas.iter().map(|s| ("schema", s)))
        .chain(spec.extensions.iter().map(|e| ("extension", &e.name)));
    for (what, n) in named {
        if let Some(r) = name_refusal(n) {
            return Some(format!("database {:?}: {what} name {r}", spec.name));
        }
    }
    let texts = [opts.encoding.as_deref(), opts.locale.as_deref()];
    let versions = spec.extensions.iter().map(|e| e.version.as_deref());
    if texts
        .into_iter()
        .chain(versions)
        .flatten()
        .any(|t| t.is_empty() || t.chars().any(|c| c.is_control()))
    {
        return Some(format!(
            "database {:?}: an encoding, locale or extension version is empty or has a control character",
            spec.name
        ));
    }
    None
}

/// The plan for one declared database.
pub fn plan(spec: &DatabaseSpec, opts: &CreateOptions, catalog: &Catalog) -> DatabasePlan {
    let mut p = DatabasePlan {
        name: spec.name.clone(),
        action: Action::None,
        stmts: vec![],
        refusal: refusal(spec, opts),
        unavailable: vec![],
    };
    if p.refusal.is_some() {
        p.action = Action::Refused;
        return p;
    }
    let name = ident(&spec.name);
    let owner = spec.owner.clone().unwrap_or_else(|| "postgres".into());
    let actual = catalog.database(&spec.name);
    match (spec.ensure, actual) {
        (Ensure::Absent, None) => return p,
        (Ensure::Absent, Some(_)) => {
            p.action = Action::Drop;
            p.stmts
                .push(Stmt::on_postgres(format!("DROP DATABASE IF EXISTS {name}")));
            return p;
        }
        (Ensure::Present, None) => {
            p.action = Action::Create;
            let mut sql = format!("CREATE DATABASE {name} OWNER {}", ident(&owner));
            if opts.encoding.is_some() || opts.locale.is_some() {
                sql.push_str(" TEMPLATE template0");
            }
            if let Some(e) = &opts.encoding {
                sql.push_str(&format!(" ENCODING {}", literal(e)));
            }
            if let Some(l) = &opts.locale {
                sql.push_str(&format!(" LOCALE {}", literal(l)));
            }
            p.stmts.push(Stmt::on_postgres(sql));
        }
        (Ensure::Present, Some(a)) if a.owner != owner => {
            p.action = Action::Alter;
            p.stmts.push(Stmt::on_postgres(format!(
                "ALTER DATABASE {name} OWNER TO {}",
                ident(&owner)
            )));
        }
        (Ensure::Present, Some(_)) => {}
    }
    inside(spec, &owner, catalog, &mut p);
    p
}

/// Schemas and extensions, run inside the database. A database not yet
/// inspected (just created) gets every statement (all are idempotent).
fn inside(spec: &DatabaseSpec, owner: &str, catalog: &Catalog, p: &mut DatabasePlan) {
    let actual = catalog.database(&spec.name).filter(|d| d.inspected);
    let db = Some(spec.name.clone());
    let mut changed = false;
    for s in &spec.schemas {
        if actual.is_some_and(|a| a.schemas.contains(s)) {
            continue;
        }
        changed = true;
        p.stmts.push(Stmt {
            db: db.clone(),
            sql: format!(
                "CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}",
                ident(s),
                ident(owner)
            ),
        });
    }
    for e in &spec.extensions {
        let offered = catalog.available(&e.name).is_some_and(|a| {
            e.version
                .as_ref()
                .is_none_or(|v| a.versions.iter().any(|x| x == v))
        });
        if !offered {
            let v = e
                .version
                .as_deref()
                .map(|v| format!(" {v}"))
                .unwrap_or_default();
            p.unavailable.push(format!("{}{v}", e.name));
            continue;
        }
        let installed = actual.and_then(|a| a.extensions.iter().find(|x| x.name == e.name));
        let version = e
            .version
            .as_deref()
            .map(|v| format!(" VERSION {}", literal(v)));
        let sql = match (installed, &e.version) {
            (None, _) => format!(
                "CREATE EXTENSION IF NOT EXISTS {}{}",
                ident(&e.name),
                version.unwrap_or_default()
            ),
            (Some(i), Some(v)) if i.version != *v => {
                format!(
                    "ALTER EXTENSION {} UPDATE TO {}",
                    ident(&e.name),
                    literal(v)
                )
            }
            (Some(_), _) => continue,
        };
        changed = true;
        p.stmts.push(Stmt {
            db: db.clone(),
            sql,
        });
    }
    if changed && p.action == Action::None {
        p.action = Action::Alter;
    }
}

#[cfg(test)]
#[path = "databases_tests.rs"]
mod tests;
