//! One engine step: schedule (vLLM v1's FCFS scheduler with chunked prefill
//! and preemption by recompute), time it with the profile, then "execute":
//! advance computed tokens, sample, finish.

use super::Engine;
use super::block_pool::{BlockExtras, BlockId};
use super::events::CacheEvent;
use super::request::{FinishReason, RequestId, RequestStatus, Usage};
use crate::profile::StepShape;

/// A token produced by a step for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenOutput {
    pub id: RequestId,
    pub token_id: u32,
    /// The request's first generated token (its TTFT ends here).
    pub first: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FinishedRequest {
    pub id: RequestId,
    pub reason: FinishReason,
    pub usage: Usage,
    pub arrival: f64,
    pub first_token_at: f64,
    pub finished_at: f64,
}

/// What one step did. Tokens and finishes take effect at `end()`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepOutput {
    pub start: f64,
    pub duration_s: f64,
    pub shape: StepShape,
    /// Requests scheduled in this step.
    pub num_scheduled: usize,
    pub tokens: Vec<TokenOutput>,
    pub finished: Vec<FinishedRequest>,
    /// KV events of the step, in order: one batch on the wire.
    pub events: Vec<CacheEvent>,
    pub preempted: Vec<RequestId>,
}

// === impl StepOutput ===

impl StepOutput {
    pub fn end(&self) -> f64 {
        self.start + self.duration_s
    }
}

// === impl Engine (step) ===

impl Engine {
    /// Runs one step starting at `now`. `None` when there is nothing to do.
    /// A step with no request to schedule but pending events (a prefix-cache
    /// reset) returns them with a zero duration.
    pub fn step(&mut self, now: f64) -> Option<StepOutput> {
        if !self.has_work() {
            return None;
        }
        let mut out = StepOutput {
            start: now,
            ..StepOutput::default()
        };
        let scheduled = self.schedule(&mut out.preempted);
        out.num_scheduled = scheduled.len();
        for &(slot, n) in &scheduled {
            self.req_mut(slot).num_computed += n;
        }
        out.shape = self.shape(&scheduled);
        out.duration_s = if scheduled.is_empty() {
            0.0
        } else {
            self.cfg.profile.step_duration(&out.shape)
        };
        let end = out.end();
        for &(slot, _) in &scheduled {
            self.execute(slot, end, &mut out);
        }
        self.running.retain(|&slot| self.slots[slot].is_some());
        out.events = self.pool.take_events();
        Some(out)
    }

