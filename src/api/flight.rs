//! Single flight: one computation per key at a time. The fleet-wide reads
//! (`/api/v1/rollouts`, `/api/v1/fleet` for members listed rather than
//! cached) are open to anyone who can reach the API, so many concurrent
//! callers must cost one LIST per member and TTL, not one each: a caller
//! that finds no fresh value takes the key's lock, looks again (the holder
//! before it may have just filled the cache) and only then computes.
//! Keys are bounded by the configuration (member and rollout names), never
//! taken from a request before it was checked against it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

#[derive(Default)]
pub struct Flights(Mutex<BTreeMap<String, Arc<AsyncMutex<()>>>>);

impl Flights {
    /// Waits until no other caller computes `key`; the guard holds it.
    pub async fn enter(&self, key: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(key.to_string()).or_default().clone()
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn one_computation_per_key_at_a_time() {
        let flights = Arc::new(Flights::default());
        let cache = Arc::new(Mutex::new(None::<u32>));
        let computed = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (f, c, n) = (flights.clone(), cache.clone(), computed.clone());
                tokio::spawn(async move {
                    let _g = f.enter("k").await;
                    if c.lock().unwrap().is_none() {
                        n.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        *c.lock().unwrap() = Some(1);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(computed.load(Ordering::SeqCst), 1);
    }
}
