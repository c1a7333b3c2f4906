//! The segment cache: token ids of text pieces, keyed by a 64-bit xxh3 of
//! the piece (plus its length), in a sharded LRU bounded by total tokens.
//!
//! Each shard is a `Mutex` around a hash map and an intrusive doubly linked
//! recency list in a slab; a lookup holds one shard lock for a map probe and
//! a list splice and hands out an `Arc<[u32]>`, so the copy into the
//! caller's output happens outside the lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use xxhash_rust::xxh3::xxh3_64;

/// Default capacity: 4M cached tokens (~16 MB of ids).
pub const DEFAULT_CACHE_TOKENS: usize = 4 << 20;
const SHARDS: usize = 16;
const NIL: usize = usize::MAX;
/// Each entry is charged this many tokens on top of its ids (its map slot,
/// list node and allocation, ~64 bytes), so many tiny pieces cannot make
/// the cache outgrow its budget in memory.
const ENTRY_OVERHEAD_TOKENS: usize = 16;

/// Counters since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Pieces currently cached.
    pub entries: u64,
    /// Tokens currently cached.
    pub tokens: u64,
    /// Tokens returned from the cache instead of being encoded.
    pub tokens_served: u64,
    pub evictions: u64,
}

#[derive(Debug)]
pub struct SegmentCache {
    shards: Box<[Mutex<Shard>]>,
    hits: AtomicU64,
    misses: AtomicU64,
    tokens_served: AtomicU64,
}

/// A piece's cache key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    hash: u64,
    len: usize,
}

impl Key {
    pub fn of(text: &str) -> Self {
        Self::of_bytes(text.as_bytes())
    }

    pub fn of_bytes(bytes: &[u8]) -> Self {
        Key {
            hash: xxh3_64(bytes),
            len: bytes.len(),
        }
    }
}

// === impl SegmentCache ===

impl SegmentCache {
    /// A cache holding at most about `max_tokens` ids (0 disables it).
    pub fn new(max_tokens: usize) -> Self {
        let budget = max_tokens / SHARDS;
        SegmentCache {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Shard::new(budget)))
                .collect(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            tokens_served: AtomicU64::new(0),
        }
    }

    pub fn get(&self, key: Key) -> Option<Arc<[u32]>> {
        let found = self.shard(key).get(key);
        match &found {
            Some(ids) => {
                self.hits.fetch_add(1, Relaxed);
                self.tokens_served.fetch_add(ids.len() as u64, Relaxed);
            }
            None => {
                self.misses.fetch_add(1, Relaxed);
            }
        }
        found
    }

    pub fn insert(&self, key: Key, ids: Arc<[u32]>) {
        self.shard(key).insert(key, ids);
    }

    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let mut s = lock(shard);
            let budget = s.budget;
            let evictions = s.evictions;
            *s = Shard::new(budget);
            s.evictions = evictions;
        }
    }

    pub fn stats(&self) -> CacheStats {
        let mut stats = CacheStats {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            tokens_served: self.tokens_served.load(Relaxed),
            ..CacheStats::default()
        };
        for shard in self.shards.iter() {
            let s = lock(shard);
            stats.entries += s.map.len() as u64;
            stats.tokens += s.tokens as u64;
            stats.evictions += s.evictions;
        }
        stats
    }

    fn shard(&self, key: Key) -> MutexGuard<'_, Shard> {
        lock(&self.shards[(key.hash >> 32) as usize % SHARDS])
    }
}

/// A poisoned shard only means another thread panicked mid-operation; every
/// operation leaves the shard consistent, so keep using it.
fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// === impl Shard ===

#[derive(Debug)]
struct Node {
    key: Key,
    ids: Arc<[u32]>,
    prev: usize,
    next: usize,
}

/// One LRU: `head` is the most recently used node.
#[derive(Debug)]
struct Shard {
    map: HashMap<Key, usize>,
    nodes: Vec<Node>,
    free: Vec<usize>,
    head: usize,
    tail: usize,
    /// Ids currently held.
    tokens: usize,
    /// Ids plus per-entry overhead: what the budget bounds.
    charged: usize,
    budget: usize,
    evictions: u64,
}

