//! The checker of a chaos run: reads the workloads' histories, the prober's
//! samples and the final databases, and lists every violation. Pure.
//!
//! What counts (docs/reliability.md):
//! - **append-only inserts**: every insert acknowledged (`Ok`) is present
//!   at the end, and no id is present twice. An `Unknown` outcome (the
//!   connection broke while the commit was in flight) may go either way. On
//!   an asynchronous cluster a failover may lose the unreplicated tail by
//!   design: those losses are measured ([`Checked::lost_async`]), not
//!   violations.
//! - **bank transfers**: the total of all balances never changes and no
//!   balance is negative, whatever the outcomes were.
//! - **one writer**: no prober sample saw two instances behind `-rw`
//!   answering `pg_is_in_recovery() = false`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// How one operation ended, as its client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    Ok,
    /// Refused before anything could have been committed.
    Failed,
    /// The client cannot know (the connection broke during the commit).
    Unknown,
}

/// One recorded operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub cluster: String,
    /// Milliseconds since the start of the run, when the client started it.
    pub at_ms: u64,
    pub kind: OpKind,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpKind {
    Insert { id: i64 },
    Transfer { from: i32, to: i32, amount: i64 },
}

/// One prober sample of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub cluster: String,
    pub at_ms: u64,
    /// Instances behind `-rw` that answered `pg_is_in_recovery() = false`.
    pub writable_behind_rw: Vec<String>,
    /// Every instance Pod was listed Ready by the API server and answered:
    /// the state this sample saw is the one the cluster settled in, not a
    /// moment in which a thawed instance had yet to come back.
    pub settled: bool,
}

/// A cluster's final state, read after the last round healed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Final {
    pub cluster: String,
    /// Synchronous replication: a lost acknowledged insert is a violation.
    pub synchronous: bool,
    /// Every id in the insert table, duplicates included.
    pub ids: Vec<i64>,
    pub balances: Vec<i64>,
    pub expected_total: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    LostWrite {
        cluster: String,
        id: i64,
        at_ms: u64,
    },
    Duplicate {
        cluster: String,
        id: i64,
        copies: usize,
    },
    BankTotal {
        cluster: String,
        expected: i64,
        found: i64,
    },
    NegativeBalance {
        cluster: String,
        balance: i64,
    },
    TwoWritable {
        cluster: String,
        at_ms: u64,
        instances: Vec<String>,
    },
}

impl Violation {
    /// When it happened (ms into the run), to place it in the fault timeline.
    pub fn at_ms(&self) -> Option<u64> {
        match self {
            Violation::LostWrite { at_ms, .. } | Violation::TwoWritable { at_ms, .. } => {
                Some(*at_ms)
            }
            _ => None,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::LostWrite { cluster, id, at_ms } => write!(
                f,
                "{cluster}: acknowledged insert {id} (at {at_ms} ms) is missing"
            ),
            Violation::Duplicate {
                cluster,
                id,
                copies,
            } => write!(f, "{cluster}: insert {id} is present {copies} times"),
            Violation::BankTotal {
                cluster,
                expected,
                found,
            } => write!(f, "{cluster}: bank total is {found}, expected {expected}"),
            Violation::NegativeBalance { cluster, balance } => {
                write!(f, "{cluster}: a balance is negative ({balance})")
            }
            Violation::TwoWritable {
                cluster,
                at_ms,
                instances,
            } => write!(
                f,
                "{cluster}: two writable instances behind -rw at {at_ms} ms: {}",
                instances.join(", ")
            ),
        }
    }
}

/// What the checker found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Checked {
    pub violations: Vec<Violation>,
    /// Operations checked, by outcome.
    pub outcomes: BTreeMap<Outcome, usize>,
    /// Acknowledged inserts lost on asynchronous clusters (by design).
    pub lost_async: usize,
    pub samples: usize,
}

/// Checks histories, prober samples and final states.
pub fn check(ops: &[Op], samples: &[Sample], finals: &[Final]) -> Checked {
    let mut out = Checked {
        samples: samples.len(),
        ..Default::default()
    };
    for op in ops {
        *out.outcomes.entry(op.outcome).or_default() += 1;
    }
    for f in finals {
        check_inserts(ops, f, &mut out);
        check_bank(f, &mut out);
    }
    for s in samples.iter().filter(|s| s.writable_behind_rw.len() > 1) {
        out.violations.push(Violation::TwoWritable {
            cluster: s.cluster.clone(),
            at_ms: s.at_ms,
            instances: s.writable_behind_rw.clone(),
        });
    }
    out
}

