//! The CI-sized chaos run: a few rounds of the seeded fault schedule
//! (`pgfleet bench chaos`, src/bench/chaos/) on real PostgreSQL, under the
//! checked workloads and the live prober. Zero violations: every
//! acknowledged insert on the synchronous cluster present, no duplicate, the
//! bank total unchanged, never two writable instances behind `-rw`, and
//! every cluster Healthy again after each round.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use pgfleet::bench::chaos::{report, run_rounds};
use pgfleet::testkit::process::{ProcessEnv, ProcessOptions};
use std::sync::Arc;

/// The seed of the CI run; a failure names it, and
/// `pgfleet bench chaos --rounds 3 --seed 20` replays it.
const SEED: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_seeded_rounds_of_faults_break_no_invariant() {
    common::init_tracing();
    let env = ProcessEnv::start(ProcessOptions {
        dir: common::temp_dir("chaos"),
        member: "pg-a".into(),
        namespace: "chaos".into(),
        extra_toml: String::new(),
    })
    .await
    .unwrap();
    let run = run_rounds(Arc::new(env), SEED, 3).await.unwrap();
    let md = report::markdown(&run);
    eprintln!("{md}");
    // `PGFLEET_CHAOS_REPORT=docs/reliability.md` keeps the report.
    if let Some(path) = std::env::var_os("PGFLEET_CHAOS_REPORT") {
        std::fs::write(path, &md).unwrap();
    }
    assert!(run.ops > 0, "the workloads recorded no operation");
    assert!(run.checked.samples > 0, "the prober took no sample");
    assert_eq!(run.violations(), 0, "violations (seed {SEED}):\n{md}");
}
