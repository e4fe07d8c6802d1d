//! Time as an input, for the fleet operations that plan over hours.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Where the fleet operations' "now" comes from (rollout soak, backup
/// schedules); tests and benchmarks drive a [`ManualClock`] so that hours
/// of schedule pass without waiting.
pub trait Clock: Send + Sync {
    fn now(&self) -> SystemTime;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to.
pub struct ManualClock(Mutex<SystemTime>);

impl ManualClock {
    pub fn new(start: SystemTime) -> Self {
        ManualClock(Mutex::new(start))
    }

    pub fn advance(&self, by: Duration) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *t += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The wall-clock time as Kubernetes writes timestamps (RFC 3339, whole
/// seconds, `Z`), for the status fields pgfleet stamps itself.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
