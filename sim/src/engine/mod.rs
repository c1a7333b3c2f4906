//! The engine core: a synchronous state machine with no sockets, no clock
//! and no async runtime.
//!
//! A driver (the HTTP server with a real clock, or a virtual-time benchmark)
//! submits requests with [`Engine::add_request`] and calls
//! [`Engine::step`] with the current time; each step schedules a batch like
//! vLLM v1 does and returns how long it takes ([`StepOutput::duration_s`]),
//! the tokens it produced, the requests it finished and its KV events.

mod block_pool;
pub mod config;
mod events;
mod free_list;
mod hash;
mod request;
mod step;

use std::collections::{HashMap, VecDeque};

pub use config::{ConfigError, DEFAULT_NONE_HASH_SEED, EngineConfig, HashAlgo};
pub use events::{CacheEvent, MEDIUM_GPU, to_event_batch};
pub use request::{FinishReason, Lora, RejectReason, RequestId, RequestStatus, SimRequest, Usage};
pub use step::{FinishedRequest, StepOutput, TokenOutput};

use block_pool::BlockPool;
use hash::BlockHasher;
use request::{ReqState, SplitMix64};

/// Counters and gauges, as vLLM's `/metrics` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    /// Fraction of blocks referenced by requests (0..1).
    pub kv_usage: f64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: u64,
    /// Of those, tokens found.
    pub prefix_cache_hits: u64,
    pub preemptions: u64,
    pub num_gpu_blocks: usize,
}

/// Outcome of [`Engine::reset_prefix_cache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetOutcome {
    /// Cached hashes forgotten; `AllBlocksCleared` goes out with the next step.
    Cleared,
    /// Refused: requests still hold blocks (vLLM logs "Failed to reset
    /// prefix cache because some blocks are not freed yet").
    BlocksInUse,
}

#[derive(Debug, Clone)]
pub struct Engine {
    cfg: EngineConfig,
    hasher: BlockHasher,
    pool: BlockPool,
    /// Request states by slot; `index` maps ids to slots.
    slots: Vec<Option<ReqState>>,
    free_slots: Vec<usize>,
    index: HashMap<RequestId, usize>,
    waiting: VecDeque<usize>,
    running: Vec<usize>,
    prefix_cache_queries: u64,
    prefix_cache_hits: u64,
    preemptions: u64,
}

// === impl Engine ===

