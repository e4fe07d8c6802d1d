//! The Lease decision, pure: given the last Lease record read, when we saw
//! it change, the time now and who we are — take, renew or wait; and, for a
//! holder, whether it may still act.
//!
//! The rules are client-go's leader election. Expiry is measured on *our*
//! monotonic clock from the moment we saw the record change, never by
//! comparing another replica's `renewTime` with our wall clock, so clock
//! skew between replicas cannot make two of them hold at once. A holder
//! stops acting `renew_deadline` after the start of its last successful
//! renewal; everyone else waits `lease_duration` (longer) after they saw
//! that renewal, so the old holder has stopped before a new one starts.
//! Two replicas racing to take the same Lease are serialised by the API
//! server's optimistic concurrency (create conflicts, `resourceVersion` on
//! replace): only one write wins.

use std::time::{Duration, Instant};

/// What the decision reads from a Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// `None` (or empty) when released or never held.
    pub holder: Option<String>,
    /// The holder's `leaseDurationSeconds`: others wait this long.
    pub duration: Duration,
    pub transitions: i32,
    /// `metadata.resourceVersion`: changes with every write, renewals included.
    pub version: String,
}

impl Record {
    fn holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|h| !h.is_empty())
    }
}

/// The last record read and when it last changed, on our clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub record: Record,
    pub changed_at: Instant,
}

/// Folds a fresh read into the observation: the clock restarts only when
/// the record changed (a renewal or a new holder), as client-go's
/// `observedTime` does. `None` means the Lease does not exist.
pub fn observe(prev: Option<Observed>, read: Option<Record>, now: Instant) -> Option<Observed> {
    let record = read?;
    match prev {
        Some(p) if p.record == record => Some(p),
        _ => Some(Observed {
            record,
            changed_at: now,
        }),
    }
}

/// What to do next with one member's Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Absent, released, or expired: write ourselves in. `from` is the
    /// previous holder, if any (a transition is counted).
    Take { from: Option<String> },
    /// Ours: write a fresh renewTime.
    Renew,
    /// Someone else holds it, until `expires` unless they renew.
    Wait { holder: String, expires: Instant },
}

pub fn decide(seen: Option<&Observed>, now: Instant, me: &str) -> Step {
    let Some(o) = seen else {
        return Step::Take { from: None };
    };
    match o.record.holder() {
        None => Step::Take { from: None },
        Some(h) if h == me => Step::Renew,
        Some(h) => {
            let expires = o.changed_at + o.record.duration;
            if now >= expires {
                Step::Take {
                    from: Some(h.to_string()),
                }
            } else {
                Step::Wait {
                    holder: h.to_string(),
                    expires,
                }
            }
        }
    }
}

/// `leaseTransitions` after a write for `step`: counted when the holder changes.
pub fn transitions_after(prev: Option<&Record>, step: &Step) -> i32 {
    let before = prev.map_or(0, |r| r.transitions);
    match step {
        Step::Take { from: Some(_) } => before.saturating_add(1),
        _ => before,
    }
}

/// Whether a holder may still act: only until `renew_deadline` after the
/// start of its last successful write (the start, because the server may
/// have applied it at any moment before the answer came back).
pub fn may_act(last_write_started: Instant, now: Instant, renew_deadline: Duration) -> bool {
    now < last_write_started + renew_deadline
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn rec(holder: Option<&str>, version: &str) -> Record {
        Record {
            holder: holder.map(String::from),
            duration: D,
            transitions: 3,
            version: version.into(),
        }
    }

    fn seen(holder: Option<&str>, at: Instant) -> Observed {
        Observed {
            record: rec(holder, "1"),
            changed_at: at,
        }
    }

    #[test]
    fn an_absent_or_released_lease_is_taken_at_once() {
        let now = Instant::now();
        assert_eq!(decide(None, now, "a"), Step::Take { from: None });
        assert_eq!(
            decide(Some(&seen(None, now)), now, "a"),
            Step::Take { from: None }
        );
        assert_eq!(
            decide(Some(&seen(Some(""), now)), now, "a"),
            Step::Take { from: None }
        );
    }

    #[test]
    fn our_own_lease_is_renewed_even_just_after_a_restart() {
        let now = Instant::now();
        assert_eq!(decide(Some(&seen(Some("a"), now)), now, "a"), Step::Renew);
    }

    #[test]
    fn another_holder_is_waited_for_a_full_duration_from_when_we_saw_it_move() {
        let t0 = Instant::now();
        let o = seen(Some("b"), t0);
        assert_eq!(
            decide(Some(&o), t0 + D - Duration::from_millis(1), "a"),
            Step::Wait {
                holder: "b".into(),
                expires: t0 + D
            }
        );
        assert_eq!(
            decide(Some(&o), t0 + D, "a"),
            Step::Take {
                from: Some("b".into())
            }
        );
    }

    #[test]
    fn a_renewal_restarts_the_wait_and_an_unchanged_read_does_not() {
        let t0 = Instant::now();
        let o = observe(None, Some(rec(Some("b"), "1")), t0);
        let same = observe(o.clone(), Some(rec(Some("b"), "1")), t0 + D / 2);
        assert_eq!(same.as_ref().map(|o| o.changed_at), Some(t0));
        let renewed = observe(same, Some(rec(Some("b"), "2")), t0 + D / 2);
        assert_eq!(renewed.as_ref().map(|o| o.changed_at), Some(t0 + D / 2));
        assert!(matches!(
            decide(renewed.as_ref(), t0 + D, "a"),
            Step::Wait { .. }
        ));
        assert_eq!(observe(renewed, None, t0 + D), None);
    }

    #[test]
    fn transitions_count_changes_of_holder_only() {
        let r = rec(Some("b"), "1");
        let from_b = Step::Take {
            from: Some("b".into()),
        };
        assert_eq!(transitions_after(Some(&r), &from_b), 4);
        assert_eq!(transitions_after(Some(&r), &Step::Renew), 3);
        assert_eq!(transitions_after(None, &Step::Take { from: None }), 0);
    }

    #[test]
    fn a_holder_stops_before_anyone_else_may_start() {
        let renew_deadline = Duration::from_secs(10);
        let write_started = Instant::now();
        // The others saw the write no earlier than it started.
        let others_take_at = write_started + D;
        assert!(may_act(write_started, write_started, renew_deadline));
        assert!(!may_act(
            write_started,
            write_started + renew_deadline,
            renew_deadline
        ));
        assert!(write_started + renew_deadline < others_take_at);
    }
}
