//! Major upgrades. In place (`spec.majorUpgrade.method: inPlace`): the pure
//! state machine in `decide.rs`, its steps against the member cluster in
//! `execute.rs`; a check asked for without upgrading in `check.rs`; the
//! repository carried over to the new version in `backups.rs`.
//! Blue/green: the pure state machine in `blue_green.rs`, its SQL and
//! pg_hba text in `blue_green_sql.rs`, sent by `blue_green_io.rs`, its
//! steps carried out by `blue_green_exec.rs` (docs/major-upgrades.md,
//! "Blue/green").

pub mod backups;
pub mod blue_green;
pub mod blue_green_exec;
pub mod blue_green_io;
pub mod blue_green_sql;
pub mod check;
pub mod decide;
pub mod execute;
