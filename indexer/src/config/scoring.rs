//! The `scoring:` section: the policy and the knobs of the `kvsteer` rule
//! (see `scoring::kvsteer` and `indexer/README.md`, "Scoring", for what
//! each one does and the measurement behind its default).

use super::{ConfigError, invalid, positive, unit};
use serde::{Deserialize, Serialize};

pub const DEFAULT_PREFILL_RATE_PRIOR: f64 = 8_000.0;
pub const DEFAULT_CPU_HIT_WEIGHT: f64 = 0.8;
pub const DEFAULT_DECODE_MS_PER_RUNNING: f64 = 0.5;
pub const DEFAULT_WAITING_REQUEST_TOKENS: u32 = 1_024;
pub const DEFAULT_IN_FLIGHT_TTL_S: u64 = 300;
pub const DEFAULT_CALIBRATION_ALPHA: f64 = 0.1;
pub const DEFAULT_CALIBRATION_MIN_TOKENS: u32 = 256;
pub const DEFAULT_RATE_MIN_FACTOR: f64 = 0.25;
pub const DEFAULT_RATE_MAX_FACTOR: f64 = 4.0;
pub const DEFAULT_MAX_ENDPOINTS: u32 = 3;
/// vLLM's default `max_num_seqs`.
pub const DEFAULT_MAX_NUM_SEQS: u32 = 256;
pub const DEFAULT_KV_FULL_THRESHOLD: f64 = 0.95;
pub const DEFAULT_TIE_RATIO: f64 = 0.05;
/// The prefill of a placement counts as delaying the mean backlog: enough
/// that a holder keeps its group's traffic through the queues that come and
/// go at capacity (0.5 let them move groups, each move prefilled a prefix
/// again and `--groups 30` at 180 rpm fell behind its arrivals), little
/// enough that past saturation a worker given too many groups loses the
/// excess instead of holding it while its queue grows (2.0 collapsed
/// throughput to ~130 of ~180 rpm). `sim/BENCHMARKS-DIARY.md`, "4 Dec: no
/// collapse past capacity" and "6 Dec: a holder keeps its group at capacity".
pub const DEFAULT_CONGESTION_WEIGHT: f64 = 1.0;
pub const DEFAULT_ROUTE_WINDOW_S: u64 = 60;
pub const DEFAULT_PLACEMENT_WINDOW_S: u64 = 600;
pub const DEFAULT_NOVEL_SPREAD: f64 = 1.0;
pub const DEFAULT_RECOMPUTE_WEIGHT: f64 = 0.0;
/// A holder's queue counts in full against keeping its prefix's requests
/// after 10 s (`sim/BENCHMARKS-DIARY.md`, "4 Dec (late): lasting queues and
/// even placement"): 5 and 20 s gave the same sweeps within noise.
pub const DEFAULT_LASTING_QUEUE_S: f64 = 10.0;
/// Past capacity a holder keeps its prefix's requests while every other
/// queue lasts too: on mixed traffic at 1.3× capacity, live against SGLang's
/// router, fewer groups prefilled twice and 1–4 points more hits
/// (`sim/BENCHMARKS-DIARY.md`, "5 Dec (afternoon)").
pub const DEFAULT_OVERLOAD_HOLDS: bool = true;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    Random,
    RoundRobin,
    LeastRequest,
    PrefixOnly,
    #[default]
    Kvsteer,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScoringConfig {
    pub policy: Policy,
    /// Prefill throughput assumed for a worker before calibration (tokens/s).
    pub prefill_rate_prior: f64,
    /// Share of a block's prefill saved by a CPU-tier hit (0..=1).
    pub cpu_hit_weight: f64,
    /// Delay added to a prefill per running sequence (ms).
    pub decode_ms_per_running: f64,
    /// Prompt tokens assumed for each request in a worker's scraped waiting queue.
    pub waiting_request_tokens: u32,
    /// In-flight entries without a report are dropped after this long (s).
    pub in_flight_ttl_s: u64,
    /// EWMA weight of each first-token observation in the prefill rate (0..=1).
    pub calibration_alpha: f64,
    /// Observations with less predicted work than this are not used for calibration.
    pub calibration_min_tokens: u32,
    /// Calibrated rate is clamped to `[prior * min, prior * max]`.
    pub rate_min_factor: f64,
    pub rate_max_factor: f64,
    /// Endpoints returned per pick: the choice plus fallbacks.
    pub max_endpoints: u32,
    /// The workers' `--max-num-seqs`: with this many running, a waiting
    /// request waits for a slot to free.
    pub max_num_seqs: u32,
    /// KV cache usage (0..=1) from which waiting requests wait for blocks to
    /// free, for engines that do not export their cache size.
    pub kv_full_threshold: f64,
    /// Predictions within this fraction of the best one count as a tie,
    /// broken by load and then in rotation, so equal workers share traffic.
    pub tie_ratio: f64,
    /// Weight of the delay a placement's prefill adds to the requests
    /// queueing behind it (× the workers' mean first-token backlog); 0 ranks
    /// by this request's predicted TTFT alone. The charge grows with the
    /// backlog without bound, so a high weight past saturation freezes
    /// whatever share of the traffic each worker holds.
    pub congestion_weight: f64,
    /// Prompts routed to a worker within this many seconds are its working
    /// set: a placement that pushes them out of its KV cache is charged
    /// their prefill. 0: no route memory.
    pub route_window_s: u64,
    /// Prompts routed to a worker within this many seconds are the
    /// conversations and documents it has taken on (their follow-ups come
    /// back there); a prompt's prefix routed anywhere within it is known,
    /// the rest of the prompt, cached nowhere, is new. 0: no such memory
    /// (every prompt cached nowhere is new, placements are not counted).
    pub placement_window_s: u64,
    /// A prompt's new share (0..=1) times this widens its near-tie band:
    /// where a new conversation or document lands decides where its
    /// follow-ups go, so among workers within that share of the best cost
    /// it takes the least loaded, then the one with the least placed on it.
    /// 0: the band stays `tie_ratio`.
    pub novel_spread: f64,
    /// Weight of the prefill of a prefix another worker already holds: a
    /// placement that computes it again does that work twice and splits the
    /// prefix's traffic over two copies, each kept warm less often. 0: a
    /// copy elsewhere counts for nothing.
    pub recompute_weight: f64,
    /// A queue on a worker holding the prompt's prefix counts in full
    /// against keeping the prompt there only once it has lasted this long
    /// (seconds since a committed pick last found the worker with no
    /// request waiting for a first token); a younger one counts for its
    /// share of this. A burst drains by itself, and moving a prompt off its
    /// prefix prefills the prefix again elsewhere. 0: every queue counts in
    /// full.
    pub lasting_queue_s: f64,
    /// Past capacity every queue lasts, and moving a prompt off its holder
    /// relieves nobody: it prefills the prefix again elsewhere. With this
    /// on, a holder's queue counts against keeping the prompt only as far
    /// as it lasts longer than every other candidate's (the holder keeps
    /// its queue's discount up to the youngest other queue's lasting
    /// share), so a worker with a young or no queue still draws the excess.
    /// false: a holder's queue is discounted by its own age alone.
    pub overload_holds: bool,
}

