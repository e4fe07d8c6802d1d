//! A pre-flight asked for without upgrading: the annotation
//! `pgfleet.io/preflight-version` names a version, the controller runs the
//! `PreFlight` step's checks (`upgrade-check`) against the running primary
//! and records the result in `status.preFlight`, changing nothing else.
//!
//! Why: a fleet rollout with a major target checks every cluster it selects
//! before it starts any (docs/rollouts.md), so a cluster that would fail in
//! a late stage is known — and reported for the whole fleet — at the start.
//! The annotation is harmless input from anyone who may edit the object: the
//! checks only read; a version outside the image catalog is a failed check
//! naming it.

use crate::crd::major_upgrade::PreFlightStatus;

/// The annotation a fleet rollout writes to ask for a check.
pub const ANNOTATION: &str = "pgfleet.io/preflight-version";

fn major(v: &str) -> Option<u32> {
    v.trim().split('.').next()?.parse().ok()
}

/// The version to check against now, if any: one a higher major than the
/// running version, not yet checked from this running version.
pub fn wanted(
    requested: Option<&str>,
    running: Option<&str>,
    done: Option<&PreFlightStatus>,
) -> Option<String> {
    let (requested, running) = (requested?.trim(), running?);
    if major(requested)? <= major(running)? {
        return None;
    }
    let checked = done.is_some_and(|d| d.version == requested && d.from_version == running);
    (!checked).then(|| requested.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(version: &str, from: &str) -> PreFlightStatus {
        PreFlightStatus {
            version: version.into(),
            from_version: from.into(),
            ok: true,
            ..PreFlightStatus::default()
        }
    }

    #[test]
    fn a_higher_major_not_checked_yet_is_checked_once() {
        assert_eq!(wanted(Some("18"), Some("15"), None).as_deref(), Some("18"));
        assert_eq!(
            wanted(Some("18"), Some("15"), Some(&done("18", "15"))),
            None
        );
        // The running version changed (a minor update): check again.
        assert_eq!(
            wanted(Some("18"), Some("15.19"), Some(&done("18", "15"))).as_deref(),
            Some("18")
        );
    }

    #[test]
    fn the_same_or_a_lower_major_or_garbage_asks_for_nothing() {
        assert_eq!(wanted(Some("15.19"), Some("15"), None), None);
        assert_eq!(wanted(Some("14"), Some("15"), None), None);
        assert_eq!(wanted(Some("x; rm -rf /"), Some("15"), None), None);
        assert_eq!(wanted(None, Some("15"), None), None);
        assert_eq!(wanted(Some("18"), None, None), None);
    }
}
