//! Creation Events of one reconcile, published as one.
//!
//! A new PostgresCluster used to get an Event per thing created (each
//! credentials Secret, the certificate, the configuration, the backup
//! repository, the app Secret…): nine Event writes, the largest share of
//! the requests it cost (issue 16). They say the same kind of thing at the
//! same moment, so a reconcile collects them and publishes one `Created`
//! Event listing them, in order. A new instance joins it too (it was a
//! `CreatedInstance` Event of its own, one of the two Events left per new
//! cluster); its note names the Pod. Everything else (warnings, failovers,
//! switchovers, a recreated Pod) is published at once as before.

use std::collections::HashMap;
use std::sync::Mutex;

/// The Normal reasons collected into the round's `Created` Event.
const BATCHED: &[&str] = &[
    "CreatedSecret",
    "CreatedConfig",
    "CreatedPooler",
    "IssuedCertificate",
    "BackupRepository",
    "AppSecretWritten",
    "CreatedService",
    "CreatedInstance",
];

/// The API server's limit on an Event's note is 1 KiB.
const NOTE_MAX: usize = 1024;

#[derive(Default)]
pub struct Batched {
    pending: Mutex<HashMap<String, Vec<String>>>,
}

pub fn batched(reason: &str) -> bool {
    BATCHED.contains(&reason)
}

impl Batched {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<String>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn push(&self, key: &str, note: String) {
        self.lock().entry(key.to_string()).or_default().push(note);
    }

    /// The note of the round's `Created` Event (None: nothing collected).
    pub fn take(&self, key: &str) -> Option<String> {
        let notes = self.lock().remove(key)?;
        Some(join(&notes))
    }
}

/// The notes joined with "; ", cut at a character boundary to fit.
fn join(notes: &[String]) -> String {
    let mut s = notes.join("; ");
    if s.len() > NOTE_MAX {
        let mut end = NOTE_MAX - 3;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_round_s_creations_become_one_note_that_fits() {
        let b = Batched::default();
        assert!(batched("CreatedSecret") && !batched("FailoverStarted"));
        b.push("ns/db", "generated replication credentials".into());
        b.push("ns/db", "issued the server certificate".into());
        b.push("ns/other", "x".into());
        assert_eq!(
            b.take("ns/db").as_deref(),
            Some("generated replication credentials; issued the server certificate")
        );
        assert_eq!(b.take("ns/db"), None);
        b.push("ns/db", "é".repeat(2000));
        let long = b.take("ns/db").unwrap();
        assert!(long.len() <= NOTE_MAX && long.ends_with("..."));
    }
}
