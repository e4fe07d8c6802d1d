//! Operator commands for a rollout (pause, resume, abort, rollback,
//! approve), stored durably in Kubernetes (DESIGN §3): a ConfigMap
//! `pgfleet-rollout-<name>` in namespace `pgfleet-system` of every reachable
//! member cluster. Each write carries a revision one above the highest seen;
//! readers take the copy with the highest revision, so a command survives
//! any single member cluster (or the manager) going away.

use super::plan::{Control, ControlState};
use crate::fleet::Member;
use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;

pub const NAMESPACE: &str = "pgfleet-system";

/// A stored control with its revision and how many failures an operator
/// acknowledged by resuming (they no longer count against `max_failures`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stored {
    pub control: Control,
    pub acknowledged: u32,
    pub revision: u64,
}

pub fn object_name(rollout: &str) -> String {
    format!("pgfleet-rollout-{rollout}")
}

fn state_name(s: ControlState) -> &'static str {
    match s {
        ControlState::Active => "active",
        ControlState::Paused => "paused",
        ControlState::Aborted => "aborted",
        ControlState::RollingBack => "rolling-back",
    }
}

fn parse_state(s: &str) -> ControlState {
    match s {
        "paused" => ControlState::Paused,
        "aborted" => ControlState::Aborted,
        "rolling-back" => ControlState::RollingBack,
        _ => ControlState::Active,
    }
}

fn from_config_map(cm: &ConfigMap) -> Stored {
    let data = cm.data.clone().unwrap_or_default();
    let get = |k: &str| data.get(k).cloned().unwrap_or_default();
    Stored {
        control: Control {
            state: parse_state(&get("state")),
            approved: get("approved")
                .split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect::<BTreeSet<_>>(),
            reason: Some(get("reason")).filter(|r| !r.is_empty()),
        },
        acknowledged: get("acknowledged").parse().unwrap_or(0),
        revision: get("revision").parse().unwrap_or(0),
    }
}

/// Reads the newest stored control among the given members (default when
/// none holds one). Unreachable members are skipped.
pub async fn read(members: &[Arc<Member>], rollout: &str) -> Stored {
    let mut best = Stored::default();
    for m in members {
        let api: Api<ConfigMap> = Api::namespaced(m.client(), NAMESPACE);
        match api.get_opt(&object_name(rollout)).await {
            Ok(Some(cm)) => {
                let s = from_config_map(&cm);
                if s.revision > best.revision {
                    best = s;
                }
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(cluster = %m.name, error = %e, "reading rollout control"),
        }
    }
    best
}

/// Writes `next` (with a revision above the newest) to every reachable
/// member; fails only when no member took it.
pub async fn write(members: &[Arc<Member>], rollout: &str, mut next: Stored) -> anyhow::Result<()> {
    next.revision = read(members, rollout).await.revision + 1;
    let approved: Vec<&str> = next.control.approved.iter().map(String::as_str).collect();
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": object_name(rollout), "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/managed-by": "pgfleet", "pgfleet.io/rollout": rollout}},
        "data": {
            "state": state_name(next.control.state),
            "reason": next.control.reason.clone().unwrap_or_default(),
            "approved": approved.join(","),
            "acknowledged": next.acknowledged.to_string(),
            "revision": next.revision.to_string(),
        },
    });
    let mut stored = 0;
    let mut errors = vec![];
    for m in members {
        let ns: Api<Namespace> = Api::all(m.client());
        let nsobj =
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
        let pp = PatchParams::apply("pgfleet-rollout");
        let res = async {
            ns.patch(NAMESPACE, &pp, &Patch::Apply(&nsobj)).await?;
            Api::<ConfigMap>::namespaced(m.client(), NAMESPACE)
                .patch(
                    &object_name(rollout),
                    &pp.clone().force(),
                    &Patch::Apply(&cm),
                )
                .await
        }
        .await;
        match res {
            Ok(_) => stored += 1,
            Err(e) => errors.push(format!("{}: {e}", m.name)),
        }
    }
    if stored == 0 {
        bail!(
            "no member cluster could store the rollout control: {}",
            errors.join("; ")
        );
    }
    Ok(())
}

/// An operator command.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Pause,
    /// Also acknowledges the failures so far (they stop counting).
    Resume,
    Abort,
    Rollback,
    Approve(String),
}

/// Applies a command to the stored control; `failures` is the number of
/// failed PostgresClusters right now (for `Resume`).
pub fn apply(mut s: Stored, cmd: &Command, failures: u32, who: &str) -> anyhow::Result<Stored> {
    match cmd {
        Command::Pause => {
            s.control.state = ControlState::Paused;
            s.control.reason = Some(format!("paused by {who}"));
        }
        Command::Resume => {
            if matches!(
                s.control.state,
                ControlState::Aborted | ControlState::RollingBack
            ) {
                bail!(
                    "the rollout was aborted or rolled back; it cannot be resumed (define a new rollout)"
                );
            }
            s.control.state = ControlState::Active;
            s.control.reason = None;
            s.acknowledged = failures;
        }
        Command::Abort => {
            s.control.state = ControlState::Aborted;
            s.control.reason = Some(format!("aborted by {who}"));
        }
        Command::Rollback => {
            s.control.state = ControlState::RollingBack;
            s.control.reason = Some(format!("rolled back by {who}"));
        }
        Command::Approve(stage) => {
            s.control.approved.insert(stage.clone());
        }
    }
    Ok(s)
}

/// Parses a command word from the CLI or API.
pub fn parse_command(word: &str, stage: Option<&str>) -> anyhow::Result<Command> {
    Ok(match word {
        "pause" => Command::Pause,
        "resume" => Command::Resume,
        "abort" => Command::Abort,
        "rollback" => Command::Rollback,
        "approve" => Command::Approve(
            stage
                .context("approve needs the stage to approve (--stage NAME)")?
                .to_string(),
        ),
        other => {
            bail!("unknown rollout command {other:?} (pause, resume, abort, rollback, approve)")
        }
    })
}
