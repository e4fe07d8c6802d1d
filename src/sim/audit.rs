//! A request log of one emulated cluster, off unless a test turns it on: who
//! asked for what (as RBAC attributes) and whether it was allowed. The
//! deploy test uses it to prove `deploy/member`'s ClusterRole is exactly what
//! the manager uses.

use super::rbac::Attributes;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Clone)]
pub struct AuditRecord {
    /// `admin` (the cluster's own token) or `system:serviceaccount:<ns>:<name>`.
    pub user: String,
    pub attributes: Attributes,
    pub allowed: bool,
}

#[derive(Default)]
pub struct AuditLog {
    on: AtomicBool,
    records: Mutex<Vec<AuditRecord>>,
}

impl AuditLog {
    pub fn start(&self) {
        self.on.store(true, Ordering::SeqCst);
    }

    pub fn stop(&self) {
        self.on.store(false, Ordering::SeqCst);
    }

    pub fn enabled(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Everything recorded so far; the log starts empty again.
    pub fn take(&self) -> Vec<AuditRecord> {
        std::mem::take(&mut *self.records.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn record(&self, r: AuditRecord) {
        if self.enabled() {
            self.records
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(r);
        }
    }
}
