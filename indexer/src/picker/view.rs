//! What a pick sees of the workers of its model, for one prompt: the
//! prompt's block keys, where the index finds its blocks cached, and one
//! [`WorkerView`] per worker (health, the ledger's load and prompts in
//! flight, the last scrape, the route memories). Scoring
//! ([`crate::scoring`]) orders the workers from these views alone.

use super::{Model, Picker};
use crate::{
    index::WorkerMatch,
    keys::{BlockKey, KeyContext, prompt_keys},
    ledger::LocalLoad,
    routes::WorkerRoutes,
    scoring::{PromptTokens, ScrapedLoad, WorkerView},
    workers::Worker,
};
use std::{collections::HashMap, sync::Arc, time::Instant};

/// What a pick sees of every worker of the model, for one prompt.
#[derive(Debug, Clone)]
pub struct PickView {
    pub keys: Vec<BlockKey>,
    /// The prompt's blocks cached on each worker, in the model's order.
    pub found: Vec<Option<WorkerMatch>>,
    pub views: Vec<WorkerView>,
    pub prompt: PromptTokens,
    /// The index could not answer (no worker has matches then).
    pub index_error: Option<String>,
}

// === impl Picker ===

impl Picker {
    /// What a pick of `token_ids` would see of every worker of `model` at
    /// `now`, changing nothing; `None` for an unknown model. For routers
    /// that score with their own rules on the service's view (the
    /// benchmark's peer policies).
    pub async fn view(
        &self,
        model: &str,
        token_ids: &[u32],
        cache_salt: Option<&str>,
        now: Instant,
    ) -> Option<PickView> {
        let model = self.models.get(model)?;
        let workers = self.workers.serving(&model.name);
        Some(
            self.view_workers(model, &model.keys, &workers, token_ids, cache_salt, now)
                .await,
        )
    }

    /// The prompt's keys, where its blocks are cached, and one view per
    /// worker of `model` (`workers`, in their order) at `now`.
    pub(super) async fn view_workers(
        &self,
        model: &Model,
        keys_ctx: &KeyContext,
        workers: &[Arc<Worker>],
        ids: &[u32],
        cache_salt: Option<&str>,
        now: Instant,
    ) -> PickView {
        let keys = if ids.is_empty() {
            Vec::new()
        } else {
            prompt_keys(keys_ctx, cache_salt, ids)
        };
        let mut matches = HashMap::new();
        let mut index_error = None;
        if !keys.is_empty() {
            match self.index.lookup(&keys).await {
                Ok(found) => matches.extend(found.into_iter().map(|m| (m.worker, m))),
                Err(e) => index_error = Some(e.to_string()),
            }
        }
        let (loads, held) = self.ledger.view(&keys);
        let routes = self.routes.lookup(&keys, now, held);
        let (found, views) = workers
            .iter()
            .map(|w| {
                let found = matches.remove(&w.id);
                let mut view = worker_view(
                    w.is_up(self.down_after),
                    found.as_ref(),
                    model.block_size,
                    &loads.get(w.slot).copied().unwrap_or_default(),
                    w.health.load(),
                    routes.worker(w.slot),
                    self.index.worker_blocks(w.id),
                );
                let queued = view.backlog() > 0.0;
                view.queue_age_s = self.queue_age.age_s(w.slot, queued, now);
                (found, view)
            })
            .unzip();
        let prompt = PromptTokens {
            prompt_tokens: u32::try_from(ids.len()).unwrap_or(u32::MAX),
            seen_tokens: routes.seen_tokens(model.block_size),
        };
        PickView {
            keys,
            found,
            views,
            prompt,
            index_error,
        }
    }
}

/// What the picker knows about one worker for one prompt: its health, the
/// prompt's cached blocks there (`found`, from the index), our in-flight
/// load and calibrated rate, its last scrape, and what we routed there
/// recently.
fn worker_view(
    up: bool,
    found: Option<&WorkerMatch>,
    block_size: u32,
    load: &LocalLoad,
    scraped: Option<ScrapedLoad>,
    routes: WorkerRoutes,
    indexed_blocks: u64,
) -> WorkerView {
    let (gpu, any) = found.map_or((0, 0), |m| (m.gpu_blocks, m.cpu_blocks.max(m.gpu_blocks)));
    WorkerView {
        up,
        gpu_hit_tokens: gpu.saturating_mul(block_size),
        cpu_hit_tokens: (any - gpu).saturating_mul(block_size),
        in_flight: load.in_flight,
        unprefilled_tokens: load.unprefilled_tokens,
        decoding: load.decoding,
        scraped,
        prefill_rate: load.prefill_rate,
        held_hit_tokens: routes.held_blocks.saturating_mul(block_size),
        routed_prompt_tokens: routes.routed.prompt_blocks.saturating_mul(block_size),
        routed_other_tokens: routes
            .routed
            .other_blocks
            .saturating_mul(u64::from(block_size)),
        placed_prompt_tokens: routes.placed.prompt_blocks.saturating_mul(block_size),
        placed_other_tokens: routes
            .placed
            .other_blocks
            .saturating_mul(u64::from(block_size)),
        indexed_tokens: indexed_blocks.saturating_mul(u64::from(block_size)),
        // Set by the caller, from the worker's backlog in this view.
        queue_age_s: None,
    }
}
