//! The checked workloads of a chaos run, one pair per cluster, each like an
//! application: one session through `-rw` (or the pooler), reconnecting after
//! an error, every operation recorded with its outcome:
//!
//! - append-only inserts of increasing ids into `chaos_ins` (no key, so a
//!   duplicate would show);
//! - transfers between the accounts of `chaos_bank`, guarded so no balance
//!   goes negative; the total never changes.
//!
//! No session, or an `ERROR` from the server, is `Failed` (nothing was
//! committed); a broken connection, a `FATAL` or a timeout is `Unknown` (a
//! commit may have happened).

use super::checker::{Op, OpKind, Outcome};
use crate::testkit::pg;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Accounts of the bank and the balance each starts with.
pub const ACCOUNTS: i32 = 8;
pub const START_BALANCE: i64 = 1000;
/// The client's patience for one operation (a paused pooler holds it).
const OP_TIMEOUT: Duration = Duration::from_secs(15);

/// Creates the tables (idempotent) through `host:port`.
pub async fn setup(host: &str, port: u16, pw: &str) -> anyhow::Result<()> {
    let c = pg::connect(host, port, pw, Duration::from_secs(10)).await?;
    c.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS chaos_ins (id bigint NOT NULL);
         CREATE TABLE IF NOT EXISTS chaos_bank (id int PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO chaos_bank SELECT g, {START_BALANCE} FROM generate_series(1, {ACCOUNTS}) g
           ON CONFLICT DO NOTHING;"
    ))
    .await?;
    Ok(())
}

/// Where a workload connects.
#[derive(Clone)]
pub struct Target {
    pub cluster: String,
    pub host: String,
    pub port: u16,
    pub password: String,
}

/// Running workloads; [`Workloads::stop`] returns their histories.
pub struct Workloads {
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<Vec<Op>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Workloads {
    /// Starts the insert and the bank workload for each target; `t0` is the
    /// run's time origin.
    pub fn start(targets: &[Target], t0: Instant) -> Workloads {
        let stop = Arc::new(AtomicBool::new(false));
        let history = Arc::new(Mutex::new(vec![]));
        let mut tasks = vec![];
        for t in targets {
            for bank in [false, true] {
                let (t, stop, history) = (t.clone(), stop.clone(), history.clone());
                tasks.push(tokio::spawn(client(t, bank, stop, history, t0)));
            }
        }
        Workloads {
            stop,
            history,
            tasks,
        }
    }

    /// Operations recorded so far.
    pub fn count(&self) -> usize {
        self.history.lock().map(|h| h.len()).unwrap_or(0)
    }

    pub async fn stop(self) -> Vec<Op> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        let mut h = self.history.lock().map(|h| h.clone()).unwrap_or_default();
        h.sort_by_key(|o| o.at_ms);
        h
    }
}

/// A small deterministic sequence for transfer amounts and accounts.
fn pick(n: u64, modulo: u64) -> u64 {
    n.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) % modulo
}

async fn client(
    t: Target,
    bank: bool,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<Vec<Op>>>,
    t0: Instant,
) {
    let mut session: Option<tokio_postgres::Client> = None;
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let at_ms = t0.elapsed().as_millis() as u64;
        let (kind, sql) = if bank {
            let from = 1 + pick(n, ACCOUNTS as u64) as i32;
            let to =
                1 + ((from as u64 + pick(n + 7, ACCOUNTS as u64 - 1)) % ACCOUNTS as u64) as i32;
            let amount = 1 + pick(n + 3, 50) as i64;
            // One statement: the credit happens only if the guarded debit did.
            let sql = format!(
                "WITH d AS (UPDATE chaos_bank SET balance = balance - {amount} \
                   WHERE id = {from} AND balance >= {amount} RETURNING id) \
                 UPDATE chaos_bank SET balance = balance + {amount} \
                   WHERE id = {to} AND EXISTS (SELECT 1 FROM d)"
            );
            (OpKind::Transfer { from, to, amount }, sql)
        } else {
            let id = n as i64;
            (
                OpKind::Insert { id },
                format!("BEGIN; INSERT INTO chaos_ins VALUES ({id}); COMMIT;"),
            )
        };
        if session.as_ref().is_none_or(|c| c.is_closed()) {
            session = pg::connect(&t.host, t.port, &t.password, Duration::from_secs(3))
                .await
                .ok();
        }
        let outcome = match session.as_ref() {
            None => Outcome::Failed,
            Some(c) => match tokio::time::timeout(OP_TIMEOUT, c.batch_execute(&sql)).await {
                Ok(Ok(())) => Outcome::Ok,
                // An ERROR aborts the transaction: nothing committed. A
                // FATAL (the server shutting down) may come after a commit.
                Ok(Err(e)) if e.as_db_error().is_some_and(|d| d.severity() == "ERROR") => {
                    Outcome::Failed
                }
                _ => Outcome::Unknown,
            },
        };
        if outcome != Outcome::Ok {
            session = None;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Ok(mut h) = history.lock() {
            h.push(Op {
                cluster: t.cluster.clone(),
                at_ms,
                kind,
                outcome,
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
