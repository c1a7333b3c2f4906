//! The discrete-event loop of one run: one workload plan, one policy, N
//! engines. No sockets, no sleeping: events are processed in virtual-time
//! order (ties in insertion order), so a run is a pure function of its inputs.
//!
//! ```text
//! arrival ─pick─▶ engine.add_request ─▶ engine.step(t) … step end:
//!   first tokens → router.first_token     finished → router.done (+ next turn)
//!   KV events → to_event_batch → encode_batch ─(event delay)─▶ decode_batch → Index::apply_batch
//! scrape timer: engine.stats() → router.scrape
//! ```

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use kvsteer_indexer::config::ScoringConfig;
use kvsteer_kv_events::{Encoding, encode_batch};

use super::oracle;
use super::policy::BenchPolicy;
use super::router::{Latency, VirtualRouter};
use super::workload::{Plan, Tenant, What};
use kvsteer_sim::engine::{Engine, EngineConfig, SimRequest, StepOutput, to_event_batch};

/// Everything a run needs besides the plan.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub policy: BenchPolicy,
    pub workers: usize,
    pub engine: EngineConfig,
    pub scoring: ScoringConfig,
    pub seed: u64,
    /// KV events reach the index this long after their step ends (s).
    pub event_delay_s: f64,
    /// The indexer scrapes engine metrics this often (s).
    pub scrape_interval_s: f64,
    /// The scrape includes the engines' latency histograms.
    pub scrape_latency: bool,
    /// Requests sent to a given worker instead of the policy's pick (the
    /// `search` policy's candidates); requests not in it are picked by the
    /// policy.
    pub placement: Option<Arc<Placement>>,
    /// `search`: runs it may try (each a full run).
    pub search_runs: usize,
}

/// Which planned request a request is: a single arrival, or one turn of a
/// session. The same across runs of one plan whatever the placement
/// (record indices are not: turns are submitted when the previous one ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RequestKey {
    Arrival(usize),
    Turn { session: usize, turn: usize },
}

/// A worker per planned request.
pub type Placement = HashMap<RequestKey, usize>;

/// One request's fate.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    pub tenant: Tenant,
    /// The shared-prefix group of a chat prompt (see [`crate::summary::GroupSummary`]).
    pub group: Option<u32>,
    pub arrival: f64,
    pub worker: usize,
    pub prompt_tokens: u32,
    pub matched_tokens: u32,
    /// The router's predicted TTFT of the chosen worker; none live (the
    /// routers under test don't say).
    pub predicted_ttft_s: Option<f64>,
    pub cached_tokens: u32,
    pub first_token_at: Option<f64>,
    pub finished_at: Option<f64>,
    /// The engine refused it (too long for the model).
    pub rejected: bool,
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct RunOutput {
    pub records: Vec<RequestRecord>,
    /// `records[i]`'s planned request (empty for live runs).
    pub keys: Vec<RequestKey>,
    pub preemptions: u64,
    pub event_batches: u64,
    pub event_errors: u64,
    pub steps: u64,
    pub end_s: f64,
    pub prefill_rates: Vec<f64>,
}

impl RunOutput {
    /// A run known only by its requests (a live run's, a test's): no
    /// engine counters, ended at `end_s`.
    pub fn of_records(records: Vec<RequestRecord>, keys: Vec<RequestKey>, end_s: f64) -> Self {
        Self {
            records,
            keys,
            preemptions: 0,
            event_batches: 0,
            event_errors: 0,
            steps: 0,
            end_s,
            prefill_rates: Vec::new(),
        }
    }
}

#[derive(Debug)]
enum Ev {
    Arrive(usize),
    Turn { session: usize, turn: usize },
    StepEnd(usize, Box<StepOutput>),
    Events(usize, Vec<u8>),
    Scrape,
}

struct Timed {
    t: f64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    /// Reversed: the heap pops the earliest, then the first inserted.
    fn cmp(&self, o: &Self) -> Ordering {
        o.t.total_cmp(&self.t).then(o.seq.cmp(&self.seq))
    }
}

struct Session {
    /// The conversation so far: every prompt and answer token.
    context: Vec<u32>,
}

struct Sim<'a> {
    plan: &'a Plan,
    cfg: &'a RunConfig,
    engines: Vec<Engine>,
    busy: Vec<bool>,
    /// When each engine's step in flight ends (the `oracle` policy's start).
    free_at: Vec<f64>,
    latency: Vec<Latency>,
    router: VirtualRouter,
    heap: BinaryHeap<Timed>,
    seq: u64,
    records: Vec<RequestRecord>,
    keys: Vec<RequestKey>,
    sessions: HashMap<usize, Session>,
    /// Request id → session, for requests that are session turns.
    session_of: HashMap<u64, (usize, usize)>,
    /// Generated tokens of session turns in flight.
    outputs: HashMap<u64, Vec<u32>>,
    in_flight: usize,
    event_batches: u64,
    /// `Ev::Events` in the heap.
    events_pending: usize,
    steps: u64,
    end_s: f64,
}

