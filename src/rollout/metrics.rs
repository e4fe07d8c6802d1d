//! Rollout progress by rollout and stage, refreshed after every engine round
//! (`engine.rs`). The families live in the process registry (`metrics`);
//! what a rollout's states are and how its status maps onto them is the
//! rollout's own.

use super::plan::{RolloutState, RolloutStatus};

/// Every value of the `state` label of `pgfleet_rollout_state`.
pub const STATES: &[&str] = &[
    "running",
    "pre_flight",
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
        RolloutState::PreFlight { .. } => "pre_flight",
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
    crate::metrics::rollout_state(rollout, STATES, state_name(&status.state));
    for st in &status.stages {
        let counts = [
            ("total", st.total),
            ("done", st.done),
            ("in_flight", st.in_flight),
            ("failed", st.failed),
            ("pending", st.pending),
            ("deferred", st.deferred),
        ];
        crate::metrics::rollout_stage(rollout, &st.name, &counts);
    }
}
