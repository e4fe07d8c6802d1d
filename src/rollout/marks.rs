//! The marks a rollout leaves on each PostgresCluster (annotations): its
//! only memory of per-cluster progress. Written in the same patch as the
//! version change they describe, so a version is never changed without the
//! record of what it was before.

use super::plan::{Mark, Pgc};
use super::preflight::PreFlight;
use crate::config::choices::MajorMethod;
use crate::crd::PostgresCluster;
use kube::ResourceExt;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::SystemTime;

pub const ROLLOUT: &str = "pgfleet.io/rollout";
pub const PREVIOUS: &str = "pgfleet.io/rollout-previous-version";
pub const STARTED: &str = "pgfleet.io/rollout-started";
pub const FINISHED: &str = "pgfleet.io/rollout-finished";
pub const FAILED: &str = "pgfleet.io/rollout-failed";
pub const REVERTED: &str = "pgfleet.io/rollout-reverted";
/// Asks for a pre-flight without upgrading (controller::major_upgrade::check).
pub const PRE_FLIGHT: &str = crate::controller::major_upgrade::check::ANNOTATION;

/// Failure reasons are kept short: they come from instance status lines.
const MAX_REASON: usize = 512;

pub fn format_time(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

pub fn parse_time(s: &str) -> Option<SystemTime> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| SystemTime::from(t.with_timezone(&chrono::Utc)))
}

/// The mark on a PGC, if it carries a complete one.
pub fn read(annotations: &BTreeMap<String, String>) -> Option<Mark> {
    Some(Mark {
        rollout: annotations.get(ROLLOUT)?.clone(),
        previous_version: annotations.get(PREVIOUS)?.clone(),
        started: parse_time(annotations.get(STARTED)?)?,
        finished: annotations.get(FINISHED).and_then(|t| parse_time(t)),
        failed: annotations.get(FAILED).cloned(),
        reverted: annotations.get(REVERTED).is_some_and(|v| v == "true"),
    })
}

/// The planner's view of one PostgresCluster.
pub fn observe(member: &str, pg: &PostgresCluster, stage: Option<usize>) -> Pgc {
    let st = pg.status.clone().unwrap_or_default();
    Pgc {
        member: member.to_string(),
        namespace: pg.namespace().unwrap_or_default(),
        name: pg.name_any(),
        stage,
        spec_version: pg.spec.version.clone(),
        current_version: st.current_version.clone(),
        healthy: st.phase == Some(crate::crd::Phase::Healthy),
        update_failure: st
            .rolling_update
            .and_then(|r| r.failure)
            .or_else(|| major_upgrade_failure(&pg.spec.version, st.major_upgrade.as_deref())),
        mark: read(pg.annotations()),
        instances: pg.spec.cluster_size.max(1) as u32,
        pre_flight_requested: pg.annotations().get(PRE_FLIGHT).cloned(),
        pre_flight: st.pre_flight.map(|p| PreFlight {
            version: p.version,
            from_version: p.from_version,
            failure: match p.ok {
                true => None,
                false => Some(p.reason.unwrap_or_else(|| "failed".into())),
            },
        }),
    }
}

/// A major upgrade to `spec.version` that stopped on the old version (its
/// pre-flight or `pg_upgrade` failed, a blue/green upgrade rolled back —
/// a guardrail, its switch timing out, or switched back): the rollout's
/// failure for the PGC.
fn major_upgrade_failure(
    spec_version: &str,
    record: Option<&crate::crd::major_upgrade::MajorUpgradeStatus>,
) -> Option<String> {
    use crate::controller::major_upgrade::blue_green::{ROLLED_BACK, ROLLING_BACK};
    use crate::controller::major_upgrade::decide::{FAILED, PRE_FLIGHT_FAILED};
    let r = record.filter(|r| r.to_version == spec_version)?;
    [PRE_FLIGHT_FAILED, FAILED, ROLLING_BACK, ROLLED_BACK]
        .contains(&r.step.as_str())
        .then(|| r.failure.clone().unwrap_or_else(|| r.step.clone()))
}

