//! Handing freed heap back to the operating system.
//!
//! A cold converge allocates far more than it keeps: every round parses
//! watch events and answers, builds the desired objects and serializes
//! applies, and drops all of it. glibc's allocator keeps what was freed in
//! its arenas for the next allocation and returns only the top of each
//! heap, so after a burst pages that are wholly free stay resident. A
//! container's memory limit counts the resident set, not the live heap.
//!
//! How much this returns is measured, and it is not much: at 100 × 100 in
//! `pgfleet bench fleet` the manager held 327 MiB after a release, of which
//! 217 MiB were live heap and 98 MiB free memory in partly used pages
//! (fragmentation, which no trim can return); the release itself took the
//! RSS from 340 to 327 MiB. It is kept because it is cheap and returns the
//! pages a burst frees wholesale, not because it is the lever for the
//! memory per PostgresCluster.
//!
//! The Go runtime, which every other Kubernetes controller runs on,
//! returns idle heap to the system in the background (its scavenger);
//! [`spawn_releaser`] does the same for pgfleet: every few seconds,
//! `malloc_trim(0)` on a blocking thread, which releases the free pages of
//! every arena (`madvise(MADV_DONTNEED)`), not only the top of the heap. It
//! does not move live data and costs a walk of the free lists, with each
//! arena locked while it is walked (measured with the fleet benchmark:
//! 9.8 ms on a 337 MiB heap, 0.2 % of the time at one release every 5 s;
//! the change→status p99 at 400/s did not move). On other allocators
//! (musl, other systems) there is nothing to do.

use crate::platform::task::AbortOnDrop;
use std::time::Duration;

/// How often the background releaser runs: often enough that the memory a
/// burst of reconciles left is returned soon after it, rarely enough that
/// its cost is nothing next to the reconciles.
pub const RELEASE_EVERY: Duration = Duration::from_secs(5);

/// Returns the free pages of the allocator's arenas to the system; whether
/// any memory was released. Blocks for the walk: call it off the async
/// workers ([`spawn_releaser`]) or where a short block does not matter.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_free_memory() -> bool {
    // SAFETY: malloc_trim only takes the allocator's own locks and works on
    // its free lists; it has no preconditions on the caller and does not
    // touch memory in use. A pad of 0 keeps nothing spare at a heap's top.
    #[allow(unsafe_code)]
    let released = unsafe { libc::malloc_trim(0) };
    released == 1
}

/// Without glibc's allocator there is no retained arena memory to return.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_memory() -> bool {
    false
}

/// What the allocator holds, in bytes: in use by the program (the live
/// heap, mmapped blocks included) and held free in its arenas. `None`
/// without glibc's allocator. For the benchmarks' reports: the resident
/// set alone does not tell live data from fragmentation.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn heap() -> Option<Heap> {
    // SAFETY: mallinfo2 only reads the allocator's statistics under its
    // own locks and returns them by value.
    #[allow(unsafe_code)]
    let m = unsafe { libc::mallinfo2() };
    Some(Heap {
        in_use: (m.uordblks + m.hblkhd) as u64,
        free: m.fordblks as u64,
    })
}

/// Without glibc's allocator there is no such statistic.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn heap() -> Option<Heap> {
    None
}

/// The allocator's figures ([`heap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heap {
    pub in_use: u64,
    pub free: u64,
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
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert!(released, "19 KB runs freed between live pieces");
        }
        assert!(all.iter().all(|k| k.iter().all(|&b| b == k[0])));
        assert_eq!(all.len(), 1001);
    }
}
