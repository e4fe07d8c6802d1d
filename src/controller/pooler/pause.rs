//! PgBouncer PAUSE/RESUME for a switchover, with the guarantee that every
//! PAUSE is followed by a RESUME: when the switchover returns early (a step
//! failed or timed out), or its task is cancelled, the guard's `Drop` sends
//! RESUME from a task of its own, under a deadline and with retries. A pooler
//! left paused holds every client of the cluster until someone notices.

use crate::controller::pooler;
use crate::controller::reconcile::Error;
use crate::postgres::exec::{ExecError, run_command};
use std::time::Duration;

/// Deadline of one admin command. PAUSE waits for running transactions to
/// finish; one that has not within this time fails the switchover step (it
/// is retried on the next round) instead of holding clients indefinitely.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(20);
/// RESUME attempts made by a guard dropped while armed.
const RESUME_ATTEMPTS: u32 = 12;

/// Runs a PgBouncer admin command in each of `pods`, each under
/// [`ADMIN_TIMEOUT`]. Returns the pods that did not take it. A refusal
/// (PAUSE on a paused pooler, RESUME on a running one) counts as taken.
pub async fn admin(client: &kube::Client, ns: &str, pods: &[String], cmd: &str) -> Vec<String> {
    let what = format!("pgbouncer {cmd}");
    let what = what.as_str();
    // All at once: clients of every pooler wait for the slowest one only.
    let sent = pods.iter().map(|pod| async move {
        let r = run_command(
            client,
            ns,
            pod,
            "pgbouncer",
            pooler::admin_command(cmd),
            what,
            ADMIN_TIMEOUT,
        )
        .await;
        (pod, r)
    });
    let mut missed = vec![];
    for (pod, r) in futures::future::join_all(sent).await {
        match r {
            Ok(_) => {}
            Err(ExecError::Verb { message, .. }) => {
                tracing::debug!(%pod, cmd, %message, "pooler admin command refused");
            }
            Err(e) => {
                tracing::warn!(%pod, cmd, error = %e, "pooler admin command did not complete");
                missed.push(pod.clone());
            }
        }
    }
    missed
}

/// Poolers that were (or may have been) paused and must get RESUME.
pub struct Paused {
    client: kube::Client,
    ns: String,
    pods: Vec<String>,
    armed: bool,
}

impl Paused {
    /// Pauses every pod in `pods`. The guard is armed before the first PAUSE
    /// is sent, so a PAUSE that times out half-way (or a cancelled task) is
    /// still followed by RESUME. An error means some pooler did not confirm
    /// the PAUSE; the guard dropped with it resumes them all.
    pub async fn pause(client: &kube::Client, ns: &str, pods: Vec<String>) -> Result<Self, Error> {
        let guard = Paused {
            client: client.clone(),
            ns: ns.to_string(),
            pods,
            armed: true,
        };
        let sent = guard.pods.iter().map(|pod| {
            run_command(
                client,
                ns,
                pod,
                "pgbouncer",
                pooler::admin_command("PAUSE"),
                "pgbouncer PAUSE",
                ADMIN_TIMEOUT,
            )
        });
        for r in futures::future::join_all(sent).await {
            match r {
                // Already paused: what we wanted.
                Ok(_) | Err(ExecError::Verb { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(guard)
    }

    /// Sends RESUME now. Pods that do not take it are handed to a background
    /// task that keeps trying (the guard stays armed for them), so the caller
    /// can go on recording the switchover.
    pub async fn resume(mut self) {
        let missed = admin(&self.client, &self.ns, &self.pods, "RESUME").await;
        if missed.is_empty() {
            self.armed = false;
        } else {
            self.pods = missed;
        }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if !self.armed || self.pods.is_empty() {
            return;
        }
        let (client, ns, pods) = (
            self.client.clone(),
            std::mem::take(&mut self.ns),
            std::mem::take(&mut self.pods),
        );
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::error!(
                ?pods,
                "no runtime to send RESUME from; poolers may stay paused"
            );
            return;
        };
        rt.spawn(resume_with_retries(client, ns, pods));
    }
}

/// RESUME until every pod has taken it, backing off between rounds.
async fn resume_with_retries(client: kube::Client, ns: String, mut pods: Vec<String>) {
    let mut wait = Duration::from_millis(500);
    for attempt in 1..=RESUME_ATTEMPTS {
        pods = admin(&client, &ns, &pods, "RESUME").await;
        if pods.is_empty() {
            tracing::info!(%ns, attempt, "poolers resumed after an interrupted switchover");
            return;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(30));
    }
    tracing::error!(%ns, ?pods, "poolers did not take RESUME; they may stay paused");
}
