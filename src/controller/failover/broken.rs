//! A test-only switch that breaks fencing, so the chaos checker can prove it
//! catches a split brain (integration/chaos.rs,
//! `a_build_without_fencing_is_caught`).
//!
//! Fencing is every step that keeps a deposed primary from taking writes:
//! the `fenced` label and the `fence` verb before the promotion, the
//! deletion of its Pod after it, and the pipeline's relabel of a former
//! primary to replica. With the switch on, all of them are skipped: the old
//! primary keeps its label and stays behind `-rw` when it comes back.
//!
//! Why an environment variable read only under `cfg(debug_assertions)`, and
//! not a cargo feature: CI builds with `--all-features`, so a feature would
//! break fencing in every test; and a release build (the product) must not
//! be breakable by its environment at all, so there the switch is the
//! constant `false` and the variable is never read.

/// The variable that turns the switch on for a whole debug process (`1`).
pub const ENV: &str = "PGFLEET_TEST_BREAK_FENCING";

/// Set by [`break_fencing_in_this_process`].
#[cfg(debug_assertions)]
static BROKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns the switch on for this process: the broken-build test calls it
/// before starting its environment (nextest gives every test a process of
/// its own, so no other test's manager sees it; the test crate forbids the
/// `unsafe` that setting [`ENV`] would take).
#[cfg(debug_assertions)]
pub fn break_fencing_in_this_process() {
    BROKEN.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// True only in a debug build switched on by [`ENV`]`=1` or
/// [`break_fencing_in_this_process`].
pub fn fencing_disabled() -> bool {
    #[cfg(debug_assertions)]
    {
        BROKEN.load(std::sync::atomic::Ordering::Relaxed)
            || std::env::var_os(ENV).is_some_and(|v| v == "1")
    }
    #[cfg(not(debug_assertions))]
    {
        false
    }
}