impl Engine {
    pub fn new(cfg: EngineConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Self {
            hasher: BlockHasher::new(
                cfg.prefix_caching_hash_algo,
                cfg.hash_seed,
                &cfg.none_hash_seed,
            ),
            pool: BlockPool::new(cfg.num_gpu_blocks),
            cfg,
            slots: Vec::new(),
            free_slots: Vec::new(),
            index: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            preemptions: 0,
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Queues a request (FCFS) after checking it against the model length.
    pub fn add_request(&mut self, req: SimRequest) -> Result<(), RejectReason> {
        let prompt_tokens = req.prompt_token_ids.len();
        let max_model_len = self.cfg.max_model_len;
        if prompt_tokens == 0 {
            return Err(RejectReason::EmptyPrompt);
        }
        if prompt_tokens > max_model_len {
            return Err(RejectReason::PromptTooLong {
                prompt_tokens,
                max_model_len,
            });
        }
        if req.max_tokens == 0 {
            return Err(RejectReason::MaxTokensZero(req.max_tokens));
        }
        if req.max_tokens > max_model_len - prompt_tokens {
            return Err(RejectReason::MaxTokensTooLarge {
                max_tokens: req.max_tokens,
                prompt_tokens,
                max_model_len,
            });
        }
        if self.index.contains_key(&req.id) {
            return Err(RejectReason::DuplicateId(req.id));
        }
        let mut rng = SplitMix64::new(self.cfg.seed ^ req.id.wrapping_mul(0xa076_1d64_78bd_642f));
        let filler_offset = (rng.next_u64() % self.cfg.filler_token_ids.len() as u64) as usize;
        let mut block_hashes = Vec::with_capacity(prompt_tokens / self.cfg.block_size + 1);
        let hasher = match &req.lora {
            Some(lora) => self.hasher.for_lora(&lora.name),
            None => self.hasher.clone(),
        };
        let mut hasher = match req.cache_salt.as_deref() {
            Some(salt) if !salt.is_empty() => hasher.salted(salt),
            _ => hasher,
        };
        hasher.extend(
            &mut block_hashes,
            &req.prompt_token_ids,
            self.cfg.block_size,
        );
        let state = ReqState {
            id: req.id,
            prompt_len: prompt_tokens,
            token_ids: req.prompt_token_ids,
            block_hashes,
            block_ids: Vec::new(),
            num_cached_blocks: 0,
            num_computed: 0,
            max_tokens: req.max_tokens,
            min_tokens: req.min_tokens,
            ignore_eos: req.ignore_eos,
            arrival: req.arrival,
            first_token_at: None,
            cached_tokens: None,
            status: RequestStatus::Waiting,
            rng,
            filler_offset,
            hasher,
            lora: req.lora,
            cache_salt: req.cache_salt.filter(|s| !s.is_empty()),
        };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot] = Some(state);
                slot
            }
            None => {
                self.slots.push(Some(state));
                self.slots.len() - 1
            }
        };
        self.index.insert(req.id, slot);
        self.waiting.push_back(slot);
        Ok(())
    }

    /// Drops a request wherever it is, freeing its blocks (they stay
    /// cached). `false` when the id is unknown (finished or never added).
    pub fn abort(&mut self, id: RequestId) -> bool {
        let Some(slot) = self.index.remove(&id) else {
            return false;
        };
        self.running.retain(|&s| s != slot);
        self.waiting.retain(|&s| s != slot);
        self.release(slot);
        true
    }

    /// The status of a live request.
    pub fn status(&self, id: RequestId) -> Option<RequestStatus> {
        let slot = *self.index.get(&id)?;
        self.slots[slot].as_ref().map(|r| r.status)
    }

    /// True while any request is waiting or running, or events are pending.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty() || self.pool.has_events()
    }

    /// Forgets every cached block hash. With `reset_running_requests`,
    /// running requests are preempted first (vLLM's
    /// `reset_prefix_cache?reset_running_requests=true`); otherwise the reset
    /// is refused while any request holds blocks, like vLLM.
    pub fn reset_prefix_cache(&mut self, reset_running_requests: bool) -> ResetOutcome {
        if reset_running_requests {
            while let Some(slot) = self.running.pop() {
                self.preempt(slot);
            }
        }
        if self.pool.reset() {
            ResetOutcome::Cleared
        } else {
            ResetOutcome::BlocksInUse
        }
    }

    pub fn stats(&self) -> EngineStats {
        let total = self.pool.num_blocks();
        EngineStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_usage: 1.0 - self.pool.num_free() as f64 / total as f64,
            prefix_cache_queries: self.prefix_cache_queries,
            prefix_cache_hits: self.prefix_cache_hits,
            preemptions: self.preemptions,
            num_gpu_blocks: total,
        }
    }

    fn req(&self, slot: usize) -> &ReqState {
        self.slots[slot].as_ref().expect("live slot")
    }

    fn req_mut(&mut self, slot: usize) -> &mut ReqState {
        self.slots[slot].as_mut().expect("live slot")
    }

    /// Frees a request's blocks (last block first, so the tail of a sequence
    /// is evicted before its prefix) and its slot.
    fn release(&mut self, slot: usize) -> Option<ReqState> {
        let req = self.slots[slot].take()?;
        self.pool.free(req.block_ids.iter().rev().copied());
        self.free_slots.push(slot);
        Some(req)
    }

    /// Preemption by recompute: blocks freed, request back to the front of
    /// the waiting queue with nothing computed.
    fn preempt(&mut self, slot: usize) {
        let req = self.slots[slot].as_mut().expect("live slot");
        let blocks = std::mem::take(&mut req.block_ids);
        req.num_cached_blocks = 0;
        req.num_computed = 0;
        req.status = RequestStatus::Preempted;
        self.pool.free(blocks.iter().rev().copied());
        self.waiting.push_front(slot);
        self.preemptions += 1;
    }
}
