//! Fleet-wide admission of reconciles (`manager.reconciles_in_flight`).
//!
//! Each member has its own worker pool (`workers_per_cluster`), which keeps
//! members apart; but a thousand members × 8 workers let 8,000 reconciles
//! run at once on a manager with two cores. Under a cold start every one of
//! them progressed a little at a time: for the first minute of a 1,000 × 10
//! converge almost nothing finished, the in-flight work held the memory, and
//! Lease renewals (on both ends) queued behind the backlog. Admitting a
//! bounded number at a time lets reconciles finish in order — the same work,
//! done sooner, with less held at once (kube-apiserver's max-in-flight limit
//! answers the same problem on the other side).
//!
//! The bulkhead between members stays: an admission is held while the
//! member keeps answering. A reconcile stuck on a member that stopped
//! answering (its calls wait for their deadline) gives its admission back
//! once the member has been silent for [`HOLD`], so slow members cannot
//! take the fleet's admissions away from the others; they only run a little
//! over the bound. Every reconcile gives it back after [`MAX_HOLD`] at the
//! latest (the long waits of a switchover must not hold the fleet).
//!
//! Measured (issue 16): with a fixed 2 s lease instead, a cold start whose
//! reconciles took longer than that (the emulator was the bottleneck) had
//! every one of 3,000 reconciles in flight at once, 135 MB of futures.

use crate::fleet::swap::Answered;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, oneshot};

/// How long a member may be silent before its reconciles give their
/// admissions back.
pub const HOLD: Duration = Duration::from_secs(2);
/// How long one reconcile may keep its admission at most.
pub const MAX_HOLD: Duration = Duration::from_secs(10);

/// The fleet's admissions (`None`: no fleet-wide bound) and how long a
/// silent member keeps one.
#[derive(Clone, Debug, Default)]
pub struct Admission(Option<Arc<Semaphore>>, Duration);

/// Held while a reconcile runs; dropping it gives the admission back.
pub struct Admitted(#[allow(dead_code)] Option<oneshot::Sender<()>>);

impl Admission {
    /// `limit` reconciles at once across the fleet; 0 for no bound.
    pub fn new(limit: u32) -> Admission {
        Self::leased_for(limit, HOLD)
    }

    fn leased_for(limit: u32, hold: Duration) -> Admission {
        let sem = (limit > 0).then(|| Arc::new(Semaphore::new(limit as usize)));
        Admission(sem, hold)
    }

    /// Waits for an admission (in arrival order), held while `member`
    /// answers (see the module's doc).
    pub async fn admit(&self, member: &Answered) -> Admitted {
        let Some(sem) = &self.0 else {
            return Admitted(None);
        };
        let Ok(permit) = sem.clone().acquire_owned().await else {
            return Admitted(None);
        };
        let (done, mut finished) = oneshot::channel::<()>();
        let (hold, member) = (self.1, member.clone());
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + MAX_HOLD.max(hold);
            loop {
                let next = (tokio::time::Instant::now() + hold).min(until);
                tokio::select! {
                    _ = &mut finished => break,
                    _ = tokio::time::sleep_until(next) => {}
                }
                if next >= until || member.ago() >= hold {
                    break;
                }
            }
            drop(permit);
        });
        Admitted(Some(done))
    }

    /// Admissions free now (for tests and the status page).
    pub fn available(&self) -> Option<usize> {
        self.0.as_ref().map(|s| s.available_permits())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn admissions_are_bounded_returned_on_drop_and_held_while_the_member_answers() {
        let a = Admission::leased_for(2, Duration::from_millis(50));
        let member = Answered::default();
        let first = a.admit(&member).await;
        let _second = a.admit(&member).await;
        assert_eq!(a.available(), Some(0));
        // A third waits until one is given back (the lease is long gone
        // only after 50 ms; dropping is what frees it here).
        let waiter = tokio::spawn({
            let a = a.clone();
            let member = member.clone();
            async move { a.admit(&member).await }
        });
        drop(first);
        let third = waiter.await.unwrap();
        // While the member answers, the holders keep their admissions.
        for _ in 0..10 {
            member.mark();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(a.available(), Some(0));
        // Holders on a silent member lose their admissions.
        let mut freed = false;
        for _ in 0..500 {
            if a.available() == Some(2) {
                freed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(freed, "leased admissions were never given back");
        drop(third);
        assert_eq!(Admission::new(0).available(), None);
    }
}