/// Runs `plan` under `cfg` to completion (every admitted request finishes).
pub fn run(plan: &Plan, cfg: &RunConfig) -> RunOutput {
    let engines: Vec<Engine> = (0..cfg.workers)
        .map(|i| {
            let mut e = cfg.engine.clone();
            e.seed = cfg.seed.wrapping_add(i as u64);
            Engine::new(e).expect("engine config validated by the caller")
        })
        .collect();
    let mut sim = Sim {
        plan,
        cfg,
        busy: vec![false; cfg.workers],
        free_at: vec![0.0; cfg.workers],
        latency: vec![Latency::default(); cfg.workers],
        router: VirtualRouter::new(
            cfg.policy,
            cfg.scoring.clone(),
            cfg.workers,
            cfg.engine.block_size as u32,
            cfg.seed,
        ),
        engines,
        heap: BinaryHeap::new(),
        seq: 0,
        records: Vec::with_capacity(plan.arrivals.len()),
        keys: Vec::with_capacity(plan.arrivals.len()),
        sessions: HashMap::new(),
        session_of: HashMap::new(),
        outputs: HashMap::new(),
        in_flight: 0,
        event_batches: 0,
        events_pending: 0,
        steps: 0,
        end_s: 0.0,
    };
    for (i, a) in plan.arrivals.iter().enumerate() {
        sim.push(a.t, Ev::Arrive(i));
    }
    sim.push(0.0, Ev::Scrape);
    while let Some(Timed { t, ev, .. }) = sim.heap.pop() {
        sim.end_s = sim.end_s.max(t);
        match ev {
            Ev::Arrive(i) => sim.arrive(i, t),
            Ev::Turn { session, turn } => sim.turn(session, turn, t),
            Ev::StepEnd(w, out) => sim.step_end(w, *out, t),
            Ev::Events(w, payload) => {
                sim.events_pending -= 1;
                sim.router.apply_events(w, &payload);
            }
            Ev::Scrape => {
                let stats: Vec<_> = sim.engines.iter().map(Engine::stats).collect();
                let none = vec![Latency::default(); cfg.workers];
                let latency = if cfg.scrape_latency {
                    &sim.latency
                } else {
                    &none
                };
                sim.router.scrape(&stats, latency, t);
                // Keep scraping while anything can still happen.
                if sim.in_flight > 0 || sim.heap.len() > sim.events_pending {
                    sim.push(t + cfg.scrape_interval_s, Ev::Scrape);
                }
            }
        }
    }
    RunOutput {
        preemptions: sim.engines.iter().map(|e| e.stats().preemptions).sum(),
        event_errors: sim.router.event_errors,
        prefill_rates: sim.router.prefill_rates(),
        records: sim.records,
        keys: sim.keys,
        event_batches: sim.event_batches,
        steps: sim.steps,
        end_s: sim.end_s,
    }
}

// === impl Sim ===

