//! The `kvsteer` policy: predicted time to first token, and what a
//! placement costs the requests behind it.
//!
//! ```text
//! queued   = max(unprefilled tokens we sent, scraped waiting × waiting_request_tokens)
//! gpu_hits = max(GPU-cached prefix, prefix of a request in flight there)
//! uncached = max(prompt − gpu_hits − cpu_hits × cpu_hit_weight, 1)
//! slots    = (waiting + 1) × slot_time / running   (when waiting > 0 and running ≥ max_num_seqs,
//!                                                  or kv_usage ≥ kv_full_threshold and the
//!                                                  cache size is unknown)
//! idle     = GPU-cached prefix − prefix of a request in flight there   (≥ 0)
//! blocks   = (queued + uncached + idle − free KV tokens) × slot_time / used KV tokens   (when > 0)
//! ttft_ms  = max(1000 × queued / rate, 1000 × slots, 1000 × blocks)   (wait for the work ahead)
//!          + running × decode_ms_per_running (decode steps sharing the batches)
//!          + 1000 × uncached / rate          (this request's own prefill)
//! evicted  = clamp(routed_other + prompt − KV tokens, 0, prompt − routed_prompt)
//! again    = max over candidates of gpu_hits − gpu_hits
//! cost_ms  = ttft_ms + 1000 × uncached / rate × congestion_weight × mean backlog
//!          + 1000 × evicted / rate
//!          + 1000 × again / rate × recompute_weight × (1 − new_share)
//!          − queue_ms × keep                                 (holders only)  (rank)
//! keep     = max(1 − lasted(holder), min over the other candidates of lasted)
//!            (overload_holds, the default; off: 1 − lasted(holder))
//! lasted   = min(1, queue age / lasting_queue_s)   (1 when the age is unknown)
//! ```
//! A request in flight on the worker (picked, not ended) holds its prefix
//! there: one with no first token yet prefills it before this one, one
//! running keeps it referenced. So the prefix they share counts as cached
//! there: the index shows only what is cached now, and past saturation a
//! group whose prefix is still queued would otherwise look cold everywhere
//! and scatter.
//! The queue term takes the larger of our count and the engine's because the
//! engine's waiting queue contains our requests too (summing would count them
//! twice) but also sees traffic from other routers, and the scrape lags.
//! The slot term covers one other reason a vLLM queue forms: every running
//! slot (`max_num_seqs`) taken, so waiting requests start only as running
//! ones finish. `slot_time` is how long a request holds its slot after its
//! first token, from the engine's own latency histograms (mean end-to-end
//! latency minus mean TTFT, see `scrape.rs`).
//! The block term covers the other: the engine admits a request only when
//! its KV blocks fit. The cache size comes from `vllm:cache_config_info`,
//! the used part from `kv_usage`; the tokens queued ahead and this request's
//! uncached tokens that do not fit wait for running requests to release
//! theirs, `used / slot_time` tokens per second (Little's law on the cache).
//! Without it a worker whose cache is full of decoding requests has an empty
//! prefill queue and looks fast; requests sent there wait or preempt others.
//! The prompt's cached blocks count in what it needs unless a request in
//! flight there holds them (`idle`): vLLM counts a cached block that no
//! running request references as free (it stays in the free list, first
//! to be evicted), and takes it off that list when a request that hits it
//! is admitted. A conversation's next turn, whose last turn has ended,
//! needs its whole context in free blocks; a question on a prefix its
//! group's running requests hold needs only its own.
//!
//! [`order`] ranks by `cost_ms`, not `ttft_ms`: prefill time is the resource
//! every request shares, so a placement also delays the requests that will
//! queue behind it, and near saturation a cache miss (the whole prompt to
//! prefill instead of its question) costs them more than it saves this one.
//! Their number is estimated from the workers' mean backlog (requests
//! without a first token, see `WorkerView::backlog`) times
//! `congestion_weight`. With nothing queued anywhere the cost is the
//! predicted TTFT; as queues grow a cold placement must save more than the
//! extra prefill it adds for everyone, so the cache keeps its traffic.
//! The charge grows with the backlog, without bound past saturation, so
//! the weight is moderate (1): with 2 a worker that took one group too many
//! at the start kept it however long its queue grew, and the cluster's
//! throughput fell to that worker's; with 0.5 the queues that come and go
//! at capacity moved groups, each move prefilled a prefix again, and the
//! cluster fell behind its arrivals.
//! `ttft_ms` stays this request's own prediction (reported, calibrated).
//!
//! `again` is a prefix another candidate holds that this one would prefill
//! again: the cluster does that work twice and splits the prefix's traffic
//! over two copies, each kept warm half as often. `recompute_weight` (off by
//! default) charges it; the charge fades with the prompt's new share, because
//! a new conversation is meant to spread (its follow-ups come back wherever
//! it lands) and a question on a shared prefix is not.
//!
//! A holder (a worker with more of the prompt than some other candidate,
//! and as much as any; when none has more than another, the worker the
//! prompt was placed on within `placement_window_s`, its home, while its
//! cache has room or the prompt was routed there within the route window)
//! is charged its queue only as far as the queue lasts: a queue younger
//! than `lasting_queue_s` (10 s) counts for its age's share of it. A burst
//! drains by itself; a request moved off its prefix for it prefills the
//! prefix again elsewhere, and past capacity that extra work is what makes
//! every queue grow. A queue that lasts still moves the prompt, which is
//! what relieves a worker that took too many groups.
//! And a holder keeps as much of its discount as every other candidate's
//! queue has lasted (`overload_holds`): past capacity, where all of them
//! last, moving a group prefills its prefix again and relieves nobody; a
//! worker whose queue is young or empty still draws the excess.
//!
//! `evicted` charges what a placement costs the requests that come back:
//! the KV index shows only what is cached now, so a conversation whose
//! prefix was just evicted (or is still being prefilled) looks cold
//! everywhere and would go wherever its first token comes earliest, piling
//! conversations onto the workers that already hold others. The picker
//! remembers the prompt blocks it routed to each worker recently
//! (`routes::RouteMemory`): `routed_other` is that working set minus this
//! prompt's part, `routed_prompt`. Beyond the cache, LRU
//! evicts the excess, at most what this placement adds to the set, and the
//! owners prefill it again at this worker's rate. A conversation returning to
//! the worker it used adds little there; a new one is charged where the
//! cache is already claimed; with room everywhere the charge is 0.

use super::{PromptTokens, Ranked, ScrapedLoad, WorkerView};
use crate::config::ScoringConfig;

