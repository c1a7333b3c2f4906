//! Two peer routers, implemented from their public descriptions so kvsteer is
//! compared with smart routers, not only with random.
//!
//! **`dynamo_like`** — NVIDIA Dynamo's KV router ("Router Design" and "KV
//! Router" pages of docs.nvidia.com/dynamo): for each worker,
//! `cost = overlap_score_weight × potential prefill blocks + potential active
//! blocks`, where prefill blocks are the prompt's tokens not in that worker's
//! cache (from a KV-event-fed index, here kvsteer's own index, which is what
//! Dynamo's indexer is too) plus the prefill still pending on the worker, in
//! blocks, and active blocks are the blocks held by the worker's in-flight
//! requests plus the new request's. `overlap_score_weight` 1.0 and router
//! temperature 0 (pick the minimum) are Dynamo's defaults. Simplification:
//! active blocks count prompt blocks only (Dynamo can also grow them with
//! generated tokens).
//!
//! **`sglang_like`** — SGLang's router `cache_aware` policy (sgl-router /
//! sgl-model-gateway README and `RouterArgs` defaults): the router keeps its
//! own approximate prefix tree of the prompts it sent to each worker (it does
//! not see engine evictions). If the load is imbalanced
//! (`max > min × balance_rel_threshold` and `max − min > balance_abs_threshold`,
//! load = the router's pending requests per worker) it picks the least loaded
//! worker; otherwise the worker with the longest match if
//! `match / prompt > cache_threshold`, else the worker with the smallest
//! tree. Defaults: cache_threshold 0.3, balance_abs_threshold 64,
//! balance_rel_threshold 1.5, eviction every 120 s down to max_tree_size 2^26
//! characters (≈ 2^24 tokens at 4 characters a token). The tree is matched at
//! block granularity here (SGLang matches characters).

use std::collections::HashMap;

use kvsteer_indexer::keys::BlockKey;

pub const DYNAMO_OVERLAP_SCORE_WEIGHT: f64 = 1.0;
pub const SGLANG_CACHE_THRESHOLD: f64 = 0.3;
pub const SGLANG_BALANCE_ABS_THRESHOLD: u32 = 64;
pub const SGLANG_BALANCE_REL_THRESHOLD: f64 = 1.5;
pub const SGLANG_EVICTION_INTERVAL_S: f64 = 120.0;
pub const SGLANG_MAX_TREE_TOKENS: u64 = 1 << 24;

/// What a peer policy needs to know about one worker for one request.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PeerView {
    /// Prompt blocks cached on the worker (from the KV-event index).
    pub cached_blocks: u32,
}

// === Dynamo-like ===

#[derive(Debug, Default)]
pub struct DynamoLike {
    workers: Vec<DynamoWorker>,
    requests: HashMap<u64, DynamoRequest>,
}

#[derive(Debug, Default, Clone)]
struct DynamoWorker {
    /// Active blocks by key, with the number of requests holding each.
    active: HashMap<BlockKey, u32>,
    /// Partial last blocks of active requests (not shared).
    partial: u64,
    /// Prefill tokens of requests without a first token yet.
    prefill_tokens: u64,
}

#[derive(Debug)]
struct DynamoRequest {
    worker: usize,
    keys: Vec<BlockKey>,
    partial: bool,
    prefill_tokens: u64,
    prefilled: bool,
}

impl DynamoLike {
    pub fn new(workers: usize) -> Self {
        Self {
            workers: vec![DynamoWorker::default(); workers],
            requests: HashMap::new(),
        }
    }

