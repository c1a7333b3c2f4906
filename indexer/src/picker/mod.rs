//! A pick, end to end, and the reports that close it. Shared by the gRPC
//! `Pick` and the admin `/debug/score` dry run.
//!
//! [`Picker::pick_at`]: tokenize ([`crate::tokenize`]) → keys
//! ([`crate::keys`]) → lookup ([`crate::index`]) → what the pick sees of
//! each worker ([`view`]) → order ([`crate::scoring`]) → commit: the
//! request's entry in the [`crate::ledger`] and its blocks in the
//! [`crate::routes`] memories ([`Picker::commit`]). [`report`]: first
//! token, done, cancel close the entry and calibrate; the housekeeping
//! tick expires what never closed.

mod commit;
mod queue_age;
pub mod report;
mod view;

pub use commit::{Committed, Placement};
pub use view::PickView;

use crate::{
    config::{Config, Policy, ScoringConfig},
    index::Index,
    keys::KeyContext,
    ledger::Ledger,
    metrics::Metrics,
    prompt::Prompt,
    routes::RouteMemory,
    scoring::{self, Prediction, Rotation},
    tokenize::{Encoder, Limits, Unread},
    workers::{Worker, Workers},
};
use kvsteer_tokenize::PromptTokenizer;
use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

/// One model: its tokenizer and key context (its workers are those of
/// [`Workers`] serving it at the moment of a pick).
pub struct Model {
    pub name: String,
    pub tokenizer: Option<Arc<PromptTokenizer>>,
    pub keys: KeyContext,
    pub block_size: u32,
    /// What its picks may tokenize.
    pub limits: Limits,
}

pub struct Picker {
    policy: Policy,
    scoring: ScoringConfig,
    down_after: u32,
    models: HashMap<String, Model>,
    index: Index,
    workers: Arc<Workers>,
    /// One entry per picked request until its terminal report.
    ledger: Ledger,
    metrics: Arc<Metrics>,
    routes: RouteMemory,
    /// How long each worker's queue has lasted, as picks saw it.
    queue_age: queue_age::QueueAge,
    counter: AtomicUsize,
    encoder: Encoder,
}

/// The request, in domain terms.
#[derive(Debug, Clone)]
pub struct PickInput {
    pub request_id: String,
    pub tenant: String,
    pub model: String,
    /// The prompt, or why it could not be read (the pick degrades).
    pub prompt: Result<Prompt, String>,
    pub cache_salt: Option<String>,
}

/// When a pick happens and the `random` policy's draw for it. The service
/// picks at [`PickAt::now`]; the benchmark passes virtual instants and
/// seeded draws, so its runs repeat.
#[derive(Debug, Clone, Copy)]
pub struct PickAt {
    /// Stamps the route memory and the in-flight entry, and ages both.
    pub now: Instant,
    pub random: u64,
}

/// A request's `model` resolved: the served model and, for a LoRA
/// adapter, its name.
struct Resolved<'a> {
    model: &'a Model,
    lora: Option<&'a str>,
    /// The request named no model: the only one served.
    defaulted: bool,
}

/// The parts of a request a pick needs besides its prompt.
struct RequestRef<'a> {
    request_id: &'a str,
    tenant: &'a str,
    model: &'a str,
    cache_salt: Option<&'a str>,
    /// When the pick began (tokenizing included), for its latency.
    start: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A real pick: records in-flight load, advances round-robin, counts metrics.
    Commit,
    /// A real pick whose caller commits it: [`Outcome::placement`] holds
    /// the commit for [`Picker::commit`] (the gRPC handler, once it knows
    /// its caller is still there).
    Deferred,
    /// `/debug/score`: changes no state.
    DryRun,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub policy: &'static str,
    pub worker: String,
    pub prompt_tokens: u32,
    pub matched_tokens: u32,
    pub predicted_ttft_ms: f64,
    pub degraded: bool,
    pub reason: String,
}

