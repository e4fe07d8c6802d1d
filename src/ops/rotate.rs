//! `pgfleet rotate-password`: a new password for one managed role,
//! applied on the primary first and then written to the role's Secret.
//!
//! PostgreSQL checks a password only when a session authenticates, so
//! every open connection keeps working; a client that reconnects reads the
//! Secret, which holds the new password from the moment it is written. The
//! password is set as a SCRAM verifier through pods/exec (stdin), like
//! every role change of the controller (controller::access), and is never
//! printed.

use crate::controller::access::{AppLogin, app_secret_data, app_secret_name};
use crate::crd::PostgresCluster;
use crate::postgres::exec::run_verb_stdin;
use crate::postgres::sql::{ident, literal, random_password, scram_verifier_random};
use anyhow::{Context, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use std::collections::BTreeMap;
use std::time::Duration;

/// What was rotated.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Rotated {
    pub role: String,
    /// The Secret that now holds the new password.
    pub secret: String,
    /// The instance the password was set on.
    pub primary: String,
}

/// Where a role's password lives: the `<name>-app` Secret (the initdb
/// owner without a Secret of its own) or a Secret named in the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordHome {
    App(AppLogin),
    Named(String),
}

/// Finds the Secret of `role` in the spec (pure).
pub fn password_home(pg: &PostgresCluster, ns: &str, role: &str) -> anyhow::Result<PasswordHome> {
    let name = pg.metadata.name.clone().unwrap_or_default();
    if let Some(r) = pg.spec.roles.iter().find(|r| r.name == role)
        && let Some(s) = &r.password_secret
    {
        return Ok(PasswordHome::Named(s.clone()));
    }
    let init = pg
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.initdb.clone())
        .unwrap_or_default();
    let owner = init.owner.clone().unwrap_or_else(|| "app".into());
    if owner == role {
        if let Some(s) = init.secret {
            return Ok(PasswordHome::Named(s));
        }
        return Ok(PasswordHome::App(AppLogin {
            cluster: name,
            namespace: ns.to_string(),
            username: owner,
            password: String::new(),
            dbname: init.database.unwrap_or_else(|| "app".into()),
            pooler: pg.spec.pooler.as_ref().is_some_and(|p| p.enabled),
        }));
    }
    bail!(
        "role {role:?} is neither the application owner nor a spec.roles entry with a passwordSecret"
    )
}

/// Rotates the password of `role` in PostgresCluster `ns/name`.
pub async fn rotate_password(
    client: kube::Client,
    ns: &str,
    name: &str,
    role: &str,
) -> anyhow::Result<Rotated> {
    let pg = Api::<PostgresCluster>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .with_context(|| format!("reading PostgresCluster {ns}/{name}"))?;
    let home = password_home(&pg, ns, role)?;
    let primary = pg
        .status
        .as_ref()
        .and_then(|s| s.current_primary.clone())
        .with_context(|| format!("{ns}/{name} has no primary yet"))?;
    let password = random_password();
    set_password(&client, ns, &primary, role, &password).await?;
    let secret = write_secret(&client, ns, &home, &password).await?;
    // Once more: a controller round that read the old Secret just before it
    // was written may have put the old password back meanwhile.
    set_password(&client, ns, &primary, role, &password).await?;
    Ok(Rotated {
        role: role.to_string(),
        secret,
        primary,
    })
}

/// `ALTER ROLE … PASSWORD` with a fresh verifier, through exec (stdin).
async fn set_password(
    client: &kube::Client,
    ns: &str,
    primary: &str,
    role: &str,
    password: &str,
) -> anyhow::Result<()> {
    let sql = format!(
        "ALTER ROLE {} WITH PASSWORD {};\n",
        ident(role),
        literal(&scram_verifier_random(password))
    );
    run_verb_stdin(
        client,
        ns,
        primary,
        &["apply-sql", "--db", "postgres"],
        sql,
        Duration::from_secs(30),
    )
    .await
    .with_context(|| format!("setting the new password of {role:?} on {primary}"))?;
    Ok(())
}

/// Writes the new password (and, for the app Secret, every key derived
/// from it) into the role's Secret; returns the Secret's name.
async fn write_secret(
    client: &kube::Client,
    ns: &str,
    home: &PasswordHome,
    password: &str,
) -> anyhow::Result<String> {
    let (secret, data): (String, BTreeMap<String, String>) = match home {
        PasswordHome::App(l) => {
            let mut l = l.clone();
            l.password = password.to_string();
            (app_secret_name(&l.cluster), app_secret_data(&l))
        }
        PasswordHome::Named(s) => (
            s.clone(),
            BTreeMap::from([("password".to_string(), password.to_string())]),
        ),
    };
    let data: BTreeMap<String, ByteString> = data
        .into_iter()
        .map(|(k, v)| (k, ByteString(v.into_bytes())))
        .collect();
    let patch = serde_json::json!({"data": data});
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(&secret, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| {
            format!("the new password is set in PostgreSQL but Secret {secret} could not be written; run rotate-password again")
        })?;
    Ok(secret)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pg(spec: serde_json::Value) -> PostgresCluster {
        PostgresCluster::new("orders", serde_json::from_value(spec).unwrap())
    }

    #[test]
    fn finds_where_a_password_lives() {
        let p = pg(
            serde_json::json!({"roles": [{"name": "reader", "passwordSecret": "reader-pw"},
            {"name": "nopw"}]}),
        );
        assert_eq!(
            password_home(&p, "shop", "reader").unwrap(),
            PasswordHome::Named("reader-pw".into())
        );
        match password_home(&p, "shop", "app").unwrap() {
            PasswordHome::App(l) => {
                assert_eq!((l.username.as_str(), l.dbname.as_str()), ("app", "app"))
            }
            other => panic!("{other:?}"),
        }
        assert!(password_home(&p, "shop", "nopw").is_err());
        assert!(password_home(&p, "shop", "postgres").is_err());
        let p = pg(serde_json::json!({"bootstrap": {"initdb": {"owner": "o", "secret": "mine"}}}));
        assert_eq!(
            password_home(&p, "shop", "o").unwrap(),
            PasswordHome::Named("mine".into())
        );
    }
}