// === impl Default ===

impl Default for ScoringConfig {
    fn default() -> Self {
        Self {
            policy: Policy::default(),
            prefill_rate_prior: DEFAULT_PREFILL_RATE_PRIOR,
            cpu_hit_weight: DEFAULT_CPU_HIT_WEIGHT,
            decode_ms_per_running: DEFAULT_DECODE_MS_PER_RUNNING,
            waiting_request_tokens: DEFAULT_WAITING_REQUEST_TOKENS,
            in_flight_ttl_s: DEFAULT_IN_FLIGHT_TTL_S,
            calibration_alpha: DEFAULT_CALIBRATION_ALPHA,
            calibration_min_tokens: DEFAULT_CALIBRATION_MIN_TOKENS,
            rate_min_factor: DEFAULT_RATE_MIN_FACTOR,
            rate_max_factor: DEFAULT_RATE_MAX_FACTOR,
            max_endpoints: DEFAULT_MAX_ENDPOINTS,
            max_num_seqs: DEFAULT_MAX_NUM_SEQS,
            kv_full_threshold: DEFAULT_KV_FULL_THRESHOLD,
            tie_ratio: DEFAULT_TIE_RATIO,
            congestion_weight: DEFAULT_CONGESTION_WEIGHT,
            route_window_s: DEFAULT_ROUTE_WINDOW_S,
            placement_window_s: DEFAULT_PLACEMENT_WINDOW_S,
            novel_spread: DEFAULT_NOVEL_SPREAD,
            recompute_weight: DEFAULT_RECOMPUTE_WEIGHT,
            lasting_queue_s: DEFAULT_LASTING_QUEUE_S,
            overload_holds: DEFAULT_OVERLOAD_HOLDS,
        }
    }
}

