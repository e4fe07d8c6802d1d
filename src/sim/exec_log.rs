//! Every `pods/exec` command a cluster was asked to run, so tests can check
//! what reached a pod (for example that a paused PgBouncer was sent RESUME).
//! Bounded: only the most recent commands are kept.

use std::collections::VecDeque;
use std::sync::Mutex;

const KEEP: usize = 10_000;

#[derive(Debug, Clone, PartialEq)]
pub struct ExecRecord {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// The argv joined by spaces.
    pub command: String,
}

#[derive(Default)]
pub struct ExecLog {
    records: Mutex<VecDeque<ExecRecord>>,
}

impl ExecLog {
    pub fn record(&self, r: ExecRecord) {
        let mut g = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if g.len() >= KEEP {
            g.pop_front();
        }
        g.push_back(r);
    }

    /// The commands recorded so far, oldest first.
    pub fn snapshot(&self) -> Vec<ExecRecord> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}