/// The predicted TTFT of one request on one worker, by component.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Prediction {
    /// Tokens to prefill ahead of this request.
    pub queued_tokens: f64,
    /// This request's tokens to prefill after cache hits.
    pub uncached_tokens: f64,
    /// Time before this request starts: the token queue, or the wait for a
    /// slot or KV blocks when that is longer.
    pub queue_ms: f64,
    /// The wait for a running slot or KV blocks alone (0 when neither is short).
    pub wait_ms: f64,
    pub decode_ms: f64,
    pub prefill_ms: f64,
    pub ttft_ms: f64,
    /// Recently routed tokens of other prompts this placement pushes out of
    /// the worker's cache.
    pub evicted_tokens: f64,
    /// Their prefill again, when their requests come back.
    pub evict_ms: f64,
}

impl Prediction {
    /// Tokens the worker prefills before this request's first token.
    pub fn work_tokens(&self) -> f64 {
        self.queued_tokens + self.uncached_tokens
    }

    /// The part of the predicted TTFT that is not prefill work: the decode
    /// steps sharing the batches. A first token observed sooner than this
    /// carries no prefill time.
    pub fn non_prefill_ms(&self) -> f64 {
        self.decode_ms
    }

    /// What a placement costs everyone: this request's TTFT plus the delay
    /// its prefill adds to the `backlog` requests that queue behind it.
    /// and the prefill of other requests' prefixes it evicts.
    pub fn cost_ms(&self, backlog: f64) -> f64 {
        self.ttft_ms + self.prefill_ms * backlog + self.evict_ms
    }

    /// Prefill time per uncached token on this worker (0 with nothing to prefill).
    pub fn ms_per_token(&self) -> f64 {
        if self.uncached_tokens > 0.0 {
            self.prefill_ms / self.uncached_tokens
        } else {
            0.0
        }
    }
}

pub fn predict(cfg: &ScoringConfig, prompt_tokens: u32, w: &WorkerView) -> Prediction {
    let rate = if w.prefill_rate.is_finite() && w.prefill_rate > 0.0 {
        w.prefill_rate
    } else {
        cfg.prefill_rate_prior
    };
    let scraped_queue = w.scraped.map_or(0.0, |s| {
        s.waiting.max(0.0) * f64::from(cfg.waiting_request_tokens)
    });
    let queued_tokens = (w.unprefilled_tokens as f64).max(scraped_queue);
    let running = f64::from(w.decoding).max(w.scraped.map_or(0.0, |s| s.running.max(0.0)));
    let prompt = f64::from(prompt_tokens);
    let cached_anywhere = f64::from(w.gpu_hit_tokens) + f64::from(w.cpu_hit_tokens);
    let gpu = f64::from(gpu_held(prompt_tokens, w));
    let cpu = (cached_anywhere - gpu).clamp(0.0, prompt - gpu);
    // vLLM always computes at least the last prompt token.
    let uncached_tokens = (prompt - gpu - cpu * cfg.cpu_hit_weight).max(prompt.min(1.0));
    // Cached blocks no request in flight there holds are in the free part
    // of the cache until this request takes them.
    let idle_hits = f64::from(
        w.gpu_hit_tokens
            .min(prompt_tokens)
            .saturating_sub(w.held_hit_tokens),
    );
    let wait_ms = w.scraped.map_or(0.0, |s| {
        slot_wait_ms(cfg, &s).max(kv_wait_ms(&s, queued_tokens + uncached_tokens + idle_hits))
    });
    let queue_ms = (1000.0 * queued_tokens / rate).max(wait_ms);
    let decode_ms = running * cfg.decode_ms_per_running;
    let prefill_ms = 1000.0 * uncached_tokens / rate;
    let evicted_tokens = w
        .scraped
        .map_or(0.0, |s| evicted_tokens(s.kv_capacity_tokens, prompt, w));
    Prediction {
        queued_tokens,
        uncached_tokens,
        queue_ms,
        wait_ms,
        decode_ms,
        prefill_ms,
        ttft_ms: queue_ms + decode_ms + prefill_ms,
        evicted_tokens,
        evict_ms: 1000.0 * evicted_tokens / rate,
    }
}

/// The prompt's leading tokens in the worker's GPU cache by the time its
/// prefill starts: cached now, or held by a request in flight there
/// (prefilled first if still queued, referenced while it runs).
fn gpu_held(prompt_tokens: u32, w: &WorkerView) -> u32 {
    w.gpu_hit_tokens.max(w.held_hit_tokens).min(prompt_tokens)
}

/// The working set a placement pushes out of the cache: the worker must
/// hold the tokens recently routed to it (`routed_other_tokens`) and this
/// prompt; what exceeds its KV cache is evicted (LRU), up to the tokens this
/// placement adds to the set (the prompt's tokens not already routed there).
/// 0 when the engine does not export its cache size.
fn evicted_tokens(capacity: f64, prompt: f64, w: &WorkerView) -> f64 {
    if capacity <= 0.0 {
        return 0.0;
    }
    let added = (prompt - f64::from(w.routed_prompt_tokens)).max(0.0);
    let over = w.routed_other_tokens as f64 + prompt - capacity;
    over.clamp(0.0, added)
}

/// Requests waiting for a running slot (`max_num_seqs`, or KV blocks when
/// the engine does not export its cache size) start as running ones finish:
/// R slots each held `slot_time` free one every slot_time / R, and this
/// request needs the (waiting + 1)th. Only when the engine is really out of
/// slots or blocks: a waiting queue also forms for one step at a time behind
/// the prefill token budget, which the token term covers.
fn slot_wait_ms(cfg: &ScoringConfig, s: &ScrapedLoad) -> f64 {
    let kv_full = s.kv_capacity_tokens <= 0.0 && s.kv_usage >= cfg.kv_full_threshold;
    let full = s.running >= f64::from(cfg.max_num_seqs) || kv_full;
    match s.slot_time_s() {
        Some(slot) if full && s.waiting > 0.0 && s.running > 0.0 => {
            1000.0 * (s.waiting + 1.0) * slot / s.running
        }
        _ => 0.0,
    }
}

/// The wait for KV blocks: the engine admits a request only when its blocks
/// fit. `need` tokens (the prefills queued ahead, this one's uncached
/// tokens and its cached ones nothing running holds) against the free part
/// of the cache; what does not fit waits for
/// running requests to finish, which release the used blocks at
/// `used / slot_time` tokens per second (Little's law on the cache).
fn kv_wait_ms(s: &ScrapedLoad, need: f64) -> f64 {
    let capacity = s.kv_capacity_tokens;
    let Some(slot) = s.slot_time_s() else {
        return 0.0;
    };
    if capacity <= 0.0 {
        return 0.0;
    }
    let used = s.kv_usage.clamp(0.0, 1.0) * capacity;
    let short = need - (capacity - used);
    if short <= 0.0 || used <= 0.0 {
        return 0.0;
    }
    1000.0 * short * slot / used
}

