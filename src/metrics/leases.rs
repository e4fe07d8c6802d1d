//! Ownership Lease health, fleet-wide: how long each renewal round took
//! (`pgfleet_lease_renew_duration_seconds`) and how often a held Lease was
//! given up because no renewal succeeded within the renew deadline
//! (`pgfleet_lease_losses_total`). A loss stops the member's controllers
//! and restarts them with a full relist, so losses under load are the
//! figure that says renewals waited behind other work (DESIGN §8; `pgfleet
//! bench fleet` prints both). Unlabelled: with a thousand members a
//! per-member histogram would be ~16,000 series for one health figure;
//! which member lost is in the log.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bucket upper bounds: 1 ms doubling to ~16 s, then +Inf.
const BUCKETS: usize = 15;

fn bound(i: usize) -> f64 {
    0.001 * f64::from(1u32 << i)
}

#[derive(Debug, Default)]
pub struct Store {
    /// Renewal rounds per bucket (index BUCKETS: above the last bound).
    rounds: [AtomicU64; BUCKETS + 1],
    sum_micros: AtomicU64,
    losses: AtomicU64,
}

impl Store {
    /// One renewal round of a held Lease (success or not) took `took`.
    pub fn renewed(&self, took: Duration) {
        let s = took.as_secs_f64();
        let i = (0..BUCKETS).find(|&i| s <= bound(i)).unwrap_or(BUCKETS);
        self.rounds[i].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// A held Lease was given up: not renewed within the renew deadline.
    pub fn lost(&self) {
        self.losses.fetch_add(1, Ordering::Relaxed);
    }

    pub fn losses(&self) -> u64 {
        self.losses.load(Ordering::Relaxed)
    }

    /// Renewal rounds so far, and the upper bound of the bucket holding
    /// quantile `q` (`None` for no rounds or beyond the last bound): what a
    /// Prometheus `histogram_quantile` would answer, without interpolation.
    pub fn quantile(&self, q: f64) -> (u64, Option<Duration>) {
        let counts: Vec<u64> = self
            .rounds
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return (0, None);
        }
        let rank = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return (
                    total,
                    (i < BUCKETS).then(|| Duration::from_secs_f64(bound(i))),
                );
            }
        }
        (total, None)
    }
}

impl Collector for Store {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts: Vec<u64> = self
            .rounds
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let buckets: Vec<(f64, u64)> = counts
            .iter()
            .enumerate()
            .map(|(i, n)| (if i < BUCKETS { bound(i) } else { f64::MAX }, *n))
            .collect();
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        encoder
            .encode_descriptor(
                "pgfleet_lease_renew_duration_seconds",
                "Time one renewal round of a held ownership Lease took (read and write at the member's API server)",
                None,
                MetricType::Histogram,
            )?
            .encode_histogram::<NoLabelSet>(sum, counts.iter().sum(), &buckets, None)?;
        encoder
            .encode_descriptor(
                "pgfleet_lease_losses",
                "Held ownership Leases given up because no renewal succeeded within the renew deadline",
                None,
                MetricType::Counter,
            )?
            .encode_counter::<NoLabelSet, _, u64>(&self.losses(), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_bucket_bounds_and_losses_count() {
        let s = Store::default();
        assert_eq!(s.quantile(0.99), (0, None));
        for _ in 0..98 {
            s.renewed(Duration::from_micros(700));
        }
        s.renewed(Duration::from_millis(30));
        s.renewed(Duration::from_secs(60));
        assert_eq!(s.quantile(0.5), (100, Some(Duration::from_millis(1))));
        assert_eq!(s.quantile(0.99), (100, Some(Duration::from_millis(32))));
        assert_eq!(s.quantile(1.0), (100, None));
        s.lost();
        assert_eq!(s.losses(), 1);
    }
}
