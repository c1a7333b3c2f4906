//! Ids whose terminal report (done, cancelled) came while the ledger had no
//! entry for them: most often because the report overtook its own pick
//! (the filter gave up waiting and reported `Cancelled` before the pick
//! committed). The pick that commits later finds its tombstone and is not
//! counted. Tombstones live `ttl` and at most `capacity` are kept (the
//! oldest go first): a report for an id that is never picked (expired,
//! another replica's, garbage) must not grow memory.

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

pub(super) struct Tombstones {
    ttl: Duration,
    capacity: usize,
    at: HashMap<String, Instant>,
    /// Insertion order, for expiry; ids taken since (or tombstoned again)
    /// leave stale entries, skipped when they come out.
    order: VecDeque<(Instant, String)>,
    /// Dropped by the capacity bound before their TTL.
    pub(super) evicted: u64,
}

// === impl Tombstones ===

impl Tombstones {
    pub(super) fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            ttl,
            capacity: capacity.max(1),
            at: HashMap::new(),
            order: VecDeque::new(),
            evicted: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.at.len()
    }

    /// Remembers `id` from `now` (a tombstone already there is kept as is).
    /// Returns whether it is new.
    pub(super) fn insert(&mut self, id: &str, now: Instant) -> bool {
        if self.at.contains_key(id) {
            return false;
        }
        self.at.insert(id.to_owned(), now);
        self.order.push_back((now, id.to_owned()));
        while self.at.len() > self.capacity || self.order.len() > 2 * self.capacity {
            let Some((at, old)) = self.order.pop_front() else {
                break;
            };
            if self.at.get(&old) == Some(&at) {
                self.at.remove(&old);
                self.evicted += 1;
            }
        }
        true
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.at.contains_key(id)
    }

    /// Removes `id`'s tombstone; returns whether there was one.
    pub(super) fn take(&mut self, id: &str) -> bool {
        self.at.remove(id).is_some()
    }

    /// Drops tombstones older than the TTL; returns how many.
    pub(super) fn expire(&mut self, now: Instant) -> usize {
        let mut dropped = 0;
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) <= self.ttl {
                break;
            }
            let Some((at, id)) = self.order.pop_front() else {
                break;
            };
            if self.at.get(&id) == Some(&at) {
                self.at.remove(&id);
                dropped += 1;
            }
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstones_expire_and_are_bounded() {
        let t0 = Instant::now();
        let mut t = Tombstones::new(Duration::from_secs(30), 2);
        assert!(t.insert("a", t0));
        assert!(!t.insert("a", t0 + Duration::from_secs(5)), "kept as is");
        assert!(t.insert("b", t0 + Duration::from_secs(10)));
        assert!(t.insert("c", t0 + Duration::from_secs(10)));
        // Over capacity: the oldest went.
        assert_eq!((t.len(), t.evicted), (2, 1));
        assert!(!t.take("a"));
        assert!(t.take("b"));
        assert!(!t.take("b"));
        assert_eq!(t.expire(t0 + Duration::from_secs(40)), 0);
        assert_eq!(t.expire(t0 + Duration::from_secs(41)), 1);
        assert_eq!(t.len(), 0);
        // A taken id tombstoned again lives from its new time.
        t.insert("d", t0 + Duration::from_secs(50));
        t.take("d");
        t.insert("d", t0 + Duration::from_secs(70));
        assert_eq!(t.expire(t0 + Duration::from_secs(90)), 0);
        assert_eq!(t.len(), 1);
        assert_eq!(t.expire(t0 + Duration::from_secs(101)), 1);
    }
}
