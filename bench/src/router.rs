//! The router in virtual time: the indexer's own `Picker` (index, request
//! ledger, route memory, scoring) driven with virtual timestamps instead
//! of a wall clock.
//!
//! The indexer's policies pick with `Picker::pick_at` (the service's pick
//! at a given moment; the prompts are token ids, as in a completions
//! request) at `base + t` with a seeded draw for `random`, and reports go
//! through `Picker::report`; scrapes are recorded in the workers' `Health`
//! as the service's scrape loop does. The peer policies score
//! `Picker::view` (the same lookup and views, changing nothing) with their own rules and record their picks in the request ledger
//! so that their predictions are measured alike. Virtual time maps onto
//! `Instant`s as `base + t`, so the ledger's durations are virtual durations.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::executor::block_on;
use kvsteer_indexer::app::build_picker;
use kvsteer_indexer::config::{Config, ModelConfig, ScoringConfig, WorkerConfig};
use kvsteer_indexer::index::Index;
use kvsteer_indexer::ledger::Entry;
use kvsteer_indexer::picker::report::Report;
use kvsteer_indexer::picker::{Mode, PickAt, PickInput, PickView, Picker};
use kvsteer_indexer::prompt::Prompt;
use kvsteer_indexer::scoring::{self, HistogramMean, Prediction, ScrapedLoad};
use kvsteer_indexer::workers::Workers;
use kvsteer_kv_events::decode_batch;
use kvsteer_tokenize::CompletionPrompt;
use prometheus_client::registry::Registry;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::peers::{DynamoLike, PeerView, SglangLike};
use super::policy::BenchPolicy;
use super::service::ServicePool;
use kvsteer_sim::engine::EngineStats;

/// The model name the simulated workers serve (keys are seeded by it).
pub const MODEL: &str = "kvsteer-sim/bench";
/// The tenant of every bench request.
const TENANT: &str = "bench";

