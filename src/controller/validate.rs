//! Validation of a PostgresCluster spec beyond what the CRD schema checks
//! (cron syntax, durations, cross-field rules). Pure; every problem is
//! reported, and an invalid spec never touches running instances.

use crate::crd::PostgresClusterSpec;
use crate::postgres::{hba, params, shown};
use std::str::FromStr;
use std::time::Duration;

/// At most this many problems are listed (the rest are counted): the
/// message travels into a condition and an Event.
const MAX_PROBLEMS: usize = 8;
/// Characters of problems listed (the joined message stays under 1 KiB).
const MAX_MESSAGE: usize = 900;

/// Major versions the instance contract is tested with.
pub const SUPPORTED_MAJORS: std::ops::RangeInclusive<u32> = 13..=18;

/// What validation parsed, typed: the rest of the reconcile uses these and
/// never parses (or falls back) again.
#[derive(Debug, Clone, PartialEq)]
pub struct Valid {
    /// `spec.failoverDelay`.
    pub failover_delay: Duration,
}

/// `spec.majorUpgrade.keepBlueMinutes` at most (the CRD's bound).
pub const MAX_KEEP_BLUE_MINUTES: u32 = 10080;

pub fn validate(spec: &PostgresClusterSpec) -> Result<Valid, Vec<String>> {
    let mut errs = vec![];
    if !(1..=16).contains(&spec.cluster_size) {
        errs.push(format!(
            "spec.clusterSize: {} is outside 1..16",
            spec.cluster_size
        ));
    }
    match spec
        .version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok())
    {
        Some(m) if SUPPORTED_MAJORS.contains(&m) => {}
        _ => errs.push(format!(
            "spec.version: \"{}\" is not a supported PostgreSQL version (majors {}-{})",
            shown(&spec.version),
            SUPPORTED_MAJORS.start(),
            SUPPORTED_MAJORS.end()
        )),
    }
    if let Some(cron) = &spec.backup_schedule
        && let Err(e) = croner::Cron::from_str(cron)
    {
        errs.push(format!(
            "spec.backupSchedule: \"{}\" is not a valid cron expression: {}",
            shown(cron),
            shown(&e.to_string())
        ));
    }
    if let Some(fb) = spec.bootstrap.as_ref().and_then(|b| b.from_backup.as_ref()) {
        // Names and time syntax; the member, the clock and consent are
        // checked by the controller before the source is read.
        errs.extend(super::restore_source::syntax(fb));
    }
    let failover_delay = humantime::parse_duration(&spec.failover_delay)
        .map_err(|e| {
            errs.push(format!(
                "spec.failoverDelay: \"{}\": {}",
                shown(&spec.failover_delay),
                shown(&e.to_string())
            ))
        })
        .ok();
    if let Some(sync) = &spec.synchronous
        && sync.number >= spec.cluster_size
    {
        errs.push(format!(
            "spec.synchronous.number: {} needs at least {} instances, clusterSize is {}",
            sync.number,
            sync.number.saturating_add(1),
            spec.cluster_size
        ));
    }
    // The CRD bounds it too; a copy of the CRD without the schema (or an
    // edited one) must not keep blue for years.
    if let Some(m) = spec
        .major_upgrade
        .as_ref()
        .and_then(|m| m.keep_blue_minutes)
        && m > MAX_KEEP_BLUE_MINUTES
    {
        errs.push(format!(
            "spec.majorUpgrade.keepBlueMinutes: {m} is over {MAX_KEEP_BLUE_MINUTES} (7 days)"
        ));
    }
    parameters(spec, &mut errs);
    super::placement::validate(spec, &mut errs);
    super::storage::validate(spec, &mut errs);
    match failover_delay {
        Some(failover_delay) if errs.is_empty() => Ok(Valid { failover_delay }),
        _ => Err(bounded(errs)),
    }
}

/// The first problems, as many as fit [`MAX_PROBLEMS`] and
/// [`MAX_MESSAGE`] (an Event's note holds 1 KiB), then how many more.
fn bounded(mut errs: Vec<String>) -> Vec<String> {
    let mut total = 0;
    let keep = errs
        .iter()
        .take(MAX_PROBLEMS)
        .take_while(|e| {
            total += e.len() + 2;
            total <= MAX_MESSAGE
        })
        .count()
        .max(1);
    if keep < errs.len() {
        let more = errs.len() - keep;
        errs.truncate(keep);
        errs.push(format!("and {more} more problems"));
    }
    errs
}

