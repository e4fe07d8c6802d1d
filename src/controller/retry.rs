//! When a failed reconcile runs again, by error category. Pure: the
//! failure count per PostgresCluster is kept in [`Failures`], the decision
//! is [`after`].
//!
//! A conflict is someone else's write landing first: the next attempt
//! almost always succeeds, so it comes at once. An unreachable or slow
//! member is not helped by hammering it: those back off exponentially, as
//! do server errors and our own bugs. A refused spec cannot succeed until
//! someone changes it, so it waits for a change to the object (or one of
//! its children) instead of a timer.

use super::error::Category;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// The delay before the next attempt after `failures` consecutive failures
/// (1 for the first) of `category`; `None`: wait for a change instead.
pub fn after(category: Category, failures: u32) -> Option<Duration> {
    let (base, cap) = match category {
        Category::Conflict => return Some(Duration::from_millis(500)),
        Category::InvalidSpec => return None,
        Category::ServerError => (Duration::from_secs(2), Duration::from_secs(60)),
        Category::Unreachable | Category::Timeout => {
            (Duration::from_secs(5), Duration::from_secs(300))
        }
        Category::Forbidden => (Duration::from_secs(30), Duration::from_secs(600)),
        Category::Internal => (Duration::from_secs(10), Duration::from_secs(300)),
    };
    let doublings = failures.saturating_sub(1).min(16);
    Some(base.saturating_mul(1 << doublings).min(cap))
}

/// The [`Failures`] key of a PostgresCluster.
pub fn key(pg: &impl kube::Resource) -> String {
    use kube::ResourceExt;
    format!("{}/{}", pg.namespace().unwrap_or_default(), pg.name_any())
}

/// Consecutive failed reconciles per PostgresCluster (`namespace/name`),
/// reset by a successful one.
#[derive(Debug, Default)]
pub struct Failures(Mutex<HashMap<String, u32>>);

impl Failures {
    /// Counts one more failure; returns the count including it.
    pub fn failed(&self, key: &str) -> u32 {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// Forgets the failures of a cluster that reconciled (or is gone).
    pub fn succeeded(&self, key: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_retry_fast_and_invalid_specs_wait_for_a_change() {
        for n in [1, 2, 10] {
            assert_eq!(
                after(Category::Conflict, n),
                Some(Duration::from_millis(500))
            );
            assert_eq!(after(Category::InvalidSpec, n), None);
        }
    }

    #[test]
    fn unreachable_members_back_off_exponentially_up_to_a_cap() {
        let d = |n| after(Category::Unreachable, n).map(|d| d.as_secs());
        assert_eq!(d(1), Some(5));
        assert_eq!(d(2), Some(10));
        assert_eq!(d(3), Some(20));
        assert_eq!(d(7), Some(300));
        assert_eq!(d(u32::MAX), Some(300));
        assert_eq!(after(Category::Timeout, 1), after(Category::Unreachable, 1));
        // Server errors start sooner, permissions later.
        assert!(after(Category::ServerError, 1) < d(1).map(Duration::from_secs));
        assert!(after(Category::Forbidden, 1) > d(1).map(Duration::from_secs));
    }

    #[test]
    fn failures_count_per_cluster_and_reset_on_success() {
        let f = Failures::default();
        assert_eq!(f.failed("shop/orders"), 1);
        assert_eq!(f.failed("shop/orders"), 2);
        assert_eq!(f.failed("shop/carts"), 1);
        f.succeeded("shop/orders");
        assert_eq!(f.failed("shop/orders"), 1);
    }
}