/// How one candidate scored.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub worker: usize,
    pub name: String,
    pub endpoint: String,
    pub matched_tokens: u32,
    pub prediction: Prediction,
    pub in_flight: u32,
    /// How long its first-token queue has lasted (see [`WorkerView::queue_age_s`]).
    pub queue_age_s: Option<f64>,
    /// Tokens routed to it within the route window, this prompt's and
    /// others': its working set as the router sees it.
    pub routed_tokens: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Ordered endpoints: the choice, then fallbacks. Empty = no opinion.
    pub endpoints: Vec<String>,
    pub decision: Decision,
    /// Every worker of the model, in configuration order.
    pub candidates: Vec<Candidate>,
    /// [`Mode::Deferred`]: what [`Picker::commit`] records (`None` when
    /// there is nothing to record: no choice).
    pub placement: Option<Placement>,
}

pub fn policy_name(p: Policy) -> &'static str {
    match p {
        Policy::Random => "random",
        Policy::RoundRobin => "round_robin",
        Policy::LeastRequest => "least_request",
        Policy::PrefixOnly => "prefix_only",
        Policy::Kvsteer => "kvsteer",
    }
}

// === impl PickAt ===

impl PickAt {
    /// Now, with a fresh draw.
    pub fn now() -> Self {
        Self {
            now: Instant::now(),
            random: rand::random(),
        }
    }
}

// === impl Picker ===

impl Picker {
    /// `tokenizers` by model name; a model without one is scored on load only.
    pub fn new(
        cfg: &Config,
        tokenizers: HashMap<String, Arc<PromptTokenizer>>,
        index: Index,
        workers: Arc<Workers>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let models = cfg
            .models
            .iter()
            .map(|m| {
                let model = Model {
                    name: m.name.clone(),
                    tokenizer: tokenizers.get(&m.name).cloned(),
                    keys: KeyContext::new(&m.name, None, m.block_size),
                    block_size: m.block_size,
                    limits: Limits {
                        max_bytes: m.tokenize_cap(),
                        max_model_len: m.max_model_len,
                    },
                };
                (m.name.clone(), model)
            })
            .collect();
        let routes = RouteMemory::new(workers.capacity(), &cfg.scoring, ROUTE_ENTRIES);
        let encoder = Encoder::new(
            cfg.tokenize.large_prompt_bytes,
            cfg.tokenize.max_concurrent_large,
            metrics.clone(),
        );
        let ledger = Ledger::new(
            workers.capacity(),
            cfg.scoring.prefill_rate_prior,
            Duration::from_secs(cfg.scoring.in_flight_ttl_s),
            HELD_BLOCKS,
        );
        Self {
            encoder,
            routes,
            queue_age: queue_age::QueueAge::new(workers.capacity()),
            ledger,
            policy: cfg.scoring.policy,
            scoring: cfg.scoring.clone(),
            down_after: cfg.scrape.down_after,
            models,
            index,
            workers,
            metrics,
            counter: AtomicUsize::new(0),
        }
    }

    pub fn down_after(&self) -> u32 {
        self.down_after
    }