    /// The worker with the lowest cost; ties go to `tie(worker)` order.
    pub fn choose(
        &self,
        prompt_tokens: u32,
        block_size: u32,
        keys: &[BlockKey],
        views: &[PeerView],
        tie: impl Fn(usize) -> usize,
    ) -> usize {
        let bs = f64::from(block_size.max(1));
        let mut best = (f64::INFINITY, usize::MAX, 0);
        for (w, (state, view)) in self.workers.iter().zip(views).enumerate() {
            let cached =
                u64::from(view.cached_blocks.min(keys.len() as u32)) * u64::from(block_size);
            let new_prefill = u64::from(prompt_tokens).saturating_sub(cached);
            let prefill_blocks = (state.prefill_tokens + new_prefill) as f64 / bs;
            let new_active = keys
                .iter()
                .filter(|k| !state.active.contains_key(k))
                .count() as u64
                + u64::from(!prompt_tokens.is_multiple_of(block_size.max(1)));
            let active_blocks = (state.active.len() as u64 + state.partial + new_active) as f64;
            let cost = DYNAMO_OVERLAP_SCORE_WEIGHT * prefill_blocks + active_blocks;
            let key = (cost, tie(w), w);
            if key.0 < best.0 || (key.0 == best.0 && key.1 < best.1) {
                best = key;
            }
        }
        best.2
    }

    pub fn on_pick(
        &mut self,
        id: u64,
        worker: usize,
        prompt_tokens: u32,
        block_size: u32,
        keys: Vec<BlockKey>,
        cached_blocks: u32,
    ) {
        let Some(w) = self.workers.get_mut(worker) else {
            return;
        };
        for k in &keys {
            *w.active.entry(*k).or_insert(0) += 1;
        }
        let partial = !prompt_tokens.is_multiple_of(block_size.max(1));
        w.partial += u64::from(partial);
        let prefill_tokens = u64::from(prompt_tokens).saturating_sub(
            u64::from(cached_blocks.min(keys.len() as u32)) * u64::from(block_size),
        );
        w.prefill_tokens += prefill_tokens;
        self.requests.insert(
            id,
            DynamoRequest {
                worker,
                keys,
                partial,
                prefill_tokens,
                prefilled: false,
            },
        );
    }

    pub fn on_first_token(&mut self, id: u64) {
        if let Some(r) = self.requests.get_mut(&id)
            && !r.prefilled
        {
            r.prefilled = true;
            let w = &mut self.workers[r.worker];
            w.prefill_tokens = w.prefill_tokens.saturating_sub(r.prefill_tokens);
        }
    }

    pub fn on_done(&mut self, id: u64) {
        let Some(r) = self.requests.remove(&id) else {
            return;
        };
        let w = &mut self.workers[r.worker];
        if !r.prefilled {
            w.prefill_tokens = w.prefill_tokens.saturating_sub(r.prefill_tokens);
        }
        w.partial -= u64::from(r.partial);
        for k in &r.keys {
            if let Some(n) = w.active.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    w.active.remove(k);
                }
            }
        }
    }
}

// === SGLang-like ===

#[derive(Debug, Default)]
pub struct SglangLike {
    /// Per worker: the router's approximate tree (key → last use tick).
    trees: Vec<HashMap<BlockKey, u64>>,
    pending: Vec<u32>,
    requests: HashMap<u64, usize>,
    tick: u64,
    next_eviction_s: f64,
    block_size: u32,
}

impl SglangLike {
    pub fn new(workers: usize, block_size: u32) -> Self {
        Self {
            trees: vec![HashMap::new(); workers],
            pending: vec![0; workers],
            requests: HashMap::new(),
            tick: 0,
            next_eviction_s: SGLANG_EVICTION_INTERVAL_S,
            block_size: block_size.max(1),
        }
    }

