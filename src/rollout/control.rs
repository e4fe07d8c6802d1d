//! Operator commands for a rollout (pause, resume, abort, rollback,
//! approve), stored durably in Kubernetes (DESIGN §3): a ConfigMap
//! `pgfleet-rollout-<name>` in namespace `pgfleet-system` of ONE member
//! cluster, the control home.
//!
//! Why one home: the controls decide what the whole fleet does (an approval
//! starts a stage on every member), so only a copy the platform team alone
//! can write may count. The home is `[manager] control_member`, else the
//! lowest-named configured cluster: a cluster the platform team runs, where
//! tenants get no rights in `pgfleet-system`. A ConfigMap of that name on any
//! other member is ignored — a member cluster admin (or anyone who can write
//! `pgfleet-system` there) cannot approve, resume or un-abort a rollout.
//! While the home is unreachable nothing new starts (the engine counts the
//! rollout as paused) and commands fail, rather than trusting another copy.
//!
//! What is read is still checked ([`trusted`]): approvals only for stages the
//! rollout has, acknowledged failures never more than the failures observed,
//! revisions with checked arithmetic.

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

/// The member whose control counts: `configured` when it names a member,
/// else the lowest-named member. None only for an empty fleet or a
/// configured name the fleet does not have (config validation refuses that).
pub fn home_of(members: &[Arc<Member>], configured: Option<&str>) -> Option<Arc<Member>> {
    match configured {
        Some(name) => members.iter().find(|m| m.name == name).cloned(),
        None => members.iter().min_by(|a, b| a.name.cmp(&b.name)).cloned(),
    }
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

/// What of a stored control the engine may act on: approvals of stages
/// the rollout has (others are dropped: an approval is consent to one named
/// stage, and a stage added later must be approved again), and at most
/// `failures` acknowledged failures (an acknowledgement forgives failures an
/// operator saw, never future ones).
pub fn trusted(mut s: Stored, stages: &[&str], failures: u32) -> Stored {
    s.control.approved.retain(|a| stages.contains(&a.as_str()));
    s.acknowledged = s.acknowledged.min(failures);
    s
}

/// Reads the stored control from the home (default when it holds none).
/// Fails when the home cannot be read: no other copy is trusted instead.
pub async fn read(home: &Member, rollout: &str) -> anyhow::Result<Stored> {
    let api: Api<ConfigMap> = Api::namespaced(home.client(), NAMESPACE);
    let cm = api.get_opt(&object_name(rollout)).await.with_context(|| {
        format!(
            "reading the control of rollout {rollout} from its home, member cluster {}",
            home.name
        )
    })?;
    Ok(cm.as_ref().map(from_config_map).unwrap_or_default())
}

/// Writes `next` to the home with a revision one above the stored one.
pub async fn write(home: &Member, rollout: &str, mut next: Stored) -> anyhow::Result<()> {
    next.revision = next_revision(read(home, rollout).await?.revision)?;
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
    let ns: Api<Namespace> = Api::all(home.client());
    let nsobj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    let pp = PatchParams::apply("pgfleet-rollout");
    ns.patch(NAMESPACE, &pp, &Patch::Apply(&nsobj))
        .await
        .with_context(|| format!("creating namespace {NAMESPACE} on {}", home.name))?;
    Api::<ConfigMap>::namespaced(home.client(), NAMESPACE)
        .patch(
            &object_name(rollout),
            &pp.clone().force(),
            &Patch::Apply(&cm),
        )
        .await
        .with_context(|| {
            format!(
                "storing the control of rollout {rollout} on its home, member cluster {}",
                home.name
            )
        })?;
    Ok(())
}

/// The revision after `current`; an exhausted counter is an error, never a
/// wrap to 0 or a panic.
pub fn next_revision(current: u64) -> anyhow::Result<u64> {
    current.checked_add(1).with_context(|| {
        format!("the stored rollout control has revision {current}, the highest there is; delete the ConfigMap to start over")
    })
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
/// failed PostgresClusters right now (for `Resume`); `stages` the rollout's
/// stage names (only those can be approved).
pub fn apply(
    mut s: Stored,
    cmd: &Command,
    failures: u32,
    stages: &[&str],
    who: &str,
) -> anyhow::Result<Stored> {
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
            if !stages.contains(&stage.as_str()) {
                bail!(
                    "the rollout has no stage {stage:?} (stages: {})",
                    stages.join(", ")
                );
            }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn revisions_never_wrap() {
        assert_eq!(next_revision(41).unwrap(), 42);
        assert!(next_revision(u64::MAX).is_err());
    }

    #[test]
    fn only_real_stages_are_approved_and_acknowledgements_are_clamped() {
        let mut s = Stored::default();
        s.control.approved = ["canary", "all", "../x"].map(String::from).into();
        s.acknowledged = u32::MAX;
        let t = trusted(s, &["canary", "rest"], 2);
        assert_eq!(
            t.control.approved.into_iter().collect::<Vec<_>>(),
            vec!["canary"]
        );
        assert_eq!(t.acknowledged, 2);
        let err = apply(
            Stored::default(),
            &Command::Approve("bogus".into()),
            0,
            &["canary"],
            "t",
        )
        .unwrap_err();
        assert!(err.to_string().contains("no stage \"bogus\""), "{err}");
        let ok = apply(
            Stored::default(),
            &Command::Approve("canary".into()),
            0,
            &["canary"],
            "t",
        )
        .unwrap();
        assert!(ok.control.approved.contains("canary"));
    }
}
