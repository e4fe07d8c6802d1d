//! Fleet-wide backups with pgBackRest (DESIGN §3, §4, §6): schedules spread
//! over a window, caps, PostgresBackup records, retention, WAL-archiving
//! health and restore drills. `schedule` decides (pure); `dispatch` observes
//! the fleet and acts, `run` carries out one backup. What every instance
//! needs (its pgbackrest.conf, repository, passphrase and TLS pair) is in
//! `pgbackrest`, below the controller; this dispatcher sits above it.

pub mod dispatch;
pub mod drill;
pub mod run;
pub mod schedule;
pub mod source;
pub mod verify;
