//! The reachability probe of one member (on the control lane, see
//! [`super::control`]): marks it Ready on a successful probe and Unreachable
//! after `threshold` failures in a row; rebuilds its clients when the
//! kubeconfig file changes (rotated credentials, moved server), and — while
//! the member has no usable client — retries building them with backoff.
//!
//! A probe is only sent when the lane has had no success for a whole
//! interval. The Lease elector renews (or reads) the member's Lease on the
//! same lane every `retry_period` (2 s by default, the probe interval is
//! 5 s): an answered renewal is stronger evidence than `/version` (an
//! authenticated write that the API server stored), so a probe after it
//! asked again what was known. At 1,000 members that was ~200 requests/s
//! (1.9 per PostgresCluster at 1,000 × 10). As HTTP/2 sends no PING on a
//! connection that carries traffic, the probe goes out when the evidence
//! is an interval old, so an unreachable member is noticed as fast as
//! before: the first failed probe comes at most one interval after the
//! last success.

use super::{ConnState, Member, permissions, redact};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

pub(super) async fn probe_loop(
    m: Arc<Member>,
    interval: Duration,
    timeout: Duration,
    threshold: u32,
    members: usize,
) {
    let mut failures = 0u32;
    let mut seen = mtime(&m.kubeconfig);
    let mut retry = Backoff::new();
    let mut checks = permissions::Schedule::spread(members);
    loop {
        let now = mtime(&m.kubeconfig);
        let connected = m.connected();
        if now != seen || (!connected && retry.due()) {
            seen = now;
            rebuild(&m, connected, &mut retry).await;
            checks.now();
        }
        if !m.connected() {
            tokio::time::sleep(interval.min(Duration::from_secs(1))).await;
            continue;
        }
        let heard = m.control_succeeded().ago();
        if heard < interval {
            m.set_state(ConnState::Ready);
            failures = 0;
            permission_check(&m, &mut checks).await;
            // Look again when this evidence is an interval old.
            tokio::time::sleep(interval - heard).await;
            continue;
        }
        let client = m.control_client();
        match tokio::time::timeout(timeout, client.apiserver_version()).await {
            Ok(Ok(_)) => {
                failures = 0;
                m.set_state(ConnState::Ready);
                permission_check(&m, &mut checks).await;
            }
            outcome => {
                failures = failures.saturating_add(1);
                let reason = match outcome {
                    Ok(Err(e)) => redact(&e.to_string()),
                    _ => format!("no answer within {timeout:?}"),
                };
                if failures >= threshold {
                    checks.now();
                    m.set_state(ConnState::Unreachable { reason });
                }
            }
        }
        // Probe faster while not Ready, so recovery is noticed quickly.
        let wait = if matches!(m.state(), ConnState::Ready) {
            interval
        } else {
            interval.min(Duration::from_secs(1))
        };
        tokio::time::sleep(wait).await;
    }
}

/// The member's permission check, when its schedule says it is due.
async fn permission_check(m: &Arc<Member>, checks: &mut permissions::Schedule) {
    if checks.due() {
        // Off the lane: the reviews go through the data client and may
        // wait for its rate limit.
        let member = m.clone();
        let check = m
            .data_runtime
            .spawn(async move { member.check_permissions().await })
            .await
            .unwrap_or_default();
        checks.done(&check);
    }
}

/// Builds the member's clients from its kubeconfig again and swaps them in.
async fn rebuild(m: &Member, connected: bool, retry: &mut Backoff) {
    match m.build_lanes().await {
        Ok((data, control)) => {
            m.backend.swap(data);
            m.control_backend.swap(control);
            retry.reset();
            tracing::info!(cluster = %m.name, "kubeconfig loaded; client rebuilt");
            if !connected {
                m.set_state(ConnState::Connecting);
            }
        }
        Err(e) => {
            let reason = format!("{e:#}");
            if connected {
                // The old client keeps working until the file is fixed.
                tracing::warn!(cluster = %m.name, error = %reason, "kubeconfig changed but is not usable");
            } else {
                retry.failed();
                m.set_state(ConnState::Unreachable { reason });
            }
        }
    }
}

/// When to try building a missing client again: 1 s, doubling to 60 s.
struct Backoff {
    wait: Duration,
    next: Instant,
}

impl Backoff {
    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(60);

    fn new() -> Self {
        Backoff {
            wait: Self::FIRST,
            next: Instant::now(),
        }
    }

    fn due(&self) -> bool {
        Instant::now() >= self.next
    }

    fn failed(&mut self) {
        self.next = Instant::now() + self.wait;
        self.wait = (self.wait * 2).min(Self::MAX);
    }

    fn reset(&mut self) {
        self.wait = Self::FIRST;
    }
}
