//! Fleet-wide version rollouts (DESIGN §6): stages of member clusters, each
//! moving its PostgresClusters to a target version with bounded concurrency,
//! soak times, approvals and a failure budget. `plan` holds every decision as
//! a pure function over observed state; the engine around it only observes
//! and applies. The same engine rotates a fleet role set's password
//! stage by stage (`target`).

pub mod control;
pub mod engine;
pub mod marks;
pub mod metrics;
pub mod plan;
pub mod plan_model;
pub mod preflight;
pub mod status;
pub mod target;
pub mod trace;
