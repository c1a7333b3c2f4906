//! `kvsteer-bench` flags (a contract: outside checks run them) and their
//! per-workload defaults.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use kvsteer_indexer::config::ScoringConfig;

use super::driver::RunConfig;
use super::policy::{ALL_POLICIES, BenchPolicy};
use super::trace::{self, TraceRequest};
use super::workload::{Plan, Sizes, WorkloadKind};
use kvsteer_sim::engine::EngineConfig;
use kvsteer_sim::profile::TimingProfile;

pub const DEFAULT_RATES: &str = "10,20,40,60,80,100,120";
pub const DEFAULT_DURATION_S: f64 = 600.0;
pub const DEFAULT_WORKERS: usize = 6;
pub const DEFAULT_PROFILE: &str = "l40s-27b-fp8";
pub const DEFAULT_EVENT_DELAY_MS: f64 = 5.0;
pub const DEFAULT_SCRAPE_INTERVAL_MS: f64 =
    kvsteer_indexer::config::DEFAULT_SCRAPE_INTERVAL_MS as f64;

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Workload(s), comma-separated: shared-prefix, multi-turn, independent,
    /// mixed, trace (needs --trace).
    #[arg(long, default_value = "shared-prefix", value_delimiter = ',')]
    pub workload: Vec<WorkloadKind>,
    /// Policies, comma-separated, all run on the same arrivals; `k8s_service`
    /// (a random pod per client connection) is known but not in the default.
    #[arg(long, default_value = ALL_POLICIES)]
    pub policies: String,
    /// Request rates to sweep (requests/min), comma-separated.
    #[arg(long, default_value = DEFAULT_RATES, value_delimiter = ',')]
    pub rates: Vec<f64>,
    /// Arrivals span this long (virtual seconds); the run drains after it.
    #[arg(long, default_value_t = DEFAULT_DURATION_S)]
    pub duration_s: f64,
    #[arg(long, default_value_t = DEFAULT_WORKERS)]
    pub workers: usize,
    /// Engine timing profile (l40s-27b-fp8, tiny-cpu, test).
    #[arg(long, default_value = DEFAULT_PROFILE)]
    pub profile: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// JSON results file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// PNG plots go here (default: beside --out).
    #[arg(long)]
    pub plot_dir: Option<PathBuf>,
    /// Write every request of every run to this folder, one JSON line per
    /// request (`<workload>-<policy>-<rate>rpm[-run<k>].jsonl`): where each
    /// went, its cached tokens and its TTFT, to see which requests make a
    /// run's tail.
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// Shared-prefix groups (multi-turn: agent kinds sharing a system prompt).
    #[arg(long)]
    pub groups: Option<u32>,
    #[arg(long)]
    pub users_per_group: Option<u32>,
    /// Group prefix (multi-turn: system prompt) tokens.
    #[arg(long)]
    pub prefix_tokens: Option<u32>,
    /// Question tokens (multi-turn: mean user message per turn).
    #[arg(long)]
    pub question_tokens: Option<u32>,
    /// Output tokens per request (multi-turn: mean per turn).
    #[arg(long)]
    pub output_tokens: Option<u32>,
    /// Multi-turn: mean think time between turns (s).
    #[arg(long)]
    pub think_s: Option<f64>,
    /// Multi-turn: sessions end once their context passes this.
    #[arg(long)]
    pub max_context_tokens: Option<u32>,
    /// Mooncake-style JSONL trace for `--workload trace`.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// KV events reach the index this long after their step (virtual ms).
    #[arg(long, default_value_t = DEFAULT_EVENT_DELAY_MS)]
    pub event_delay_ms: f64,
    /// The indexer scrapes engine metrics this often (virtual ms).
    #[arg(long, default_value_t = DEFAULT_SCRAPE_INTERVAL_MS)]
    pub scrape_interval_ms: f64,
    /// Feed the engines' e2e/TTFT latency histograms to the scrape, as the
    /// service reads them from `/metrics` (`false`: gauges only, a diagnostic).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub scrape_latency: bool,
    /// Parallel runs (default: available cores).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// `--policies search`: full runs the placement search may make per
    /// workload × rate (its two starts included).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(2..))]
    pub search_runs: u32,
    /// Scoring settings for the indexer's policies: a YAML file, an indexer
    /// configuration (its `scoring:` section is used) or that section alone.
    /// Default: the indexer's defaults.
    #[arg(long)]
    pub scoring: Option<PathBuf>,
    /// Print no table and no progress.
    #[arg(long)]
    pub quiet: bool,
    /// Drive real streaming HTTP load instead of virtual time.
    #[arg(long)]
    pub live: bool,
    /// Live targets, `NAME=URL` or `URL` (repeat to compare, e.g.
    /// `kvsteer=http://127.0.0.1:8080 round_robin=http://127.0.0.1:8081`).
    #[arg(long, num_args = 1.., value_delimiter = ' ')]
    pub target: Vec<String>,
    /// Live: worker base URLs whose prefix caches are reset
    /// (`POST /reset_prefix_cache`) before each target's run, so every
    /// target starts cold.
    #[arg(long, num_args = 1.., value_delimiter = ' ')]
    pub reset_worker: Vec<String>,
    /// Live: the model name sent in requests.
    #[arg(long, default_value = "Qwen/Qwen3-8B")]
    pub model: String,
    /// Live: send chat requests with text prompts (one single-token word per
    /// planned token, so shared prefixes stay shared in tokens) to
    /// `/v1/chat/completions`, for routers that take only text. Needs
    /// `--tokenizer`.
    #[arg(long)]
    pub chat: bool,
    /// Live, `--chat`: the tokenizer folder the words are chosen from (the
    /// workers' tokenizer).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Live: the workers run this many times faster than the profile's
    /// clock (`kvsteer-sim engine --time-scale`); arrivals and think times are
    /// compressed by it and measured times scaled back, so figures read in
    /// the profile's seconds.
    #[arg(long, default_value_t = 1.0)]
    pub live_time_scale: f64,
    /// Live: run every target this many times at each rate (the order of
    /// the targets rotating), and compare them on the median of the runs.
    /// One live run is noisy past the knee: on the same arrivals kvsteer's
    /// p90 moved up to 38 % from its median over three runs (sim/BENCHMARKS.md,
    /// "Medians of three runs per router").
    #[arg(long, default_value_t = 1)]
    pub repeats: u32,
    /// Live: a shell command (`sh -c`) run before each target's run, with
    /// `KVSTEER_BENCH_TARGET` (its name) and `KVSTEER_BENCH_TARGET_URL` set,
    /// e.g. one that restarts that router, so that no run inherits what the
    /// router learned in the runs before it (the workers' caches are reset
    /// after it). The bench stops when it fails.
    #[arg(long)]
    pub before_run: Option<String>,
}