pub struct VirtualRouter {
    policy: BenchPolicy,
    picker: Arc<Picker>,
    workers: Arc<Workers>,
    index: Index,
    block_size: u32,
    base: Instant,
    /// Tie-break rotation of the peer policies (the picker keeps its own).
    counter: usize,
    rng: ChaCha8Rng,
    dynamo: DynamoLike,
    sglang: SglangLike,
    service: ServicePool,
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
        let mut cfg = Config {
            models: vec![ModelConfig {
                name: MODEL.to_owned(),
                tokenizer: PathBuf::new(),
                block_size,
                ..ModelConfig::default()
            }],
            workers: (0..workers)
                .map(|w| WorkerConfig {
                    name: format!("w{w}"),
                    endpoint: format!("sim-{w}:8000"),
                    model: MODEL.to_owned(),
                    ..WorkerConfig::default()
                })
                .collect(),
            scoring,
            ..Config::default()
        };
        if let BenchPolicy::Indexer(p) = policy {
            cfg.scoring.policy = p.into();
        }
        // The bench reads no metrics: they are counted and dropped.
        let picker = build_picker(&cfg, HashMap::new(), &mut Registry::default());
        let (registered, index) = (picker.workers().clone(), picker.index().clone());
        Self {
            policy,
            picker,
            workers: registered,
            index,
            block_size,
            base: Instant::now(),
            counter: 0,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x0007_a11e),
            dynamo: DynamoLike::new(workers),
            sglang: SglangLike::new(workers, block_size),
            service: ServicePool::new(workers),
            event_errors: 0,
        }
    }

    fn instant(&self, t: f64) -> Instant {
        self.base + Duration::from_secs_f64(t.max(0.0))
    }

    /// The policy's pick. `oracle` needs the engines, so the driver picks for
    /// it and records the pick with [`Self::pick_known`]; asked here, it gets
    /// `sglang_like`'s rule, and so does `search` for a request its
    /// placement lacks.
    pub fn pick(&mut self, id: u64, prompt: &[u32], now: f64) -> Choice {
        let at = PickAt {
            now: self.instant(now),
            random: self.rng.next_u64(),
        };
        let request_id = id.to_string();
        match self.policy {
            BenchPolicy::Indexer(_) => {
                let input = PickInput {
                    request_id,
                    tenant: TENANT.to_owned(),
                    model: MODEL.to_owned(),
                    prompt: Ok(Prompt::Completion {
                        prompt: CompletionPrompt::Ids(prompt.to_vec()),
                        add_special_tokens: None,
                    }),
                    cache_salt: None,
                };
                let out = block_on(self.picker.pick_at(input, Mode::Commit, at));
                let c = out
                    .candidates
                    .iter()
                    .find(|c| c.name == out.decision.worker)
                    .expect("the bench registers its model and workers");
                Choice {
                    worker: c.worker,
                    prediction: c.prediction,
                    matched_tokens: c.matched_tokens,
                }
            }
            BenchPolicy::DynamoLike
            | BenchPolicy::SglangLike
            | BenchPolicy::K8sService
            | BenchPolicy::Oracle
            | BenchPolicy::Search => self.peer_pick(id, &request_id, prompt, now, at.random, None),
        }
    }

    /// Records a pick made outside the router (the `oracle`'s) like a peer
    /// policy's: in the ledger, with the service's prediction there.
    /// No draw is taken: a known worker needs none.
    pub fn pick_known(&mut self, id: u64, prompt: &[u32], now: f64, worker: usize) -> Choice {
        self.peer_pick(id, &id.to_string(), prompt, now, 0, Some(worker))
    }

    /// A pick by a policy of the bench's own (a peer's, or the Service's
    /// connection draw), measured on the service's view of the workers.
    fn peer_pick(
        &mut self,
        id: u64,
        request_id: &str,
        prompt: &[u32],
        now: f64,
        draw: u64,
        known: Option<usize>,
    ) -> Choice {
        let at = self.instant(now);
        let prompt_tokens = u32::try_from(prompt.len()).unwrap_or(u32::MAX);
        let PickView {
            keys, found, views, ..
        } = block_on(self.picker.view(MODEL, prompt, None, at))
            .expect("the bench registers its model");
        let n = views.len().max(1);
        let counter = self.counter;
        self.counter += 1;
        let tie = |w: usize| (w + n - counter % n) % n;
        let cached = |w: usize| found[w].as_ref().map_or(0, |m| m.gpu_blocks);
        let worker = match (known, self.policy) {
            (Some(w), _) => w.min(n - 1),
            (None, BenchPolicy::K8sService) => self.service.pick(id, now, draw),
            (None, BenchPolicy::DynamoLike) => {
                let peer: Vec<PeerView> = (0..views.len())
                    .map(|w| PeerView {
                        cached_blocks: cached(w),
                    })
                    .collect();
                let w = self
                    .dynamo
                    .choose(prompt_tokens, self.block_size, &keys, &peer, tie);
                self.dynamo
                    .on_pick(id, w, prompt_tokens, self.block_size, keys, cached(w));
                w
            }
            (None, _) => {
                let w = self.sglang.choose(prompt_tokens, &keys, now, tie);
                self.sglang.on_pick(id, w, &keys);
                w
            }
        };
        let scoring = self.picker.scoring();
        let prediction = scoring::predict(scoring, prompt_tokens, &views[worker]);
        // In flight like the service's picks; no queued prompt (the peers
        // do not see the ledger's).
        self.picker.ledger().open(
            request_id,
            Entry {
                worker,
                prediction,
                picked_at: at,
                first_token_at: None,
                tenant: TENANT.to_owned(),
                policy: self.policy.name(),
            },
            Vec::new(),
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
        let at = self.instant(now);
        // A measured (streamed) first token without a filter-side time: the
        // time since the pick is the TTFT.
        self.picker
            .report(&Report::first_token(&id.to_string(), 0.0, true), at);
    }

    /// The filter's done report.
    pub fn done(&mut self, id: u64, now: f64) {
        self.dynamo.on_done(id);
        self.sglang.on_done(id);
        self.service.done(id, now);
        let at = self.instant(now);
        self.picker.report(&Report::done(&id.to_string(), 0.0), at);
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

    /// A metrics scrape of every engine, and the housekeeping sweep (the
    /// service does both on its scrape timer). `latency` is each engine's
    /// cumulative e2e and TTFT histogram (sum, count), as `/metrics` has them.
    pub fn scrape(&mut self, stats: &[EngineStats], latency: &[Latency], now: f64) {
        let at = self.instant(now);
        for ((w, s), l) in self.workers.iter().zip(stats).zip(latency) {
            let histogram = |sum| HistogramMean {
                sum,
                count: l.count,
                mean: None,
            };
            let load = ScrapedLoad {
                waiting: s.waiting as f64,
                running: s.running as f64,
                kv_usage: s.kv_usage,
                kv_capacity_tokens: (s.num_gpu_blocks as f64) * f64::from(self.block_size),
                e2e: histogram(l.e2e_sum),
                ttft: histogram(l.ttft_sum),
            };
            w.health.record(Ok(load), at);
        }
        self.picker.housekeep(at);
    }

    /// Calibrated prefill rate per worker (tokens/s).
    pub fn prefill_rates(&self) -> Vec<f64> {
        self.picker
            .ledger()
            .snapshot()
            .iter()
            .map(|l| l.prefill_rate)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::IndexerPolicy;
    use kvsteer_kv_events::{Encoding, encode_batch};
    use kvsteer_sim::engine::{Engine, EngineConfig, SimRequest, to_event_batch};
    use kvsteer_sim::profile::TimingProfile;

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
                lora: None,
                cache_salt: None,
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
        r.done(10, 1.5);
        assert!(r.picker.ledger().is_empty());
        // A garbage payload is counted, not fatal.
        r.apply_events(0, b"not msgpack");
        assert_eq!(r.event_errors, 1);
    }

    /// Worker 0's scrape as the picker sees it.
    fn scraped(r: &VirtualRouter) -> ScrapedLoad {
        r.workers.get(0).and_then(|w| w.health.load()).unwrap()
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
        assert_eq!(scraped(&r).slot_time_s(), None);
        // Two requests of 4 s with 1 s to the first token: 3 s per slot.
        r.scrape(&stats, &[at(8.0, 2.0, 2.0)], 2.0);
        assert_eq!(scraped(&r).slot_time_s(), Some(3.0));
        // Nothing new: unchanged; one request of 14 s moves the mean by alpha.
        r.scrape(&stats, &[at(8.0, 2.0, 2.0)], 3.0);
        assert_eq!(scraped(&r).e2e.mean, Some(4.0));
        r.scrape(&stats, &[at(22.0, 3.0, 3.0)], 4.0);
        let e2e = scraped(&r).e2e.mean.unwrap();
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
                    r.done(i, i as f64);
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

    #[test]
    fn the_service_routes_by_connection() {
        let prompt: Vec<u32> = (0..64).collect();
        let mut r = VirtualRouter::new(BenchPolicy::K8sService, ScoringConfig::default(), 6, 16, 1);
        // One request at a time, each within the keep-alive of the last: one
        // connection, one pod, whatever the draws.
        let sequential: Vec<usize> = (0..16u64)
            .map(|i| {
                let w = r.pick(i, &prompt, i as f64).worker;
                r.done(i, i as f64 + 0.5);
                w
            })
            .collect();
        assert!(
            sequential.iter().all(|&w| w == sequential[0]),
            "{sequential:?}"
        );
        // Sixteen at once: sixteen connections, drawn over the pods.
        let concurrent: std::collections::HashSet<usize> = (16..32u64)
            .map(|i| r.pick(i, &prompt, 20.0).worker)
            .collect();
        assert!(concurrent.len() > 1, "{concurrent:?}");
        // The picks are measured like every other policy's.
        assert_eq!(r.picker.ledger().len(), 16);
    }
}