    pub fn choose(
        &mut self,
        prompt_tokens: u32,
        keys: &[BlockKey],
        now: f64,
        tie: impl Fn(usize) -> usize,
    ) -> usize {
        if now >= self.next_eviction_s {
            self.evict();
            self.next_eviction_s = now + SGLANG_EVICTION_INTERVAL_S;
        }
        let n = self.trees.len();
        let (max, min) = (
            self.pending.iter().copied().max().unwrap_or(0),
            self.pending.iter().copied().min().unwrap_or(0),
        );
        let imbalanced = f64::from(max) > f64::from(min) * SGLANG_BALANCE_REL_THRESHOLD
            && max - min > SGLANG_BALANCE_ABS_THRESHOLD;
        let by =
            |f: &dyn Fn(usize) -> (u64, usize)| (0..n).min_by_key(|&w| (f(w), tie(w))).unwrap_or(0);
        if imbalanced {
            by(&|w| (u64::from(self.pending[w]), 0))
        } else {
            let matched: Vec<usize> = self
                .trees
                .iter()
                .map(|t| keys.iter().take_while(|k| t.contains_key(k)).count())
                .collect();
            let best = by(&|w| (u64::MAX - matched[w] as u64, 0));
            let rate = (matched[best] as f64 * f64::from(self.block_size))
                / f64::from(prompt_tokens.max(1));
            if rate > SGLANG_CACHE_THRESHOLD {
                best
            } else {
                by(&|w| (self.trees[w].len() as u64, 0))
            }
        }
    }

    pub fn on_pick(&mut self, id: u64, worker: usize, keys: &[BlockKey]) {
        let Some(tree) = self.trees.get_mut(worker) else {
            return;
        };
        self.tick += 1;
        for k in keys {
            tree.insert(*k, self.tick);
        }
        self.pending[worker] += 1;
        self.requests.insert(id, worker);
    }

    pub fn on_done(&mut self, id: u64) {
        if let Some(w) = self.requests.remove(&id) {
            self.pending[w] = self.pending[w].saturating_sub(1);
        }
    }

    /// LRU trim of each worker's tree to the size limit.
    fn evict(&mut self) {
        let cap = (SGLANG_MAX_TREE_TOKENS / u64::from(self.block_size)) as usize;
        for tree in &mut self.trees {
            if tree.len() <= cap {
                continue;
            }
            let mut ticks: Vec<u64> = tree.values().copied().collect();
            ticks.sort_unstable();
            let cutoff = ticks[tree.len() - cap];
            tree.retain(|_, t| *t >= cutoff);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(range: std::ops::Range<u64>) -> Vec<BlockKey> {
        range.map(BlockKey).collect()
    }

    #[test]
    fn dynamo_prefers_overlap_until_active_blocks_outweigh_it() {
        let mut d = DynamoLike::new(2);
        let k = keys(0..10);
        // Worker 0 caches 8 of 10 blocks: cost 2 + 10 vs 10 + 10.
        let views = [PeerView { cached_blocks: 8 }, PeerView { cached_blocks: 0 }];
        assert_eq!(d.choose(160, 16, &k, &views, |w| w), 0);
        // Load worker 0 with 20 other active blocks: 2 + 30 > 10 + 10.
        d.on_pick(1, 0, 320, 16, keys(100..120), 20);
        assert_eq!(d.choose(160, 16, &k, &views, |w| w), 1);
        d.on_first_token(1);
        d.on_done(1);
        assert_eq!(d.choose(160, 16, &k, &views, |w| w), 0);
        assert!(d.workers[0].active.is_empty());
        assert_eq!((d.workers[0].partial, d.workers[0].prefill_tokens), (0, 0));
    }

    #[test]
    fn sglang_follows_its_tree_then_balances() {
        let mut s = SglangLike::new(2, 16);
        let k = keys(0..10);
        // Empty trees: smallest tree (tie → order).
        assert_eq!(s.choose(160, &k, 0.0, |w| w), 0);
        s.on_pick(1, 0, &k);
        // Worker 1's tree is smaller, but worker 0 matches 100 %.
        assert_eq!(s.choose(160, &k, 0.0, |w| w), 0);
        // A different prompt goes to the smaller tree.
        assert_eq!(s.choose(160, &keys(50..60), 0.0, |w| w), 1);
        // Imbalance: 70 pending on worker 0, 0 on worker 1.
        for id in 2..72 {
            s.on_pick(id, 0, &k);
        }
        assert_eq!(s.choose(160, &k, 0.0, |w| w), 1);
        for id in 1..72 {
            s.on_done(id);
        }
        assert_eq!(s.choose(160, &k, 0.0, |w| w), 0);
    }
}
