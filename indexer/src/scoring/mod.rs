//! Scoring: pure functions from a view of every worker to an ordered list of
//! choices. No clocks, no locks, no I/O: the picker builds the views.
//!
//! Every policy gets the same [`WorkerView`]s and every candidate gets a
//! [`Prediction`] (so the predicted TTFT is reported whatever the policy);
//! the policy only decides the order.

mod baselines;
pub mod kvsteer;

use crate::config::{Policy, ScoringConfig};

pub use kvsteer::{Prediction, calibrate, predict};

/// What the picker knows about one worker at pick time.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WorkerView {
    /// False when its metrics endpoint stopped answering.
    pub up: bool,
    /// Prompt tokens held in GPU memory (whole blocks).
    pub gpu_hit_tokens: u32,
    /// Further prompt tokens held in CPU memory (offloaded blocks).
    pub cpu_hit_tokens: u32,
    /// Leading prompt tokens of a request picked for it that has not ended
    /// (the ledger's prompts in flight): cached by the time this one's
    /// prefill starts (one with no first token yet prefills them first), and
    /// referenced by the engine while that one runs, so they count in its
    /// used KV cache.
    pub held_hit_tokens: u32,
    /// Requests picked for it and not yet done.
    pub in_flight: u32,
    /// Uncached prompt tokens of requests picked for it that have no first token yet.
    pub unprefilled_tokens: u64,
    /// Requests picked for it that are past their first token.
    pub decoding: u32,
    /// Last scrape of its `/metrics`, when it has one.
    pub scraped: Option<ScrapedLoad>,
    /// Calibrated prefill throughput, tokens/s.
    pub prefill_rate: f64,
    /// This prompt's tokens we routed to it recently (whole blocks; see
    /// `routes::RouteMemory`), cached there or not.
    pub routed_prompt_tokens: u32,
    /// Other prompts' tokens we routed to it recently: the working set its
    /// cache would have to hold for those requests' next turns to hit.
    pub routed_other_tokens: u64,
    /// This prompt's tokens routed to it within `placement_window_s`
    /// (whole blocks), cached there or not: where its conversation or
    /// document was placed.
    pub placed_prompt_tokens: u32,
    /// Other prompts' tokens routed to it within `placement_window_s`: the
    /// conversations and documents it has taken on, cached there or not.
    pub placed_other_tokens: u64,
    /// Tokens the index holds for it (whole blocks, every tier): how full
    /// its cache is.
    pub indexed_tokens: u64,
    /// Seconds since a committed pick last found it without a first-token
    /// backlog (0: it has none now); `None` when none has, which counts as
    /// a lasting queue.
    pub queue_age_s: Option<f64>,
}

/// The engine's own view of its load (vLLM gauges).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ScrapedLoad {
    pub waiting: f64,
    pub running: f64,
    pub kv_usage: f64,
    /// KV cache size in tokens (`vllm:cache_config_info`: `num_gpu_blocks`
    /// × `block_size`); 0 when the engine does not export it.
    pub kv_capacity_tokens: f64,
    /// `vllm:e2e_request_latency_seconds`: time from arrival to the end.
    pub e2e: HistogramMean,
    /// `vllm:time_to_first_token_seconds`: time from arrival to the first token.
    pub ttft: HistogramMean,
}

/// A cumulative latency histogram's sum and count, and the recent mean of
/// the observations (from its growth between scrapes).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HistogramMean {
    pub sum: f64,
    pub count: f64,
    /// `None` until something was observed.
    pub mean: Option<f64>,
}

/// Weight of the newest scrape interval in a histogram's recent mean.
pub const MEAN_ALPHA: f64 = 0.3;

impl HistogramMean {
    /// Sets the recent mean after a scrape, from `prev` (the previous
    /// scrape): what was observed in between moves it by [`MEAN_ALPHA`].
    ///
    /// The first scrape (`prev` is `None`: the indexer just started or
    /// just met the worker) only sets the baseline: the histogram's
    /// lifetime holds whatever the engine served before, maybe hours of
    /// another load, so the mean starts with the first interval that
    /// observes something. A histogram that went back means the engine
    /// restarted: everything in it is recent, so its lifetime mean starts
    /// over.
    pub fn follow(&mut self, prev: Option<&HistogramMean>) {
        self.mean = match prev {
            None => None,
            Some(p) if self.count < p.count || self.sum < p.sum => {
                (self.count > 0.0).then(|| self.sum / self.count)
            }
            Some(p) if self.count == p.count => p.mean,
            Some(p) => {
                let sample = (self.sum - p.sum) / (self.count - p.count);
                Some(p.mean.map_or(sample, |m| m + MEAN_ALPHA * (sample - m)))
            }
        };
    }
}

