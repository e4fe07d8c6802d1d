//! The loop around one member's Lease: read, decide (`decide.rs`), write,
//! and start or stop the member's controller accordingly. All timing that
//! matters for safety is on this process's monotonic clock.

use super::decide::{self, Observed, Step};
use super::{Slot, Timings, lease};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use std::sync::Arc;
use std::time::Instant;

pub(super) struct Elector {
    pub slot: Arc<Slot>,
    pub me: String,
    pub timings: Timings,
    api: Api<Lease>,
    /// The last Lease read or written, and how its record was observed.
    last: Option<Lease>,
    seen: Option<Observed>,
    /// The start of our last successful write while holding.
    renewed: Option<Instant>,
}

enum Outcome {
    /// We hold the Lease (written just now).
    Hold,
    /// Someone else holds it.
    Held(String),
    /// Our write lost a race; the next round reads again.
    Conflict,
    /// The Lease we held was deleted under us: stop at once, since others
    /// may create it anew right away.
    Gone,
}

impl Elector {
    pub fn new(slot: Arc<Slot>, me: String, timings: Timings) -> Elector {
        let api = lease::api(slot.member.control_client());
        Elector {
            slot,
            me,
            timings,
            api,
            last: None,
            seen: None,
            renewed: None,
        }
    }

    /// Runs rounds every retry period until aborted; `first` fires after
    /// the first round, so a manager can start owning before it returns.
    pub async fn run(mut self, first: tokio::sync::oneshot::Sender<()>) {
        self.round().await;
        let _ = first.send(());
        loop {
            let mut wait = self.timings.retry_period;
            if self.renewed.is_none() {
                // Waiting replicas spread out (client-go's jitter), so
                // they do not all hit the API server in the same instant.
                wait += wait.mul_f64(rand::random::<f64>() * 0.2);
            }
            tokio::time::sleep(wait).await;
            self.round().await;
        }
    }

    async fn round(&mut self) {
        let started = Instant::now();
        let deadline = self.timings.renew_deadline;
        // A holder's round may not outlast its right to act.
        let budget = match self.renewed {
            Some(r) => (r + deadline).saturating_duration_since(started),
            None => deadline,
        };
        let member = self.slot.member.name.clone();
        let holding = self.renewed.is_some();
        let outcome = tokio::time::timeout(budget, self.attempt()).await;
        if holding {
            crate::metrics::get().leases.renewed(started.elapsed());
        }
        match outcome {
            Ok(Ok(Outcome::Hold)) => {
                self.renewed = Some(started);
                self.slot.acquire(&self.me);
            }
            Ok(Ok(Outcome::Held(by))) => {
                if self.renewed.take().is_some() {
                    tracing::warn!(cluster = %member, holder = %by, "lease taken by another replica; stopping");
                }
                self.slot.lose(Some(by));
            }
            Ok(Ok(Outcome::Conflict)) => {}
            Ok(Ok(Outcome::Gone)) => {
                if self.renewed.take().is_some() {
                    tracing::warn!(cluster = %member, "lease deleted; stopping");
                }
                self.slot.lose(None);
            }
            Ok(Err(e)) => {
                tracing::debug!(cluster = %member, error = %super::redacted(&e), "lease round failed")
            }
            Err(_) => tracing::debug!(cluster = %member, "lease round timed out"),
        }
        if let Some(r) = self.renewed
            && !decide::may_act(r, Instant::now(), deadline)
        {
            tracing::warn!(cluster = %member, "lease not renewed within the renew deadline; stopping");
            crate::metrics::get().leases.lost();
            self.renewed = None;
            self.last = None;
            let holder = self.seen.as_ref().and_then(|o| o.record.holder.clone());
            self.slot.lose(holder);
        }
    }

    async fn attempt(&mut self) -> kube::Result<Outcome> {
        // Holding with a known version: renew straight away (a 409 tells us
        // if anyone wrote since); otherwise read first.
        let current = match (&self.renewed, &self.last) {
            (Some(_), Some(l)) => Some(l.clone()),
            _ => lease::read(&self.api).await?,
        };
        let now = Instant::now();
        self.seen = decide::observe(self.seen.take(), current.as_ref().map(lease::record), now);
        let step = decide::decide(self.seen.as_ref(), now, &self.me);
        if let Step::Wait { holder, .. } = step {
            self.last = current;
            return Ok(Outcome::Held(holder));
        }
        let duration = self.timings.lease_duration;
        match lease::write(&self.api, current.as_ref(), &step, &self.me, duration).await {
            Ok(written) => {
                if let Step::Take { from } = &step {
                    tracing::info!(cluster = %self.slot.member.name, identity = %self.me,
                        previous = from.as_deref().unwrap_or("none"), "lease acquired");
                }
                self.seen = decide::observe(
                    self.seen.take(),
                    Some(lease::record(&written)),
                    Instant::now(),
                );
                self.last = Some(written);
                Ok(Outcome::Hold)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                self.last = None;
                Ok(Outcome::Conflict)
            }
            Err(kube::Error::Api(e)) if e.code == 404 && current.is_some() => {
                self.last = None;
                self.seen = None;
                Ok(Outcome::Gone)
            }
            Err(e) => Err(e),
        }
    }
}
