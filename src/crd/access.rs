//! What applications connect with (issue 13): the application database
//! created at bootstrap (`spec.bootstrap.initdb`), declarative roles
//! (`spec.roles`) and databases (`spec.databases`), and what the controller
//! reports about them (`status.access`). Every name here is tenant input:
//! the CRD bounds its length, `postgres::roles` checks it is an identifier
//! pgfleet may manage before any SQL is rendered.

use super::cluster::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec.bootstrap.initdb`: the application database and its owner,
/// created on the primary once it runs (idempotently: a database or role
/// that exists is left as it is). Defaults: database `app`, owner `app`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InitdbSpec {
    /// The application database (default `app`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub database: Option<String>,
    /// The role owning it, with LOGIN (default `app`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub owner: Option<String>,
    /// An existing Secret (keys `username`, `password`) whose password the
    /// owner gets; generated when absent. The username must equal `owner`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub secret: Option<String>,
    /// `ENCODING` of the database (default `UTF8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub encoding: Option<String>,
    /// `LOCALE` of the database (default: the cluster's, `C.UTF-8` style).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub locale: Option<String>,
}

/// Whether a declared role or database must exist.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Ensure {
    #[default]
    Present,
    /// Dropped when it exists (a role owning objects is reported, not
    /// forced: pgfleet never reassigns or drops a tenant's objects).
    Absent,
}

/// `spec.roles[]`: one role managed on the primary. Attributes left out
/// keep PostgreSQL's defaults for a new role (`inherit` true, the rest
/// false); a role altered by hand is reported as drift and corrected.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleSpec {
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    #[serde(default)]
    pub ensure: Ensure,
    #[serde(default)]
    pub login: bool,
    #[serde(default)]
    pub superuser: bool,
    #[serde(default)]
    pub createdb: bool,
    #[serde(default)]
    pub createrole: bool,
    #[serde(default = "yes")]
    pub inherit: bool,
    #[serde(default)]
    pub replication: bool,
    #[serde(default)]
    pub bypassrls: bool,
    /// `CONNECTION LIMIT` (-1: none, the default).
    #[serde(default = "no_limit")]
    #[schemars(range(min = -1, max = 100000))]
    pub connection_limit: i32,
    /// `VALID UNTIL`, RFC 3339 ("2027-01-01T00:00:00Z"); none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub valid_until: Option<String>,
    /// Roles this role is a member of (memberships not listed are revoked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 63)))]
    pub in_roles: Vec<String>,
    /// A Secret in this namespace with key `password` (and optionally
    /// `username`, which must equal `name`): the role's password. A changed
    /// Secret is applied at the next reconcile, without a restart. Without
    /// it the role has no password (it cannot log in with one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub password_secret: Option<String>,
    /// `COMMENT ON ROLE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub comment: Option<String>,
}

fn yes() -> bool {
    true
}
fn no_limit() -> i32 {
    -1
}

/// `spec.databases[]`: one database managed on the primary, with the
/// extensions and schemas it must have. Extensions and schemas are only
/// ever created, never dropped (that would destroy data).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseSpec {
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// The owning role (default `postgres`); it must exist (declare it in
    /// `spec.roles` or as the initdb owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub owner: Option<String>,
    /// `absent` drops the database only when nobody is connected to it.
    #[serde(default)]
    pub ensure: Ensure,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub extensions: Vec<ExtensionSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 63)))]
    pub schemas: Vec<String>,
}

/// An extension a database must have.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionSpec {
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// A version the image offers; the default version when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub version: Option<String>,
}

/// `status.access`: what the controller last found and did on the primary.
/// Computed by the access step and written with the round's status.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessStatus {
    /// The spec generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The primary the roles were last reconciled on (a new primary after
    /// a failover or restore is checked at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
    /// The superuser keeps network access although
    /// `spec.enableSuperuserAccess` is not set: the cluster ran before
    /// pgfleet managed access (set once, at the first access round).
    #[serde(default)]
    pub legacy_superuser_access: bool,
    /// `AppDatabaseReady`, `RolesReconciled`, `DatabasesReconciled`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<RoleStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub databases: Vec<DatabaseStatus>,
}

/// One managed role as last seen.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleStatus {
    pub name: String,
    /// `reconciled`, `created`, `altered`, `dropped`, `absent`, `refused`,
    /// `failed`.
    pub state: String,
    /// What differed from the spec on the primary (empty when nothing did).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<String>,
    /// Where the role is declared: `spec` (the tenant's `spec.roles` or
    /// the initdb owner) or `fleet:<set>` (`[roles.<set>]` of the fleet
    /// config, which the spec cannot override).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// For a fleet role: the password generation last applied (the source
    /// Secret's key `password-<generation>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// SHA-256 (hex, first 16 characters) of the password last applied,
    /// salted with the role name: tells a changed Secret apart without
    /// keeping the password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One managed database as last seen.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseStatus {
    pub name: String,
    /// `reconciled`, `created`, `altered`, `dropped`, `absent`, `refused`,
    /// `failed`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The annotation naming the password generation of fleet role set `set`
/// a PostgresCluster is to use: written by a rollout with `role_set`.
pub fn role_set_annotation(set: &str) -> String {
    format!("roles.pgfleet.io/{set}")
}

impl super::PostgresCluster {
    /// The generation of fleet role set `set` applied last, as reported in
    /// `status.access` (for the role the set declares).
    pub fn role_set_applied(&self, set: &str) -> Option<u64> {
        let source = format!("fleet:{set}");
        self.status
            .as_ref()?
            .access
            .as_ref()?
            .roles
            .iter()
            .find(|r| r.source.as_deref() == Some(source.as_str()))
            .and_then(|r| r.generation)
    }

    /// The generation of `set` this cluster is to use: the annotation a
    /// rollout wrote, else the one it has (a cluster never moves to a new
    /// password outside a rollout), else `None` (a new cluster: the newest).
    pub fn role_set_pinned(&self, set: &str) -> Option<u64> {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(&role_set_annotation(set)))
            .and_then(|g| g.trim().parse().ok())
            .or_else(|| self.role_set_applied(set))
    }
}
