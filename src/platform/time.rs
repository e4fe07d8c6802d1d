//! Timestamps as records and status carry them: RFC 3339 in UTC, whole
//! seconds (what `kubectl get` shows and compares as text). The clock that
//! plans over hours is [`super::clock`].

use chrono::{DateTime, Utc};
use std::time::SystemTime;

/// Now, as status fields carry it.
pub fn now_rfc3339() -> String {
    ts(Utc::now())
}

/// A `SystemTime` (a [`super::clock::Clock`] reading) as status fields carry it.
pub fn system_ts(t: SystemTime) -> String {
    ts(DateTime::<Utc>::from(t))
}

pub fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// `None` for anything that is not RFC 3339 (a hand-edited record).
pub fn parse_ts(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_whole_seconds() {
        let t = parse_ts("2026-12-03T04:05:06Z");
        assert_eq!(t.map(ts).as_deref(), Some("2026-12-03T04:05:06Z"));
        assert!(parse_ts("yesterday").is_none());
    }
}
