//! The control lane: the work that keeps a replica's right to act and its
//! view of who is reachable — Lease renewals (`ha`) and the reachability
//! probes — runs on a runtime of its own, on its own OS thread, with a
//! client (and so an HTTP/2 connection) of its own per member.
//!
//! Why: on the shared runtime a renewal's task waits in the run queue behind
//! thousands of ready reconcile tasks, and its request waits in the member's
//! connection behind their streams. On a saturated machine (1,000 members on
//! two cores) that wait passed the 10 s renew deadline thousands of times;
//! each loss stops the member's controllers and restarts them with a full
//! relist. A thread of its own is scheduled by the kernel like any other
//! thread, so a renewal waits for a time slice, never for the fleet's
//! backlog. client-go's leader election likewise uses its own client.
//!
//! Everything spawned here must stay small: a lane that does reconcile work
//! would queue renewals behind it again.

use std::future::Future;
use std::sync::OnceLock;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

static LANE: OnceLock<Option<Handle>> = OnceLock::new();

/// The control runtime, started on first use. `None` only when the thread or
/// runtime could not be created; callers then fall back to the current runtime.
fn handle() -> Option<&'static Handle> {
    LANE.get_or_init(|| match start() {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(error = %e, "control lane not started; Lease renewals and probes share the main runtime");
            None
        }
    })
    .as_ref()
}

fn start() -> std::io::Result<Handle> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let handle = rt.handle().clone();
    std::thread::Builder::new()
        .name(THREAD.into())
        // A current-thread runtime runs its tasks only while driven.
        .spawn(move || rt.block_on(std::future::pending::<()>()))?;
    Ok(handle)
}

/// Whether the calling code runs on the control lane's thread (a guard for
/// work that must never run there: reconciles).
pub fn on_lane() -> bool {
    std::thread::current().name() == Some(THREAD)
}

const THREAD: &str = "pgfleet-control";

/// Spawns `f` on the control lane.
pub fn spawn<F>(f: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match handle() {
        Some(h) => h.spawn(f),
        None => tokio::spawn(f),
    }
}

/// Runs `f` on the control lane and waits for it: what builds a client
/// there (a kube client spawns its request worker, and hyper its connection
/// tasks, on the runtime that builds and drives them).
pub async fn run<F>(f: F) -> anyhow::Result<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    spawn(f)
        .await
        .map_err(|e| anyhow::anyhow!("control lane task failed: {e}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[tokio::test]
    async fn work_runs_on_its_own_thread() {
        let here = std::thread::current().id();
        let name = super::run(async { std::thread::current().name().map(String::from) })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("pgfleet-control"));
        assert!(super::run(async { super::on_lane() }).await.unwrap());
        assert!(!super::on_lane());
        let there = super::run(async { std::thread::current().id() })
            .await
            .unwrap();
        assert_ne!(here, there);
    }
}