impl Sim<'_> {
    fn push(&mut self, t: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Timed {
            t,
            seq: self.seq,
            ev,
        });
    }

    fn arrive(&mut self, i: usize, now: f64) {
        let a = &self.plan.arrivals[i];
        match &a.what {
            What::Single { prompt, output } => {
                let tokens = self.plan.prompt(prompt);
                let key = RequestKey::Arrival(i);
                self.submit(key, a.tenant, prompt.group(), tokens, *output, now);
            }
            &What::Session(s) => {
                let context = self.plan.session_start(&self.plan.sessions[s]);
                self.sessions.insert(s, Session { context });
                self.turn(s, 0, now);
            }
        }
    }

    fn turn(&mut self, session: usize, turn: usize, now: f64) {
        let plan = &self.plan.sessions[session];
        let Some(state) = self.sessions.get_mut(&session) else {
            return;
        };
        if turn >= plan.turns.len() || (turn > 0 && now > self.plan.end_s) {
            self.sessions.remove(&session);
            return;
        }
        self.plan.user_message(plan, turn, &mut state.context);
        let output = plan.turns[turn].output;
        let max_len = self.cfg.engine.max_model_len;
        if state.context.len() + output as usize > max_len {
            self.sessions.remove(&session);
            return;
        }
        let prompt = state.context.clone();
        let key = RequestKey::Turn { session, turn };
        let id = self.submit(key, Tenant::Agent, None, prompt, output, now);
        if self.records[id as usize].rejected {
            self.sessions.remove(&session);
            return;
        }
        self.session_of.insert(id, (session, turn));
        self.outputs.insert(id, Vec::with_capacity(output as usize));
    }

    /// Routes and submits one request; returns its id (its record index).
    fn submit(
        &mut self,
        key: RequestKey,
        tenant: Tenant,
        group: Option<u32>,
        prompt: Vec<u32>,
        output: u32,
        now: f64,
    ) -> u64 {
        let id = self.records.len() as u64;
        let req = SimRequest {
            id,
            prompt_token_ids: prompt,
            max_tokens: output.max(1) as usize,
            min_tokens: 0,
            ignore_eos: true,
            arrival: now,
            lora: None,
            cache_salt: None,
        };
        let placed = self
            .cfg
            .placement
            .as_ref()
            .and_then(|p| p.get(&key).copied())
            .filter(|&w| w < self.engines.len());
        let choice = if let Some(w) = placed {
            self.router.pick_known(id, &req.prompt_token_ids, now, w)
        } else if self.cfg.policy == BenchPolicy::Oracle {
            let (w, first_at) = oracle::choose(&self.engines, &self.free_at, &req, id as usize);
            let mut choice = self.router.pick_known(id, &req.prompt_token_ids, now, w);
            // Its prediction is what it foresaw: the error measures the foresight.
            if let Some(t) = first_at {
                choice.prediction.ttft_ms = (t - now) * 1000.0;
            }
            choice
        } else {
            self.router.pick(id, &req.prompt_token_ids, now)
        };
        let prompt_tokens = req.prompt_token_ids.len() as u32;
        let w = choice.worker;
        let added = self.engines[w].add_request(req);
        self.keys.push(key);
        self.records.push(RequestRecord {
            tenant,
            group,
            arrival: now,
            worker: w,
            prompt_tokens,
            matched_tokens: choice.matched_tokens,
            predicted_ttft_s: Some(choice.prediction.ttft_ms / 1000.0),
            cached_tokens: 0,
            first_token_at: None,
            finished_at: None,
            rejected: added.is_err(),
        });
        if added.is_err() {
            // The filter would report the error response as done.
            self.router.done(id, now);
            return id;
        }
        self.in_flight += 1;
        if !self.busy[w] {
            self.start_step(w, now);
        }
        id
    }

    fn start_step(&mut self, w: usize, now: f64) {
        match self.engines[w].step(now) {
            Some(out) => {
                self.busy[w] = true;
                self.steps += 1;
                let end = out.end();
                self.free_at[w] = end;
                self.push(end, Ev::StepEnd(w, Box::new(out)));
            }
            None => self.busy[w] = false,
        }
    }

    fn step_end(&mut self, w: usize, out: StepOutput, now: f64) {
        for tok in &out.tokens {
            if tok.first {
                self.records[tok.id as usize].first_token_at = Some(now);
                self.router.first_token(tok.id, now);
            }
            if let Some(buf) = self.outputs.get_mut(&tok.id) {
                buf.push(tok.token_id);
            }
        }
        if !out.events.is_empty() {
            let batch = to_event_batch(&out.events, self.cfg.engine.block_size, now);
            let payload = encode_batch(&batch, Encoding::Map);
            self.event_batches += 1;
            self.events_pending += 1;
            self.push(now + self.cfg.event_delay_s, Ev::Events(w, payload));
        }
        for f in &out.finished {
            let r = &mut self.records[f.id as usize];
            r.finished_at = Some(f.finished_at);
            r.cached_tokens = f.usage.cached_tokens as u32;
            let l = &mut self.latency[w];
            l.e2e_sum += f.finished_at - f.arrival;
            l.ttft_sum += f.first_token_at - f.arrival;
            l.count += 1.0;
            self.in_flight -= 1;
            self.router.done(f.id, f.finished_at);
            if let Some((session, turn)) = self.session_of.remove(&f.id) {
                let generated = self.outputs.remove(&f.id).unwrap_or_default();
                if let Some(state) = self.sessions.get_mut(&session) {
                    state.context.extend_from_slice(&generated);
                    let think = self.plan.sessions[session]
                        .turns
                        .get(turn + 1)
                        .map_or(0.0, |t| t.think_s);
                    self.push(
                        now + think,
                        Ev::Turn {
                            session,
                            turn: turn + 1,
                        },
                    );
                }
            }
        }
        self.start_step(w, now);
    }
}
