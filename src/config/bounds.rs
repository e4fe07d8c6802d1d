//! Upper (and lower) bounds of every duration key. humantime accepts
//! `500000y`; taken at its word, a lease that long never expires (HA is off
//! without anyone noticing), a deadline that long is none, and `Instant + d`
//! overflows and panics. Each bound is far beyond any sensible setting and
//! well inside what the code that uses the value handles.

use std::time::Duration;

use super::error::Seg;
use super::validate::Checker;
use super::values::HumanDuration;

const SEC: u64 = 1;
const MIN: u64 = 60 * SEC;
const HOUR: u64 = 60 * MIN;
const DAY: u64 = 24 * HOUR;

/// The allowed range of one duration key.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    /// Zero allowed?
    pub zero: bool,
    pub max: Duration,
}

const fn upto(secs: u64) -> Range {
    Range {
        zero: false,
        max: Duration::from_secs(secs),
    }
}

const fn zero_upto(secs: u64) -> Range {
    Range {
        zero: true,
        max: Duration::from_secs(secs),
    }
}

pub const PROBE_INTERVAL: Range = upto(10 * MIN);
pub const PROBE_TIMEOUT: Range = upto(5 * MIN);
/// A Lease must expire soon enough that a replica taking over a dead one's
/// members is still a fail-over, not an outage.
pub const LEASE_DURATION: Range = upto(5 * MIN);
pub const RENEW_DEADLINE: Range = upto(5 * MIN);
pub const RETRY_PERIOD: Range = upto(MIN);
pub const API_REQUEST_TIMEOUT: Range = upto(10 * MIN);
pub const BACKUP_WINDOW: Range = zero_upto(7 * DAY);
pub const BACKUP_START_DEADLINE: Range = upto(7 * DAY);
/// A century of backups is kept longer than any regulation asks.
pub const RETENTION_AGE: Range = upto(36_500 * DAY);
pub const PROGRESS_DEADLINE: Range = upto(30 * DAY);
pub const SOAK: Range = zero_upto(30 * DAY);
/// The HTTP API's header-read and whole-request deadlines.
pub const HTTP_TIMEOUT: Range = upto(HOUR);

/// What is wrong with `d` for `range`, if anything.
pub fn check(d: Duration, range: Range) -> Option<String> {
    if d.is_zero() && !range.zero {
        return Some("must be longer than 0s".into());
    }
    if d > range.max {
        return Some(format!(
            "must be at most {} (longer values are refused: they would disable what the key controls)",
            humantime::format_duration(range.max)
        ));
    }
    None
}

impl Checker {
    /// A duration within `range` (parse errors reported as usual).
    pub(super) fn duration(&mut self, path: Vec<Seg>, value: &HumanDuration, range: Range) {
        match value.parsed() {
            Some(d) => {
                if let Some(msg) = check(*d, range) {
                    self.err(path, msg);
                }
            }
            None => self.checked(path, value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_refuse_zero_and_absurd_lengths() {
        let y = humantime::parse_duration("500000y").expect("humantime parses it");
        assert!(check(y, LEASE_DURATION).is_some_and(|m| m.contains("at most 5m")));
        assert!(check(Duration::ZERO, LEASE_DURATION).is_some());
        assert!(check(Duration::ZERO, SOAK).is_none());
        assert!(check(Duration::from_secs(15), LEASE_DURATION).is_none());
        assert!(check(Duration::from_secs(10 * 365 * DAY), RETENTION_AGE).is_none());
    }
}