    pub fn scoring(&self) -> &ScoringConfig {
        &self.scoring
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The KV index it looks prompts up in.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// The workers it picks from.
    pub fn workers(&self) -> &Arc<Workers> {
        &self.workers
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Forgets a leaving worker (slot `slot`, named `name`): its ledger
    /// entries, its route memory entries, its metrics. Returns the ledger
    /// entries dropped (requests in flight there).
    pub fn forget_worker(&self, slot: usize, name: &str) -> usize {
        let dropped = self.ledger.forget(slot);
        self.routes.forget(slot);
        self.queue_age.forget(slot);
        self.metrics.forget_worker(name);
        dropped
    }

    /// The cache of the worker in slot `slot` was emptied (see
    /// [`crate::streams::OnCleared`]): what was routed there within the
    /// route window is no longer its working set. Without this, a placement
    /// there is charged for evicting prompts that are gone, for as long as
    /// the route window (`route_window_s`), and prompts routed there before
    /// count as held there.
    pub fn worker_cleared(&self, slot: usize) {
        self.routes.cleared(slot);
    }

    pub fn model(&self, name: &str) -> Option<&Model> {
        self.models.get(name)
    }

    /// The prompt's token ids (the first prompt of a completions batch),
    /// within the model's limits (see [`crate::tokenize`]): a prompt too large
    /// to be worth tokenizing, or one arriving while the large-prompt
    /// permits are taken, has none and its pick is scored on load only.
    pub async fn tokenize(&self, model: &Model, prompt: Prompt) -> Result<Vec<u32>, Unread> {
        self.encoder
            .ids(model.tokenizer.as_ref(), model.limits, prompt)
            .await
    }

    /// A pick, now. Dropping the future (the caller is gone) stops a large
    /// prompt's tokenization and commits nothing.
    pub async fn pick(&self, input: PickInput, mode: Mode) -> Outcome {
        self.pick_at(input, mode, PickAt::now()).await
    }

    /// A pick at a given moment and `random` draw: tokenize → keys →
    /// lookup → view of the workers → score, then (per `mode`) commit to
    /// the ledger and the route memories. The service picks at
    /// [`PickAt::now`]; the benchmark passes virtual instants and seeded
    /// draws (and prompts as token ids), so its runs repeat.
    pub async fn pick_at(&self, input: PickInput, mode: Mode, at: PickAt) -> Outcome {
        let PickInput {
            request_id,
            tenant,
            model,
            prompt,
            cache_salt,
        } = input;
        let request = RequestRef {
            request_id: &request_id,
            tenant: &tenant,
            model: &model,
            cache_salt: cache_salt.as_deref(),
            start: Instant::now(),
        };
        // Tokenized before `decide` (which only needs the result) so that
        // the encode may run off this thread; unknown models and models
        // without workers are answered by `decide` without tokenizing.
        let ids = match (self.resolve_model(&model), prompt) {
            (_, Err(e)) => Err(Unread::Failed(e)),
            (Ok(r), Ok(p)) if self.has_candidates(&r) => self.tokenize(r.model, p).await,
            (_, Ok(_)) => Ok(Vec::new()),
        };
        self.decide(request, ids, mode, at).await
    }

    /// The pick once the prompt is tokenized: `ids` are its token ids (or
    /// why there are none: the pick degrades to load only), `at` its
    /// moment and draw.
    async fn decide(
        &self,
        request: RequestRef<'_>,
        ids: Result<Vec<u32>, Unread>,
        mode: Mode,
        at: PickAt,
    ) -> Outcome {
        // Wall time, for the pick latency histogram (tokenizing included).
        let start = request.start;
        let policy = policy_name(self.policy);
        let tenant = self.metrics.tenant_label(request.tenant);
        let resolved = match self.resolve_model(request.model) {
            Ok(r) => {
                if r.defaulted && mode != Mode::DryRun {
                    self.metrics.model_defaulted.inc();
                    tracing::debug!(model = %r.model.name, request_id = %request.request_id, "no model in the request: the only one served");
                }
                r
            }
            Err(reason) => {
                self.count(mode, policy, "unknown_model", &tenant, start);
                return empty(policy, reason);
            }
        };
        let model = resolved.model;
        let workers = self.candidates(&resolved);
        // An adapter's blocks are keyed with its name, as its engine's are.
        let keys_ctx = match resolved.lora {
            Some(lora) => model.keys.with_lora(Some(lora)),
            None => model.keys.clone(),
        };
        if workers.is_empty() {
            self.count(mode, policy, "no_workers", &tenant, start);
            return empty(policy, "no_workers".into());
        }

        let mut reason = String::new();
        let mut degraded: Option<&'static str> = None;
        let ids = match ids {
            Ok(ids) => ids,
            Err(e) => {
                degraded = Some(e.reason());
                reason = e.to_string();
                Vec::new()
            }
        };
        let view = self
            .view_workers(model, &keys_ctx, &workers, &ids, request.cache_salt, at.now)
            .await;
        let prompt_tokens = view.prompt.prompt_tokens;
        if let Some(e) = &view.index_error {
            degraded = Some("index_unavailable");
            reason = format!("index_unavailable: {e}");
        }
        let counter = match mode {
            Mode::Commit | Mode::Deferred => self.counter.fetch_add(1, Relaxed),
            Mode::DryRun => self.counter.load(Relaxed),
        };
        let rotation = Rotation {
            counter,
            random: at.random,
        };
        let views = &view.views;
        if mode != Mode::DryRun {
            for (w, v) in workers.iter().zip(views) {
                self.queue_age.observe(w.slot, v.backlog() > 0.0, at.now);
            }
        }
        // Each worker predicted once: ranked, and reported for every one.
        let predictions = scoring::predict_all(&self.scoring, prompt_tokens, views);
        let ranked = scoring::rank(
            self.policy,
            &self.scoring,
            view.prompt,
            views,
            &predictions,
            rotation,
        );
        let candidates: Vec<Candidate> = workers
            .iter()
            .zip(views)
            .zip(&predictions)
            .map(|((w, v), &prediction)| Candidate {
                worker: w.slot,
                name: w.cfg.name.clone(),
                endpoint: w.cfg.endpoint.clone(),
                matched_tokens: v.matched_tokens().min(prompt_tokens),
                prediction,
                in_flight: v.in_flight,
                queue_age_s: v.queue_age_s,
                routed_tokens: u64::from(v.routed_prompt_tokens) + v.routed_other_tokens,
            })
            .collect();
        let Some(best) = ranked.first() else {
            self.count(mode, policy, "no_workers", &tenant, start);
            return empty(policy, "no_workers".into());
        };
        let chosen = &candidates[best.index];
        let mut outcome = Outcome {
            endpoints: ranked
                .iter()
                .map(|r| candidates[r.index].endpoint.clone())
                .collect(),
            decision: Decision {
                policy,
                worker: chosen.name.clone(),
                prompt_tokens,
                matched_tokens: chosen.matched_tokens,
                predicted_ttft_ms: best.prediction.ttft_ms,
                degraded: degraded.is_some(),
                reason,
            },
            candidates: candidates.clone(),
            placement: None,
        };

        if mode == Mode::DryRun {
            return outcome;
        }
        let placement = Placement {
            request_id: request.request_id.to_owned(),
            worker: chosen.worker,
            worker_id: workers[best.index].id,
            keys: view.keys,
            prediction: best.prediction,
            tenant,
            policy,
            degraded,
            prompt_tokens,
            matched_tokens: chosen.matched_tokens,
            at: at.now,
            start,
        };
        if mode == Mode::Deferred {
            outcome.placement = Some(placement);
        } else {
            self.commit(placement);
        }
        outcome
    }

    /// The request's model: by name, or the only one served when the
    /// request names none (OpenAI clients may leave `model` out when a
    /// server has one). Otherwise the reason the pick has no opinion.
    fn resolve_model<'a>(&'a self, name: &'a str) -> Result<Resolved<'a>, String> {
        if let Some(model) = self.models.get(name) {
            return Ok(Resolved {
                model,
                lora: None,
                defaulted: false,
            });
        }
        if !name.is_empty() {
            // A LoRA adapter some worker serves (its `/v1/models`).
            return match self
                .workers
                .adapter_base(name)
                .and_then(|base| self.models.get(&base))
            {
                Some(model) => Ok(Resolved {
                    model,
                    lora: Some(name),
                    defaulted: false,
                }),
                None => Err(format!("unknown_model: {name:?}")),
            };
        }
        let mut served = self.models.iter();
        match (served.next(), served.next()) {
            (Some((_, model)), None) => Ok(Resolved {
                model,
                lora: None,
                defaulted: true,
            }),
            _ => Err(format!(
                "unknown_model: the request names no model and {} are served",
                self.models.len()
            )),
        }
    }

    /// The workers a resolved request may go to: those of its model, and
    /// for an adapter only those that serve it.
    fn candidates(&self, r: &Resolved<'_>) -> Vec<Arc<Worker>> {
        let mut workers = self.workers.serving(&r.model.name);
        if let Some(lora) = r.lora {
            workers.retain(|w| w.serves_adapter(lora));
        }
        workers
    }

    /// [`Self::candidates`] is not empty (without collecting them).
    fn has_candidates(&self, r: &Resolved<'_>) -> bool {
        match r.lora {
            None => self.workers.serves(&r.model.name),
            // `adapter_base` found it on a worker of this model.
            Some(_) => true,
        }
    }
}

/// `(block, worker)` entries each route memory keeps at most (~20 MB).
pub const ROUTE_ENTRIES: usize = 1 << 18;

/// Prompt blocks the ledger counts as held at most, summed over the
/// requests in flight (a shared prefix counts once per request): 2^20 is
/// 16M prompt tokens of 16-token blocks, more than 8 workers × 256 running
/// sequences × 4k-token prompts; past it the oldest requests stop counting
/// (`kvsteer_ledger_held_dropped_total`). About 8 bytes per block in the
/// requests' records plus ~60 per distinct block and worker.
pub const HELD_BLOCKS: usize = 1 << 20;

fn empty(policy: &'static str, reason: String) -> Outcome {
    Outcome {
        endpoints: Vec::new(),
        decision: Decision {
            policy,
            worker: String::new(),
            prompt_tokens: 0,
            matched_tokens: 0,
            predicted_ttft_ms: 0.0,
            degraded: false,
            reason,
        },
        candidates: Vec::new(),
        placement: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::build_picker;
    use crate::picker::report::Report;
    use crate::routes::{RouteView, Routed};
    use crate::scoring::ScrapedLoad;
    use prometheus_client::registry::Registry;

    fn picker(policy: &str) -> Arc<Picker> {
        let cfg = Config::from_yaml(&format!(
            "models: [{{name: m, tokenizer: /nowhere}}]
workers:
  - {{name: a, endpoint: 127.0.0.1:1, model: m}}
  - {{name: b, endpoint: 127.0.0.1:2, model: m}}
scoring: {{policy: {policy}}}
"
        ))
        .unwrap();
        build_picker(&cfg, HashMap::new(), &mut Registry::default())
    }

    /// Two workers of model `m` with the shared Qwen3 tokenizer, on `index`.
    fn tokenizing_picker(index: Index, registry: &mut Registry) -> Arc<Picker> {
        let shared = kvsteer_e2e::shared_dir();
        let tok = PromptTokenizer::from_dir(&shared.join("tokenizers/qwen3")).unwrap();
        let cfg = Config::from_yaml(
            "models: [{name: m, tokenizer: /nowhere}]
workers:
  - {name: a, endpoint: 127.0.0.1:1, model: m}
  - {name: b, endpoint: 127.0.0.1:2, model: m}
",
        )
        .unwrap();
        let tokenizers = HashMap::from([("m".to_owned(), Arc::new(tok))]);
        crate::app::build_picker_on(&cfg, tokenizers, registry, index)
    }

    /// A text prompt of 64 tokens, 4 blocks (unread by the pickers that load no
    /// tokenizer).
    fn input(id: &str, model: &str) -> PickInput {
        PickInput {
            request_id: id.into(),
            tenant: "t".into(),
            model: model.into(),
            prompt: Ok(Prompt::Completion {
                prompt: kvsteer_tokenize::CompletionPrompt::Text(format!(
                    "hello{}",
                    " hello".repeat(63)
                )),
                add_special_tokens: None,
            }),
            cache_salt: None,
        }
    }

    #[tokio::test]
    async fn unknown_model_has_no_opinion() {
        let out = picker("kvsteer").pick(input("r", "x"), Mode::Commit).await;
        assert!(out.endpoints.is_empty());
        assert!(out.decision.reason.starts_with("unknown_model"));
    }

    #[tokio::test]
    async fn without_tokens_the_pick_degrades_to_load_only() {
        let p = picker("kvsteer");
        let first = p.pick(input("r1", "m"), Mode::Commit).await;
        assert!(first.decision.degraded);
        assert!(first.decision.reason.starts_with("tokenize_failed"));
        assert_eq!(first.endpoints.len(), 2);
        // The second request avoids the worker the first one loaded.
        let mut bad = input("r2", "m");
        bad.prompt = Err("tools_json: invalid JSON".into());
        let second = p.pick(bad, Mode::Commit).await;
        assert_eq!(p.ledger().len(), 2);
        assert_ne!(first.decision.worker, second.decision.worker);
        assert_eq!(first.endpoints[0], second.endpoints[1]);
    }

    #[tokio::test]
    async fn dry_run_changes_nothing() {
        let p = picker("round_robin");
        let a = p.pick(input("r1", "m"), Mode::DryRun).await;
        let b = p.pick(input("r2", "m"), Mode::DryRun).await;
        assert_eq!(a.endpoints, b.endpoints);
        assert!(p.ledger().is_empty());
        let c = p.pick(input("r3", "m"), Mode::Commit).await;
        let d = p.pick(input("r4", "m"), Mode::Commit).await;
        assert_ne!(c.endpoints[0], d.endpoints[0]);
        assert_eq!(p.ledger().len(), 2);
        let now = Instant::now();
        p.report(&Report::first_token("r3", 5.0, true), now);
        p.report(&Report::done("r3", 9.0), now);
        p.report(&Report::cancelled("r4"), now);
        assert!(p.ledger().is_empty());
    }

    #[tokio::test]
    async fn a_prompt_follows_its_twin_in_flight_until_the_twin_ends() {
        let p = tokenizing_picker(Index::memory(1 << 10), &mut Registry::default());
        let first = p.pick(input("r1", "m"), Mode::Commit).await;
        assert!(!first.decision.degraded, "{:?}", first.decision);
        // Nothing is cached anywhere yet, but the same prompt queued behind
        // r1 needs one token of prefill there.
        let twin = p.pick(input("r2", "m"), Mode::Commit).await;
        assert_eq!(twin.decision.worker, first.decision.worker);
        // Running (first tokens in), they keep the prefix referenced there.
        for id in ["r1", "r2"] {
            p.report(&Report::first_token(id, 5.0, true), Instant::now());
        }
        let third = p.pick(input("r3", "m"), Mode::Commit).await;
        assert_eq!(third.decision.worker, first.decision.worker);
        assert_eq!(p.ledger().stats().held_blocks, 12);
        // Ended, they hold nothing.
        for id in ["r1", "r2", "r3"] {
            p.report(&Report::done(id, 9.0), Instant::now());
        }
        assert_eq!(p.ledger().stats().held_blocks, 0);
    }

    #[tokio::test]
    async fn the_route_window_holds_what_the_caches_hold() {
        let p = tokenizing_picker(Index::memory(1 << 10), &mut Registry::default());
        let mut other = input("r2", "m");
        other.prompt = Ok(Prompt::Completion {
            prompt: kvsteer_tokenize::CompletionPrompt::Text(format!(
                "world{}",
                " world".repeat(63)
            )),
            add_special_tokens: None,
        });
        for pick in [input("r1", "m"), other] {
            assert!(!p.pick(pick, Mode::Commit).await.decision.degraded);
        }
        let counted = |window: fn(&RouteView) -> &Vec<Routed>| {
            let view = p.routes.lookup(&[], Instant::now(), Default::default());
            window(&view).iter().map(|r| r.other_blocks).sum::<u64>()
        };
        let now = Instant::now();
        // Cache sizes unknown: the time window alone.
        p.housekeep(now);
        assert_eq!(counted(|v| &v.routed), 8, "two prompts of 4 blocks");
        // Caches of 3 blocks each: the window keeps the newest 6.
        for w in p.workers().iter() {
            let load = ScrapedLoad {
                kv_capacity_tokens: 48.0,
                ..ScrapedLoad::default()
            };
            w.health.record(Ok(load), now);
        }
        p.housekeep(now);
        assert_eq!(counted(|v| &v.routed), 6);
        assert_eq!(counted(|v| &v.placed), 8, "placements stay");
    }

    #[tokio::test]
    async fn a_deferred_pick_is_recorded_only_when_committed() {
        let p = picker("kvsteer");
        let mut out = p.pick(input("r1", "m"), Mode::Deferred).await;
        assert_eq!(out.endpoints.len(), 2);
        assert!(p.ledger().is_empty(), "nothing before the commit");
        let placement = out.placement.take().expect("a placement");
        assert_eq!(p.commit(placement), Committed::Recorded);
        assert_eq!(p.ledger().len(), 1);
        // Its cancel overtakes the next pick: that one is never counted.
        p.report(&Report::cancelled("r2"), Instant::now());
        let mut late = p.pick(input("r2", "m"), Mode::Deferred).await;
        assert_eq!(
            p.commit(late.placement.take().unwrap()),
            Committed::Reported
        );
        assert_eq!(p.ledger().len(), 1);
        // Nothing to commit without a choice.
        let unknown = p.pick(input("r3", "x"), Mode::Deferred).await;
        assert_eq!(unknown.placement, None);
        p.report(&Report::done("r1", 1.0), Instant::now());
        assert!(p.ledger().is_empty());
        assert!(p.ledger().snapshot().iter().all(|w| w.in_flight == 0));
    }

    #[tokio::test]
    async fn a_pick_without_a_model_uses_the_only_one_served() {
        let p = picker("kvsteer");
        let out = p.pick(input("r1", ""), Mode::Commit).await;
        assert_eq!(out.endpoints.len(), 2, "{:?}", out.decision);
        assert_eq!(out.decision.prompt_tokens, 0, "no tokenizer: load only");
        assert_eq!(p.ledger().len(), 1);
        assert_eq!(p.metrics.model_defaulted.get(), 1);
        // A dry run is not counted.
        p.pick(input("r2", ""), Mode::DryRun).await;
        assert_eq!(p.metrics.model_defaulted.get(), 1);

        // Several models: no guess.
        let cfg = Config::from_yaml(
            "models: [{name: m, tokenizer: /nowhere}, {name: n, tokenizer: /nowhere}]
workers:
  - {name: a, endpoint: 127.0.0.1:1, model: m}
  - {name: b, endpoint: 127.0.0.1:2, model: n}
",
        )
        .unwrap();
        let two = build_picker(&cfg, HashMap::new(), &mut Registry::default());
        let out = two.pick(input("r1", ""), Mode::Commit).await;
        assert!(out.endpoints.is_empty());
        assert_eq!(
            out.decision.reason,
            "unknown_model: the request names no model and 2 are served"
        );
        assert!(two.ledger().is_empty());
    }

    fn ids_input(id: &str, token_ids: Vec<u32>) -> PickInput {
        PickInput {
            request_id: id.into(),
            tenant: "t".into(),
            model: "m".into(),
            prompt: Ok(Prompt::Completion {
                prompt: kvsteer_tokenize::CompletionPrompt::Ids(token_ids),
                add_special_tokens: None,
            }),
            cache_salt: None,
        }
    }

    /// Token ids need no tokenizer, and the moment is the caller's: the
    /// route memory ages by it, not by the wall clock.
    #[tokio::test]
    async fn picks_of_token_ids_run_at_the_given_moment() {
        let p = picker("kvsteer");
        // Far from the wall clock: a pick stamped `Instant::now()` would be
        // out of every window by then.
        let t0 = Instant::now() + std::time::Duration::from_secs(1_000);
        let at = |s: u64| PickAt {
            now: t0 + std::time::Duration::from_secs(s),
            random: 0,
        };
        let first = p
            .pick_at(ids_input("r1", vec![7; 64]), Mode::Commit, at(0))
            .await;
        assert!(!first.decision.degraded, "{:?}", first.decision);
        assert_eq!(first.decision.prompt_tokens, 64);
        let twin = p
            .pick_at(ids_input("r2", vec![7; 64]), Mode::Commit, at(1))
            .await;
        assert_eq!(twin.decision.worker, first.decision.worker);
        // The route memory ages by the given moments: within the placement
        // window the prompt is known, an hour later it is not.
        for (s, request) in [
            (2, scoring::PromptTokens::seen(64)),
            (3_600, scoring::PromptTokens::unseen(64)),
        ] {
            let sight = p.view("m", &[7; 64], None, at(s).now).await.unwrap();
            assert_eq!(sight.prompt, request, "at {s} s");
        }
        let unknown = PickInput {
            model: "x".into(),
            ..ids_input("r4", vec![7; 64])
        };
        let out = p.pick_at(unknown, Mode::Commit, at(3_601)).await;
        assert!(out.decision.reason.starts_with("unknown_model"));
    }

    /// The random policy draws from the caller's number: the same draws
    /// give the same picks.
    #[tokio::test]
    async fn random_picks_follow_the_given_draws() {
        let picks = |draws: Vec<u64>| async move {
            let p = picker("random");
            let mut out = Vec::new();
            for (i, random) in draws.into_iter().enumerate() {
                let at = PickAt {
                    now: Instant::now(),
                    random,
                };
                let id = format!("r{i}");
                let o = p
                    .pick_at(ids_input(&id, vec![1; 32]), Mode::Commit, at)
                    .await;
                out.push(o.decision.worker);
            }
            out
        };
        let draws: Vec<u64> = (0..16u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let a = picks(draws.clone()).await;
        assert_eq!(a, picks(draws).await);
        assert!(a.iter().any(|w| w != &a[0]), "{a:?}");
    }

    #[tokio::test]
    async fn a_view_changes_nothing() {
        let p = picker("kvsteer");
        let now = Instant::now();
        p.pick_at(
            ids_input("r1", vec![7; 64]),
            Mode::Commit,
            PickAt { now, random: 0 },
        )
        .await;
        let a = p.view("m", &[7; 64], None, now).await.unwrap();
        let b = p.view("m", &[7; 64], None, now).await.unwrap();
        assert_eq!(a.views, b.views);
        assert_eq!(a.keys.len(), 4);
        assert_eq!(a.found, vec![None, None]);
        assert_eq!(a.prompt, scoring::PromptTokens::seen(64));
        // The twin in flight shows on one worker only.
        let held: Vec<u32> = a.views.iter().map(|v| v.held_hit_tokens).collect();
        assert!(held.contains(&64) && held.contains(&0), "{held:?}");
        assert_eq!(p.ledger().len(), 1);
        assert!(p.view("x", &[7; 64], None, now).await.is_none());
    }

    /// A backend whose every call fails, like Redis when it is down.
    struct Down;

    impl crate::index::IndexBackend for Down {
        fn apply<'a>(
            &'a self,
            _: crate::index::WorkerId,
            _: &'a [crate::index::KeyOp],
        ) -> futures::future::BoxFuture<'a, Result<(), crate::index::IndexError>> {
            Box::pin(async { Err(crate::index::IndexError::Backend("down".into())) })
        }
        fn purge_worker(
            &self,
            _: crate::index::WorkerId,
        ) -> futures::future::BoxFuture<'_, Result<(), crate::index::IndexError>> {
            Box::pin(async { Err(crate::index::IndexError::Backend("down".into())) })
        }
        fn lookup<'a>(
            &'a self,
            _: &'a [crate::keys::BlockKey],
        ) -> futures::future::BoxFuture<
            'a,
            Result<Vec<crate::index::WorkerMatch>, crate::index::IndexError>,
        > {
            Box::pin(async { Err(crate::index::IndexError::Backend("down".into())) })
        }
        fn entries(&self) -> u64 {
            0
        }
        fn worker_blocks(&self, _: crate::index::WorkerId) -> u64 {
            0
        }
    }

    #[tokio::test]
    async fn index_failure_degrades_to_load_only_and_is_counted() {
        let mut registry = Registry::default();
        let p = tokenizing_picker(Index::with_backend(Arc::new(Down)), &mut registry);
        let first = p.pick(input("r1", "m"), Mode::Commit).await;
        assert!(first.decision.degraded);
        assert!(
            first.decision.reason.starts_with("index_unavailable"),
            "{:?}",
            first.decision
        );
        assert_eq!(first.decision.prompt_tokens, 64);
        assert_eq!(first.decision.matched_tokens, 0);
        assert_eq!(first.endpoints.len(), 2);
        // Load still steers: the next pick (another prompt: the same one
        // would follow its queued twin) avoids the loaded worker.
        let mut other = input("r2", "m");
        other.prompt = Ok(Prompt::Completion {
            prompt: kvsteer_tokenize::CompletionPrompt::Ids(vec![2; 64]),
            add_special_tokens: None,
        });
        let second = p.pick(other, Mode::Commit).await;
        assert_ne!(first.decision.worker, second.decision.worker);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains(
                r#"kvsteer_degraded_picks_total{reason="index_unavailable",tenant="other"} 2"#
            ),
            "{out}"
        );
    }
}
