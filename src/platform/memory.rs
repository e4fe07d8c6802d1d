//! The allocator, and handing freed heap back to the operating system.
//!
//! **mimalloc is the global allocator** (for every binary that links this
//! crate: the product, its tests and benchmarks run on the same one). A
//! cold converge allocates far more than it keeps — every round parses
//! watch events and answers, builds the desired objects, serializes
//! applies, and drops all of it — so the allocator's speed is a large
//! share of the manager's CPU: `pgfleet bench fleet --clusters 100
//! --per-cluster 100`, glibc against mimalloc back to back (2026-12-07):
//! the manager's CPU in the cold converge 77.4 → 58.7 s, the emulator's
//! 91.2 → 85.1 s; `pgfleet bench emulator`: creates 8,753 → 12,454 Pods/s,
//! merge patches 5,546 → 7,189/s, watch fan-out 55,443 → 71,875 events/s.
//! The resident set after the converge did not move (234.9 → 233.9 MiB;
//! mimalloc starts higher, so the benchmark's growth per PostgresCluster
//! reads lower, 19.71 → 17.01 KiB, without holding less). glibc's
//! allocator remains one cfg away for tools that intercept `malloc`
//! (heaptrack): `RUSTFLAGS="--cfg pgfleet_system_alloc"`.
//!
//! Returning memory: mimalloc purges the pages it freed on its own (after
//! `purge_delay`, as its heaps are next used); [`release_free_memory`]
//! forces what is pending. With glibc (the cfg above), freed memory stays
//! in its arenas and only the top of each heap is returned, so the release
//! is `malloc_trim(0)`, which hands back the free pages of every arena
//! (`madvise(MADV_DONTNEED)`). Either way the manager runs it every few
//! seconds on a blocking thread ([`spawn_releaser`]), as the Go runtime's
//! scavenger does for every other Kubernetes controller. Neither moves
//! live data: fragmentation (free memory in partly used pages) stays.
//!
//! The image sets two of mimalloc's options in the environment
//! (deploy/images/pgfleet/Dockerfile): `MIMALLOC_ARENA_EAGER_COMMIT=0`
//! (commit arena memory as it is used) and `MIMALLOC_PURGE_DELAY=0` (purge
//! what is freed at once). At 1,000 idle members: 441 KiB per member with
//! mimalloc's defaults, 361 with both (glibc: 344); at 100 × 100 the
//! resident set after the cold converge 233.9 → 192.6 MiB, for 69.0 s of
//! the manager's CPU instead of 58.7. They have to come from the
//! environment: eager commit is read when the first arena is reserved,
//! before `main` runs (set from `main` it changed nothing, measured).

use crate::platform::task::AbortOnDrop;
use std::time::Duration;

#[cfg(not(pgfleet_system_alloc))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How often the background releaser runs: often enough that the memory a
/// burst of reconciles left is returned soon after it, rarely enough that
/// its cost is nothing next to the reconciles.
pub const RELEASE_EVERY: Duration = Duration::from_secs(5);

/// Returns the allocator's free pages to the system; whether it could.
/// Blocks for the walk: call it off the async workers ([`spawn_releaser`])
/// or where a short block does not matter.
#[cfg(not(pgfleet_system_alloc))]
pub fn release_free_memory() -> bool {
    // SAFETY: mi_collect only works on mimalloc's own free lists and
    // segments under its own synchronization; it has no preconditions on
    // the caller and does not touch memory in use.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_collect(true)
    };
    true
}

#[cfg(all(pgfleet_system_alloc, target_os = "linux", target_env = "gnu"))]
pub fn release_free_memory() -> bool {
    // SAFETY: malloc_trim only takes the allocator's own locks and works on
    // its free lists; it has no preconditions on the caller and does not
    // touch memory in use. A pad of 0 keeps nothing spare at a heap's top.
    #[allow(unsafe_code)]
    let released = unsafe { libc::malloc_trim(0) };
    released == 1
}

/// The system allocator without glibc: nothing retained to return.
#[cfg(all(
    pgfleet_system_alloc,
    not(all(target_os = "linux", target_env = "gnu"))
))]
pub fn release_free_memory() -> bool {
    false
}

/// What the allocator holds, as a phrase for the benchmarks' reports (the
/// resident set alone does not tell live data from what the allocator
/// keeps): mimalloc's committed memory, or glibc's heap in use and held
/// free.
#[cfg(not(pgfleet_system_alloc))]
pub fn describe() -> Option<String> {
    let (mut commit, mut peak) = (0usize, 0usize);
    let none = std::ptr::null_mut();
    // SAFETY: every out-parameter is either a valid pointer to a local or
    // null, which mi_process_info documents as "not wanted".
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_process_info(none, none, none, none, none, &mut commit, &mut peak, none)
    };
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    Some(format!(
        "mimalloc committed {:.1} MiB, peak {:.1} MiB",
        mib(commit),
        mib(peak)
    ))
}

#[cfg(all(pgfleet_system_alloc, target_os = "linux", target_env = "gnu"))]
pub fn describe() -> Option<String> {
    // SAFETY: mallinfo2 only reads the allocator's statistics under its
    // own locks and returns them by value.
    #[allow(unsafe_code)]
    let m = unsafe { libc::mallinfo2() };
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    Some(format!(
        "heap in use {:.1} MiB, held free {:.1} MiB",
        mib(m.uordblks + m.hblkhd),
        mib(m.fordblks)
    ))
}

#[cfg(all(
    pgfleet_system_alloc,
    not(all(target_os = "linux", target_env = "gnu"))
))]
pub fn describe() -> Option<String> {
    None
}

/// Runs [`release_free_memory`] every `every` on the blocking pool until
/// the returned guard is dropped.
pub fn spawn_releaser(every: Duration) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // A failed join is a panic in the walk, which cannot happen
            // short of a corrupt heap; there is nothing else to do with it.
            let _ = tokio::task::spawn_blocking(release_free_memory).await;
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Freed memory is handed back: the freed pieces sit between live ones
    /// (so `free` itself cannot trim them off the heap's top), below the
    /// mmap threshold; the release succeeds and what is live stays intact.
    #[test]
    fn freed_heap_between_live_data_is_released() {
        let mut all: Vec<Vec<u8>> = (0..20_000).map(|i| vec![(i % 20) as u8; 1000]).collect();
        // Keep every twentieth piece (and the last), free the runs between.
        let mut i = 0;
        all.retain(|_| {
            i += 1;
            (i - 1) % 20 == 0 || i == 20_000
        });
        let released = release_free_memory();
        if cfg!(any(
            not(pgfleet_system_alloc),
            all(target_os = "linux", target_env = "gnu")
        )) {
            assert!(released, "19 KB runs freed between live pieces");
        }
        assert!(all.iter().all(|k| k.iter().all(|&b| b == k[0])));
        assert_eq!(all.len(), 1001);
    }
}