impl ScrapedLoad {
    /// How long a request holds a running slot after its first token
    /// (mean end-to-end latency minus mean TTFT), in seconds.
    pub fn slot_time_s(&self) -> Option<f64> {
        Some((self.e2e.mean? - self.ttft.mean?).max(0.0))
    }
}

/// A choice: the worker's position in the views and its prediction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ranked {
    pub index: usize,
    pub prediction: Prediction,
}

/// The prompt being placed, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PromptTokens {
    pub prompt_tokens: u32,
    /// Its tokens already in a prompt routed within `placement_window_s`
    /// (to any worker), cached anywhere now or not.
    pub seen_tokens: u32,
}

/// The pick's place in the stateful policies' rotation (round robin, the
/// tie-break) and its `random` draw, chosen by the caller so that a dry
/// run can leave the service's state alone.
#[derive(Debug, Clone, Copy)]
pub struct Rotation {
    /// Round-robin position and tie-break rotation.
    pub counter: usize,
    /// Seed for the `random` policy.
    pub random: u64,
}

// === impl PromptTokens ===

impl PromptTokens {
    /// A prompt whose prefix nobody has seen: nothing is known of it.
    pub fn unseen(prompt_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            seen_tokens: 0,
        }
    }

    /// A prompt seen before in full (the next turn of a conversation
    /// whose prompt is already known, a retry).
    pub fn seen(prompt_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            seen_tokens: prompt_tokens,
        }
    }

    /// The share of the prompt (0..=1) neither seen before nor cached on
    /// any worker: what this request starts.
    pub fn new_share(&self, views: &[WorkerView]) -> f64 {
        if self.prompt_tokens == 0 {
            return 0.0;
        }
        let known = views
            .iter()
            .map(WorkerView::matched_tokens)
            .fold(self.seen_tokens, u32::max)
            .min(self.prompt_tokens);
        f64::from(self.prompt_tokens - known) / f64::from(self.prompt_tokens)
    }
}

// === impl WorkerView ===

impl WorkerView {
    pub fn matched_tokens(&self) -> u32 {
        self.gpu_hit_tokens.saturating_add(self.cpu_hit_tokens)
    }

    /// Requests on the worker as far as anyone knows: our own in-flight
    /// count, or the engine's waiting + running when that is larger.
    pub fn load(&self) -> f64 {
        let scraped = self.scraped.map_or(0.0, |s| s.waiting + s.running);
        f64::from(self.in_flight).max(scraped)
    }

    /// Requests on the worker still waiting for their first token: ours
    /// that have none yet, or the engine's waiting queue when that is larger.
    pub fn backlog(&self) -> f64 {
        let ours = f64::from(self.in_flight.saturating_sub(self.decoding));
        ours.max(self.scraped.map_or(0.0, |s| s.waiting.max(0.0)))
    }
}

/// Every worker's prediction for a prompt of `prompt_tokens`, in view
/// order (what [`rank`] orders and the picker reports).
pub fn predict_all(
    cfg: &ScoringConfig,
    prompt_tokens: u32,
    views: &[WorkerView],
) -> Vec<Prediction> {
    views
        .iter()
        .map(|v| predict(cfg, prompt_tokens, v))
        .collect()
}

/// Orders the workers for `prompt`, best first, at most
/// `cfg.max_endpoints` of them. `predictions` are the workers' (from
/// [`predict_all`], in view order). Workers that are down are left out
/// unless all are down (then all are candidates: fail open).
pub fn rank(
    policy: Policy,
    cfg: &ScoringConfig,
    prompt: PromptTokens,
    views: &[WorkerView],
    predictions: &[Prediction],
    rotation: Rotation,
) -> Vec<Ranked> {
    let any_up = views.iter().any(|v| v.up);
    let mut candidates: Vec<Ranked> = views
        .iter()
        .zip(predictions)
        .enumerate()
        .filter(|(_, (v, _))| v.up || !any_up)
        .map(|(index, (_, &prediction))| Ranked { index, prediction })
        .collect();
    let n = views.len().max(1);
    // Rotating tie-break so that equal candidates share the traffic.
    let tie = |r: &Ranked| (r.index + n - rotation.counter % n) % n;
    match policy {
        Policy::Kvsteer => kvsteer::order(cfg, prompt, views, &mut candidates, tie),
        Policy::LeastRequest => baselines::least_request(&mut candidates, views, tie),
        Policy::PrefixOnly => baselines::prefix_only(&mut candidates, views, tie),
        Policy::RoundRobin => candidates.sort_by_key(tie),
        Policy::Random => baselines::shuffle(&mut candidates, rotation.random),
    }
    candidates.truncate(cfg.max_endpoints as usize);
    candidates
}

