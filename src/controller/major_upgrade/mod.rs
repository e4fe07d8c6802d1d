//! Major upgrades. In place (`spec.majorUpgrade.method: inPlace`): the pure
//! state machine in `decide.rs`, its steps against the member cluster in
//! `execute.rs`; a check asked for without upgrading in `check.rs`; the
//! repository carried over to the new version in `backups.rs`.
//! Blue/green: the pure state machine in `blue_green.rs` and its SQL and
//! pg_hba text in `blue_green_sql.rs` — not wired into the reconcile yet
//! (docs/major-upgrades.md, "Blue/green").

pub mod backups;
pub mod blue_green;
pub mod blue_green_sql;
pub mod check;
pub mod decide;
pub mod execute;
