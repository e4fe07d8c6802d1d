//! The operations that change intent, shared by the HTTP API and the direct
//! CLI commands (`pgfleet switchover`, `backup now`, `rollout pause …`), so
//! both write exactly the same durable request: an annotation on the
//! PostgresCluster, a PostgresBackup record, a rollout control ConfigMap.
//! The manager's controllers, dispatcher and engines carry them out.

use crate::crd::{PostgresBackup, PostgresCluster};
use crate::fleet::Fleet;
use crate::platform::labels::SWITCHOVER_TO;
use crate::rollout::control::{self, Stored};
use crate::rollout::engine::{Engine, Observation};
use anyhow::Context;
use kube::Api;
use kube::api::{Patch, PatchParams};
use std::sync::Arc;

/// A switchover that was requested.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SwitchoverRequested {
    /// The primary when it was requested.
    pub from: String,
    /// The requested target; `None`: the most advanced replica.
    pub to: Option<String>,
}

/// Asks the manager for a switchover of `ns/name` (optionally to `to`).
pub async fn request_switchover(
    client: kube::Client,
    ns: &str,
    name: &str,
    to: Option<&str>,
) -> anyhow::Result<SwitchoverRequested> {
    let api: Api<PostgresCluster> = Api::namespaced(client, ns);
    let before = api
        .get(name)
        .await
        .with_context(|| format!("reading PostgresCluster {ns}/{name}"))?;
    let st = before.status.unwrap_or_default();
    // The controller ignores a request for a cluster without a primary
    // (nothing to switch over from); say so instead of "from \"\"".
    let Some(from) = st.current_primary.clone() else {
        anyhow::bail!("{ns}/{name} has no current primary to switch over from");
    };
    if let Some(to) = to {
        let known = st.instances.is_empty() || st.instances.iter().any(|i| i.name == to);
        anyhow::ensure!(known, "{ns}/{name} has no instance named {to:?}");
    }
    let patch =
        serde_json::json!({"metadata": {"annotations": {SWITCHOVER_TO: to.unwrap_or("auto")}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("requesting the switchover")?;
    Ok(SwitchoverRequested {
        from,
        to: to.map(String::from),
    })
}

/// Creates an on-demand full backup record for `ns/name`; returns its name.
pub async fn request_backup(client: kube::Client, ns: &str, name: &str) -> anyhow::Result<String> {
    let pgs: Api<PostgresCluster> = Api::namespaced(client.clone(), ns);
    pgs.get(name)
        .await
        .with_context(|| format!("reading PostgresCluster {ns}/{name}"))?;
    let stamp = chrono::Utc::now().format("%Y%m%d%H%M%S");
    let backup = format!("{name}-manual-{stamp}");
    let obj: PostgresBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresBackup",
        "metadata": {"name": backup, "namespace": ns, "labels": {"pgfleet.io/cluster": name}},
        "spec": {"cluster": name, "type": "full", "trigger": "manual"},
    }))?;
    let api: Api<PostgresBackup> = Api::namespaced(client, ns);
    api.create(&Default::default(), &obj)
        .await
        .context("creating the PostgresBackup")?;
    Ok(backup)
}

/// The result of a rollout command.
pub struct RolloutCommanded {
    pub stored: Stored,
    /// Member clusters that hold the new control.
    pub stored_in: usize,
}

/// Applies `word` (pause, resume, abort, rollback, approve + `stage`) to
/// the rollout's stored control and writes it to the control home
/// (`rollout::control`). `_fleet` is unused since controls have one home;
/// kept so callers need not change.
pub async fn rollout_command(
    engine: &Engine,
    _fleet: &Arc<Fleet>,
    obs: &Observation,
    word: &str,
    stage: Option<&str>,
    who: &str,
) -> anyhow::Result<RolloutCommanded> {
    let name = &engine.spec.name;
    if let Some(why) = &obs.control_error {
        anyhow::bail!("rollout {name}: {why}");
    }
    let command = control::parse_command(word, stage)?;
    let stages: Vec<&str> = engine.spec.stages.iter().map(|s| s.name.as_str()).collect();
    let next = control::apply(
        obs.stored.clone(),
        &command,
        engine.failures(&obs.pgcs),
        &stages,
        who,
    )?;
    control::write(engine.control_home(), name, next.clone()).await?;
    Ok(RolloutCommanded {
        stored: next,
        stored_in: 1,
    })
}