// === impl ScoringConfig ===

impl ScoringConfig {
    /// Reads scoring settings from YAML: an indexer configuration (its
    /// `scoring:` section) or that section alone. Unset keys take their
    /// defaults; the result is validated.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let value: serde_norway::Value = serde_norway::from_str(text)?;
        let section = match value.get("scoring") {
            Some(s) => s.clone(),
            None if value.is_null() => serde_norway::Value::Mapping(Default::default()),
            None => value,
        };
        let cfg: ScoringConfig = serde_norway::from_value(section)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        positive("scoring.prefill_rate_prior", self.prefill_rate_prior)?;
        unit("scoring.cpu_hit_weight", self.cpu_hit_weight)?;
        if !(self.decode_ms_per_running.is_finite() && self.decode_ms_per_running >= 0.0) {
            return Err(invalid("scoring.decode_ms_per_running", "must be >= 0"));
        }
        if self.in_flight_ttl_s == 0 {
            return Err(invalid("scoring.in_flight_ttl_s", "must be > 0"));
        }
        unit("scoring.calibration_alpha", self.calibration_alpha)?;
        positive("scoring.rate_min_factor", self.rate_min_factor)?;
        positive("scoring.rate_max_factor", self.rate_max_factor)?;
        if self.rate_min_factor > 1.0 || self.rate_max_factor < 1.0 {
            return Err(invalid(
                "scoring.rate_min_factor",
                "need rate_min_factor <= 1 <= rate_max_factor",
            ));
        }
        if self.max_endpoints == 0 {
            return Err(invalid("scoring.max_endpoints", "must be > 0"));
        }
        if self.max_num_seqs == 0 {
            return Err(invalid("scoring.max_num_seqs", "must be > 0"));
        }
        unit("scoring.kv_full_threshold", self.kv_full_threshold)?;
        unit("scoring.tie_ratio", self.tie_ratio)?;
        if !(self.novel_spread.is_finite() && self.novel_spread >= 0.0) {
            return Err(invalid("scoring.novel_spread", "must be >= 0"));
        }
        if !(self.congestion_weight.is_finite() && self.congestion_weight >= 0.0) {
            return Err(invalid("scoring.congestion_weight", "must be >= 0"));
        }
        if !(self.recompute_weight.is_finite() && self.recompute_weight >= 0.0) {
            return Err(invalid("scoring.recompute_weight", "must be >= 0"));
        }
        if !(self.lasting_queue_s.is_finite() && self.lasting_queue_s >= 0.0) {
            return Err(invalid("scoring.lasting_queue_s", "must be >= 0"));
        }
        Ok(())
    }
}