/// `spec.postgresql`: parameters by allowlist with one-line values of
/// bounded length, pg_hba lines that are single rules. Values are never
/// repeated in the message, only names and positions.
fn parameters(spec: &PostgresClusterSpec, errs: &mut Vec<String>) {
    let p = &spec.postgresql.parameters;
    if p.len() > params::MAX_PARAMETERS {
        errs.push(format!(
            "spec.postgresql.parameters: {} entries, at most {} are allowed",
            p.len(),
            params::MAX_PARAMETERS
        ));
    }
    for (k, v) in p {
        if let Some(why) = params::refusal(k, v) {
            errs.push(format!("spec.postgresql.parameters.{}: {why}", shown(k)));
        }
    }
    let lines = &spec.postgresql.pg_hba;
    if lines.len() > hba::MAX_LINES {
        errs.push(format!(
            "spec.postgresql.pgHba: {} lines, at most {} are allowed",
            lines.len(),
            hba::MAX_LINES
        ));
    }
    for (i, line) in lines.iter().enumerate() {
        if let Some(why) = hba::refusal(line) {
            errs.push(format!("spec.postgresql.pgHba[{i}]: {why}"));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec() -> PostgresClusterSpec {
        serde_json::from_value(serde_json::json!({"clusterSize": 3, "version": "15.20"})).unwrap()
    }

    #[test]
    fn a_plain_spec_is_valid() {
        assert!(validate(&spec()).is_ok());
    }

    #[test]
    fn every_problem_is_reported() {
        let mut s = spec();
        s.cluster_size = 2;
        s.version = "9.6".into();
        s.backup_schedule = Some("every day".into());
        s.failover_delay = "soon".into();
        s.synchronous = Some(serde_json::from_value(serde_json::json!({"number": 2})).unwrap());
        s.postgresql.parameters.insert("port".into(), "5433".into());
        s.major_upgrade = Some(
            serde_json::from_value(serde_json::json!({"method": "blueGreen",
                "keepBlueMinutes": MAX_KEEP_BLUE_MINUTES + 1}))
            .unwrap(),
        );
        let errs = validate(&s).unwrap_err();
        assert_eq!(errs.len(), 6, "{errs:#?}");
        assert!(
            errs.iter()
                .any(|e| e.starts_with("spec.majorUpgrade.keepBlueMinutes: 10081 is over 10080"))
        );
        assert!(errs.iter().any(|e| e.starts_with("spec.version")));
        assert!(errs.iter().any(|e| e.starts_with("spec.backupSchedule")));
        assert!(errs.iter().any(|e| e.starts_with("spec.failoverDelay")));
        assert!(
            errs.iter()
                .any(|e| e.starts_with("spec.synchronous.number"))
        );
        assert!(errs.iter().any(|e| e.contains("parameters.port")));
    }

    #[test]
    fn parameters_are_an_allowlist_and_nothing_huge_is_echoed() {
        let mut s = spec();
        s.postgresql
            .parameters
            .insert("archive_library".into(), "x".into());
        s.postgresql.parameters.insert(
            "work_mem".into(),
            "4MB\nshared_preload_libraries = 'evil'".into(),
        );
        s.postgresql.pg_hba = vec![
            "include_if_exists /etc/x".into(),
            "host all all all md5\r".into(),
        ];
        s.failover_delay = "x".repeat(5 << 20);
        let errs = validate(&s).unwrap_err();
        assert_eq!(errs.len(), 5, "{errs:#?}");
        assert!(
            errs.iter()
                .any(|e| e.contains("parameters.archive_library"))
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("parameters.work_mem: value contains a control"))
        );
        assert!(
            errs.iter()
                .any(|e| e.starts_with("spec.postgresql.pgHba[0]"))
        );
        assert!(
            errs.iter()
                .any(|e| e.starts_with("spec.postgresql.pgHba[1]"))
        );
        assert!(errs.iter().all(|e| !e.contains("evil")), "{errs:#?}");
        assert!(
            errs.iter().map(String::len).sum::<usize>() < 2000,
            "{errs:#?}"
        );
    }

    #[test]
    fn restore_source_names_and_time_are_checked_in_the_spec() {
        let mut s = spec();
        s.bootstrap = Some(
            serde_json::from_value(serde_json::json!({"fromBackup": {
                "cluster": "x?", "namespace": "a/b", "targetTime": "soon"}}))
            .unwrap(),
        );
        let errs = validate(&s).unwrap_err();
        assert_eq!(errs.len(), 3, "{errs:#?}");
        assert!(errs[0].starts_with("spec.bootstrap.fromBackup.cluster: \"x?\""));
    }
}