    /// Picks `(slot, tokens)` for this step within the token budget.
    fn schedule(&mut self, preempted: &mut Vec<RequestId>) -> Vec<(usize, usize)> {
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut scheduled = Vec::with_capacity(self.running.len() + 8);
        // Running requests first, in order; preempt from the back when
        // blocks run out.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let slot = self.running[i];
            let req = self.req(slot);
            let n = (req.num_tokens() - req.num_computed).min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            loop {
                if self.try_allocate(slot, n, &[]) {
                    scheduled.push((slot, n));
                    budget -= n;
                    i += 1;
                    break;
                }
                let victim = self.running.pop().expect("running is not empty");
                preempted.push(self.req(victim).id);
                self.preempt(victim);
                if victim == slot {
                    break;
                }
            }
        }
        if !preempted.is_empty() {
            return scheduled;
        }
        // Then waiting requests, FCFS, while seats and budget remain.
        while let Some(&slot) = self.waiting.front() {
            if self.running.len() >= self.cfg.max_num_seqs || budget == 0 {
                break;
            }
            let bs = self.cfg.block_size;
            let req = self.req(slot);
            let num_tokens = req.num_tokens();
            // At least one token is computed: a full hit recomputes its
            // last block.
            let hits = self
                .pool
                .longest_hit(&req.block_hashes, (num_tokens - 1) / bs);
            let computed = hits.len() * bs;
            let n = (num_tokens - computed).min(budget);
            self.req_mut(slot).num_computed = computed;
            if !self.try_allocate(slot, n, &hits) {
                self.req_mut(slot).num_computed = 0;
                break;
            }
            let req = self.req_mut(slot);
            req.status = RequestStatus::Running;
            if req.cached_tokens.is_none() {
                req.cached_tokens = Some(computed);
                self.prefix_cache_queries += num_tokens as u64;
                self.prefix_cache_hits += computed as u64;
            }
            self.waiting.pop_front();
            self.running.push(slot);
            scheduled.push((slot, n));
            budget -= n;
        }
        scheduled
    }

    /// Gives `slot` blocks for `n` more tokens (after taking the prefix hits
    /// `hits`), then caches its newly full blocks. `false`, changing
    /// nothing, when free blocks do not suffice.
    fn try_allocate(&mut self, slot: usize, n: usize, hits: &[BlockId]) -> bool {
        let bs = self.cfg.block_size;
        let req = self.req(slot);
        let total = req.num_computed + n;
        let have = req.block_ids.len() + hits.len();
        let to_allocate = total.div_ceil(bs).saturating_sub(have);
        let evictable_hits = hits.iter().filter(|&&b| self.pool.ref_cnt(b) == 0).count();
        if to_allocate + evictable_hits > self.pool.num_free() {
            return false;
        }
        for &b in hits {
            self.pool.touch(b);
        }
        let mut new_blocks = Vec::with_capacity(to_allocate);
        for _ in 0..to_allocate {
            new_blocks.push(self.pool.allocate().expect("checked free blocks"));
        }
        let req = self.slots[slot].as_mut().expect("live slot");
        req.block_ids.extend_from_slice(hits);
        req.block_ids.extend(new_blocks);
        if !hits.is_empty() {
            req.num_cached_blocks = hits.len();
        }
        // Blocks become cached as soon as they are scheduled to be full
        // (vLLM's `cache_blocks` in `allocate_slots`).
        let full = (total / bs).min(req.block_hashes.len());
        let from = req.num_cached_blocks;
        if full > from {
            let parent = from.checked_sub(1).map(|p| req.block_hashes[p]);
            self.pool.cache_full(
                &req.block_ids[from..full],
                &req.block_hashes[from..full],
                parent,
                &req.token_ids[from * bs..full * bs],
                bs,
                BlockExtras {
                    lora: req.lora.as_ref(),
                    cache_salt: req.cache_salt.as_deref(),
                },
            );
            req.num_cached_blocks = full;
        }
        true
    }

    fn shape(&self, scheduled: &[(usize, usize)]) -> StepShape {
        let mut shape = StepShape::default();
        for &(slot, n) in scheduled {
            let req = self.req(slot);
            // `num_computed` already includes this step's tokens.
            let before = req.num_computed - n;
            if n == 1 && req.num_output() > 0 && before + 1 == req.num_tokens() {
                shape.decode_seqs += 1;
                shape.decode_context_tokens += req.num_tokens() as u64;
            } else {
                let (n, c) = (n as f64, before as f64);
                shape.prefill_tokens += n as u64;
                shape.prefill_attention_pairs += n * c + n * (n + 1.0) / 2.0;
                shape.prefill_context_tokens += before as u64;
            }
        }
        shape
    }

    /// Applies the step to one request: its tokens are computed; when that
    /// completes the sequence, one token is sampled.
    fn execute(&mut self, slot: usize, end: f64, out: &mut StepOutput) {
        let (bs, eos, eos_p) = (
            self.cfg.block_size,
            self.cfg.eos_token_id,
            self.cfg.eos_probability,
        );
        let max_model_len = self.cfg.max_model_len;
        let filler_len = self.cfg.filler_token_ids.len();
        let req = self.slots[slot].as_mut().expect("live slot");
        if req.num_computed < req.num_tokens() {
            return;
        }
        let num_output = req.num_output();
        let u = req.rng.next_f64();
        let is_eos = !req.ignore_eos && num_output >= req.min_tokens && u < eos_p;
        let token_id = if is_eos {
            eos
        } else {
            self.cfg.filler_token_ids[(req.filler_offset + num_output) % filler_len]
        };
        req.token_ids.push(token_id);
        req.hasher.extend(&mut req.block_hashes, &req.token_ids, bs);
        let first = req.first_token_at.is_none();
        if first {
            req.first_token_at = Some(end);
        }
        out.tokens.push(TokenOutput {
            id: req.id,
            token_id,
            first,
        });
        let reason = if is_eos {
            Some(FinishReason::Stop)
        } else if req.num_output() >= req.max_tokens || req.num_tokens() >= max_model_len {
            Some(FinishReason::Length)
        } else {
            None
        };
        let Some(reason) = reason else { return };
        let id = req.id;
        self.index.remove(&id);
        let req = self.release(slot).expect("live slot");
        out.finished.push(FinishedRequest {
            id,
            reason,
            usage: Usage {
                prompt_tokens: req.prompt_len,
                completion_tokens: req.num_output(),
                cached_tokens: req.cached_tokens.unwrap_or(0),
            },
            arrival: req.arrival,
            first_token_at: req.first_token_at.unwrap_or(end),
            finished_at: end,
        });
    }
}
