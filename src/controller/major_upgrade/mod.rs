//! In-place major upgrades (`spec.majorUpgrade.method: inPlace`): the pure
//! state machine in `decide.rs`, its steps against the member cluster in
//! `execute.rs`; a check asked for without upgrading in `check.rs`
//! (docs/major-upgrades.md).

pub mod check;
pub mod decide;
pub mod execute;
