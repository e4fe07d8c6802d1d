//! Every integration test of pgfleet in one binary (one link instead of
//! thirty; nextest still runs each test in a process of its own). Each file
//! stays a module of its own, so a test is named `failover::…`,
//! `tenancy_restore::…` as before. The shared support lives in `common`
//! (one `eventually`, temp dirs, clients, environments), `s8_support`
//! (process-runtime pods) and `kubectl` (the kubectl runner).
//! Run one file's tests: `cargo nextest run --all-features --test integration failover::`.

// Tests panic on what they did not expect; the lints for the product's
// error handling do not apply here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "deploy/kubectl.rs"]
mod kubectl;
mod s8_support;

#[path = "access.rs"]
mod access;
#[path = "access_restore.rs"]
mod access_restore;
#[path = "api.rs"]
mod api;
#[path = "backup.rs"]
mod backup;
#[path = "backup_schedule.rs"]
mod backup_schedule;
#[path = "blue_green.rs"]
mod blue_green;
#[path = "blue_green_back.rs"]
mod blue_green_back;
#[path = "blue_green_resume.rs"]
mod blue_green_resume;
#[path = "blue_green_sql.rs"]
mod blue_green_sql;
#[path = "chaos.rs"]
mod chaos;
#[path = "controller.rs"]
mod controller;
#[path = "controller_blocked.rs"]
mod controller_blocked;
#[path = "controller_fleet.rs"]
mod controller_fleet;
#[path = "controller_knobs.rs"]
mod controller_knobs;
#[path = "dashboard.rs"]
mod dashboard;
#[path = "deploy.rs"]
mod deploy;
#[path = "dr.rs"]
mod dr;
#[path = "dr_failover.rs"]
mod dr_failover;
#[path = "drain.rs"]
mod drain;
#[path = "failover.rs"]
mod failover;
#[path = "failover_resume.rs"]
mod failover_resume;
#[path = "ha.rs"]
mod ha;
#[path = "kubectl_day.rs"]
mod kubectl_day;
#[path = "kubectl_day_pods.rs"]
mod kubectl_day_pods;
#[path = "layering.rs"]
mod layering;
#[path = "major_rollout.rs"]
mod major_rollout;
#[path = "major_upgrade.rs"]
mod major_upgrade;
#[path = "major_upgrade_backups.rs"]
mod major_upgrade_backups;
#[path = "major_upgrade_pooler.rs"]
mod major_upgrade_pooler;
#[path = "major_upgrade_resume.rs"]
mod major_upgrade_resume;
#[path = "member_permissions.rs"]
mod member_permissions;
#[path = "node_loss.rs"]
mod node_loss;
#[path = "otlp.rs"]
mod otlp;
#[path = "placement.rs"]
mod placement;
#[path = "pooler_auth.rs"]
mod pooler_auth;
#[path = "pooler_virtual.rs"]
mod pooler_virtual;
#[path = "probes.rs"]
mod probes;
#[path = "process_fs.rs"]
mod process_fs;
#[path = "process_portforward.rs"]
mod process_portforward;
#[path = "process_runtime.rs"]
mod process_runtime;
#[path = "process_runtime_pair.rs"]
mod process_runtime_pair;
#[path = "role_sets.rs"]
mod role_sets;
#[path = "rolling_update.rs"]
mod rolling_update;
#[path = "rollout.rs"]
mod rollout;
#[path = "sim_authz.rs"]
mod sim_authz;
#[path = "sim_events.rs"]
mod sim_events;
#[path = "sim_metrics.rs"]
mod sim_metrics;
#[path = "sim_network.rs"]
mod sim_network;
#[path = "sim_tenancy_pgfleet.rs"]
mod sim_tenancy_pgfleet;
#[path = "storage.rs"]
mod storage;
#[path = "storage_autogrow.rs"]
mod storage_autogrow;
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
#[path = "tls.rs"]
mod tls;
#[path = "transport.rs"]
mod transport;
