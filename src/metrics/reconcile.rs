//! Reconcile latency, errors and queue depth per member cluster.
//!
//! kube-runtime's `Controller` does not expose its scheduler's queue, so the
//! queue depth counted here is what the wrapper around reconcile sees:
//! reconciles the member's shard controllers have handed out and that have
//! not finished, waiting for one of the member's workers or running. Objects
//! still in the scheduler's delay queue (requeue timers, debouncing) are not
//! in it.

use super::{ClusterLabel, ErrorLabel, get};
use std::time::Instant;

/// Creates the member's reconcile series at zero, so a member with no
/// PostgresClusters yet still shows up on dashboards and alerts; its error
/// series start at zero for every error category.
pub fn member_started(cluster: &str, categories: &[&str]) {
    let m = get();
    let l = ClusterLabel::new(cluster);
    let _ = m.reconcile_duration.get_or_create(&l);
    for c in categories {
        let _ = m.reconcile_errors.get_or_create(&error_label(cluster, c));
    }
    let _ = m.reconcile_queue.get_or_create(&l);
}

/// One reconcile in progress: counted in the queue depth until
/// [`Timer::finish`] (or drop, when the reconcile future is cancelled).
pub struct Timer {
    label: ClusterLabel,
    started: Instant,
    done: bool,
}

/// Starts timing a reconcile of `cluster`.
pub fn start(cluster: &str) -> Timer {
    let label = ClusterLabel::new(cluster);
    get().reconcile_queue.get_or_create(&label).inc();
    Timer {
        label,
        started: Instant::now(),
        done: false,
    }
}

impl Timer {
    /// Records the outcome (`None` for success, else the error's category)
    /// and the duration.
    pub fn finish(mut self, error: Option<&str>) {
        let m = get();
        m.reconcile_duration
            .get_or_create(&self.label)
            .observe(self.started.elapsed().as_secs_f64());
        if let Some(category) = error {
            m.reconcile_errors
                .get_or_create(&error_label(&self.label.cluster, category))
                .inc();
        }
        m.reconcile_queue.get_or_create(&self.label).dec();
        self.done = true;
    }
}

fn error_label(cluster: &str, category: &str) -> ErrorLabel {
    ErrorLabel {
        cluster: cluster.to_string(),
        category: category.to_string(),
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if !self.done {
            get().reconcile_queue.get_or_create(&self.label).dec();
        }
    }
}