/// How far one observation may move the estimate: a sample's per-token
/// time counts as at most this factor from the current one (a bounded
/// EWMA step), so a few bad samples cannot drag the rate to a bound.
pub const CALIBRATION_MAX_STEP: f64 = 2.0;

/// The next prefill rate of a worker after a streamed first token.
///
/// The estimate is a per-token prefill time (ms/token), moved by
/// `calibration_alpha` (EWMA) towards each observation's
/// `(observed − decode) / work` — averaging times, not rates, so that a
/// fast sample weighs no more than a slow one. Only evidence counts:
/// - a start predicted by the slot or KV wait, or less than
///   `calibration_min_tokens` of work, says nothing about the rate;
/// - an observation at or below the predicted non-prefill time (the decode
///   steps sharing the batches) carries no prefill time;
/// - one implying a rate outside `[prior·rate_min_factor,
///   prior·rate_max_factor]` is not a prefill (a chunk sent before it, an
///   end-to-end time, a stall) and is dropped;
/// - the rest counts as at most [`CALIBRATION_MAX_STEP`]× the current
///   estimate either way (outliers bound the step, not the estimate).
///
/// The same observations give the same rate whatever the worker, so
/// identical workers converge together.
pub fn calibrate(
    cfg: &ScoringConfig,
    current_rate: f64,
    predicted: &Prediction,
    observed_ms: f64,
) -> f64 {
    let work = predicted.work_tokens();
    // A start predicted by the slot or KV wait says nothing about the rate.
    let waited = predicted.wait_ms > 0.0 && predicted.queue_ms <= predicted.wait_ms;
    if !(observed_ms.is_finite() && observed_ms > 0.0)
        || work < f64::from(cfg.calibration_min_tokens)
        || waited
    {
        return current_rate;
    }
    let prefill_ms = observed_ms - predicted.non_prefill_ms();
    if prefill_ms <= 0.0 {
        return current_rate;
    }
    let (lo, hi) = (
        cfg.prefill_rate_prior * cfg.rate_min_factor,
        cfg.prefill_rate_prior * cfg.rate_max_factor,
    );
    let implied = 1000.0 * work / prefill_ms;
    if !(lo..=hi).contains(&implied) {
        return current_rate;
    }
    let current = if current_rate.is_finite() && current_rate > 0.0 {
        current_rate.clamp(lo, hi)
    } else {
        cfg.prefill_rate_prior
    };
    let per_token = 1000.0 / current;
    let sample = (prefill_ms / work).clamp(
        per_token / CALIBRATION_MAX_STEP,
        per_token * CALIBRATION_MAX_STEP,
    );
    let next = (1.0 - cfg.calibration_alpha) * per_token + cfg.calibration_alpha * sample;
    (1000.0 / next).clamp(lo, hi)
}

/// A prompt at least this new (share of its tokens neither cached nor seen
/// recently) starts a conversation or document: among the near ties it
/// goes to the smallest working set before the least loaded worker.
pub const NEW_PROMPT_SHARE: f64 = 0.5;

/// The `kvsteer` order of `candidates` (their predictions made): by cost,
/// then the near-ties by where the prompt was placed, load and what each
/// worker holds for others.
///
/// Prefill is the shared resource: a placement also delays the requests
/// that will queue behind it, about as many as wait for a first token on a
/// worker now (the mean backlog). Costs within the band of the best are
/// equally good: the least loaded of them goes first, then the one with
/// the least routed to it in the route window (the conversations active
/// there: room for this prompt's next turns), then the least placed on it
/// in the placement window, equal ones in rotation (`tie`), so
/// near-identical calibrated rates don't decide every cold pick. The band
/// is `tie_ratio`, wider for what is new: where a new conversation or
/// document lands decides where its follow-ups go, so its placement counts
/// for longer than its first token. For the same reason a prompt at least
/// [`NEW_PROMPT_SHARE`] new takes the smallest working set before the
/// least loaded worker: the load of the moment passes, the groups a worker
/// has taken on stay (`sim/BENCHMARKS-DIARY.md`, "4 Dec (late): lasting
/// queues and even placement"). Before both, though, goes a worker that
/// holds the most of the prompt and is idle (nothing running or waiting):
/// a new conversation whose shared system prompt sits on an idle worker
/// starts there, where its first token comes soonest and delays no one
/// at that moment (`sim/BENCHMARKS-DIARY.md`, "6 Dec (evening)": the
/// spread had started it cold beside an idle holder). And a prompt that no
/// worker holds more of than another (its cache reset or evicted
/// everywhere) goes first to the
/// worker it was placed on in the placement window, which also counts as
/// its holder for the lasting-queue rule while it keeps the prompt
/// ([`home_keeps`]): a group placed evenly stays even after its caches
/// were reset.
pub(super) fn order(
    cfg: &ScoringConfig,
    prompt: PromptTokens,
    views: &[WorkerView],
    candidates: &mut [Ranked],
    tie: impl Fn(&Ranked) -> usize,
) {
    let backlog = congestion(cfg, views, candidates);
    let new_share = prompt.new_share(views);
    let held = |r: &Ranked| gpu_held(prompt.prompt_tokens, &views[r.index]);
    let most_held = candidates.iter().map(held).max().unwrap_or(0);
    let least_held = candidates.iter().map(held).min().unwrap_or(0);
    let held_alike = most_held == least_held;
    // Cached nowhere (or alike everywhere), the prompt's home is where it
    // was placed: that worker holds it for the rules below.
    let placed = |r: &Ranked| views[r.index].placed_prompt_tokens;
    let most_placed = candidates.iter().map(placed).max().unwrap_or(0);
    let least_placed = candidates.iter().map(placed).min().unwrap_or(0);
    let has_home = held_alike && most_placed > least_placed;
    let holds = |r: &Ranked| {
        if held_alike {
            has_home && placed(r) == most_placed && home_keeps(&views[r.index])
        } else {
            held(r) == most_held
        }
    };
    let recompute = cfg.recompute_weight * (1.0 - new_share);
    // With `overload_holds`, a holder's queue is discounted as far as the
    // least lasting other queue lasts: where every queue lasts, none is
    // relief. That is the least of all unless the holder's is the least,
    // then the second least.
    let (least, second) = if cfg.overload_holds && candidates.len() > 1 {
        candidates
            .iter()
            .map(|r| (r.index, lasting(cfg, &views[r.index])))
            .fold(((usize::MAX, 1.0), 1.0), |(least, second), (i, l)| {
                if l < least.1 {
                    ((i, l), least.1)
                } else {
                    (least, second.min(l))
                }
            })
    } else {
        ((usize::MAX, 0.0), 0.0)
    };
    let others_last = |index: usize| if index == least.0 { second } else { least.1 };
    let cost = |r: &Ranked| {
        let again = f64::from(most_held - held(r));
        let burst = if holds(r) {
            let keep = (1.0 - lasting(cfg, &views[r.index])).max(others_last(r.index));
            keep * r.prediction.queue_ms
        } else {
            0.0
        };
        r.prediction.cost_ms(backlog) + recompute * again * r.prediction.ms_per_token() - burst
    };
    candidates.sort_by(|a, b| cost(a).total_cmp(&cost(b)));
    let band = cfg.tie_ratio.max(cfg.novel_spread * new_share);
    let best = candidates.first().map_or(0.0, cost);
    let near = candidates
        .iter()
        .take_while(|r| cost(r) <= best * (1.0 + band))
        .count();
    let starts_something = new_share >= NEW_PROMPT_SHARE;
    // A worker that holds the most of the prompt and has nothing running
    // or waiting: starting there costs no one a wait.
    let idle_holder =
        |r: &Ranked| !held_alike && held(r) == most_held && views[r.index].load() == 0.0;
    candidates[..near].sort_by(|a, b| {
        let (va, vb) = (&views[a.index], &views[b.index]);
        let keep = idle_holder(b).cmp(&idle_holder(a));
        let home = if has_home {
            placed(b).cmp(&placed(a))
        } else {
            std::cmp::Ordering::Equal
        };
        let load = va.load().total_cmp(&vb.load());
        let routed = va.routed_other_tokens.cmp(&vb.routed_other_tokens);
        let first = if starts_something {
            routed.then(load)
        } else {
            load.then(routed)
        };
        keep.then(home)
            .then(first)
            .then(va.placed_other_tokens.cmp(&vb.placed_other_tokens))
            .then_with(|| tie(a).cmp(&tie(b)))
    });
}