/// Validated arguments.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub workloads: Vec<WorkloadKind>,
    pub policies: Vec<BenchPolicy>,
    pub rates: Vec<f64>,
    pub duration_s: f64,
    pub workers: usize,
    pub seed: u64,
    pub engine: EngineConfig,
    pub scoring: ScoringConfig,
    pub event_delay_s: f64,
    pub scrape_interval_s: f64,
    pub jobs: usize,
    pub trace: Option<Vec<TraceRequest>>,
    raw: BenchArgs,
}

pub fn workload_name(kind: WorkloadKind) -> &'static str {
    match kind {
        WorkloadKind::SharedPrefix => "shared-prefix",
        WorkloadKind::MultiTurn => "multi-turn",
        WorkloadKind::Independent => "independent",
        WorkloadKind::Mixed => "mixed",
        WorkloadKind::Trace => "trace",
    }
}

// === impl BenchArgs ===

impl BenchArgs {
    pub fn resolve(&self) -> anyhow::Result<Resolved> {
        let policies = BenchPolicy::parse_list(&self.policies)?;
        if policies.is_empty() {
            bail!("--policies is empty");
        }
        if self.rates.is_empty() || self.rates.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
            bail!("--rates must be positive numbers, got {:?}", self.rates);
        }
        if !(self.duration_s.is_finite() && self.duration_s > 0.0) {
            bail!("--duration-s must be positive, got {}", self.duration_s);
        }
        if self.workers == 0 {
            bail!("--workers must be at least 1");
        }
        for (name, v) in [
            ("--event-delay-ms", self.event_delay_ms),
            ("--scrape-interval-ms", self.scrape_interval_ms),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                bail!("{name} must be a non-negative number, got {v}");
            }
        }
        if self.scrape_interval_ms < 1.0 {
            bail!("--scrape-interval-ms must be at least 1");
        }
        if !(self.live_time_scale.is_finite() && self.live_time_scale > 0.0) {
            bail!(
                "--live-time-scale must be positive, got {}",
                self.live_time_scale
            );
        }
        if self.repeats == 0 {
            bail!("--repeats must be at least 1");
        }
        if self.repeats > 1 && !self.live {
            bail!("--repeats is for --live runs (virtual time gives the same result every run)");
        }
        if self.before_run.is_some() && !self.live {
            bail!("--before-run is for --live runs (a virtual run has no router to restart)");
        }
        if self.chat && self.tokenizer.is_none() {
            bail!("--chat needs --tokenizer DIR (the workers' tokenizer)");
        }
        let profile = TimingProfile::by_name(&self.profile)?;
        let engine = EngineConfig::new(profile);
        engine.validate().context("engine configuration")?;
        let trace = match (&self.trace, self.workload.contains(&WorkloadKind::Trace)) {
            (Some(path), true) => Some(trace::load(path)?),
            (None, true) => bail!("--workload trace needs --trace FILE"),
            (_, false) => None,
        };
        let jobs = self
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        let scoring = match &self.scoring {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("--scoring {}", path.display()))?;
                ScoringConfig::from_yaml(&text)
                    .with_context(|| format!("--scoring {}", path.display()))?
            }
            None => ScoringConfig::default(),
        };
        let mut workloads = self.workload.clone();
        workloads.dedup();
        Ok(Resolved {
            workloads,
            policies,
            rates: self.rates.clone(),
            duration_s: self.duration_s,
            workers: self.workers,
            seed: self.seed,
            engine,
            scoring,
            event_delay_s: self.event_delay_ms / 1000.0,
            scrape_interval_s: self.scrape_interval_ms / 1000.0,
            jobs,
            trace,
            raw: self.clone(),
        })
    }
}

