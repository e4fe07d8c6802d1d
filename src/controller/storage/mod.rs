//! Storage that grows: volume expansion when `spec.storage.size` is
//! raised, and WAL-aware auto-grow (`spec.storage.autoGrow`) before a
//! volume is full (docs/storage.md).
//!
//! The decisions are pure ([`expand`], [`grow`]); this module is their I/O:
//! it reads the claims from the child index, the instances' usage through
//! the instance contract (`pgfleet-instance usage`), patches one claim's
//! request at a time and returns the conditions and `status.storage`.
//!
//! Intent before action: auto-grow records the size it grows to in
//! `status.storage.grownTo` (through the round's status write) before any
//! claim is patched; the target every round works towards is the larger of
//! `spec.storage.size` and that record, so a restarted manager carries on
//! and a claim is never asked to shrink back to the spec.

pub mod expand;
pub mod grow;
pub mod quantity;
mod round;

pub use round::{Outcome, Readings, Round, run};

use crate::crd::PostgresClusterSpec;
use crate::postgres::shown;

/// Checks `spec.storage` (tenant input) beyond the CRD schema: every
/// problem names its field, nothing is echoed unbounded.
pub fn validate(spec: &PostgresClusterSpec, errs: &mut Vec<String>) {
    let size = quantity::bytes(&spec.storage.size);
    if size.is_none_or(|b| b == 0) {
        errs.push(format!(
            "spec.storage.size: \"{}\" is not a size (e.g. 10Gi)",
            shown(&spec.storage.size)
        ));
    }
    let Some(ag) = &spec.storage.auto_grow else {
        return;
    };
    if !(50..=95).contains(&ag.threshold) {
        errs.push(format!(
            "spec.storage.autoGrow.threshold: {} is outside 50..95 (percent used)",
            ag.threshold
        ));
    }
    if increment(&ag.increment).is_none() {
        errs.push(format!(
            "spec.storage.autoGrow.increment: \"{}\" is neither a size (e.g. 1Gi) nor a percent from 10% to 400%",
            shown(&ag.increment)
        ));
    }
    match (quantity::bytes(&ag.max), size) {
        (None, _) => errs.push(format!(
            "spec.storage.autoGrow.max: \"{}\" is not a size (e.g. 100Gi)",
            shown(&ag.max)
        )),
        (Some(max), Some(size)) if max < size => errs.push(format!(
            "spec.storage.autoGrow.max: {} is smaller than spec.storage.size {}",
            shown(&ag.max),
            shown(&spec.storage.size)
        )),
        _ => {}
    }
}

fn increment(s: &str) -> Option<grow::Increment> {
    match s.strip_suffix('%') {
        Some(p) => p
            .parse::<u32>()
            .ok()
            .filter(|p| (10..=400).contains(p))
            .map(grow::Increment::Percent),
        None => quantity::bytes(s)
            .filter(|b| *b > 0)
            .map(grow::Increment::Bytes),
    }
}

/// The size a new instance claim is created with: the target (the spec,
/// or auto-grow's record when larger), and never smaller than an existing
/// claim (a new replica must hold what the primary holds).
pub fn new_claim_size(
    spec_size: &str,
    grown_to: Option<&str>,
    claims: &crate::controller::plan::Observed,
) -> String {
    let largest = claims
        .claims
        .values()
        .filter_map(|c| c.request.as_deref().and_then(quantity::bytes))
        .chain(grown_to.and_then(quantity::bytes))
        .max();
    match (quantity::bytes(spec_size), largest) {
        (Some(spec), Some(big)) if big > spec => quantity::format(big),
        _ => spec_size.to_string(),
    }
}

/// The auto-grow policy of a validated spec (None: off).
pub fn policy(spec: &PostgresClusterSpec) -> Option<grow::Policy> {
    let ag = spec.storage.auto_grow.as_ref()?;
    Some(grow::Policy {
        threshold: ag.threshold,
        increment: increment(&ag.increment)?,
        max: quantity::bytes(&ag.max)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::storage::AutoGrowSpec;

    fn spec(size: &str, ag: Option<(u32, &str, &str)>) -> PostgresClusterSpec {
        let mut s: PostgresClusterSpec =
            serde_json::from_str("{}").unwrap_or_else(|_| unreachable!());
        s.storage.size = size.into();
        s.storage.auto_grow = ag.map(|(threshold, inc, max)| AutoGrowSpec {
            threshold,
            increment: inc.into(),
            max: max.into(),
        });
        s
    }

    fn errors(s: &PostgresClusterSpec) -> Vec<String> {
        let mut e = vec![];
        validate(s, &mut e);
        e
    }

    #[test]
    fn hostile_storage_specs_are_refused_naming_the_field() {
        assert!(errors(&spec("64Mi", Some((80, "32Mi", "1Gi")))).is_empty());
        assert!(errors(&spec("64Mi", Some((80, "50%", "64Mi")))).is_empty());
        let e = errors(&spec("0", Some((99, "5000%", "1Gi"))));
        assert!(e[0].starts_with("spec.storage.size:"), "{e:?}");
        assert!(
            e[1].starts_with("spec.storage.autoGrow.threshold: 99"),
            "{e:?}"
        );
        assert!(
            e[2].starts_with("spec.storage.autoGrow.increment:"),
            "{e:?}"
        );
        let e = errors(&spec("2Gi", Some((80, "0", "1Gi"))));
        assert!(
            e[0].starts_with("spec.storage.autoGrow.increment:"),
            "{e:?}"
        );
        assert!(
            e[1].contains("max: 1Gi is smaller than spec.storage.size 2Gi"),
            "{e:?}"
        );
        let long = "9".repeat(5000);
        let e = errors(&spec("1Gi", Some((80, "1Gi", &long))));
        assert!(
            e[0].starts_with("spec.storage.autoGrow.max:") && e[0].len() < 300,
            "{e:?}"
        );
        let p = policy(&spec("64Mi", Some((80, "50%", "1Gi")))).expect("policy");
        assert_eq!(p.increment, grow::Increment::Percent(50));
    }

    #[test]
    fn new_claims_are_never_smaller_than_the_existing_ones() {
        use crate::controller::plan::{ClaimInfo, Observed};
        let mut obs = Observed::default();
        assert_eq!(new_claim_size("1Gi", None, &obs), "1Gi");
        assert_eq!(new_claim_size("1Gi", Some("1536Mi"), &obs), "1536Mi");
        let big = ClaimInfo {
            request: Some("2Gi".into()),
            ..ClaimInfo::default()
        };
        obs.claims.insert("pg-1".into(), big);
        assert_eq!(new_claim_size("1Gi", Some("1536Mi"), &obs), "2Gi");
        assert_eq!(new_claim_size("4Gi", None, &obs), "4Gi");
    }
}
