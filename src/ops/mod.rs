//! Operations shared by the HTTP API and the direct CLI commands: the
//! writes that record intent (`actions`: a switchover annotation, a
//! PostgresBackup record, a rollout control) and the views both show
//! (`view`). They sit below `api` and `cli` so that neither needs the
//! other (docs/architecture.md, "Layers").

pub mod actions;
pub mod rotate;
pub mod view;
