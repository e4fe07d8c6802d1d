//! Issue 19's tenancy tests in one binary (one link instead of nine): each
//! file stays a module of its own, named as before, so a test is still
//! `tenancy_restore::…` (docs/security.md names them that way).

mod common;
#[path = "tenancy_api.rs"]
mod tenancy_api;
#[path = "tenancy_backup.rs"]
mod tenancy_backup;
#[path = "tenancy_backup_process.rs"]
mod tenancy_backup_process;
#[path = "tenancy_deadlines.rs"]
mod tenancy_deadlines;
#[path = "tenancy_input.rs"]
mod tenancy_input;
#[path = "tenancy_pods.rs"]
mod tenancy_pods;
#[path = "tenancy_rbac.rs"]
mod tenancy_rbac;
#[path = "tenancy_restore.rs"]
mod tenancy_restore;
#[path = "tenancy_rollout.rs"]
mod tenancy_rollout;