/// A cache whose indexed blocks fill this share of it evicts a block for
/// every block it stores.
pub const FULL_CACHE_SHARE: f64 = 0.9;

/// Whether a home (the worker a prompt cached nowhere was placed on)
/// still counts as its holder: its cache has room, so the prompt was lost
/// to a reset or a restart and the group placed there stays; or the prompt
/// was routed there within the route window, so its group is active there
/// and the copy was evicted moments ago. A full cache that has not seen
/// the prompt for a route window evicted it for good: it is as cold there
/// as anywhere.
fn home_keeps(w: &WorkerView) -> bool {
    has_room(w) || w.routed_prompt_tokens > 0
}

/// Whether the worker's cache has room: the index holds less than
/// [`FULL_CACHE_SHARE`] of its size (every tier counted). With the size
/// unknown (the engine does not export it) it has room.
fn has_room(w: &WorkerView) -> bool {
    let capacity = w.scraped.map_or(0.0, |s| s.kv_capacity_tokens);
    capacity <= 0.0 || (w.indexed_tokens as f64) < FULL_CACHE_SHARE * capacity
}

/// How much of a worker's queue counts as lasting (0..=1): its age as a
/// share of `lasting_queue_s`, in full when its age is unknown or the
/// setting is 0.
fn lasting(cfg: &ScoringConfig, w: &WorkerView) -> f64 {
    match w.queue_age_s {
        Some(age) if cfg.lasting_queue_s > 0.0 => (age / cfg.lasting_queue_s).clamp(0.0, 1.0),
        _ => 1.0,
    }
}

