//! The poolers of a topology's sides, seen by the DR engine: each one
//! sends clients to the one primary (its own `-rw` on the primary side,
//! the primary side's address elsewhere) and is repointed at once when
//! that moves; during a planned switchover every pooler is PAUSEd, so
//! clients wait instead of failing, and RESUMEd once it points at the new
//! primary (docs/disaster-recovery.md).

use crate::controller::pooler::{self, Upstream, pause};
use crate::fleet::Member;
use crate::platform::labels::LABEL_POOLER;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long clients may be held by a switchover that does not complete:
/// after that the poolers are resumed (clients see errors, not a hang).
pub const HOLD_AT_MOST: Duration = Duration::from_secs(30);

/// A hold of the poolers for one switchover (its epoch).
#[derive(Clone, Copy, Debug)]
struct Hold {
    epoch: u64,
    since: Instant,
    /// Paused now (false once released, so the same switchover never
    /// pauses them again).
    active: bool,
}

#[derive(Default)]
pub struct Poolers {
    /// Pod UID → where this engine last pointed it.
    pointed: Mutex<HashMap<String, Upstream>>,
    hold: Mutex<Option<Hold>>,
}
/// A member's pooler pods of `name`: (pod, uid).
async fn pods(m: &Member, ns: &str, name: &str) -> Vec<(String, String)> {
    let lp = ListParams::default().labels(&format!("{LABEL_POOLER}={name}"));
    let list = tokio::time::timeout(
        super::observe::CALL_TIMEOUT,
        Api::<Pod>::namespaced(m.client(), ns).list(&lp),
    )
    .await;
    match list {
        Ok(Ok(l)) => l
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| Some((p.metadata.name?, p.metadata.uid?)))
            .collect(),
        _ => vec![],
    }
}

impl Poolers {
    fn current(&self) -> Option<Hold> {
        *self.hold.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, h: Option<Hold>) {
        *self.hold.lock().unwrap_or_else(|e| e.into_inner()) = h;
    }

    /// Points every pooler of `m` at `to` (only those not known to be).
    pub async fn point(&self, m: &Member, ns: &str, name: &str, to: &Upstream) {
        let Some(argv) = pooler::repoint_command(to) else {
            tracing::warn!(member = %m.name, host = %to.host, "DR: refusing to point a pooler at that address");
            return;
        };
        for (pod, uid) in pods(m, ns, name).await {
            let known = {
                let map = self.pointed.lock().unwrap_or_else(|e| e.into_inner());
                map.get(&uid) == Some(to)
            };
            if known {
                continue;
            }
            let what = format!("pgbouncer repoint to {}:{}", to.host, to.port);
            let res = crate::postgres::exec::run_command(
                &m.client(),
                ns,
                &pod,
                "pgbouncer",
                argv.clone(),
                &what,
                pause::ADMIN_TIMEOUT,
            )
            .await;
            match res {
                Ok(_) => {
                    tracing::info!(member = %m.name, %pod, host = %to.host, "DR: pooler repointed");
                    let mut map = self.pointed.lock().unwrap_or_else(|e| e.into_inner());
                    map.insert(uid, to.clone());
                }
                Err(e) => tracing::warn!(member = %m.name, %pod, error = %e, "DR: pooler repoint"),
            }
        }
    }

    /// PAUSEs every pooler of the given members for the switchover of
    /// `epoch` (idempotent); after [`HOLD_AT_MOST`] they are resumed and
    /// this switchover holds them no more. True when the switchover may
    /// stop the old primary: every pooler confirmed its PAUSE (no
    /// transaction in flight through it), or the hold is over.
    pub async fn hold(&self, epoch: u64, members: &[&Member], ns: &str, name: &str) -> bool {
        let h = self.current().filter(|h| h.epoch == epoch);
        match h {
            Some(h) if !h.active => return true,
            Some(h) if h.since.elapsed() > HOLD_AT_MOST => {
                tracing::warn!(
                    epoch,
                    "DR: the switchover holds the poolers too long: resuming them"
                );
                self.release(members, ns, name).await;
                return true;
            }
            _ => {}
        }
        let mut missed = 0;
        for m in members {
            let names: Vec<String> = pods(m, ns, name).await.into_iter().map(|p| p.0).collect();
            missed += pause::admin(&m.client(), ns, &names, "PAUSE").await.len();
        }
        let since = h.map_or_else(Instant::now, |h| h.since);
        self.set(Some(Hold {
            epoch,
            since,
            active: true,
        }));
        missed == 0
    }

    /// RESUMEs every pooler of the given members if this engine paused them.
    pub async fn release(&self, members: &[&Member], ns: &str, name: &str) {
        let Some(h) = self.current().filter(|h| h.active) else {
            return;
        };
        let mut missed = 0;
        for m in members {
            let names: Vec<String> = pods(m, ns, name).await.into_iter().map(|p| p.0).collect();
            missed += pause::admin(&m.client(), ns, &names, "RESUME").await.len();
        }
        if missed == 0 {
            self.set(Some(Hold { active: false, ..h }));
        }
    }
}
