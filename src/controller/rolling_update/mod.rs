//! Rolling update of the instances when the pod template changed:
//! `decide` (pure: which instance to touch next) and `execute` (one step per
//! round, recorded in `status.rollingUpdate`).

pub mod decide;
pub mod execute;
