//! Validation of a PostgresCluster spec beyond what the CRD schema checks
//! (cron syntax, durations, cross-field rules). Pure; every problem is
//! reported, and an invalid spec never touches running instances.

use crate::crd::PostgresClusterSpec;
use crate::postgres::MANAGED_PARAMETERS;
use std::str::FromStr;

/// Major versions the instance contract is tested with.
pub const SUPPORTED_MAJORS: std::ops::RangeInclusive<u32> = 13..=17;

pub fn validate(spec: &PostgresClusterSpec) -> Result<(), Vec<String>> {
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
            spec.version,
            SUPPORTED_MAJORS.start(),
            SUPPORTED_MAJORS.end()
        )),
    }
    if let Some(cron) = &spec.backup_schedule
        && let Err(e) = croner::Cron::from_str(cron)
    {
        errs.push(format!(
            "spec.backupSchedule: \"{cron}\" is not a valid cron expression: {e}"
        ));
    }
    if let Some(fb) = spec.bootstrap.as_ref().and_then(|b| b.from_backup.as_ref()) {
        // Names and time syntax; the member, the clock and consent are
        // checked by the controller before the source is read.
        errs.extend(super::restore_source::syntax(fb));
    }
    if let Err(e) = humantime::parse_duration(&spec.failover_delay) {
        errs.push(format!(
            "spec.failoverDelay: \"{}\": {e}",
            spec.failover_delay
        ));
    }
    if let Some(sync) = &spec.synchronous
        && sync.number >= spec.cluster_size
    {
        errs.push(format!(
            "spec.synchronous.number: {} needs at least {} instances, clusterSize is {}",
            sync.number,
            sync.number + 1,
            spec.cluster_size
        ));
    }
    for k in spec.postgresql.parameters.keys() {
        if MANAGED_PARAMETERS.contains(&k.as_str()) {
            errs.push(format!(
                "spec.postgresql.parameters.{k}: is managed by pgfleet and cannot be set"
            ));
        } else if k.is_empty()
            || !k
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
        {
            errs.push(format!(
                "spec.postgresql.parameters: \"{k}\" is not a valid parameter name"
            ));
        }
    }
    for (i, line) in spec.postgresql.pg_hba.iter().enumerate() {
        if line.contains('\n') {
            errs.push(format!("spec.postgresql.pgHba[{i}]: must be a single line"));
        }
    }
    if errs.is_empty() { Ok(()) } else { Err(errs) }
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
        let errs = validate(&s).unwrap_err();
        assert_eq!(errs.len(), 5, "{errs:#?}");
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
