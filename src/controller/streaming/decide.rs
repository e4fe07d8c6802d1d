//! The pure half of "is every replica streaming?": from one sample of the
//! replicas' WAL receivers and what was seen before, which replicas have not
//! streamed for longer than the grace period, and whether that is news.
//!
//! A replica whose WAL receiver is down for a moment (a restart, a
//! switchover, the primary's pod moving) is normal; one that stays down is
//! the silent kind of failure that turns the next failover into data loss or
//! a blocked failover, so it must become visible. The grace period separates
//! the two.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// How long a replica may be without a streaming WAL receiver before it is
/// reported: longer than a restart or a switchover's rewiring (the WAL
/// receiver retries every `wal_retrieve_retry_interval`, 5 s).
pub const GRACE: Duration = Duration::from_secs(30);

/// One replica as sampled now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub instance: String,
    /// Its WAL receiver's `status` is `streaming` (false also when the
    /// instance did not answer or has no WAL receiver at all).
    pub streaming: bool,
}

/// What one cluster's replicas looked like before this sample.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    /// Replicas not streaming, since when (first sample that saw it).
    pub since: BTreeMap<String, Instant>,
    /// Replicas already reported (an Event went out for each).
    pub reported: BTreeSet<String>,
}

/// The outcome of one sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Replicas not streaming for longer than the grace period (sorted).
    pub not_streaming: Vec<String>,
    /// Of those, the ones not reported before: each gets a Warning Event.
    pub newly: Vec<String>,
    /// When to sample again to catch a replica whose grace runs out (None:
    /// every replica streams, or every stuck one is reported already).
    pub look_again: Option<Duration>,
}

impl Verdict {
    /// The `ReplicasStreaming` condition: (status, reason, message).
    pub fn condition(&self) -> (bool, &'static str, String) {
        if self.not_streaming.is_empty() {
            (true, "AllStreaming", String::new())
        } else {
            (
                false,
                "NotStreaming",
                format!(
                    "WAL receiver not streaming for more than {}s: {}",
                    GRACE.as_secs(),
                    self.not_streaming.join(", ")
                ),
            )
        }
    }
}

/// Folds one sample into `mem` and judges it. A replica that streams again
/// (or is no longer a replica) is forgotten, so a later outage is news again.
pub fn assess(mem: &mut Memory, samples: &[Sample], now: Instant, grace: Duration) -> Verdict {
    let down: BTreeSet<&str> = samples
        .iter()
        .filter(|s| !s.streaming)
        .map(|s| s.instance.as_str())
        .collect();
    mem.since.retain(|k, _| down.contains(k.as_str()));
    mem.reported.retain(|k| down.contains(k.as_str()));
    for d in &down {
        mem.since.entry((*d).to_string()).or_insert(now);
    }
    let mut not_streaming = vec![];
    let mut newly = vec![];
    let mut look_again: Option<Duration> = None;
    for (name, since) in &mem.since {
        let down_for = now.saturating_duration_since(*since);
        if down_for >= grace {
            not_streaming.push(name.clone());
            if !mem.reported.contains(name) {
                newly.push(name.clone());
            }
        } else {
            let left = grace - down_for;
            look_again = Some(look_again.map_or(left, |l| l.min(left)));
        }
    }
    mem.reported.extend(newly.iter().cloned());
    Verdict {
        not_streaming,
        newly,
        look_again,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn s(name: &str, streaming: bool) -> Sample {
        Sample {
            instance: name.into(),
            streaming,
        }
    }

    #[test]
    fn a_short_outage_is_not_reported() {
        let mut m = Memory::default();
        let t0 = Instant::now();
        let v = assess(&mut m, &[s("a-2", false), s("a-3", true)], t0, GRACE);
        assert!(v.not_streaming.is_empty() && v.newly.is_empty());
        assert_eq!(v.look_again, Some(GRACE));
        let v = assess(&mut m, &[s("a-2", true), s("a-3", true)], t0 + GRACE, GRACE);
        assert!(v.not_streaming.is_empty());
        assert_eq!(v.look_again, None);
        assert!(v.condition().0);
        assert!(m.since.is_empty());
    }

    #[test]
    fn a_long_outage_is_reported_once_and_named() {
        let mut m = Memory::default();
        let t0 = Instant::now();
        assess(&mut m, &[s("a-2", false)], t0, GRACE);
        let v = assess(
            &mut m,
            &[s("a-2", false)],
            t0 + Duration::from_secs(10),
            GRACE,
        );
        assert!(v.not_streaming.is_empty());
        assert_eq!(v.look_again, Some(Duration::from_secs(20)));
        let v = assess(&mut m, &[s("a-2", false)], t0 + GRACE, GRACE);
        assert_eq!(v.not_streaming, vec!["a-2".to_string()]);
        assert_eq!(v.newly, vec!["a-2".to_string()]);
        let (ok, reason, msg) = v.condition();
        assert!(!ok);
        assert_eq!(reason, "NotStreaming");
        assert!(msg.contains("a-2"));
        // Still down: still in the condition, but no second Event.
        let v = assess(&mut m, &[s("a-2", false)], t0 + GRACE * 2, GRACE);
        assert_eq!(v.not_streaming, vec!["a-2".to_string()]);
        assert!(v.newly.is_empty());
        assert_eq!(v.look_again, None);
    }

    #[test]
    fn recovery_then_a_new_outage_is_news_again() {
        let mut m = Memory::default();
        let t0 = Instant::now();
        assess(&mut m, &[s("a-2", false)], t0, GRACE);
        assess(&mut m, &[s("a-2", false)], t0 + GRACE, GRACE);
        let v = assess(&mut m, &[s("a-2", true)], t0 + GRACE * 2, GRACE);
        assert!(v.not_streaming.is_empty() && v.condition().0);
        assess(&mut m, &[s("a-2", false)], t0 + GRACE * 3, GRACE);
        let v = assess(&mut m, &[s("a-2", false)], t0 + GRACE * 4, GRACE);
        assert_eq!(v.newly, vec!["a-2".to_string()]);
    }

    #[test]
    fn an_instance_that_is_no_longer_a_replica_is_forgotten() {
        let mut m = Memory::default();
        let t0 = Instant::now();
        assess(&mut m, &[s("a-1", false), s("a-2", false)], t0, GRACE);
        // a-1 was promoted: it is not sampled any more.
        let v = assess(&mut m, &[s("a-2", false)], t0 + GRACE, GRACE);
        assert_eq!(v.not_streaming, vec!["a-2".to_string()]);
        assert!(!m.since.contains_key("a-1"));
    }
}
