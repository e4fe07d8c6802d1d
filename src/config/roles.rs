//! `[roles.<set>]`: fleet role sets, one PostgreSQL role the platform team
//! wants identical in every PostgresCluster whose labels match, in every
//! member cluster (a monitoring or reporting login, say).
//!
//! The password comes from a source Secret that exists once per member
//! cluster (same name and namespace everywhere, written by the platform
//! team or its secret manager), one key per generation: `password-1`,
//! `password-2`, … A cluster keeps the generation it has until a rollout
//! with `role_set = "<set>"` moves it (see docs/rollouts.md), so a new
//! password reaches the fleet stage by stage, never all at once.

use serde::Deserialize;

use super::selector::Selector;

/// The source Secret's key holding generation `g`'s password.
pub fn password_key(generation: u64) -> String {
    format!("password-{generation}")
}

/// The generations a source Secret holds (keys `password-<N>`, N ≥ 1).
pub fn generations<'a>(keys: impl Iterator<Item = &'a str>) -> Vec<u64> {
    let mut out: Vec<u64> = keys
        .filter_map(|k| k.strip_prefix("password-")?.parse().ok())
        .filter(|g| *g >= 1)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// One role set. The role attributes mean what they mean in `spec.roles`
/// (docs/connecting-applications.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct RoleSet {
    /// The PostgreSQL role (required).
    pub role: String,
    /// The PostgresClusters that get the role, by their labels, in every
    /// member cluster (required; `""` selects all).
    pub postgresclusters: Option<Selector>,
    /// The source Secret's name (required); it exists in every member.
    pub password_secret: String,
    /// The source Secret's namespace.
    pub password_secret_namespace: String,
    pub login: bool,
    pub superuser: bool,
    pub createdb: bool,
    pub createrole: bool,
    pub inherit: bool,
    pub replication: bool,
    pub bypassrls: bool,
    /// `CONNECTION LIMIT` (-1: none).
    pub connection_limit: i32,
    /// `VALID UNTIL`, RFC 3339.
    pub valid_until: Option<String>,
    pub in_roles: Vec<String>,
    pub comment: Option<String>,
}

impl Default for RoleSet {
    fn default() -> Self {
        Self {
            role: String::new(),
            postgresclusters: None,
            password_secret: String::new(),
            password_secret_namespace: "pgfleet-system".into(),
            login: true,
            superuser: false,
            createdb: false,
            createrole: false,
            inherit: true,
            replication: false,
            bypassrls: false,
            connection_limit: -1,
            valid_until: None,
            in_roles: Vec::new(),
            comment: None,
        }
    }
}

impl RoleSet {
    /// Whether a PostgresCluster with these labels gets the role.
    pub fn selects(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.postgresclusters
            .as_ref()
            .and_then(|s| s.parsed())
            .is_some_and(|s| s.matches(labels))
    }

    /// Problems with this set: `(key, message)`. `set` is its name.
    pub(crate) fn problems(&self, set: &str) -> Vec<(&'static str, String)> {
        let mut out = vec![];
        // The name goes into annotation keys (roles.pgfleet.io/<set> and the
        // rollout marks, `<set>-rollout-previous-version`): at most 63.
        if !super::selector::is_dns_label(set) || set.len() > 30 {
            out.push((
                "",
                format!(
                    "role set name {set:?} must be a DNS-1123 label of at most 30 characters \
                     (lowercase letters, digits and '-')"
                ),
            ));
        }
        if self.role.is_empty() {
            out.push(("role", "is required".into()));
        } else if let Some(r) = role_name_refusal(&self.role) {
            out.push(("role", format!("role {:?} {r}", self.role)));
        }
        if self.postgresclusters.is_none() {
            out.push((
                "postgresclusters",
                "is required (a label selector over PostgresCluster labels; \"\" selects all)"
                    .into(),
            ));
        }
        if !valid_object_name(&self.password_secret) {
            out.push((
                "password_secret",
                "is required: the name of a Secret (DNS-1123 subdomain)".into(),
            ));
        }
        if !super::selector::is_dns_label(&self.password_secret_namespace) {
            out.push((
                "password_secret_namespace",
                "must be a namespace name (DNS-1123 label)".into(),
            ));
        }
        if !(-1..=100_000).contains(&self.connection_limit) {
            out.push(("connection_limit", "must be between -1 and 100000".into()));
        }
        if let Some(v) = &self.valid_until
            && chrono::DateTime::parse_from_rfc3339(v).is_err()
        {
            out.push((
                "valid_until",
                "must be an RFC 3339 time such as \"2027-01-01T00:00:00Z\"".into(),
            ));
        }
        for r in &self.in_roles {
            // Memberships in pg_ roles (pg_monitor, pg_read_all_data) are
            // what fleet roles are for; pgfleet's own roles are not.
            let why = match r.as_str() {
                "postgres" | "replicator" => Some("is one of pgfleet's own roles"),
                _ if r.starts_with("pg_") => None,
                _ => role_name_refusal(r),
            };
            if let Some(why) = why {
                out.push(("in_roles", format!("role {r:?} {why}")));
            }
        }
        out
    }
}

/// Why a role name cannot be a fleet role (the controller checks again
/// with PostgreSQL's own rules before any SQL is rendered).
fn role_name_refusal(name: &str) -> Option<&'static str> {
    if name.len() > 63 {
        Some("is longer than 63 bytes")
    } else if name.chars().any(char::is_control) {
        Some("contains a control character")
    } else if name == "postgres" || name == "replicator" || name.starts_with("pg_") {
        Some("is reserved (pgfleet's own roles and PostgreSQL's pg_ roles)")
    } else {
        None
    }
}

fn valid_object_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(super::selector::is_dns_label)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn generations_come_from_numbered_keys_only() {
        let keys = ["password-2", "password", "password-10", "password-0", "x"];
        assert_eq!(generations(keys.into_iter()), vec![2, 10]);
    }
}
