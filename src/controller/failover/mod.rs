//! Automatic failover: `decide` (pure: is the primary lost, which replica
//! takes over) and `execute` (the I/O that carries a decision out, and
//! resumes one after a crash).

pub mod broken;
pub mod decide;
pub mod execute;

pub use decide::{Candidate, PrimaryState, SyncRule, Verdict, choose, verdict};
