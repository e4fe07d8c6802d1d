//! pgfleet: an out-of-cluster fleet manager for PostgreSQL on Kubernetes.
//! See `docs/architecture.md` for how the parts fit together.

pub mod cli;
pub mod config;
pub mod crd;
pub mod manager;
pub mod sim;
pub mod telemetry;
