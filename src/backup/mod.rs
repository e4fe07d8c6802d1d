//! Fleet-wide backups with pgBackRest (DESIGN §3, §4, §6): schedules spread
//! over a window, caps, PostgresBackup records, retention, WAL-archiving
//! health and restore drills. `schedule` decides (pure); `dispatch` observes
//! the fleet and acts, `run` carries out one backup; `repo` renders what the
//! instances need; `tls` lets a standby's backup reach the primary.

pub mod dispatch;
pub mod drill;
pub mod encryption;
pub mod incarnation;
pub mod repo;
pub mod run;
pub mod schedule;
pub mod source;
mod time;
pub mod tls;
pub mod verify;
