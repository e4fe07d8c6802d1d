//! What the engine remembers between rounds, on its own clock: when it
//! last reached each side's primary, when each replica side last streamed,
//! the primary side's recent positions, and each replica side's last lag
//! measured while both sides were up — the witness's evidence
//! (`failover.rs`). Nothing here is persisted: a restarted manager starts
//! every silence at zero, so it waits a whole `failover_after` again
//! before it may promote anyone.

use super::decide::SideView;
use super::failover::{Candidate, Witness, lag_in_time};
use crate::postgres::parse_lsn;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How much position history is kept for the lag in time.
const HISTORY: Duration = Duration::from_secs(600);
/// A WAL receiver that heard from its upstream this recently streams.
const FRESH_MS: i64 = 3000;

#[derive(Debug)]
pub struct Track {
    started: Instant,
    last_ok: HashMap<String, Instant>,
    last_streaming: HashMap<String, Instant>,
    /// (when, primary side position), newest first.
    samples: VecDeque<(Instant, u64)>,
    /// Last lag measured with both sides up: (bytes, time).
    lag: HashMap<String, (u64, Duration)>,
}

impl Track {
    pub fn new(now: Instant) -> Self {
        Self {
            started: now,
            last_ok: HashMap::new(),
            last_streaming: HashMap::new(),
            samples: VecDeque::new(),
            lag: HashMap::new(),
        }
    }

    /// Takes in one round's views; `primary` is the primary side's member.
    pub fn observe(&mut self, now: Instant, primary: &str, views: &[SideView]) {
        let p = views.iter().find(|v| v.member == primary);
        // Reached: its primary instance answered (in whatever role: during
        // a switchover the new primary side is still a standby).
        if p.is_some_and(|v| v.report.is_some()) {
            self.last_ok.insert(primary.to_string(), now);
        }
        let head = p
            .and_then(|v| v.report.as_ref())
            .filter(|r| r.role == "primary")
            .and_then(|r| r.current_lsn.as_deref().and_then(parse_lsn));
        if let Some(lsn) = head {
            self.samples.push_front((now, lsn));
            while self
                .samples
                .back()
                .is_some_and(|(t, _)| now.duration_since(*t) > HISTORY)
            {
                self.samples.pop_back();
            }
        }
        for v in views.iter().filter(|v| v.member != primary) {
            let Some(r) = &v.report else { continue };
            let fresh = r.receiver_idle_ms.is_some_and(|ms| ms < FRESH_MS);
            if r.streaming() && fresh {
                self.last_streaming.insert(v.member.clone(), now);
            }
            if let (Some(_), Some(got)) = (head, super::decide::has(r)) {
                let samples: Vec<(Duration, u64)> = self
                    .samples
                    .iter()
                    .map(|(t, l)| (now.duration_since(*t), *l))
                    .collect();
                let bytes = samples.first().map_or(0, |s| s.1.saturating_sub(got));
                if let Some(t) = lag_in_time(&samples, got) {
                    self.lag.insert(v.member.clone(), (bytes, t));
                }
            }
        }
    }

    fn since(&self, map: &HashMap<String, Instant>, member: &str, now: Instant) -> Duration {
        now.duration_since(*map.get(member).unwrap_or(&self.started))
    }

    /// The witness's evidence for a primary side that is not answering.
    pub fn witness(&self, now: Instant, primary: &str, views: &[SideView]) -> Witness {
        let replicas = views
            .iter()
            .filter(|v| v.member != primary)
            .filter_map(|v| {
                let r = v.report.as_ref().filter(|r| r.role == "replica")?;
                let lag = self.lag.get(&v.member);
                Some(Candidate {
                    member: v.member.clone(),
                    silent: self.since(&self.last_streaming, &v.member, now),
                    lag_bytes: lag.map(|l| l.0),
                    lag: lag.map(|l| l.1),
                    received: super::decide::has(r).unwrap_or(0),
                })
            })
            .collect();
        Witness {
            primary_silent: self.since(&self.last_ok, primary, now),
            replicas,
        }
    }

    /// Since the manager last reached `member`'s primary.
    pub fn silent(&self, now: Instant, member: &str) -> Duration {
        self.since(&self.last_ok, member, now)
    }

    /// The last lag measured for `member`: (bytes, time).
    pub fn lag(&self, member: &str) -> Option<(u64, Duration)> {
        self.lag.get(member).copied()
    }
}