// === impl Resolved ===

impl Resolved {
    /// The arrivals of `kind` at `rate` requests/min: the trace's, or a
    /// synthetic workload's with the flags' sizes.
    pub fn plan(&self, kind: WorkloadKind, rate: f64) -> Plan {
        match (kind, &self.trace) {
            (WorkloadKind::Trace, Some(trace)) => {
                Plan::from_trace(trace, rate, self.duration_s, self.seed)
            }
            _ => Plan::synthetic(kind, &self.sizes(kind), rate, self.duration_s, self.seed),
        }
    }

    /// The flags' sizes over the workload's defaults.
    pub fn sizes(&self, kind: WorkloadKind) -> Sizes {
        let d = default_sizes(kind);
        let a = &self.raw;
        Sizes {
            groups: a.groups.unwrap_or(d.groups).max(1),
            users_per_group: a.users_per_group.unwrap_or(d.users_per_group).max(1),
            prefix_tokens: a.prefix_tokens.unwrap_or(d.prefix_tokens),
            question_tokens: a.question_tokens.unwrap_or(d.question_tokens).max(1),
            output_tokens: a.output_tokens.unwrap_or(d.output_tokens).max(1),
            think_s: a.think_s.unwrap_or(d.think_s).max(0.0),
            max_context_tokens: a.max_context_tokens.unwrap_or(d.max_context_tokens),
        }
    }

    pub fn run_config(&self, policy: BenchPolicy) -> RunConfig {
        RunConfig {
            policy,
            workers: self.workers,
            engine: self.engine.clone(),
            scoring: self.scoring.clone(),
            seed: self.seed,
            event_delay_s: self.event_delay_s,
            scrape_interval_s: self.scrape_interval_s,
            scrape_latency: self.raw.scrape_latency,
            placement: None,
            search_runs: self.raw.search_runs as usize,
        }
    }

    pub fn args(&self) -> &BenchArgs {
        &self.raw
    }
}

/// Defaults per workload. Shared-prefix sizes follow the public reference
/// (150 groups × 5 users, 6k-token prefix, 1.2k-token question); its output
/// length is not published: 256 tokens is an assumption (see BENCHMARKS.md).
pub fn default_sizes(kind: WorkloadKind) -> Sizes {
    let shared = Sizes {
        groups: 150,
        users_per_group: 5,
        prefix_tokens: 6_000,
        question_tokens: 1_200,
        output_tokens: 256,
        think_s: 20.0,
        max_context_tokens: 20_000,
    };
    match kind {
        WorkloadKind::SharedPrefix | WorkloadKind::Independent | WorkloadKind::Trace => shared,
        WorkloadKind::MultiTurn => Sizes {
            groups: 4,
            users_per_group: 1,
            prefix_tokens: 2_000,
            question_tokens: 800,
            output_tokens: 300,
            ..shared
        },
        WorkloadKind::Mixed => Sizes {
            groups: 20,
            prefix_tokens: 3_000,
            question_tokens: 600,
            ..shared
        },
    }
}