fn check_inserts(ops: &[Op], f: &Final, out: &mut Checked) {
    let mut copies: BTreeMap<i64, usize> = BTreeMap::new();
    for id in &f.ids {
        *copies.entry(*id).or_default() += 1;
    }
    for (id, n) in copies.iter().filter(|(_, n)| **n > 1) {
        out.violations.push(Violation::Duplicate {
            cluster: f.cluster.clone(),
            id: *id,
            copies: *n,
        });
    }
    let present: BTreeSet<i64> = copies.keys().copied().collect();
    for op in ops.iter().filter(|o| o.cluster == f.cluster) {
        let OpKind::Insert { id } = op.kind else {
            continue;
        };
        if op.outcome != Outcome::Ok || present.contains(&id) {
            continue;
        }
        if f.synchronous {
            out.violations.push(Violation::LostWrite {
                cluster: f.cluster.clone(),
                id,
                at_ms: op.at_ms,
            });
        } else {
            out.lost_async += 1;
        }
    }
}

fn check_bank(f: &Final, out: &mut Checked) {
    if f.balances.is_empty() {
        return;
    }
    let found: i64 = f.balances.iter().sum();
    if found != f.expected_total {
        out.violations.push(Violation::BankTotal {
            cluster: f.cluster.clone(),
            expected: f.expected_total,
            found,
        });
    }
    for b in f.balances.iter().filter(|b| **b < 0) {
        out.violations.push(Violation::NegativeBalance {
            cluster: f.cluster.clone(),
            balance: *b,
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ins(cluster: &str, id: i64, at_ms: u64, outcome: Outcome) -> Op {
        Op {
            cluster: cluster.into(),
            at_ms,
            kind: OpKind::Insert { id },
            outcome,
        }
    }

    fn fin(cluster: &str, synchronous: bool, ids: &[i64]) -> Final {
        Final {
            cluster: cluster.into(),
            synchronous,
            ids: ids.to_vec(),
            balances: vec![50, 150],
            expected_total: 200,
        }
    }

    #[test]
    fn a_clean_history_has_no_violation() {
        let ops = [
            ins("s", 1, 10, Outcome::Ok),
            ins("s", 2, 20, Outcome::Unknown),
            ins("s", 3, 30, Outcome::Failed),
        ];
        let samples = [Sample {
            cluster: "s".into(),
            at_ms: 15,
            writable_behind_rw: vec!["s-1".into()],
            settled: true,
        }];
        let c = check(&ops, &samples, &[fin("s", true, &[1, 2])]);
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        assert_eq!(c.outcomes[&Outcome::Ok], 1);
        assert_eq!(c.outcomes[&Outcome::Unknown], 1);
        assert_eq!(c.samples, 1);
    }

    #[test]
    fn a_lost_acknowledged_write_and_a_double_writable_sample_are_both_reported() {
        let ops = [ins("s", 1, 10, Outcome::Ok), ins("s", 2, 20, Outcome::Ok)];
        let samples = [
            Sample {
                cluster: "s".into(),
                at_ms: 15,
                writable_behind_rw: vec!["s-1".into()],
                settled: true,
            },
            Sample {
                cluster: "s".into(),
                at_ms: 25,
                writable_behind_rw: vec!["s-1".into(), "s-2".into()],
                settled: true,
            },
        ];
        let c = check(&ops, &samples, &[fin("s", true, &[1])]);
        assert_eq!(c.violations.len(), 2, "{:?}", c.violations);
        assert!(c.violations.contains(&Violation::LostWrite {
            cluster: "s".into(),
            id: 2,
            at_ms: 20
        }));
        assert!(c.violations.iter().any(|v| matches!(v,
            Violation::TwoWritable { at_ms: 25, instances, .. } if instances.len() == 2)));
        let text: Vec<String> = c.violations.iter().map(|v| v.to_string()).collect();
        assert!(
            text.iter()
                .any(|t| t.contains("insert 2") && t.contains("missing"))
        );
    }

    #[test]
    fn duplicates_and_a_changed_bank_total_are_violations() {
        let mut f = fin("s", true, &[1, 1]);
        f.balances = vec![-5, 150];
        let c = check(&[ins("s", 1, 1, Outcome::Ok)], &[], &[f]);
        assert!(c.violations.contains(&Violation::Duplicate {
            cluster: "s".into(),
            id: 1,
            copies: 2
        }));
        assert!(
            c.violations
                .iter()
                .any(|v| matches!(v, Violation::BankTotal { found: 145, .. }))
        );
        assert!(
            c.violations
                .iter()
                .any(|v| matches!(v, Violation::NegativeBalance { balance: -5, .. }))
        );
    }

    #[test]
    fn an_asynchronous_cluster_losing_its_tail_is_measured_not_violated() {
        let ops = [ins("a", 1, 10, Outcome::Ok), ins("a", 2, 20, Outcome::Ok)];
        let c = check(&ops, &[], &[fin("a", false, &[1])]);
        assert!(c.violations.is_empty());
        assert_eq!(c.lost_async, 1);
    }
}
