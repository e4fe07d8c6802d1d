//! Planned switchover, requested with the annotation
//! `pgfleet.io/switchover-to: <instance>|auto` (or `pgfleet switchover`),
//! and the pooler it relies on (`pooler::pause`). With the pooler, clients see a stall but no
//! failed transaction:
//!
//! PAUSE (PgBouncer waits for running transactions, holds new ones) →
//! CHECKPOINT → clean demote of the old primary (it stops after sending all
//! WAL, and will start again as a standby) → wait until the target has
//! received everything → promote → relabel (the Services follow) → RESUME.
//!
//! The request moves from the annotation into `status.targetPrimary` plus
//! `status.switchover` before anything is touched, so a manager killed in the
//! middle resumes the same switchover and never promotes twice.

//!
//! `decide` holds the pure choices (which instance, or why none), `execute`
//! the I/O.

pub mod decide;
pub mod execute;

pub use execute::{begin, resume, take_request};

/// The annotation that requests a switchover.
pub const ANNOTATION: &str = "pgfleet.io/switchover-to";
