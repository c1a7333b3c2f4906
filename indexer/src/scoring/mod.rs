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
    /// `load::RecentRoutes`), cached there or not.
    pub routed_prompt_tokens: u32,
    /// Other prompts' tokens we routed to it recently: the working set its
    /// cache would have to hold for those requests' next turns to hit.
    pub routed_other_tokens: u64,
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
    /// scrape): what was observed in between moves it by [`MEAN_ALPHA`]. A
    /// histogram that went back means the engine restarted: its lifetime
    /// mean starts over.
    pub fn follow(&mut self, prev: Option<&HistogramMean>) {
        let lifetime = (self.count > 0.0).then(|| self.sum / self.count);
        self.mean = match prev {
            None => lifetime,
            Some(p) if self.count < p.count || self.sum < p.sum => lifetime,
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

/// Mutable inputs of the stateful policies, chosen by the caller so that a
/// dry run can leave the service's state alone.
#[derive(Debug, Clone, Copy)]
pub struct Turn {
    /// Round-robin position and tie-break rotation.
    pub counter: usize,
    /// Seed for the `random` policy.
    pub random: u64,
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

/// Orders the workers for a request of `prompt_tokens` tokens, best first,
/// at most `cfg.max_endpoints` of them. Workers that are down are left out
/// unless all are down (then all are candidates: fail open).
pub fn rank(
    policy: Policy,
    cfg: &ScoringConfig,
    prompt_tokens: u32,
    views: &[WorkerView],
    turn: Turn,
) -> Vec<Ranked> {
    let any_up = views.iter().any(|v| v.up);
    let mut candidates: Vec<Ranked> = views
        .iter()
        .enumerate()
        .filter(|(_, v)| v.up || !any_up)
        .map(|(index, v)| Ranked {
            index,
            prediction: predict(cfg, prompt_tokens, v),
        })
        .collect();
    let n = views.len().max(1);
    // Rotating tie-break so that equal candidates share the traffic.
    let tie = |r: &Ranked| (r.index + n - turn.counter % n) % n;
    match policy {
        Policy::Kvsteer => {
            // Prefill is the shared resource: a placement also delays the
            // requests that will queue behind it, about as many as wait for a
            // first token on a worker now (the mean backlog).
            let backlog = congestion(cfg, views, &candidates);
            let cost = |r: &Ranked| r.prediction.cost_ms(backlog);
            candidates.sort_by(|a, b| cost(a).total_cmp(&cost(b)));
            // Costs within tie_ratio of the best are equally good: the
            // least loaded of them goes first, then the one with the least
            // routed to it recently (room for this prompt's next turns),
            // equal ones in rotation, so near-identical calibrated rates
            // don't decide every cold pick.
            let best = candidates.first().map_or(0.0, cost);
            let near = candidates
                .iter()
                .take_while(|r| cost(r) <= best * (1.0 + cfg.tie_ratio))
                .count();
            candidates[..near].sort_by(|a, b| {
                views[a.index]
                    .load()
                    .total_cmp(&views[b.index].load())
                    .then_with(|| {
                        let routed = |r: &Ranked| views[r.index].routed_other_tokens;
                        routed(a).cmp(&routed(b))
                    })
                    .then_with(|| tie(a).cmp(&tie(b)))
            });
        }
        Policy::LeastRequest => baselines::least_request(&mut candidates, views, tie),
        Policy::PrefixOnly => baselines::prefix_only(&mut candidates, views, tie),
        Policy::RoundRobin => candidates.sort_by_key(tie),
        Policy::Random => baselines::shuffle(&mut candidates, turn.random),
    }
    candidates.truncate(cfg.max_endpoints as usize);
    candidates
}

/// The number of requests a placement's prefill delays: the mean backlog
/// of the candidates, weighted by `congestion_weight`.
fn congestion(cfg: &ScoringConfig, views: &[WorkerView], candidates: &[Ranked]) -> f64 {
    if candidates.is_empty() {
        return 0.0;
    }
    let total: f64 = candidates.iter().map(|r| views[r.index].backlog()).sum();
    cfg.congestion_weight * total / candidates.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(rate: f64) -> WorkerView {
        WorkerView {
            up: true,
            prefill_rate: rate,
            ..Default::default()
        }
    }

    fn turn(counter: usize) -> Turn {
        Turn {
            counter,
            random: counter as u64,
        }
    }

    fn order(policy: Policy, views: &[WorkerView], counter: usize) -> Vec<usize> {
        rank(
            policy,
            &ScoringConfig::default(),
            1000,
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
        assert!(rank(Policy::Kvsteer, &ScoringConfig::default(), 10, &[], turn(0)).is_empty());
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
    /// recently goes first (room for this prompt's next turns).
    #[test]
    fn kvsteer_ties_go_to_the_smaller_working_set() {
        let mut views = vec![idle(1000.0); 3];
        views[0].routed_other_tokens = 9_000;
        views[1].routed_other_tokens = 1_000;
        views[2].routed_other_tokens = 5_000;
        assert!((0..3).all(|c| order(Policy::Kvsteer, &views, c) == [1, 2, 0]));
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
        let c = rank(Policy::Kvsteer, &cfg, 10, &views, turn(0));
        assert_eq!(congestion(&cfg, &views, &c), cfg.congestion_weight * 2.0);
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
