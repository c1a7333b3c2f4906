//! The router in virtual time: the indexer's own index, load tracker and
//! scoring, driven with virtual timestamps instead of a wall clock.
//!
//! A pick does what `kvsteer_indexer::picker::Picker::pick` does after
//! tokenizing (keys → `Index::lookup` and `RouteMemory::lookup` → one
//! `WorkerView` per worker from `picker::worker_view` → `scoring::rank` →
//! `RouteMemory::record` and `LoadTracker::on_pick`), and a first-token report does
//! what `Picker::report` does (`on_first_token` → `calibrate` → `set_rate`).
//! The `Picker` itself cannot be driven here: it tokenizes text (we have
//! token ids), draws `rand::random()` for the random policy and stamps picks
//! with `Instant::now()`. Virtual time maps onto `Instant`s as
//! `base + t`, so the tracker's durations are virtual durations.

use std::time::{Duration, Instant};

use futures::executor::block_on;
use kvsteer_indexer::config::ScoringConfig;
use kvsteer_indexer::index::{Index, WorkerMatch};
use kvsteer_indexer::keys::{KeyContext, prompt_keys};
use kvsteer_indexer::load::{LoadTracker, Pending, RouteMemory};
use kvsteer_indexer::picker::{ROUTE_ENTRIES, worker_view};
use kvsteer_indexer::scoring::{
    self, HistogramMean, Prediction, Request, ScrapedLoad, Turn, WorkerView,
};
use kvsteer_kv_events::decode_batch;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::peers::{DynamoLike, PeerView, SglangLike};
use super::policy::BenchPolicy;
use crate::engine::EngineStats;

/// The model name the simulated workers serve (keys are seeded by it).
pub const MODEL: &str = "kvsteer-sim/bench";
/// Index capacity, `(block, worker)` entries (the service's default).
const INDEX_CAPACITY: usize = kvsteer_indexer::config::DEFAULT_INDEX_CAPACITY;

pub struct VirtualRouter {
    policy: BenchPolicy,
    scoring: ScoringConfig,
    keys: KeyContext,
    block_size: u32,
    index: Index,
    load: LoadTracker,
    routes: RouteMemory,
    base: Instant,
    counter: usize,
    rng: ChaCha8Rng,
    scraped: Vec<Option<ScrapedLoad>>,
    dynamo: DynamoLike,
    sglang: SglangLike,
    /// KV batches that failed to decode or had skipped blocks.
    pub event_errors: u64,
}

/// Finished requests' latencies on one engine (its `/metrics` histograms).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Latency {
    pub e2e_sum: f64,
    pub ttft_sum: f64,
    pub count: f64,
}

/// A pick: the worker and what the service would have predicted there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub worker: usize,
    pub prediction: Prediction,
    pub matched_tokens: u32,
}

// === impl VirtualRouter ===

