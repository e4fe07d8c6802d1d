//! Ownership of member clusters between pgfleet replicas (HA and
//! scale-out). Each member cluster has a `coordination.k8s.io/v1` Lease
//! `pgfleet-manager` in namespace `pgfleet-system`; a replica runs a
//! member's controller only while it holds that Lease. Kubernetes (etcd)
//! arbitrates: pgfleet invents no consensus of its own. Ownership follows
//! reachability — a replica cut off from a member cannot renew there, stops
//! acting after `renew_deadline`, and another replica takes the Lease after
//! `lease_duration`.
//!
//! `decide.rs` is the pure decision (client-go's leader-election rules),
//! `lease.rs` the API calls, `elector.rs` the loop per member, `identity.rs`
//! the replica's name. Fleet-wide work that must run once (rollout engines)
//! uses [`while_owned`] on one agreed member.

pub mod decide;
mod elector;
pub mod identity;
pub mod lease;

use crate::controller;
use crate::fleet::{Fleet, Member};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The three client-go timings (validated: deadline < duration, retry < deadline).
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Timings {
    pub fn from_settings(m: &crate::config::Manager) -> Timings {
        let get = |d: &crate::config::HumanDuration, default: u64| {
            d.parsed().copied().unwrap_or(Duration::from_secs(default))
        };
        Timings {
            lease_duration: get(&m.lease_duration, 15),
            renew_deadline: get(&m.renew_deadline, 10),
            retry_period: get(&m.retry_period, 2),
        }
    }
}

/// One member as this replica last saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberOwnership {
    pub member: String,
    /// The holder of its Lease as last observed (`None`: free, or never read).
    pub owner: Option<String>,
    /// Whether this replica holds it and runs its controller.
    pub mine: bool,
}

/// Starts a member's controller when its Lease is won.
pub type Starter = Arc<dyn Fn(Arc<Member>) -> controller::Handle + Send + Sync>;

pub(crate) struct Slot {
    member: Arc<Member>,
    state: watch::Sender<MemberOwnership>,
    controller: Mutex<Option<controller::Handle>>,
    /// Reconciles of earlier terms (a new term's handle counts from 0).
    past_reconciles: AtomicU64,
    start: Starter,
}

impl Slot {
    fn acquire(&self, me: &str) {
        let mut c = self.controller.lock().unwrap_or_else(|e| e.into_inner());
        if c.is_none() {
            // This runs in the member's elector, on the control lane
            // (`fleet::control`): its one thread is for Lease renewals and
            // probes. The controller's watches and reconciles are spawned
            // on the data runtime instead — without this they all ran on
            // the control lane's thread, every member's reconciles on one
            // core and renewals waiting behind them.
            let _data = self.member.data_runtime().enter();
            *c = Some((self.start)(self.member.clone()));
        }
        drop(c);
        self.publish(Some(me.to_string()), true);
    }

    fn lose(&self, owner: Option<String>) {
        self.stop();
        self.publish(owner, false);
    }

    fn stop(&self) {
        let old = self
            .controller
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = old {
            h.stop();
            let n = h.stats.reconciles.load(Ordering::Relaxed);
            self.past_reconciles.fetch_add(n, Ordering::Relaxed);
            tracing::info!(cluster = %self.member.name, "controller stopped (lease not held)");
        }
    }

    fn publish(&self, owner: Option<String>, mine: bool) {
        self.state.send_if_modified(|s| {
            let changed = s.owner != owner || s.mine != mine;
            s.owner = owner;
            s.mine = mine;
            changed
        });
    }
}

/// Who owns which member, and the controllers of the members this replica
/// owns. Cheap to read: everything is in memory, updated by the electors.
pub struct Ownership {
    identity: String,
    slots: Vec<Arc<Slot>>,
}

impl Ownership {
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Every member: last observed owner, and whether it is us.
    pub fn snapshot(&self) -> Vec<MemberOwnership> {
        self.slots
            .iter()
            .map(|s| s.state.borrow().clone())
            .collect()
    }

    pub fn owns(&self, member: &str) -> bool {
        self.slot(member).is_some_and(|s| s.state.borrow().mine)
    }

    /// Changes of one member's ownership.
    pub fn subscribe(&self, member: &str) -> Option<watch::Receiver<MemberOwnership>> {
        self.slot(member).map(|s| s.state.subscribe())
    }

    /// The controllers running now (those of the members we own).
    pub fn controllers(&self) -> Vec<controller::Handle> {
        self.slots
            .iter()
            .filter_map(|s| {
                s.controller
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
            })
            .collect()
    }

    /// Reconciles this replica ran for `member`, over all its terms.
    pub fn reconciles(&self, member: &str) -> u64 {
        let Some(s) = self.slot(member) else { return 0 };
        let current = s
            .controller
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |h| h.stats.reconciles.load(Ordering::Relaxed));
        s.past_reconciles.load(Ordering::Relaxed) + current
    }

    fn slot(&self, member: &str) -> Option<&Arc<Slot>> {
        self.slots.iter().find(|s| s.member.name == member)
    }

    fn stop_all(&self) {
        for s in &self.slots {
            s.stop();
            // Not inline: a held `borrow()` would deadlock the send.
            let owner = s.state.borrow().owner.clone();
            s.publish(owner, false);
        }
    }
}

