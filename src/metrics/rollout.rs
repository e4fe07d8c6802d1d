//! Rollout progress by rollout and stage, refreshed after every engine round
//! (`rollout/engine.rs`). Rollouts are few (one per `[rollouts.<name>]`), so
//! plain families are fine here.

use super::get;
use crate::rollout::plan::{RolloutState, RolloutStatus};
use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    pub rollout: String,
    pub stage: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub rollout: String,
    pub state: String,
}

/// Every value of the `state` label of `pgfleet_rollout_state`.
pub const STATES: &[&str] = &[
    "running",
    "waiting_approval",
    "soaking",
    "paused",
    "aborted",
    "rolling_back",
    "completed",
];

/// The `state` label of a rollout state.
pub fn state_name(s: &RolloutState) -> &'static str {
    match s {
        RolloutState::Running => "running",
        RolloutState::WaitingApproval { .. } => "waiting_approval",
        RolloutState::Soaking { .. } => "soaking",
        RolloutState::Paused { .. } => "paused",
        RolloutState::Aborted { .. } => "aborted",
        RolloutState::RollingBack => "rolling_back",
        RolloutState::Completed => "completed",
    }
}

/// Records a rollout's status after a round.
pub fn observe(rollout: &str, status: &RolloutStatus) {
    let m = get();
    let current = state_name(&status.state);
    for s in STATES {
        m.rollout_state
            .get_or_create(&StateLabel {
                rollout: rollout.to_string(),
                state: (*s).to_string(),
            })
            .set(i64::from(*s == current));
    }
    for st in &status.stages {
        let counts = [
            ("total", st.total),
            ("done", st.done),
            ("in_flight", st.in_flight),
            ("failed", st.failed),
            ("pending", st.pending),
            ("deferred", st.deferred),
        ];
        for (state, n) in counts {
            m.rollout_pgcs
                .get_or_create(&StageLabel {
                    rollout: rollout.to_string(),
                    stage: st.name.clone(),
                    state: state.to_string(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}
