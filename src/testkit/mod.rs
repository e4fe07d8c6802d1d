//! The environments the benchmarks (`pgfleet bench …`) and the integration
//! tests share, so that both measure and prove the same setup: fresh
//! directories, `kube::Client`s built from written kubeconfigs (the path a
//! user takes), one way of waiting for a condition, a manager over embedded
//! member clusters, and one member with real PostgreSQL (process runtime).
//!
//! Compiled only with the `testkit` cargo feature (the `bench` feature turns
//! it on): product code never uses it. Everything returns [`Error`] instead
//! of panicking; the integration tests' support module
//! (`integration/common/`) turns errors into test failures.

pub mod clients;
pub mod dirs;
pub mod fleet;
pub mod network;
pub mod pg;
pub mod process;
pub mod tls;
pub mod wait;

pub use clients::{client_from, client_without_retries};
pub use dirs::temp_dir;
pub use wait::{Outcome, until};

use std::path::PathBuf;
use std::time::Duration;

/// What went wrong while building or using a test environment.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("creating directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("a kube client from {path}: {source}")]
    Client { path: PathBuf, source: kube::Error },
    #[error("the environment's fleet config is invalid: {0}")]
    Config(String),
    #[error("starting the manager: {0:#}")]
    Manager(anyhow::Error),
    #[error("{what}: {source}")]
    Kube { what: String, source: kube::Error },
    #[error("{what}: {source}")]
    Postgres {
        what: String,
        source: tokio_postgres::Error,
    },
    #[error("gave up after {patience:?} waiting for {what}; last observed: {last}")]
    Timeout {
        what: String,
        patience: Duration,
        last: String,
    },
    #[error("{0}")]
    Unexpected(String),
}

impl Error {
    /// A kube error with what the environment was doing.
    pub fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