/// The running HA part of a manager: one elector per member. Dropping it
/// stops the electors and the controllers without releasing the Leases —
/// as a killed process would; [`Ha::release`] is the graceful stop.
pub struct Ha {
    pub ownership: Arc<Ownership>,
    electors: Vec<tokio::task::AbortHandle>,
    timings: Timings,
}

impl Ha {
    /// Starts an elector per member and waits (bounded) for each one's
    /// first round, so a replica on a free fleet owns it when this returns.
    pub async fn start(fleet: &Fleet, identity: String, timings: Timings, start: Starter) -> Ha {
        let mut slots = vec![];
        let mut electors = vec![];
        let mut first = vec![];
        for m in &fleet.members {
            let slot = Arc::new(Slot {
                member: m.clone(),
                state: watch::channel(MemberOwnership {
                    member: m.name.clone(),
                    owner: None,
                    mine: false,
                })
                .0,
                controller: Mutex::default(),
                past_reconciles: AtomicU64::new(0),
                start: start.clone(),
            });
            let (tx, rx) = tokio::sync::oneshot::channel();
            let e = elector::Elector::new(slot.clone(), identity.clone(), timings);
            // On the control lane: renewals never wait behind reconcile work.
            electors.push(crate::fleet::control::spawn(e.run(tx)).abort_handle());
            first.push(rx);
            slots.push(slot);
        }
        // An unreachable member must not hold up the others for long.
        let bound = timings.renew_deadline.min(Duration::from_secs(5));
        let _ = tokio::time::timeout(bound, futures::future::join_all(first)).await;
        Ha {
            ownership: Arc::new(Ownership { identity, slots }),
            electors,
            timings,
        }
    }

    /// Graceful stop: stops electing and every controller, then gives back
    /// the Leases we hold so other replicas take them at once.
    pub async fn release(&self) {
        for e in &self.electors {
            e.abort();
        }
        self.ownership.stop_all();
        let me = self.ownership.identity.clone();
        let releases = self.ownership.slots.iter().map(|s| {
            let api = lease::api(s.member.client());
            let (me, name) = (me.clone(), s.member.name.clone());
            async move {
                match lease::release(&api, &me).await {
                    Ok(true) => tracing::info!(cluster = %name, "lease released"),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(cluster = %name, error = %redacted(&e), "lease not released")
                    }
                }
            }
        });
        let all = futures::future::join_all(releases);
        let _ = tokio::time::timeout(self.timings.renew_deadline, all).await;
    }
}

impl Drop for Ha {
    fn drop(&mut self) {
        for e in &self.electors {
            e.abort();
        }
        self.ownership.stop_all();
    }
}

/// Runs `start`'s work while this replica owns `member`, dropping it (its
/// tasks abort) when ownership is lost. Work that must run on one replica
/// only — the rollout engines — hangs off one agreed member this way.
pub fn while_owned<G: Send + 'static>(
    mut rx: watch::Receiver<MemberOwnership>,
    start: impl Fn() -> G + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut running: Option<G> = None;
        loop {
            let mine = rx.borrow_and_update().mine;
            match (mine, running.is_some()) {
                (true, false) => running = Some(start()),
                (false, true) => running = None,
                _ => {}
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    })
}

/// Like [`while_owned`], while this replica owns ANY of the members
/// behind `rxs`: what a cross-cluster DR engine needs, which must keep
/// running when the one member it would otherwise follow is the one lost.
pub fn while_any_owned<G: Send + 'static>(
    mut rxs: Vec<watch::Receiver<MemberOwnership>>,
    start: impl Fn() -> G + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut running: Option<G> = None;
        loop {
            // Every receiver marked seen (no short circuit), then any.
            let owned: Vec<bool> = rxs
                .iter_mut()
                .map(|rx| rx.borrow_and_update().mine)
                .collect();
            let mine = owned.contains(&true);
            match (mine, running.is_some()) {
                (true, false) => running = Some(start()),
                (false, true) => running = None,
                _ => {}
            }
            if rxs.is_empty() {
                return;
            }
            let changed = rxs.iter_mut().map(|rx| Box::pin(rx.changed()));
            if futures::future::select_all(changed).await.0.is_err() {
                return;
            }
        }
    })
}

/// The first line of an API error; Lease errors carry no credentials, but
/// transport errors can be long.
fn redacted(e: &kube::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts live guards: the work `while_owned` runs.
    struct Guard(Arc<AtomicUsize>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        for _ in 0..500 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never: {what}");
    }

    #[tokio::test]
    async fn fleet_work_runs_only_while_the_member_is_owned() {
        let state = |mine| MemberOwnership {
            member: "a".into(),
            owner: None,
            mine,
        };
        let (tx, rx) = watch::channel(state(false));
        let (live, starts) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (l, s) = (live.clone(), starts.clone());
        let task = while_owned(rx, move || {
            l.fetch_add(1, Ordering::SeqCst);
            s.fetch_add(1, Ordering::SeqCst);
            Guard(l.clone())
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(starts.load(Ordering::SeqCst), 0);
        tx.send_replace(state(true));
        until("started", || live.load(Ordering::SeqCst) == 1).await;
        tx.send_replace(state(false));
        until("stopped", || live.load(Ordering::SeqCst) == 0).await;
        tx.send_replace(state(true));
        until("started again", || starts.load(Ordering::SeqCst) == 2).await;
        assert_eq!(live.load(Ordering::SeqCst), 1);
        drop(tx);
        until("stopped with the manager", || {
            live.load(Ordering::SeqCst) == 0
        })
        .await;
        let _ = task.await;
    }
}