impl VirtualRouter {
    pub fn new(
        policy: BenchPolicy,
        scoring: ScoringConfig,
        workers: usize,
        block_size: u32,
        seed: u64,
    ) -> Self {
        let index = Index::memory(INDEX_CAPACITY);
        for w in 0..workers {
            index.register_worker(w as u32, MODEL, block_size);
        }
        let ttl = Duration::from_secs(scoring.in_flight_ttl_s);
        Self {
            load: LoadTracker::new(workers, scoring.prefill_rate_prior, ttl),
            routes: RouteMemory::new(workers, &scoring, ROUTE_ENTRIES),
            policy,
            scoring,
            keys: KeyContext::new(MODEL, None, block_size),
            block_size,
            index,
            base: Instant::now(),
            counter: 0,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x0007_a11e),
            scraped: vec![None; workers],
            dynamo: DynamoLike::new(workers),
            sglang: SglangLike::new(workers, block_size),
            event_errors: 0,
        }
    }

    fn instant(&self, t: f64) -> Instant {
        self.base + Duration::from_secs_f64(t.max(0.0))
    }

    pub fn pick(&mut self, id: u64, prompt: &[u32], now: f64) -> Choice {
        let n = self.scraped.len();
        let prompt_tokens = u32::try_from(prompt.len()).unwrap_or(u32::MAX);
        let keys = prompt_keys(&self.keys, None, prompt);
        let matches: Vec<WorkerMatch> = if keys.is_empty() {
            Vec::new()
        } else {
            // The memory backend answers inline; an error cannot happen there
            // but would degrade to "no matches" like the service.
            block_on(self.index.lookup(&keys)).unwrap_or_default()
        };
        let mut found: Vec<Option<WorkerMatch>> = vec![None; n];
        for m in matches {
            if let Some(slot) = found.get_mut(m.worker as usize) {
                *slot = Some(m);
            }
        }
        let loads = self.load.snapshot();
        let at = self.instant(now);
        let routes = self.routes.lookup(&keys, at);
        let views: Vec<WorkerView> = (0..n)
            .map(|w| {
                worker_view(
                    true,
                    found[w].as_ref(),
                    self.block_size,
                    &loads[w],
                    self.scraped[w],
                    routes.worker(w),
                )
            })
            .collect();
        let turn = Turn {
            counter: self.counter,
            random: self.rng.next_u64(),
        };
        self.counter += 1;
        let tie = |w: usize| (w + n - turn.counter % n) % n;
        let worker = match self.policy {
            BenchPolicy::Indexer(p) => {
                let request = Request {
                    prompt_tokens,
                    seen_tokens: routes.seen_tokens(self.block_size),
                };
                scoring::rank(p.into(), &self.scoring, request, &views, turn)
                    .first()
                    .map_or(0, |r| r.index)
            }
            BenchPolicy::DynamoLike => {
                let peer: Vec<PeerView> = found
                    .iter()
                    .map(|m| PeerView {
                        cached_blocks: m.as_ref().map_or(0, |m| m.gpu_blocks),
                    })
                    .collect();
                self.dynamo
                    .choose(prompt_tokens, self.block_size, &keys, &peer, tie)
            }
            BenchPolicy::SglangLike => self.sglang.choose(prompt_tokens, &keys, now, tie),
        };
        let prediction = scoring::predict(&self.scoring, prompt_tokens, &views[worker]);
        let request_id = id.to_string();
        match self.policy {
            BenchPolicy::DynamoLike => self.dynamo.on_pick(
                id,
                worker,
                prompt_tokens,
                self.block_size,
                keys,
                found[worker].as_ref().map_or(0, |m| m.gpu_blocks),
            ),
            BenchPolicy::SglangLike => self.sglang.on_pick(id, worker, &keys),
            BenchPolicy::Indexer(_) => self.routes.record(&request_id, worker, &keys, at),
        }
        self.load.on_pick(
            &request_id,
            Pending {
                worker,
                prediction,
                picked_at: at,
                first_token_at: None,
                tenant: "bench".to_owned(),
                policy: self.policy.name(),
            },
        );
        Choice {
            worker,
            prediction,
            matched_tokens: views[worker].matched_tokens().min(prompt_tokens),
        }
    }

    /// The filter's first-token report (`Picker::report(FirstToken)`).
    pub fn first_token(&mut self, id: u64, now: f64) {
        self.dynamo.on_first_token(id);
        let request_id = id.to_string();
        self.routes.prefilled(&request_id);
        let at = self.instant(now);
        let Some(p) = self.load.on_first_token(&request_id, at) else {
            return;
        };
        let observed_ms = at.saturating_duration_since(p.picked_at).as_secs_f64() * 1000.0;
        let current = self
            .load
            .snapshot()
            .get(p.worker)
            .map_or(self.scoring.prefill_rate_prior, |l| l.prefill_rate);
        let next = scoring::calibrate(&self.scoring, current, &p.prediction, observed_ms);
        if next != current {
            self.load.set_rate(p.worker, next);
        }
    }

    /// The filter's done report.
    pub fn done(&mut self, id: u64) {
        self.dynamo.on_done(id);
        self.sglang.on_done(id);
        let request_id = id.to_string();
        self.routes.prefilled(&request_id);
        self.load.on_finish(&request_id);
    }

    /// One KV event payload as it came off the wire.
    pub fn apply_events(&mut self, worker: usize, payload: &[u8]) {
        match decode_batch(payload) {
            Ok(decoded) => {
                let stats = block_on(self.index.apply_batch(worker as u32, &decoded.batch));
                if !decoded.skipped.is_empty() || stats.skipped > 0 {
                    self.event_errors += 1;
                }
            }
            Err(_) => self.event_errors += 1,
        }
    }

    /// A metrics scrape of every engine, and the tracker's TTL sweep (the
    /// service does both on its scrape timer). `latency` is each engine's
    /// cumulative e2e and TTFT histogram (sum, count), as `/metrics` has them.
    pub fn scrape(&mut self, stats: &[EngineStats], latency: &[Latency], now: f64) {
        for ((slot, s), l) in self.scraped.iter_mut().zip(stats).zip(latency) {
            let prev = slot.as_ref();
            let mut e2e = HistogramMean {
                sum: l.e2e_sum,
                count: l.count,
                mean: None,
            };
            let mut ttft = HistogramMean {
                sum: l.ttft_sum,
                count: l.count,
                mean: None,
            };
            e2e.follow(prev.map(|p| &p.e2e));
            ttft.follow(prev.map(|p| &p.ttft));
            *slot = Some(ScrapedLoad {
                waiting: s.waiting as f64,
                running: s.running as f64,
                kv_usage: s.kv_usage,
                kv_capacity_tokens: (s.num_gpu_blocks as f64) * f64::from(self.block_size),
                e2e,
                ttft,
            });
        }
        self.load.expire(self.instant(now));
    }

    /// Calibrated prefill rate per worker (tokens/s).
    pub fn prefill_rates(&self) -> Vec<f64> {
        self.load
            .snapshot()
            .iter()
            .map(|l| l.prefill_rate)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::policy::IndexerPolicy;
    use crate::engine::{Engine, EngineConfig, SimRequest, to_event_batch};
    use crate::profile::TimingProfile;
    use kvsteer_kv_events::{Encoding, encode_batch};

    /// KV event payloads of one engine serving `prompt` to the end.
    fn served(prompt: &[u32]) -> Vec<Vec<u8>> {
        let mut engine =
            Engine::new(EngineConfig::new(TimingProfile::by_name("test").unwrap())).unwrap();
        engine
            .add_request(SimRequest {
                id: 1,
                prompt_token_ids: prompt.to_vec(),
                max_tokens: 2,
                min_tokens: 0,
                ignore_eos: true,
                arrival: 0.0,
            })
            .unwrap();
        let (mut t, mut out) = (0.0, Vec::new());
        while let Some(step) = engine.step(t) {
            t = step.end();
            if !step.events.is_empty() {
                out.push(encode_batch(
                    &to_event_batch(&step.events, 16, t),
                    Encoding::Map,
                ));
            }
        }
        out
    }

    #[test]
    fn events_through_the_wire_steer_kvsteer_to_the_warm_worker() {
        let prompt: Vec<u32> = (0..1_000).map(|i| 5_000 + i).collect();
        let kvsteer = BenchPolicy::Indexer(IndexerPolicy::Kvsteer);
        let mut r = VirtualRouter::new(kvsteer, ScoringConfig::default(), 3, 16, 1);
        for payload in served(&prompt) {
            r.apply_events(2, &payload);
        }
        assert_eq!(r.event_errors, 0);
        let c = r.pick(10, &prompt, 1.0);
        assert_eq!(c.worker, 2);
        assert_eq!(c.matched_tokens, 992);
        // The pick is now in flight there; the report calibrates and releases it.
        r.first_token(10, 1.2);
        r.done(10);
        assert!(r.load.is_empty());
        // A garbage payload is counted, not fatal.
        r.apply_events(0, b"not msgpack");
        assert_eq!(r.event_errors, 1);
    }

    #[test]
    fn scraped_latency_means_follow_the_histograms() {
        let kvsteer = BenchPolicy::Indexer(IndexerPolicy::Kvsteer);
        let mut r = VirtualRouter::new(kvsteer, ScoringConfig::default(), 1, 16, 1);
        let stats = [EngineStats::default()];
        let at = |e2e_sum, ttft_sum, count| Latency {
            e2e_sum,
            ttft_sum,
            count,
        };
        r.scrape(&stats, &[at(0.0, 0.0, 0.0)], 1.0);
        assert_eq!(r.scraped[0].unwrap().slot_time_s(), None);
        // Two requests of 4 s with 1 s to the first token: 3 s per slot.
        r.scrape(&stats, &[at(8.0, 2.0, 2.0)], 2.0);
        assert_eq!(r.scraped[0].unwrap().slot_time_s(), Some(3.0));
        // Nothing new: unchanged; one request of 14 s moves the mean by alpha.
        r.scrape(&stats, &[at(8.0, 2.0, 2.0)], 3.0);
        assert_eq!(r.scraped[0].unwrap().e2e.mean, Some(4.0));
        r.scrape(&stats, &[at(22.0, 3.0, 3.0)], 4.0);
        let e2e = r.scraped[0].unwrap().e2e.mean.unwrap();
        assert!(
            (e2e - (4.0 + kvsteer_indexer::scoring::MEAN_ALPHA * 10.0)).abs() < 1e-9,
            "{e2e}"
        );
    }

    #[test]
    fn random_is_seeded() {
        let prompt: Vec<u32> = (0..64).collect();
        let picks = |seed| {
            let random = BenchPolicy::Indexer(IndexerPolicy::Random);
            let mut r = VirtualRouter::new(random, ScoringConfig::default(), 4, 16, seed);
            (0..32u64)
                .map(|i| {
                    let w = r.pick(i, &prompt, i as f64).worker;
                    r.done(i);
                    w
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(picks(1), picks(1));
        assert_ne!(picks(1), picks(2));
        assert!(
            picks(1)
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len()
                > 1
        );
    }
}
