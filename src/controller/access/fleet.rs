//! Fleet role sets (`[roles.<set>]`) in the access round: which sets a
//! PostgresCluster gets, the password generation it is pinned to, and how
//! they merge with what the tenant declares.
//!
//! Precedence: a fleet role always wins. A `spec.roles` entry (or the
//! initdb owner) with a fleet role's name is not applied — in either
//! direction: the tenant can neither change its attributes, nor drop it
//! with `ensure: absent`, nor take its name for a role of its own — and is
//! reported as `refused` in `status.access.roles`, which turns
//! `RolesReconciled` false with the reason in its message.

use crate::config::roles::{RoleSet, generations, password_key};
use crate::crd::PostgresCluster;
use crate::crd::access::{Ensure, RoleSpec, RoleStatus};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;

/// A fleet role for one cluster: its spec, and the generation and password
/// it is to have (or why they cannot be read).
pub(super) struct FleetRole {
    pub set: String,
    pub spec: RoleSpec,
    pub password: Result<(u64, String), String>,
    /// The generation `status.access` reports applied.
    pub applied: Option<u64>,
}

/// The sets selecting `pg`, with their passwords read from the source
/// Secret in this member cluster. Without a pin (a new cluster) the newest
/// generation is used: there is no older client to keep working.
pub(super) async fn roles_for(
    pg: &PostgresCluster,
    client: &kube::Client,
    sets: &BTreeMap<String, RoleSet>,
) -> Vec<FleetRole> {
    let labels = pg.labels();
    let mut out = vec![];
    for (name, set) in sets.iter().filter(|(_, s)| s.selects(labels)) {
        let api: Api<Secret> = Api::namespaced(client.clone(), &set.password_secret_namespace);
        let secret = api.get_opt(&set.password_secret).await.map_err(|e| {
            format!(
                "fleet role set {name}: could not read Secret {}/{}: {e}",
                set.password_secret_namespace, set.password_secret
            )
        });
        let password = secret.and_then(|s| pick(name, set, s.as_ref(), pg.role_set_pinned(name)));
        out.push(FleetRole {
            set: name.clone(),
            spec: role_spec(set),
            password,
            applied: pg.role_set_applied(name),
        });
    }
    out
}

/// The generation and password to apply (pure).
fn pick(
    set_name: &str,
    set: &RoleSet,
    secret: Option<&Secret>,
    pinned: Option<u64>,
) -> Result<(u64, String), String> {
    let where_ = format!(
        "fleet role set {set_name}: Secret {}/{}",
        set.password_secret_namespace, set.password_secret
    );
    let secret = secret.ok_or_else(|| format!("{where_} does not exist in this member cluster"))?;
    let data = secret.data.clone().unwrap_or_default();
    let have = generations(data.keys().map(String::as_str));
    let generation = match pinned.or(have.last().copied()) {
        Some(g) => g,
        None => return Err(format!("{where_} has no key password-<N>")),
    };
    let value = data
        .get(&password_key(generation))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned());
    match value {
        Some(p) if !p.is_empty() && !p.contains(['\n', '\r', '\0']) => Ok((generation, p)),
        Some(_) => Err(format!(
            "{where_}: key {} is not a usable password (one line, not empty)",
            password_key(generation)
        )),
        None => Err(format!(
            "{where_} has no key {} (generation {generation})",
            password_key(generation)
        )),
    }
}

/// The set's role as a `spec.roles` entry (its password is set apart).
pub(super) fn role_spec(set: &RoleSet) -> RoleSpec {
    RoleSpec {
        name: set.role.clone(),
        ensure: Ensure::Present,
        login: set.login,
        superuser: set.superuser,
        createdb: set.createdb,
        createrole: set.createrole,
        inherit: set.inherit,
        replication: set.replication,
        bypassrls: set.bypassrls,
        connection_limit: set.connection_limit,
        valid_until: set.valid_until.clone(),
        in_roles: set.in_roles.clone(),
        password_secret: None,
        comment: set.comment.clone(),
    }
}

/// The status of a tenant's role that collides with a fleet role.
pub(super) fn conflict(name: &str, set: &str) -> RoleStatus {
    RoleStatus {
        name: name.to_string(),
        state: "refused".into(),
        source: Some("spec".into()),
        message: Some(format!(
            "role {name:?} is managed by fleet role set {set:?}; the spec entry is ignored \
             (a fleet role cannot be changed, dropped or taken over by spec.roles)"
        )),
        ..Default::default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(keys: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                keys.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn set() -> RoleSet {
        RoleSet {
            role: "monitor".into(),
            password_secret: "monitor-pw".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_new_cluster_takes_the_newest_a_pinned_one_keeps_its_generation() {
        let s = secret(&[("password-1", "one"), ("password-2", "two")]);
        assert_eq!(
            pick("m", &set(), Some(&s), None).unwrap(),
            (2, "two".into())
        );
        assert_eq!(
            pick("m", &set(), Some(&s), Some(1)).unwrap(),
            (1, "one".into())
        );
    }

    #[test]
    fn missing_secret_or_generation_is_an_error_without_the_password() {
        let s = secret(&[("password-1", "sekrit")]);
        let e = pick("m", &set(), Some(&s), Some(3)).unwrap_err();
        assert!(e.contains("password-3") && !e.contains("sekrit"), "{e}");
        let e = pick("m", &set(), None, None).unwrap_err();
        assert!(e.contains("pgfleet-system/monitor-pw"), "{e}");
        let e = pick("m", &set(), Some(&secret(&[("password", "x")])), None).unwrap_err();
        assert!(e.contains("password-<N>"), "{e}");
    }
}
