//! pgfleet: an out-of-cluster fleet manager for PostgreSQL on Kubernetes.
//! See `docs/architecture.md` for how the parts fit together.

pub mod api;
pub mod backup;
#[cfg(feature = "bench")]
pub mod bench;
pub mod cli;
pub mod clock;
pub mod config;
pub mod controller;
pub mod crd;
pub mod fleet;
pub mod ha;
pub mod http_client;
pub mod manager;
pub mod metrics;
pub mod postgres;
pub mod rollout;
pub mod sim;
pub mod telemetry;
#[cfg(feature = "testkit")]
pub mod testkit;
