//! pgfleet: an out-of-cluster fleet manager for PostgreSQL on Kubernetes.
//! See `docs/architecture.md` for how the parts fit together.

pub mod api;
pub mod backup;
#[cfg(feature = "bench")]
pub mod bench;
pub mod cli;
pub mod config;
pub mod controller;
pub mod crd;
pub mod dr;
pub mod emulated;
pub mod fleet;
pub mod ha;
pub mod http_client;
pub mod manager;
pub mod metrics;
pub mod ops;
pub mod pgbackrest;
pub mod platform;
pub mod postgres;
pub mod rollout;
/// The embedded Kubernetes, now its own crate; this alias keeps `pgfleet::sim::…`
/// paths working while the rest of the code moves to `pgfleet_sim::…`.
pub use pgfleet_sim as sim;
pub mod telemetry;
#[cfg(feature = "testkit")]
pub mod testkit;