/// Asks the PGC's controller for a pre-flight against `version`.
pub fn pre_flight_patch(version: &str) -> Value {
    json!({"metadata": {"annotations": {PRE_FLIGHT: version}}})
}

/// Starting: the new version and the mark, in one merge patch.
/// Across a major, `spec.majorUpgrade.method` is set in the same patch.
pub fn start_patch(
    rollout: &str,
    from: &str,
    to: &str,
    now: SystemTime,
    method: Option<MajorMethod>,
) -> Value {
    let mut p = json!({
        "metadata": {"annotations": {ROLLOUT: rollout, PREVIOUS: from, STARTED: format_time(now),
            FINISHED: null, FAILED: null, REVERTED: null}},
        "spec": {"version": to},
    });
    if let Some(m) = method {
        p["spec"]["majorUpgrade"] = json!({"method": m.as_str()});
    }
    p
}

pub fn finish_patch(at: SystemTime) -> Value {
    json!({"metadata": {"annotations": {FINISHED: format_time(at)}}})
}

pub fn fail_patch(reason: &str) -> Value {
    let mut r: String = reason.chars().take(MAX_REASON).collect();
    if r.len() < reason.len() {
        r.push('…');
    }
    json!({"metadata": {"annotations": {FAILED: r}}})
}

pub fn revert_patch(previous: &str) -> Value {
    json!({"metadata": {"annotations": {REVERTED: "true"}}, "spec": {"version": previous}})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_start_patch_reads_back_as_an_in_flight_mark() {
        let t = parse_time("2026-12-02T10:00:00.250Z").unwrap();
        let p = start_patch("minor", "15.18", "15.20", t, None);
        assert!(p["spec"].get("majorUpgrade").is_none());
        let major = start_patch("major", "15", "18", t, Some(MajorMethod::InPlace));
        assert_eq!(major["spec"]["majorUpgrade"]["method"], "inPlace");
        assert_eq!(p["spec"]["version"], "15.20");
        let ann: BTreeMap<String, String> = p["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        let m = read(&ann).unwrap();
        assert_eq!(m.rollout, "minor");
        assert_eq!(m.previous_version, "15.18");
        assert_eq!(m.started, t);
        assert!(m.finished.is_none() && m.failed.is_none() && !m.reverted);
    }

    #[test]
    fn a_rolled_back_blue_green_upgrade_fails_the_rollout_for_its_cluster() {
        let record = |step: &str| crate::crd::major_upgrade::MajorUpgradeStatus {
            from_version: "15".into(),
            to_version: "18".into(),
            step: step.into(),
            failure: Some("table public.log has no replica identity".into()),
            ..Default::default()
        };
        for step in ["RollingBack", "RolledBack", "PreFlightFailed", "Failed"] {
            let why = major_upgrade_failure("18", Some(&record(step)));
            assert!(why.is_some_and(|w| w.contains("public.log")), "{step}");
        }
        for step in ["Switched", "SwitchingBack", "CatchingUp", "Upgrading"] {
            assert_eq!(
                major_upgrade_failure("18", Some(&record(step))),
                None,
                "{step}"
            );
        }
        // A record of another target (the tenant went back) is not this one.
        assert_eq!(
            major_upgrade_failure("15", Some(&record("RolledBack"))),
            None
        );
        let bg = start_patch(
            "major",
            "15",
            "18",
            SystemTime::UNIX_EPOCH,
            Some(MajorMethod::BlueGreen),
        );
        assert_eq!(bg["spec"]["majorUpgrade"]["method"], "blueGreen");
    }

    #[test]
    fn long_failure_reasons_are_cut() {
        let p = fail_patch(&"x".repeat(2000));
        assert!(
            p["metadata"]["annotations"][FAILED]
                .as_str()
                .unwrap()
                .chars()
                .count()
                <= MAX_REASON + 1
        );
    }
}
