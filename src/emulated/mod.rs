//! pgfleet's side of the embedded Kubernetes (the `pgfleet-sim` crate, which
//! knows nothing of PostgreSQL): what pgfleet plugs into it. The virtual
//! runtime (an in-memory model of the instance agent, for scale tests and the
//! embedded default) sits here, next to the contract types it answers with,
//! so a contract change breaks its build rather than its tests.

pub mod images;
pub mod virtual_extensions;
pub mod virtual_kubelet;

use pgfleet_sim::{RuntimeKind, SimOptions};
use std::path::PathBuf;
use std::sync::Arc;

/// The kubelet runtimes pgfleet offers for emulated clusters (`pgfleet sim
/// --runtime`, tests, benches).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Runtime {
    /// Pods are scheduled nowhere and never run (API server only).
    None,
    /// Pods become Ready at once; exec runs commands on this host.
    Host,
    /// Pods become Ready at once; `pgfleet-instance` verbs answer from an
    /// in-memory PostgreSQL model (scale tests, the embedded default).
    Virtual,
    /// Each container is a real local process (PostgreSQL, PgBouncer) with
    /// its own loopback address; Services get a working ClusterIP proxy.
    Process,
}

impl Runtime {
    /// The emulator's runtime for this choice, pgfleet's plug-ins included.
    pub fn kind(self) -> RuntimeKind {
        match self {
            Runtime::None => RuntimeKind::None,
            Runtime::Host => RuntimeKind::Host,
            Runtime::Virtual => virtual_runtime(),
            Runtime::Process => RuntimeKind::Process,
        }
    }
}

/// The virtual runtime, a fresh model per emulated cluster.
pub fn virtual_runtime() -> RuntimeKind {
    RuntimeKind::custom("virtual", |_dir| {
        Arc::new(virtual_kubelet::VirtualRuntime::default())
    })
}

/// The local user the process runtime runs pgfleet's containers as: their
/// `runAsUser` is 999, the `postgres` user of the images, which is another
/// uid (or none) on a machine with PostgreSQL installed from packages.
pub const RUN_AS: &str = "postgres";

/// Options for `n` emulated clusters (sim-1 … sim-n) in `dir` with pgfleet's
/// image table and user, so the process runtime runs PostgreSQL and
/// PgBouncer.
pub fn sim_options(dir: impl Into<PathBuf>, n: usize) -> SimOptions {
    SimOptions {
        images: images::rules(),
        run_as: Some(RUN_AS.into()),
        ..SimOptions::new(dir, n)
    }
}