/// [`rank`] with the predictions made here (tests).
#[cfg(test)]
pub(crate) fn rank_views(
    policy: Policy,
    cfg: &ScoringConfig,
    prompt: PromptTokens,
    views: &[WorkerView],
    rotation: Rotation,
) -> Vec<Ranked> {
    let predictions = predict_all(cfg, prompt.prompt_tokens, views);
    rank(policy, cfg, prompt, views, &predictions, rotation)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No request waiting on it, as a pick finds an idle worker (its
    /// queue's age is 0: see `picker::queue_age`).
    fn idle(rate: f64) -> WorkerView {
        WorkerView {
            up: true,
            prefill_rate: rate,
            queue_age_s: Some(0.0),
            ..Default::default()
        }
    }

    fn turn(counter: usize) -> Rotation {
        Rotation {
            counter,
            random: counter as u64,
        }
    }

    fn order(policy: Policy, views: &[WorkerView], counter: usize) -> Vec<usize> {
        order_for(policy, PromptTokens::seen(1000), views, counter)
    }

    /// `rank` of `prompt` by `policy` with the default scoring: the
    /// workers' indices, best first.
    fn order_for(
        policy: Policy,
        prompt: PromptTokens,
        views: &[WorkerView],
        counter: usize,
    ) -> Vec<usize> {
        rank_views(
            policy,
            &ScoringConfig::default(),
            prompt,
            views,
            turn(counter),
        )
        .iter()
        .map(|r| r.index)
        .collect()
    }

    #[test]
    fn down_workers_are_skipped_unless_all_are_down() {
        let mut views = vec![idle(1000.0); 3];
        views[0].up = false;
        assert_eq!(order(Policy::Kvsteer, &views, 0), vec![1, 2]);
        for v in &mut views {
            v.up = false;
        }
        assert_eq!(order(Policy::Kvsteer, &views, 0).len(), 3);
    }

    #[test]
    fn at_most_max_endpoints() {
        let views = vec![idle(1000.0); 5];
        assert_eq!(order(Policy::Kvsteer, &views, 0).len(), 3);
        assert!(
            rank_views(
                Policy::Kvsteer,
                &ScoringConfig::default(),
                PromptTokens::unseen(10),
                &[],
                turn(0)
            )
            .is_empty()
        );
    }

    #[test]
    fn round_robin_rotates() {
        let views = vec![idle(1000.0); 3];
        assert_eq!(order(Policy::RoundRobin, &views, 0), vec![0, 1, 2]);
        assert_eq!(order(Policy::RoundRobin, &views, 1), vec![1, 2, 0]);
        assert_eq!(order(Policy::RoundRobin, &views, 5), vec![2, 0, 1]);
    }

    #[test]
    fn equal_kvsteer_candidates_share_traffic() {
        let views = vec![idle(1000.0); 3];
        let firsts: std::collections::HashSet<_> = (0..3)
            .map(|c| order(Policy::Kvsteer, &views, c)[0])
            .collect();
        assert_eq!(firsts.len(), 3);
    }

    #[test]
    fn near_equal_kvsteer_candidates_share_traffic_and_clear_winners_win() {
        // Calibrated rates 2 % apart: a tie within tie_ratio, so rotation decides.
        let views = vec![idle(1000.0), idle(1020.0), idle(1010.0)];
        let firsts: std::collections::HashSet<_> = (0..3)
            .map(|c| order(Policy::Kvsteer, &views, c)[0])
            .collect();
        assert_eq!(firsts.len(), 3);
        // Among the near-ties the least loaded goes first.
        let mut loaded = views.clone();
        loaded[1].in_flight = 2;
        loaded[2].in_flight = 1;
        assert_eq!(order(Policy::Kvsteer, &loaded, 1)[0], 0);
        // 20 % faster is no tie.
        let views = vec![idle(1000.0), idle(1200.0), idle(1000.0)];
        assert!((0..3).all(|c| order(Policy::Kvsteer, &views, c)[0] == 1));
    }

    /// Equal predictions and load: the worker with the least routed to it
    /// in the route window goes first (room for this prompt's next turns),
    /// then the one with the least placed on it in the placement window.
    #[test]
    fn kvsteer_ties_go_to_the_smaller_working_set() {
        let mut views = vec![idle(1000.0); 3];
        views[0].routed_other_tokens = 9_000;
        views[1].routed_other_tokens = 1_000;
        views[2].routed_other_tokens = 5_000;
        assert!((0..3).all(|c| order(Policy::Kvsteer, &views, c) == [1, 2, 0]));
        let mut views = vec![idle(1000.0); 3];
        views[0].placed_other_tokens = 50_000;
        views[1].placed_other_tokens = 1_000;
        views[1].routed_other_tokens = 1_000;
        views[2].placed_other_tokens = 20_000;
        assert!((0..3).all(|c| order(Policy::Kvsteer, &views, c) == [2, 0, 1]));
    }

    /// A new prompt (a group's or conversation's first request) takes the
    /// smallest working set before the least loaded worker: the load of the
    /// moment passes, what a worker has taken on stays. A known prompt keeps
    /// the load first.
    #[test]
    fn new_prompts_tie_to_the_smaller_working_set_before_the_load() {
        let mut views = vec![idle(1000.0); 3];
        views[0].in_flight = 3;
        views[0].routed_other_tokens = 1_000;
        views[1].routed_other_tokens = 9_000;
        views[2].in_flight = 1;
        views[2].routed_other_tokens = 5_000;
        let first = |prompt| order_for(Policy::Kvsteer, prompt, &views, 0);
        assert_eq!(first(PromptTokens::unseen(1000)), [0, 2, 1]);
        assert_eq!(first(PromptTokens::seen(1000)), [1, 2, 0]);
        // Under half new: known.
        let mostly_seen = PromptTokens {
            prompt_tokens: 1000,
            seen_tokens: 600,
        };
        assert_eq!(first(mostly_seen), [1, 2, 0]);
    }

    /// A prompt cached nowhere (its caches were reset or evicted) goes back
    /// to the worker it was placed on, before the least loaded, and that
    /// worker counts as its holder for the lasting-queue rule while it
    /// keeps the prompt (room in its cache, or the prompt routed there
    /// within the route window): its group's place stays. Where a worker
    /// holds more of it, the cost decides and the placement memory breaks
    /// no tie.
    #[test]
    fn a_prompt_cached_nowhere_goes_back_where_it_was_placed() {
        let mut views = vec![idle(1000.0); 3];
        views[1].in_flight = 2;
        views[1].placed_prompt_tokens = 800;
        views[2].placed_prompt_tokens = 400;
        let first = |views: &[WorkerView]| order(Policy::Kvsteer, views, 0)[0];
        assert_eq!(first(&views), 1);
        // A block of it cached everywhere: held alike, still the placement.
        let mut held = views.clone();
        for v in &mut held {
            v.gpu_hit_tokens = 16;
        }
        assert_eq!(first(&held), 1);
        // Workers 0 and 2 hold more than worker 1 (a near tie at 1000
        // tok/s): the load decides again.
        held[1].gpu_hit_tokens = 0;
        assert_eq!(first(&held), 0);
        // Its home has a queue (300 ms ahead): a burst keeps the prompt
        // there, a queue that has lasted (or of unknown age) moves it.
        let mut home = views.clone();
        home[1].in_flight = 0;
        home[1].unprefilled_tokens = 300;
        home[1].queue_age_s = Some(1.0);
        assert_eq!(first(&home), 1);
        home[1].queue_age_s = None;
        assert_ne!(first(&home), 1);
        // A full home that has not seen the prompt for a route window
        // evicted it: it is as cold there as anywhere, so even a burst
        // moves it. With room (its cache was reset), or with the prompt
        // routed there within the route window, the burst keeps it.
        home[1].queue_age_s = Some(1.0);
        home[1].scraped = Some(ScrapedLoad {
            kv_capacity_tokens: 10_000.0,
            ..ScrapedLoad::default()
        });
        home[1].indexed_tokens = 9_500;
        assert_ne!(first(&home), 1);
        home[1].routed_prompt_tokens = 800;
        assert_eq!(first(&home), 1);
        home[1].routed_prompt_tokens = 0;
        home[1].indexed_tokens = 5_000;
        assert_eq!(first(&home), 1);
    }

    #[test]
    fn the_new_share_is_what_no_cache_holds_and_no_recent_prompt_had() {
        let mut views = vec![idle(1000.0); 2];
        assert_eq!(PromptTokens::unseen(1000).new_share(&views), 1.0);
        assert_eq!(PromptTokens::seen(1000).new_share(&views), 0.0);
        assert_eq!(PromptTokens::unseen(0).new_share(&views), 0.0);
        views[1].gpu_hit_tokens = 400;
        views[1].cpu_hit_tokens = 200;
        assert_eq!(PromptTokens::unseen(1000).new_share(&views), 0.4);
        let seen_more = PromptTokens {
            prompt_tokens: 1000,
            seen_tokens: 900,
        };
        assert!((seen_more.new_share(&views) - 0.1).abs() < 1e-9);
        let overshoot = PromptTokens {
            prompt_tokens: 1000,
            seen_tokens: 5000,
        };
        assert_eq!(overshoot.new_share(&views), 0.0);
    }

    /// A new prompt (a conversation's first turn) spreads: among workers
    /// within its new share of the best cost, the least claimed one takes
    /// it, even when a busier one holds its shared system prompt; an idle
    /// holder keeps it. A prompt seen before keeps the narrow band: its
    /// predicted TTFT decides.
    #[test]
    fn new_prompts_spread_and_known_ones_follow_the_prediction() {
        let cfg = ScoringConfig {
            congestion_weight: 0.0,
            ..ScoringConfig::default()
        };
        // The system prompt (2,000 of 6,000 tokens) is cached on worker 0,
        // which already holds two other conversations and decodes one.
        let mut warm = idle(1000.0);
        warm.gpu_hit_tokens = 2_000;
        warm.routed_other_tokens = 30_000;
        warm.placed_other_tokens = 30_000;
        warm.in_flight = 1;
        warm.decoding = 1;
        let mut views = [warm, idle(1000.0), idle(1000.0)];
        let first = |r: PromptTokens, views: &[WorkerView]| {
            rank_views(Policy::Kvsteer, &cfg, r, views, turn(0))[0].index
        };
        // 4,000 of 6,000 tokens new: cold workers (6 s) are within 2/3 of
        // the warm one's 4 s; the emptier wins.
        assert_ne!(first(PromptTokens::unseen(6_000), &views), 0);
        // The holder idle: its first token comes soonest and delays no one.
        views[0].in_flight = 0;
        views[0].decoding = 0;
        assert_eq!(first(PromptTokens::unseen(6_000), &views), 0);
        // Its engine reports a request running that is not ours: busy.
        views[0].scraped = Some(ScrapedLoad {
            running: 1.0,
            ..ScrapedLoad::default()
        });
        assert_ne!(first(PromptTokens::unseen(6_000), &views), 0);
        views[0].scraped = None;
        views[0].in_flight = 1;
        views[0].decoding = 1;
        let first = |r: PromptTokens| first(r, &views);
        // The same prompt seen before (its conversation was placed, then
        // evicted everywhere): the cache decides.
        assert_eq!(first(PromptTokens::seen(6_000)), 0);
        // Off: the band stays tie_ratio.
        let off = ScoringConfig {
            novel_spread: 0.0,
            ..cfg.clone()
        };
        let ranked = rank_views(
            Policy::Kvsteer,
            &off,
            PromptTokens::unseen(6_000),
            &views,
            turn(0),
        );
        assert_eq!(ranked[0].index, 0);
    }

    #[test]
    fn backlog_is_ours_or_the_engines_waiting_queue() {
        let mut v = idle(1000.0);
        v.in_flight = 5;
        v.decoding = 3;
        assert_eq!(v.backlog(), 2.0);
        v.scraped = Some(ScrapedLoad {
            waiting: 4.0,
            running: 9.0,
            ..ScrapedLoad::default()
        });
        assert_eq!(v.backlog(), 4.0);
        let views = [v, idle(1000.0)];
        let cfg = ScoringConfig::default();
        let c = rank_views(
            Policy::Kvsteer,
            &cfg,
            PromptTokens::unseen(10),
            &views,
            turn(0),
        );
        assert_eq!(
            kvsteer::congestion(&cfg, &views, &c),
            cfg.congestion_weight * 2.0
        );
    }

    #[test]
    fn random_is_a_permutation_of_the_candidates() {
        let views = vec![idle(1000.0); 3];
        let mut seen = std::collections::HashSet::new();
        for seed in 0..50 {
            let mut o = order(Policy::Random, &views, seed);
            seen.insert(o[0]);
            o.sort_unstable();
            assert_eq!(o, vec![0, 1, 2]);
        }
        assert_eq!(seen.len(), 3);
    }
}