impl Shard {
    fn new(budget: usize) -> Self {
        Shard {
            map: HashMap::new(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            tokens: 0,
            charged: 0,
            budget,
            evictions: 0,
        }
    }

    fn get(&mut self, key: Key) -> Option<Arc<[u32]>> {
        let idx = *self.map.get(&key)?;
        self.unlink(idx);
        self.push_front(idx);
        Some(self.nodes[idx].ids.clone())
    }

    fn insert(&mut self, key: Key, ids: Arc<[u32]>) {
        let cost = charge(&ids);
        if cost > self.budget || self.map.contains_key(&key) {
            return;
        }
        while self.charged + cost > self.budget && self.tail != NIL {
            self.evict_tail();
        }
        let node = Node {
            key,
            ids,
            prev: NIL,
            next: NIL,
        };
        let idx = match self.free.pop() {
            Some(idx) => {
                self.nodes[idx] = node;
                idx
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.map.insert(key, idx);
        self.push_front(idx);
        self.tokens += self.nodes[idx].ids.len();
        self.charged += cost;
    }

    fn evict_tail(&mut self) {
        let idx = self.tail;
        self.unlink(idx);
        let node = &mut self.nodes[idx];
        self.map.remove(&node.key);
        self.tokens -= node.ids.len();
        self.charged -= charge(&node.ids);
        node.ids = Arc::from([]);
        self.free.push(idx);
        self.evictions += 1;
    }

    fn unlink(&mut self, idx: usize) {
        let (prev, next) = (self.nodes[idx].prev, self.nodes[idx].next);
        match prev {
            NIL => self.head = next,
            p => self.nodes[p].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.nodes[n].prev = prev,
        }
    }

    fn push_front(&mut self, idx: usize) {
        self.nodes[idx].prev = NIL;
        self.nodes[idx].next = self.head;
        match self.head {
            NIL => self.tail = idx,
            h => self.nodes[h].prev = idx,
        }
        self.head = idx;
    }
}

fn charge(ids: &[u32]) -> usize {
    ids.len() + ENTRY_OVERHEAD_TOKENS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u32) -> Arc<[u32]> {
        (0..n).collect()
    }

    #[test]
    fn hit_miss_and_stats() {
        let cache = SegmentCache::new(1 << 20);
        let k = Key::of("hello");
        assert!(cache.get(k).is_none());
        cache.insert(k, ids(3));
        assert_eq!(cache.get(k).as_deref(), Some(&[0, 1, 2][..]));
        let s = cache.stats();
        assert_eq!(
            (s.hits, s.misses, s.entries, s.tokens, s.tokens_served),
            (1, 1, 1, 3, 3)
        );
        cache.clear();
        assert!(cache.get(k).is_none());
        assert_eq!(cache.stats().entries, 0);
    }

    #[test]
    fn same_hash_different_length_is_a_different_key() {
        assert_ne!(Key::of("ab"), Key::of("abc"));
    }

    #[test]
    fn lru_evicts_least_recently_used_within_budget() {
        let o = ENTRY_OVERHEAD_TOKENS;
        let mut shard = Shard::new(10 + 2 * o);
        let (a, b, c) = (Key::of("a"), Key::of("b"), Key::of("c"));
        shard.insert(a, ids(4));
        shard.insert(b, ids(4));
        assert!(shard.get(a).is_some()); // b is now the oldest
        shard.insert(c, ids(4));
        assert!(shard.get(b).is_none());
        assert!(shard.get(a).is_some() && shard.get(c).is_some());
        assert_eq!(
            (shard.tokens, shard.charged, shard.evictions),
            (8, 8 + 2 * o, 1)
        );
        // Too big for the shard: not stored, nothing evicted.
        shard.insert(Key::of("big"), ids(11 + 2 * o as u32));
        assert_eq!((shard.map.len(), shard.evictions), (2, 1));
        // Slots are reused.
        shard.insert(Key::of("d"), ids(9 + o as u32));
        assert_eq!(shard.map.len(), 1);
        assert!(shard.nodes.len() <= 3);
    }

    #[test]
    fn random_operations_keep_invariants() {
        use rand::{Rng, SeedableRng, rngs::SmallRng};
        let mut rng = SmallRng::seed_from_u64(7);
        let mut shard = Shard::new(200);
        for _ in 0..5000 {
            let key = Key::of(&rng.random_range(0..60u32).to_string());
            if rng.random_bool(0.5) {
                shard.insert(key, ids(rng.random_range(0..30)));
            } else {
                shard.get(key);
            }
            assert!(shard.charged <= shard.budget);
            let mut walked = 0;
            let mut idx = shard.head;
            while idx != NIL {
                walked += 1;
                idx = shard.nodes[idx].next;
            }
            assert_eq!(walked, shard.map.len());
            let sum: usize = shard.map.values().map(|&i| shard.nodes[i].ids.len()).sum();
            assert_eq!(sum, shard.tokens);
            assert_eq!(shard.charged, sum + shard.map.len() * ENTRY_OVERHEAD_TOKENS);
        }
    }
}
