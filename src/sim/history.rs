//! The watch history of one emulated cluster: what a kube-apiserver's watch
//! cache and etcd's not-yet-compacted revisions are together, so a watch can
//! resume from a resourceVersion it already saw.
//!
//! Why it is shaped like this: it used to keep every event whole (the parsed
//! object and the one before it) for the last 100,000 writes, and the live
//! broadcast channel kept another 65,536 — so an emulated cluster held every
//! version of every object it ever wrote, ~16× its JSON each: 17 GB for 1,000
//! members × 10 PostgresClusters in a 200 s benchmark. A real API server keeps
//! a short window in its watch cache and compacts etcd every five minutes.
//! Here every event keeps only what the store keeps of an object — its JSON
//! (made once per write, shared, not copied) and a small index — so an event
//! costs about its object's JSON; events older than the compaction window,
//! or beyond the cap, are gone (`410 Gone`, the client relists) — as after
//! etcd's compaction.

use super::store::{Gone, WatchEvent};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// kube-apiserver compacts etcd every five minutes (`--etcd-compaction-interval`).
pub const COMPACTION_WINDOW: Duration = Duration::from_secs(300);

pub struct History {
    events: VecDeque<(Instant, Arc<WatchEvent>)>,
    cap: usize,
    window: Duration,
    /// Events with rv <= this are no longer here.
    compacted_rv: u64,
}

impl History {
    pub fn new(cap: usize, window: Duration) -> Self {
        History {
            events: VecDeque::new(),
            cap,
            window,
            compacted_rv: 1,
        }
    }

    pub fn compacted_rv(&self) -> u64 {
        self.compacted_rv
    }

    pub fn push(&mut self, ev: Arc<WatchEvent>) {
        self.push_at(ev, Instant::now());
    }

    fn push_at(&mut self, ev: Arc<WatchEvent>, now: Instant) {
        self.events.push_back((now, ev));
        while let Some((at, first)) = self.events.front() {
            if self.events.len() <= self.cap && now.duration_since(*at) <= self.window {
                break;
            }
            self.compacted_rv = first.rv;
            self.events.pop_front();
        }
    }

    /// Events after `rv`, or `Gone` when some of them are no longer kept.
    pub fn since(&self, rv: u64) -> Result<Vec<Arc<WatchEvent>>, Gone> {
        if rv < self.compacted_rv {
            return Err(Gone {
                oldest: self.compacted_rv,
            });
        }
        // Events are in rv order.
        let start = self.events.partition_point(|(_, e)| e.rv <= rv);
        Ok(self.events.range(start..).map(|(_, e)| e.clone()).collect())
    }

    /// Forgets everything up to `rv` (tests provoke `410 Gone` this way; a
    /// loaded snapshot starts here).
    pub fn compact_to(&mut self, rv: u64) {
        self.events.clear();
        self.compacted_rv = rv;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::store::{EventType, StoredObject};
    use bytes::Bytes;

    fn ev(rv: u64) -> Arc<WatchEvent> {
        let obj = |rv: u64| {
            let v =
                serde_json::json!({"metadata": {"name": "a", "resourceVersion": rv.to_string()}});
            StoredObject::parse(Bytes::from(serde_json::to_vec(&v).unwrap())).unwrap()
        };
        Arc::new(WatchEvent {
            rv,
            key: crate::resources::ResKey {
                group: String::new(),
                plural: "configmaps".into(),
            },
            kind: EventType::Modified,
            obj: obj(rv),
            prev: Some(obj(rv - 1)),
        })
    }

    #[test]
    fn events_come_back_in_order_and_the_oldest_are_gone() {
        const RECENT: usize = 256;
        let t0 = Instant::now();
        let mut h = History::new(RECENT + 10, COMPACTION_WINDOW);
        for rv in 2..(2 + RECENT as u64 + 10) {
            h.push_at(ev(rv), t0);
        }
        let all = h.since(1).unwrap();
        assert_eq!(all.len(), RECENT + 10);
        assert_eq!(all[0].rv, 2);
        assert_eq!(all[0].obj.value()["metadata"]["resourceVersion"], "2");
        assert_eq!(all[0].prev.as_ref().unwrap().rv(), 1);
        assert_eq!(h.since(200).unwrap()[0].rv, 201);
        // Over the cap: the oldest go, and asking for them is Gone.
        h.push_at(ev(2 + RECENT as u64 + 10), t0);
        assert_eq!(h.compacted_rv(), 2);
        assert!(h.since(1).is_err());
        assert_eq!(h.since(2).unwrap()[0].rv, 3);
        // Past the compaction window everything older goes.
        let later = t0 + COMPACTION_WINDOW + Duration::from_secs(1);
        h.push_at(ev(3 + RECENT as u64 + 10), later);
        assert_eq!(h.events.len(), 1);
        assert!(h.since(5).is_err());
        assert_eq!(h.since(2 + RECENT as u64 + 10).unwrap().len(), 1);
    }
}