/// The number of requests a placement's prefill delays: the mean backlog
/// of the candidates, weighted by `congestion_weight`.
pub(super) fn congestion(cfg: &ScoringConfig, views: &[WorkerView], candidates: &[Ranked]) -> f64 {
    if candidates.is_empty() {
        return 0.0;
    }
    let total: f64 = candidates.iter().map(|r| views[r.index].backlog()).sum();
    cfg.congestion_weight * total / candidates.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DEFAULT_CONGESTION_WEIGHT, Policy};
    use crate::scoring::{PromptTokens, Rotation, ScrapedLoad, rank_views};

    const RATE: f64 = 10_000.0;
    const PROMPT: u32 = 8_192;
    const MATCHED: u32 = 6_144;

    fn cfg() -> ScoringConfig {
        ScoringConfig {
            prefill_rate_prior: RATE,
            // Exact crossovers: no near-tie band (rank's tests cover it) and
            // ranked by this request's TTFT alone (`busy_workers_keep_the_cache`
            // covers the congestion charge).
            tie_ratio: 0.0,
            congestion_weight: 0.0,
            // The holder's own queue age alone
            // (`overload_holds_keeps_the_request_while_every_queue_lasts`
            // covers the rule).
            overload_holds: false,
            ..Default::default()
        }
    }

    /// Holds most of the prompt, but has `queued` tokens of other prefills ahead.
    fn warm(queued: u64, running: u32) -> WorkerView {
        WorkerView {
            up: true,
            gpu_hit_tokens: MATCHED,
            in_flight: 4,
            unprefilled_tokens: queued,
            decoding: running,
            prefill_rate: RATE,
            ..Default::default()
        }
    }

    fn cold() -> WorkerView {
        WorkerView {
            up: true,
            prefill_rate: RATE,
            ..Default::default()
        }
    }

    fn choice(views: &[WorkerView]) -> usize {
        choice_with(&cfg(), views)
    }

    fn choice_with(cfg: &ScoringConfig, views: &[WorkerView]) -> usize {
        let t = Rotation {
            counter: 0,
            random: 0,
        };
        rank_views(Policy::Kvsteer, cfg, PromptTokens::seen(PROMPT), views, t)[0].index
    }

    #[test]
    fn components_add_up() {
        let p = predict(&cfg(), PROMPT, &warm(2_000, 10));
        assert_eq!(p.queue_ms, 200.0);
        assert_eq!(p.decode_ms, 10.0 * cfg().decode_ms_per_running);
        assert_eq!(p.prefill_ms, 1000.0 * f64::from(PROMPT - MATCHED) / RATE);
        assert_eq!(p.ttft_ms, p.queue_ms + p.decode_ms + p.prefill_ms);
    }

    #[test]
    fn fully_cached_prompt_still_prefills_one_token() {
        let mut w = cold();
        w.gpu_hit_tokens = PROMPT + 64;
        assert_eq!(predict(&cfg(), PROMPT, &w).uncached_tokens, 1.0);
        assert_eq!(predict(&cfg(), 0, &w).uncached_tokens, 0.0);
    }

    #[test]
    fn cpu_hits_save_less_than_gpu_hits() {
        let mut gpu = cold();
        gpu.gpu_hit_tokens = MATCHED;
        let mut cpu = cold();
        cpu.cpu_hit_tokens = MATCHED;
        let (g, c) = (predict(&cfg(), PROMPT, &gpu), predict(&cfg(), PROMPT, &cpu));
        let expected = f64::from(PROMPT) - f64::from(MATCHED) * cfg().cpu_hit_weight;
        assert_eq!(c.uncached_tokens, expected);
        assert!(g.ttft_ms < c.ttft_ms && c.ttft_ms < predict(&cfg(), PROMPT, &cold()).ttft_ms);
        assert_eq!(choice(&[cpu, gpu]), 1);
    }

    /// A group's prefix queued on a worker (picked, not yet prefilled) is
    /// cached there by the time a request sent behind it starts: the index
    /// shows nothing yet, but that worker's prefill is the question alone.
    #[test]
    fn a_prefix_queued_on_a_worker_counts_as_cached_there() {
        let queue = u64::from(PROMPT);
        let mut queued = cold();
        queued.unprefilled_tokens = queue;
        queued.held_hit_tokens = MATCHED;
        let p = predict(&cfg(), PROMPT, &queued);
        assert_eq!(p.uncached_tokens, f64::from(PROMPT - MATCHED));
        assert_eq!(p.queue_ms, 1000.0 * queue as f64 / RATE);
        // Behind the queue with the prefix beats an idle worker only while
        // the queue is shorter than the prefix it brings.
        let idle = cold();
        assert_eq!(choice(&[idle, queued]), 0);
        queued.unprefilled_tokens = u64::from(MATCHED) - 64;
        assert_eq!(choice(&[idle, queued]), 1);
        // A cached prefix and a queued one are not added: the longer counts,
        // and CPU-held blocks beyond it still count at their weight.
        let mut both = cold();
        both.gpu_hit_tokens = 1_024;
        both.cpu_hit_tokens = 4_096;
        both.held_hit_tokens = 2_048;
        let p = predict(&cfg(), PROMPT, &both);
        let cpu = f64::from(1_024 + 4_096 - 2_048) * cfg().cpu_hit_weight;
        assert_eq!(p.uncached_tokens, f64::from(PROMPT - 2_048) - cpu);
    }

    /// Warm-but-busy vs cold-and-idle: the warm worker wins while the work
    /// queued on it costs less than the prefill it saves.
    ///   warm: (Q + P − M)/r + R·d      cold: P/r
    ///   warm wins ⇔ Q < M − R·d·r/1000
    #[test]
    fn warm_saturated_vs_cold_idle_crossover() {
        let running = 20;
        let d = cfg().decode_ms_per_running;
        let crossover = f64::from(MATCHED) - f64::from(running) * d * RATE / 1000.0;
        assert!(crossover > 0.0);
        let below = (crossover - 16.0) as u64;
        let above = (crossover + 16.0) as u64;
        assert_eq!(choice(&[warm(below, running), cold()]), 0);
        assert_eq!(choice(&[warm(above, running), cold()]), 1);
        // Without running sequences the crossover is exactly the matched tokens.
        assert_eq!(choice(&[warm(u64::from(MATCHED) - 1, 0), cold()]), 0);
        assert_eq!(choice(&[warm(u64::from(MATCHED) + 1, 0), cold()]), 1);
    }

    #[test]
    fn scraped_queue_counts_when_larger_than_ours() {
        let mut w = warm(0, 0);
        w.scraped = Some(ScrapedLoad {
            waiting: 8.0,
            running: 30.0,
            kv_usage: 0.9,
            ..ScrapedLoad::default()
        });
        let p = predict(&cfg(), PROMPT, &w);
        assert_eq!(
            p.queued_tokens,
            8.0 * f64::from(cfg().waiting_request_tokens)
        );
        assert_eq!(p.decode_ms, 30.0 * cfg().decode_ms_per_running);
        // A larger local count wins over the scrape (no double counting).
        w.unprefilled_tokens = 100_000;
        assert_eq!(predict(&cfg(), PROMPT, &w).queued_tokens, 100_000.0);
    }

    /// A worker whose slots are all taken: the new request waits for
    /// (waiting + 1) slots to free, one every slot_time / running.
    #[test]
    fn full_slots_make_the_warm_worker_wait() {
        let mut w = warm(0, 0);
        let mut load = ScrapedLoad {
            waiting: 6.0,
            running: f64::from(cfg().max_num_seqs),
            ..ScrapedLoad::default()
        };
        let running = load.running;
        load.e2e.mean = Some(100.5);
        load.ttft.mean = Some(0.5);
        w.scraped = Some(load);
        let p = predict(&cfg(), PROMPT, &w);
        assert_eq!(p.queue_ms, 1000.0 * 7.0 * 100.0 / running);
        assert_eq!(choice(&[w, cold()]), 1);
        // The same queue with free slots and blocks is a token-budget queue:
        // no slot term.
        let mut budget = load;
        budget.running = running - 1.0;
        w.scraped = Some(budget);
        let p = predict(&cfg(), PROMPT, &w);
        assert_eq!(p.queue_ms, 1000.0 * p.queued_tokens / RATE);
        // Full KV cache with free slots: waits for blocks.
        budget.kv_usage = 0.99;
        w.scraped = Some(budget);
        assert!(predict(&cfg(), PROMPT, &w).queue_ms > 1000.0);
        // Slots free again (nobody waiting): the cache wins.
        load.waiting = 0.0;
        w.scraped = Some(load);
        assert_eq!(choice(&[w, cold()]), 0);
        // No latency observed yet: no slot term, only the token queue.
        load.waiting = 6.0;
        load.e2e.mean = None;
        w.scraped = Some(load);
        let p = predict(&cfg(), PROMPT, &w);
        assert_eq!(p.queue_ms, 1000.0 * p.queued_tokens / RATE);
    }

    /// A cache of 10,000 tokens, `usage` of it held by running requests that
    /// keep it 10 s after their first token.
    fn kv(usage: f64) -> ScrapedLoad {
        let mut load = ScrapedLoad {
            running: 4.0,
            kv_usage: usage,
            kv_capacity_tokens: 10_000.0,
            ..ScrapedLoad::default()
        };
        load.e2e.mean = Some(10.5);
        load.ttft.mean = Some(0.5);
        load
    }

    /// Tokens that do not fit in the free cache wait for running requests
    /// to release theirs: used / slot_time tokens per second.
    #[test]
    fn blocks_that_do_not_fit_wait_for_running_requests() {
        let mut full = cold();
        full.scraped = Some(kv(0.9));
        let p = predict(&cfg(), PROMPT, &full);
        let short = f64::from(PROMPT) - 1_000.0;
        assert!((p.wait_ms - 1000.0 * short * 10.0 / 9_000.0).abs() < 1e-6);
        assert_eq!(p.queue_ms, p.wait_ms);
        // Free blocks for the whole prompt: no wait.
        let mut empty = cold();
        empty.scraped = Some(kv(0.1));
        assert_eq!(predict(&cfg(), PROMPT, &empty).wait_ms, 0.0);
        // The emptier cache wins between two idle cold workers, though
        // neither has a prefill queue.
        assert_eq!(choice(&[full, empty]), 1);
        // Prefills queued ahead need blocks first.
        let mut queued = empty;
        queued.unprefilled_tokens = 4_000;
        assert!(predict(&cfg(), PROMPT, &queued).wait_ms > 0.0);
        // A warm prompt whose cached blocks a request in flight there holds
        // (already in the used part) needs blocks for its uncached part only.
        let mut warm_full = warm(0, 0);
        warm_full.held_hit_tokens = MATCHED;
        warm_full.scraped = Some(kv(0.9));
        let w = predict(&cfg(), PROMPT, &warm_full);
        assert!(w.wait_ms < p.wait_ms && w.ttft_ms < p.ttft_ms);
        // Cached blocks nothing holds are in the free part until it takes
        // them: it needs blocks for the whole prompt, as cold, and only its
        // prefill is shorter.
        warm_full.held_hit_tokens = 0;
        let idle = predict(&cfg(), PROMPT, &warm_full);
        assert_eq!(idle.wait_ms, p.wait_ms);
        assert!(idle.prefill_ms < p.prefill_ms);
        // Held in part: the rest of the cached blocks count.
        warm_full.held_hit_tokens = MATCHED / 2;
        let half = predict(&cfg(), PROMPT, &warm_full);
        let expect = 1000.0 * (f64::from(PROMPT - MATCHED / 2) - 1_000.0) * 10.0 / 9_000.0;
        assert!((half.wait_ms - expect).abs() < 1e-6, "{half:?}");
        // Cache size not exported: only the kv_full_threshold slot rule.
        let mut unknown = kv(0.9);
        unknown.kv_capacity_tokens = 0.0;
        full.scraped = Some(unknown);
        assert_eq!(predict(&cfg(), PROMPT, &full).wait_ms, 0.0);
    }

    /// Near saturation a cache miss is prefill taken from everyone queued:
    /// the warm worker keeps the request although the cold one would give
    /// it an earlier first token.
    #[test]
    fn busy_workers_keep_the_cache() {
        let queued = u64::from(MATCHED) + 1_000;
        let views = |backlog: u32| {
            let mut busy_cold = cold();
            busy_cold.in_flight = backlog;
            let mut w = warm(queued, 0);
            w.in_flight = backlog;
            vec![w, busy_cold, busy_cold, cold()]
        };
        let congested = ScoringConfig {
            congestion_weight: DEFAULT_CONGESTION_WEIGHT,
            ..cfg()
        };
        // Nobody waiting: a cold worker gives the earlier TTFT and wins.
        let idle = views(0);
        let ttft = |v: &WorkerView| predict(&congested, PROMPT, v).ttft_ms;
        assert!(ttft(&idle[3]) < ttft(&idle[0]));
        assert_ne!(choice_with(&congested, &idle), 0);
        // Two requests waiting for their first token on most workers: the
        // 6,144 tokens a miss adds delay them, and the cache wins.
        assert_eq!(choice_with(&congested, &views(2)), 0);
        // Ranked by this request's TTFT alone, it would spill.
        assert_eq!(choice(&views(2)), 3);
    }

    /// A prefix cached on one worker and computed again on another is
    /// prefilled twice: with `recompute_weight` the cold worker is charged
    /// that work, so a warm worker a little slower keeps the request; a
    /// much slower one still loses it. A prefix cached nowhere costs nothing.
    #[test]
    fn computing_a_held_prefix_again_is_charged() {
        let recompute = ScoringConfig {
            recompute_weight: 1.0,
            ..cfg()
        };
        // Warm: 7,000 queued tokens + 2,048 to prefill (904.8 ms) against
        // cold: 8,192 (819.2 ms), + 614.4 ms for the 6,144 held on worker 0.
        let views = [warm(7_000, 0), cold()];
        assert_eq!(choice(&views), 1);
        assert_eq!(choice_with(&recompute, &views), 0);
        // Warm behind 14,000 queued tokens (1,604.8 ms): the cold worker wins.
        assert_eq!(choice_with(&recompute, &[warm(14_000, 0), cold()]), 1);
        // Held nowhere: nothing to charge, the earlier first token wins.
        let mut busy = cold();
        busy.unprefilled_tokens = 1_000;
        assert_eq!(choice_with(&recompute, &[busy, cold()]), 1);
        // A request queued there holds it too.
        let mut queued = busy;
        queued.held_hit_tokens = MATCHED;
        queued.unprefilled_tokens = 7_000;
        assert_eq!(choice(&[queued, cold()]), 1);
        assert_eq!(choice_with(&recompute, &[queued, cold()]), 0);
    }

    /// The charge fades with the prompt's new share: a conversation's first
    /// turn that shares only a system prompt with the holder's traffic goes
    /// where its first token comes soonest; the same prompt seen before stays.
    #[test]
    fn the_recompute_charge_fades_for_new_prompts() {
        let recompute = ScoringConfig {
            recompute_weight: 1.0,
            novel_spread: 0.0,
            ..cfg()
        };
        // Holds 1,024 of 8,192 tokens behind 1,500 queued: 150 + 716.8 ms,
        // against 819.2 ms cold (+ 102.4 ms for the 1,024 when charged whole).
        let mut holder = cold();
        holder.gpu_hit_tokens = 1_024;
        holder.unprefilled_tokens = 1_500;
        let views = [holder, cold()];
        let pick = |prompt| {
            let t = Rotation {
                counter: 0,
                random: 0,
            };
            rank_views(Policy::Kvsteer, &recompute, prompt, &views, t)[0].index
        };
        assert_eq!(pick(PromptTokens::seen(PROMPT)), 0);
        // 7/8 of it new: 12.8 ms charged, the cold worker is sooner.
        assert_eq!(pick(PromptTokens::unseen(PROMPT)), 1);
    }

    /// A holder's queue counts against keeping the prompt only as far as it
    /// has lasted: a burst keeps the request on its prefix, a queue of
    /// `lasting_queue_s` or more (or of unknown age) moves it as before.
    /// Workers holding no more than the others are never discounted.
    #[test]
    fn a_burst_on_the_holder_keeps_the_request_a_lasting_queue_moves_it() {
        let lasting = cfg();
        assert_eq!(lasting.lasting_queue_s, 10.0);
        let off = ScoringConfig {
            lasting_queue_s: 0.0,
            ..cfg()
        };
        // Warm behind 7,000 queued tokens: 700 + 204.8 ms, cold 819.2 ms.
        let aged = |age| {
            let mut w = warm(7_000, 0);
            w.queue_age_s = age;
            [w, cold()]
        };
        assert_eq!(choice_with(&off, &aged(Some(1.0))), 1, "off: in full");
        assert_eq!(
            choice_with(&lasting, &aged(Some(1.0))),
            0,
            "a burst: 70 ms counted"
        );
        assert_eq!(
            choice_with(&lasting, &aged(Some(5.0))),
            0,
            "half of it: 350 ms"
        );
        assert_eq!(
            choice_with(&lasting, &aged(Some(10.0))),
            1,
            "lasted: in full"
        );
        assert_eq!(choice_with(&lasting, &aged(Some(60.0))), 1);
        assert_eq!(
            choice_with(&lasting, &aged(None)),
            1,
            "unknown age: in full"
        );
        // Nobody holds more than the others: the younger queue gets no
        // discount, the shorter one wins.
        let mut young = cold();
        young.unprefilled_tokens = 3_000;
        young.queue_age_s = Some(0.5);
        let mut old = cold();
        old.unprefilled_tokens = 2_000;
        old.queue_age_s = Some(30.0);
        assert_eq!(choice_with(&lasting, &[young, old]), 1);
    }

    /// With `overload_holds`, a holder whose queue lasts keeps the request
    /// while every other candidate's queue lasts too (moving it would
    /// prefill its prefix again and relieve nobody); a worker with no queue,
    /// or a young one, still draws it.
    #[test]
    fn overload_holds_keeps_the_request_while_every_queue_lasts() {
        let holds = ScoringConfig {
            overload_holds: true,
            ..cfg()
        };
        // Warm behind 9,000 queued tokens for a minute: 900 + 204.8 ms.
        let mut holder = warm(9_000, 0);
        holder.queue_age_s = Some(60.0);
        // Cold behind 2,500 tokens: 250 + 819.2 ms.
        let other = |age| {
            let mut w = cold();
            w.unprefilled_tokens = 2_500;
            w.queue_age_s = age;
            w
        };
        let lasted = [holder, other(Some(60.0))];
        assert_eq!(choice_with(&cfg(), &lasted), 1, "off: the queue moves it");
        assert_eq!(choice_with(&holds, &lasted), 0, "every queue lasts");
        assert_eq!(
            choice_with(&holds, &[holder, other(None)]),
            0,
            "a queue of unknown age counts as lasting"
        );
        // A young queue elsewhere counts for its age's share: 45 ms of the
        // holder's 900 discounted still keeps it (1,059.8 against 1,069.2 ms);
        // an idle worker (819.2 ms) draws the request.
        assert_eq!(choice_with(&holds, &[holder, other(Some(0.5))]), 0);
        let mut idle = cold();
        idle.queue_age_s = Some(0.0);
        assert_eq!(choice_with(&holds, &[holder, idle]), 1);
        // The least lasting other queue decides: one idle worker among
        // lasting queues takes it.
        assert_eq!(choice_with(&holds, &[holder, other(Some(60.0)), idle]), 2);
    }

    /// Past saturation the congestion charge must not freeze the traffic
    /// where it is: the warm worker's queue and the mean backlog grow
    /// together, and with the default weight the predicted wait outgrows
    /// the charge, so an overloaded worker loses its excess to idle ones.
    /// With weight 2 the charge grows faster and the warm worker keeps
    /// everything however long its queue (how `--groups 30` collapsed).
    #[test]
    fn an_overloaded_worker_loses_its_excess() {
        // `queued` requests waiting on the warm worker, each with a
        // question (the prompt minus the shared prefix) still to prefill.
        let views = |queued: u32| {
            let mut w = warm(u64::from(queued) * u64::from(PROMPT - MATCHED), 0);
            w.in_flight = queued;
            vec![w, cold(), cold(), cold()]
        };
        let weight = |congestion_weight| ScoringConfig {
            congestion_weight,
            ..cfg()
        };
        let default = weight(DEFAULT_CONGESTION_WEIGHT);
        assert_eq!(choice_with(&default, &views(8)), 0);
        for queued in [16, 64, 1_000] {
            assert_ne!(choice_with(&default, &views(queued)), 0, "{queued} queued");
        }
        // Half the weight moves it sooner: a queue that comes and goes at
        // capacity already moves the group (a prefix prefilled again).
        assert_ne!(choice_with(&weight(0.5), &views(8)), 0);
        for queued in [8, 64, 1_000] {
            assert_eq!(choice_with(&weight(2.0), &views(queued)), 0);
        }
    }

    /// A worker whose KV cache is full of recently routed prompts: a prompt
    /// placed there evicts what it adds to that working set, and the
    /// eviction is charged (not predicted as this request's TTFT).
    #[test]
    fn evicting_recently_routed_prompts_is_charged() {
        let scraped = ScrapedLoad {
            kv_capacity_tokens: 20_000.0,
            ..ScrapedLoad::default()
        };
        let mut full = cold();
        full.scraped = Some(scraped);
        full.routed_other_tokens = 18_000;
        let p = predict(&cfg(), PROMPT, &full);
        let over = 18_000.0 + f64::from(PROMPT) - 20_000.0;
        assert_eq!(p.evicted_tokens, over);
        assert_eq!(p.evict_ms, 1000.0 * over / RATE);
        assert_eq!(p.cost_ms(0.0), p.ttft_ms + p.evict_ms);
        assert_eq!(p.ttft_ms, predict(&cfg(), PROMPT, &cold()).ttft_ms);
        // Room for it: nothing evicted. At most what the prompt adds.
        let mut roomy = full;
        roomy.routed_other_tokens = 10_000;
        assert_eq!(predict(&cfg(), PROMPT, &roomy).evicted_tokens, 0.0);
        let mut crammed = full;
        crammed.routed_other_tokens = 90_000;
        assert_eq!(
            predict(&cfg(), PROMPT, &crammed).evicted_tokens,
            f64::from(PROMPT)
        );
        // The prompt was routed there before (its cache since evicted): it
        // comes back to its own working set, which costs nobody else.
        let mut home = full;
        home.routed_prompt_tokens = PROMPT - 800;
        assert_eq!(predict(&cfg(), PROMPT, &home).evicted_tokens, 800.0);
        // Cold everywhere: home wins over the full stranger, and an empty
        // worker wins over both.
        assert_eq!(choice(&[full, home]), 1);
        let mut empty = cold();
        empty.scraped = Some(scraped);
        assert_eq!(choice(&[full, home, empty]), 2);
        // Cache size unknown.
        let mut unknown = full;
        unknown.scraped = Some(ScrapedLoad::default());
        assert_eq!(predict(&cfg(), PROMPT, &unknown).evicted_tokens, 0.0);
    }

    #[test]
    fn slower_calibrated_rate_moves_the_choice() {
        let mut slow = cold();
        slow.prefill_rate = RATE / 4.0;
        let mut warm_slow = warm(0, 0);
        warm_slow.prefill_rate = RATE / 4.0;
        // Uncached 2048 tokens at rate/4 (819 ms) vs 8192 at rate (819 ms): tie
        // broken by load; one block more cached decides.
        warm_slow.gpu_hit_tokens = MATCHED + 16;
        assert_eq!(choice(&[warm_slow, cold()]), 0);
        assert_eq!(choice(&[slow, cold()]), 1);
    }

    #[test]
    fn calibration_moves_the_per_token_time_towards_the_observation() {
        let c = cfg();
        let p = predict(&c, PROMPT, &cold());
        // Observed twice as slow as predicted: the per-token time moves by
        // alpha towards twice itself.
        let next = calibrate(&c, RATE, &p, 2.0 * p.ttft_ms);
        let expected = RATE / (1.0 + c.calibration_alpha);
        assert!((next - expected).abs() < 1e-6, "{next} vs {expected}");
        // As observed: no change.
        assert!((calibrate(&c, RATE, &p, p.ttft_ms) - RATE).abs() < 1e-6);
        // Three times as slow counts as twice: one sample's step is bounded.
        assert!((calibrate(&c, RATE, &p, 3.0 * p.ttft_ms) - expected).abs() < 1e-6);
        // A start predicted by the wait for blocks or slots: unchanged.
        let waited = Prediction {
            queue_ms: 5_000.0,
            wait_ms: 5_000.0,
            ..p
        };
        assert_eq!(calibrate(&c, RATE, &waited, 2.0 * p.ttft_ms), RATE);
        // Too little work to tell, or nonsense: unchanged.
        let tiny = predict(&c, 8, &cold());
        assert_eq!(calibrate(&c, RATE, &tiny, 500.0), RATE);
        assert_eq!(calibrate(&c, RATE, &p, f64::NAN), RATE);
    }

    /// What is not a prefill time does not move the rate: a first token
    /// sooner than the decode steps ahead of it, one implying a rate beyond
    /// the clamp (a chunk sent before the prefill), an end-to-end time.
    #[test]
    fn samples_without_a_prefill_time_are_dropped() {
        let c = cfg();
        let mut busy = cold();
        busy.decoding = 200;
        let p = predict(&c, PROMPT, &busy);
        assert_eq!(p.non_prefill_ms(), 100.0);
        let mut r = RATE;
        for observed in [0.001, 50.0, 100.0, 1e9, 60.0 * p.ttft_ms] {
            r = calibrate(&c, r, &p, observed);
            assert_eq!(r, RATE, "after {observed} ms");
        }
    }

    /// The issue's failure: samples that are not prefill times pinned
    /// identical workers at the two clamp bounds. A few bad samples that do
    /// pass the checks (within the clamp) move the rate by a bounded step,
    /// never to a bound, and it comes back.
    #[test]
    fn a_few_bad_samples_do_not_pin_the_rate() {
        let c = cfg();
        let p = predict(&c, PROMPT, &cold());
        let (lo, hi) = (RATE * c.rate_min_factor, RATE * c.rate_max_factor);
        let mut r = RATE;
        // Just inside the bounds: 3.9× too slow, then 3.9× too fast.
        for _ in 0..3 {
            r = calibrate(&c, r, &p, 3.9 * p.ttft_ms);
        }
        assert!(r > RATE / 1.5 && r > lo * 1.5, "{r}");
        r = RATE;
        for _ in 0..3 {
            r = calibrate(&c, r, &p, p.ttft_ms / 3.9);
        }
        assert!(r < RATE * 1.5 && r < hi / 1.5, "{r}");
        for _ in 0..40 {
            r = calibrate(&c, r, &p, p.ttft_ms);
        }
        assert!((r / RATE - 1.0).abs() < 0.02, "{r}");
    }

    /// Identical workers fed different noisy samples of the same true rate
    /// (±30 %, with an occasional sample that is not a prefill time) end
    /// within 20 % of each other and of the truth, starting from a prior
    /// off by half.
    #[test]
    fn identical_workers_converge_to_the_true_rate() {
        let c = ScoringConfig {
            prefill_rate_prior: RATE / 2.0,
            ..cfg()
        };
        let truth = RATE;
        let p = predict(&c, PROMPT, &cold());
        let true_ms = 1000.0 * p.work_tokens() / truth;
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut noise = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % 1_000) as f64 / 1_000.0
        };
        let rates: Vec<f64> = (0..3)
            .map(|_| {
                let mut r = c.prefill_rate_prior;
                for i in 0..40 {
                    let observed = match i % 10 {
                        // A role chunk sent before the prefill, and an
                        // end-to-end time: not prefill times.
                        3 => 0.5,
                        7 => 40.0 * true_ms,
                        _ => true_ms * (0.7 + 0.6 * noise()),
                    };
                    r = calibrate(&c, r, &p, observed);
                }
                r
            })
            .collect();
        for r in &rates {
            assert!((r / truth - 1.0).abs() < 0.2, "{rates:?}");
        }
        let (min, max) = rates
            .iter()
            .fold((f64::MAX, 0.0_f64), |(a, b), &r| (a.min(r), b.max(r)));
        assert!(max / min < 1.2, "{rates:?}");
    }
}
