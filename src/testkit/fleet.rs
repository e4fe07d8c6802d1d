//! A pgfleet manager, in-process, over embedded member clusters: the
//! environment of the controller tests and the rollout benchmark (virtual
//! runtime) and, with one member on the process runtime, of the failover
//! and backup tests and benchmarks ([`super::process`]).

use super::{Error, Result, wait};
use crate::config::Settings;
use crate::crd::PostgresCluster;
use crate::manager::Manager;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, Patch, PatchParams};
use std::path::Path;
use std::time::Duration;

/// Shards and workers per member of the many-object environments (more
/// than the defaults, so a test's objects do not queue behind each other).
pub const MANY_OBJECTS: &str = "shards_per_cluster = 4\nworkers_per_cluster = 8\n";

/// The fleet config of an environment: members `members` embedded on
/// `runtime` ("virtual" or "process"), member `i` labelled `env=test,
/// wave=i` (rollout stages select on them); fast probes, so Unreachable and
/// Ready transitions are quick; generous client QPS, so the client rate
/// limit never paces a test. `manager_extra` goes into `[manager]`.
pub fn embedded_toml(
    state_dir: &Path,
    runtime: &str,
    members: &[&str],
    manager_extra: &str,
) -> String {
    let mut toml = format!(
        "[manager]\nstate_dir = \"{}\"\nprobe_interval = \"500ms\"\nprobe_timeout = \"500ms\"\n\
         probe_failure_threshold = 2\nqps = 500.0\nburst = 1000\n{manager_extra}\
         [manager.embedded]\nruntime = \"{runtime}\"\n",
        state_dir.display()
    );
    for (i, name) in members.iter().enumerate() {
        toml.push_str(&format!(
            "\n[[clusters]]\nname = \"{name}\"\nembedded = true\nlabels = {{ env = \"test\", wave = \"{i}\" }}\n"
        ));
    }
    toml
}

/// Parses an environment's fleet config; the error shows the config.
pub fn load(toml: &str) -> Result<Settings> {
    crate::config::load_str(toml, "testkit").map_err(|e| Error::Config(format!("{e}\n{toml}")))
}

/// Starts a manager from `toml` and waits until every embedded member
/// serves the PostgresCluster kind (the manager installs the CRD in the
/// background).
pub async fn start_manager(toml: &str, patience: Duration) -> Result<Manager> {
    let mgr = crate::manager::start(&load(toml)?, false)
        .await
        .map_err(Error::Manager)?;
    for member in &mgr.fleet.members {
        wait_served(&member.client(), &member.name, patience).await?;
    }
    Ok(mgr)
}

/// Waits until `client`'s cluster serves the PostgresCluster kind.
pub async fn wait_served(client: &kube::Client, member: &str, patience: Duration) -> Result<()> {
    let api: Api<PostgresCluster> = Api::all(client.clone());
    let what = format!("the PostgresCluster CRD served in {member}");
    wait::until(patience, &what, || {
        let api = api.clone();
        async move { api.list(&ListParams::default()).await.map(|_| ()) }
    })
    .await
}

/// Creates namespace `ns` (server-side apply: no error when it exists).
pub async fn apply_namespace(client: &kube::Client, ns: &str) -> Result<()> {
    let obj =
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
    Api::<Namespace>::all(client.clone())
        .patch(
            ns,
            &PatchParams::apply("pgfleet-testkit"),
            &Patch::Apply(&obj),
        )
        .await
        .map_err(Error::kube(format!("creating namespace {ns}")))?;
    Ok(())
}
