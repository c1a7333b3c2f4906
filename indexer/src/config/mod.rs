//! The service configuration (YAML): every key has a default, unknown keys are
//! rejected, and [`Config::validate`] names the field that is wrong.

mod checks;
mod index;
mod scoring;
mod tenants;

pub use index::{IndexBackend, IndexConfig};
pub use scoring::*;
pub use tenants::TenantsConfig;

use checks::*;

use crate::discovery::{DiscoveryConfig, DiscoveryError};
use serde::{Deserialize, Serialize};
use std::{collections::HashSet, path::PathBuf};

// === defaults ===

pub const DEFAULT_GRPC_LISTEN: &str = "127.0.0.1:9090";
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9091";
pub const DEFAULT_BLOCK_SIZE: u32 = 16;
pub const DEFAULT_INDEX_CAPACITY: usize = 4_000_000;
pub const DEFAULT_TENANT_HEADER: &str = "x-tenant-id";
pub const DEFAULT_SCRAPE_INTERVAL_MS: u64 = 1_000;
pub const DEFAULT_SCRAPE_TIMEOUT_MS: u64 = 500;
pub const DEFAULT_SCRAPE_DOWN_AFTER: u32 = 3;
/// Decoded batches queued per worker. A replay (up to vLLM's 10,000
/// buffered batches, read as fast as the index applies them) keeps this
/// queue full: at ~7 KB a decoded batch, 1,024 held ~7 MB per worker, and
/// three workers replaying at once after a Redis restart lifted the RSS by
/// 20+ MB. Live traffic needs little: a step publishes one batch.
pub const DEFAULT_EVENT_CHANNEL: usize = 128;
pub const DEFAULT_MAX_REPLAY_RETRIES: u32 = 3;
pub const DEFAULT_BACKOFF_INITIAL_MS: u64 = 100;
pub const DEFAULT_BACKOFF_MAX_MS: u64 = 5_000;
/// A model's longest prompt when `max_model_len` is not set: generous (most
/// long-context models), so that valid long prompts are steered.
pub const DEFAULT_MAX_MODEL_LEN: u32 = 131_072;
/// Prompt text bytes per token assumed at most when `max_tokenize_bytes` is
/// derived from `max_model_len` (Qwen3/Llama tokenizers average 3.5-4.5 on
/// prose and code): a prompt with more text has more tokens than the engine
/// accepts, so it is not worth encoding.
pub const TOKENIZE_BYTES_PER_TOKEN: u64 = 8;
/// Prompts with more text than this are encoded on a blocking thread and
/// count against [`DEFAULT_MAX_LARGE_TOKENIZATIONS`] (~32k tokens, ~10 ms cold).
pub const DEFAULT_LARGE_PROMPT_BYTES: usize = 128 << 10;
/// Large prompts encoded at once. Encoding takes ~300 bytes of transient
/// memory per byte of text, so two 1 MiB prompts peak near 600 MB.
pub const DEFAULT_MAX_LARGE_TOKENIZATIONS: usize = 2;
/// The filter's default `max_body_bytes` (8 MiB) plus room for the proto
/// framing of a `PickRequest` (field tags and lengths; text is not escaped).
pub const DEFAULT_GRPC_MAX_MESSAGE_BYTES: usize = 9 << 20;
/// The filter's default `max_body_bytes`, to explain the gRPC limit.
pub const FILTER_DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;
pub const DEFAULT_RECONNECT_MAX_MS: u64 = 1_000;
pub const DEFAULT_DOWN_GRACE_MS: u64 = 2_000;

// === types ===

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub grpc_listen: String,
    pub admin_listen: String,
    pub models: Vec<ModelConfig>,
    /// Static workers (outside Kubernetes, or beside discovered ones).
    pub workers: Vec<WorkerConfig>,
    /// Workers found at run time (Kubernetes pods).
    #[serde(skip_serializing_if = "is_default")]
    pub discovery: DiscoveryConfig,
    pub scoring: ScoringConfig,
    pub index: IndexConfig,
    pub tenants: TenantsConfig,
    pub scrape: ScrapeConfig,
    pub streams: StreamsConfig,
    pub grpc: GrpcConfig,
    pub tokenize: TokenizeConfig,
    /// Access to the admin listener's `/debug/*` endpoints.
    #[serde(skip_serializing_if = "is_default")]
    pub admin: AdminConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    pub name: String,
    /// Folder with `tokenizer.json` and `tokenizer_config.json`.
    pub tokenizer: PathBuf,
    pub block_size: u32,
    /// The engine's `--max-model-len`: a longer prompt is rejected by the
    /// engine wherever it goes, so it is scored on load only.
    pub max_model_len: u32,
    /// Prompt text (bytes) beyond which the prompt is not tokenized and the
    /// pick is scored on load only (`prompt_too_large`); default
    /// `max_model_len × TOKENIZE_BYTES_PER_TOKEN`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokenize_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    pub name: String,
    /// `ip:port` that Envoy routes to.
    pub endpoint: String,
    pub model: String,
    /// ZeroMQ PUB endpoint of the engine's KV events (`tcp://host:port`).
    pub kv_events: Option<String>,
    /// ZeroMQ ROUTER endpoint for replays.
    pub replay: Option<String>,
    /// Prometheus endpoint (`http://host:port/metrics`).
    pub metrics: Option<String>,
    pub data_parallel_rank: Option<u32>,
    /// Bind the SUB socket and let the engine connect in.
    pub bind: bool,
    /// Event topic; `kv@<endpoint>@<model>` when absent.
    pub topic: Option<String>,
}

/// The environment variable holding the `/debug/*` bearer token when
/// `admin.token_file` is unset.
pub const ADMIN_TOKEN_ENV: &str = "KVSTEER_ADMIN_TOKEN";

/// The admin listener (`admin_listen`) beyond its address: who may call
/// `/debug/workers` and `/debug/score` (they show the fleet and run picks).
/// `/metrics`, `/healthz` and `/readyz` stay open: put a NetworkPolicy or a
/// loopback address in front of the port.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    pub debug: DebugAccess,
    /// File whose content (trimmed) is the bearer token of `debug: token`;
    /// unset: the `KVSTEER_ADMIN_TOKEN` environment variable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DebugAccess {
    /// Anyone who reaches the admin port (the default; it listens on loopback).
    #[default]
    Enabled,
    /// `/debug/*` answers 404.
    Disabled,
    /// `/debug/*` needs `Authorization: Bearer <token>`.
    Token,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScrapeConfig {
    pub interval_ms: u64,
    pub timeout_ms: u64,
    /// Consecutive failed scrapes after which a worker is marked down.
    pub down_after: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamsConfig {
    /// Batches queued per worker between the subscriber and the index.
    pub channel_capacity: usize,
    pub max_replay_retries: u32,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    /// Cap of the delay between reconnect attempts to a worker's PUB after
    /// its connection was lost (zeromq's own reconnect backs off to 30 s).
    pub reconnect_max_ms: u64,
    /// A worker whose stream lost its engine (or whose scrape is down) this
    /// long is given up: its blocks are purged.
    pub down_grace_ms: u64,
    /// Reconnect when a live stream is silent this long (s); off when absent.
    pub idle_reconnect_s: Option<u64>,
}

/// The gRPC server the filter calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpcConfig {
    /// Largest `PickRequest` accepted (bytes). Must be at least the filter's
    /// `max_body_bytes`: a larger Pick is refused and the request goes
    /// unsteered.
    pub max_message_bytes: usize,
    /// This replica's gRPC address as Envoy's indexer cluster knows it
    /// (`ip:port`): answered with every pick, so that the filter sends the
    /// request's reports to the replica holding its ledger entry. Default:
    /// `$POD_IP:<grpc_listen port>` when `POD_IP` is set, else none (one
    /// replica, or reports to any).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
    /// TLS on the gRPC listener, with client certificates required; unset:
    /// plaintext HTTP/2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<GrpcTlsConfig>,
}

/// Server certificate and the CA whose client certificates are admitted
/// (rustls). Every connection must present a client certificate that chains
/// to `client_ca_file`; others are refused in the handshake.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcTlsConfig {
    /// PEM certificate chain of this server.
    pub cert_file: PathBuf,
    /// PEM private key of `cert_file`.
    pub key_file: PathBuf,
    /// PEM CA certificate(s) the clients' (Envoy's) certificates chain to.
    pub client_ca_file: PathBuf,
}

/// Bounds on the tokenization work one pick may cause.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TokenizeConfig {
    /// Prompts with more text than this (bytes) are large: encoded on a
    /// blocking thread, stopped when the pick's caller is gone, and limited
    /// by `max_concurrent_large`.
    pub large_prompt_bytes: usize,
    /// Large prompts encoded at once; a pick that finds them all taken is
    /// scored on load only (`tokenize_busy`) instead of waiting.
    pub max_concurrent_large: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid YAML: {0}")]
    Parse(#[from] serde_norway::Error),
    #[error("{field}: required")]
    Missing { field: String },
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("{field}: duplicate value {value:?}")]
    Duplicate { field: String, value: String },
    #[error("{field}: model {model:?} is not listed under `models`")]
    UnknownModel { field: String, model: String },
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
}

// === impl Default ===

impl Default for Config {
    fn default() -> Self {
        Self {
            grpc_listen: DEFAULT_GRPC_LISTEN.into(),
            admin_listen: DEFAULT_ADMIN_LISTEN.into(),
            models: Vec::new(),
            workers: Vec::new(),
            discovery: DiscoveryConfig::default(),
            scoring: ScoringConfig::default(),
            index: IndexConfig::default(),
            tenants: TenantsConfig::default(),
            scrape: ScrapeConfig::default(),
            streams: StreamsConfig::default(),
            grpc: GrpcConfig::default(),
            tokenize: TokenizeConfig::default(),
            admin: AdminConfig::default(),
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            tokenizer: PathBuf::new(),
            block_size: DEFAULT_BLOCK_SIZE,
            max_model_len: DEFAULT_MAX_MODEL_LEN,
            max_tokenize_bytes: None,
        }
    }
}

impl Default for GrpcConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: DEFAULT_GRPC_MAX_MESSAGE_BYTES,
            advertise: None,
            tls: None,
        }
    }
}

impl Default for TokenizeConfig {
    fn default() -> Self {
        Self {
            large_prompt_bytes: DEFAULT_LARGE_PROMPT_BYTES,
            max_concurrent_large: DEFAULT_MAX_LARGE_TOKENIZATIONS,
        }
    }
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        Self {
            interval_ms: DEFAULT_SCRAPE_INTERVAL_MS,
            timeout_ms: DEFAULT_SCRAPE_TIMEOUT_MS,
            down_after: DEFAULT_SCRAPE_DOWN_AFTER,
        }
    }
}

impl Default for StreamsConfig {
    fn default() -> Self {
        Self {
            channel_capacity: DEFAULT_EVENT_CHANNEL,
            max_replay_retries: DEFAULT_MAX_REPLAY_RETRIES,
            backoff_initial_ms: DEFAULT_BACKOFF_INITIAL_MS,
            backoff_max_ms: DEFAULT_BACKOFF_MAX_MS,
            reconnect_max_ms: DEFAULT_RECONNECT_MAX_MS,
            down_grace_ms: DEFAULT_DOWN_GRACE_MS,
            idle_reconnect_s: None,
        }
    }
}

// === impl Config ===

impl Config {
    /// Parses YAML and validates it.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let cfg: Config = serde_norway::from_str(text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    pub fn to_yaml(&self) -> String {
        serde_norway::to_string(self).unwrap_or_else(|e| format!("# cannot print: {e}\n"))
    }

    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.name == name)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        socket_addr("grpc_listen", &self.grpc_listen)?;
        socket_addr("admin_listen", &self.admin_listen)?;
        if self.admin.token_file.is_some() && self.admin.debug != DebugAccess::Token {
            return Err(invalid(
                "admin.token_file",
                "is only read with `debug: token`",
            ));
        }
        if self.models.is_empty() {
            return Err(missing("models"));
        }
        let mut names = HashSet::new();
        for (i, m) in self.models.iter().enumerate() {
            let f = |k: &str| format!("models[{i}].{k}");
            if m.name.is_empty() {
                return Err(missing(&f("name")));
            }
            if !names.insert(m.name.as_str()) {
                return Err(duplicate(&f("name"), &m.name));
            }
            if m.tokenizer.as_os_str().is_empty() {
                return Err(missing(&f("tokenizer")));
            }
            if !(1..=4096).contains(&m.block_size) {
                return Err(invalid(&f("block_size"), "must be in 1..=4096"));
            }
            if m.max_model_len == 0 {
                return Err(invalid(&f("max_model_len"), "must be > 0"));
            }
            if m.max_tokenize_bytes == Some(0) {
                return Err(invalid(&f("max_tokenize_bytes"), "must be > 0"));
            }
        }
        if self.workers.is_empty() && self.discovery.kubernetes.is_none() {
            return Err(missing("workers (or discovery.kubernetes)"));
        }
        self.discovery.validate(|name| self.model(name).is_some())?;
        let (mut names, mut endpoints) = (HashSet::new(), HashSet::new());
        for (i, w) in self.workers.iter().enumerate() {
            let f = |k: &str| format!("workers[{i}].{k}");
            if w.name.is_empty() {
                return Err(missing(&f("name")));
            }
            if !names.insert(w.name.as_str()) {
                return Err(duplicate(&f("name"), &w.name));
            }
            socket_addr(&f("endpoint"), &w.endpoint)?;
            if !endpoints.insert((w.endpoint.as_str(), w.data_parallel_rank)) {
                return Err(duplicate(&f("endpoint"), &w.endpoint));
            }
            if w.model.is_empty() {
                return Err(missing(&f("model")));
            }
            if self.model(&w.model).is_none() {
                return Err(ConfigError::UnknownModel {
                    field: f("model"),
                    model: w.model.clone(),
                });
            }
            for (key, value) in [("kv_events", &w.kv_events), ("replay", &w.replay)] {
                if let Some(v) = value {
                    zmq_endpoint(&f(key), v)?;
                }
            }
            if w.replay.is_some() && w.kv_events.is_none() {
                return Err(invalid(&f("replay"), "needs `kv_events` as well"));
            }
            if let Some(url) = &w.metrics
                && !url.starts_with("http://")
            {
                return Err(invalid(&f("metrics"), "must be an http:// URL"));
            }
        }
        self.scoring.validate()?;
        self.index.validate()?;
        self.tenants.validate()?;
        for (field, model) in self.tenants.models() {
            if self.model(model).is_none() {
                return Err(ConfigError::UnknownModel {
                    field,
                    model: model.to_owned(),
                });
            }
        }
        if self.scrape.interval_ms == 0 {
            return Err(invalid("scrape.interval_ms", "must be > 0"));
        }
        if self.scrape.timeout_ms == 0 {
            return Err(invalid("scrape.timeout_ms", "must be > 0"));
        }
        if self.scrape.down_after == 0 {
            return Err(invalid("scrape.down_after", "must be > 0"));
        }
        if self.grpc.max_message_bytes < MIN_GRPC_MESSAGE_BYTES {
            return Err(invalid(
                "grpc.max_message_bytes",
                "must be at least 65536 (a Pick carries the whole prompt)",
            ));
        }
        if let Some(a) = &self.grpc.advertise {
            socket_addr("grpc.advertise", a)?;
        }
        if self.tokenize.max_concurrent_large == 0 {
            return Err(invalid("tokenize.max_concurrent_large", "must be > 0"));
        }
        if self.streams.channel_capacity == 0 {
            return Err(invalid("streams.channel_capacity", "must be > 0"));
        }
        if self.streams.backoff_initial_ms == 0
            || self.streams.backoff_max_ms < self.streams.backoff_initial_ms
        {
            return Err(invalid(
                "streams.backoff_max_ms",
                "need 0 < backoff_initial_ms <= backoff_max_ms",
            ));
        }
        if self.streams.reconnect_max_ms < self.streams.backoff_initial_ms {
            return Err(invalid(
                "streams.reconnect_max_ms",
                "must be >= backoff_initial_ms",
            ));
        }
        Ok(())
    }
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Below this no realistic Pick fits.
const MIN_GRPC_MESSAGE_BYTES: usize = 64 << 10;

impl Config {
    /// What the size limits mean for requests, one line each, for
    /// `check-config`: which Picks the gRPC server accepts (and how that
    /// must agree with the filter's `max_body_bytes`), which prompts are
    /// tokenized, and how many large ones at once.
    pub fn explain(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let max = self.grpc.max_message_bytes;
        lines.push(format!(
            "grpc.max_message_bytes {max} ({}): a Pick larger than this is refused and its \
             request goes unsteered; set the filter's max_body_bytes to at most this",
            mib(max)
        ));
        if max < FILTER_DEFAULT_MAX_BODY_BYTES + (FILTER_DEFAULT_MAX_BODY_BYTES >> 4) {
            lines.push(format!(
                "warning: grpc.max_message_bytes is below the filter's default max_body_bytes \
                 ({}) plus proto framing: lower the filter's max_body_bytes to {max} or less, \
                 or bodies in between are buffered and never steered",
                mib(FILTER_DEFAULT_MAX_BODY_BYTES)
            ));
        }
        for m in &self.models {
            lines.push(format!(
                "model {:?}: prompts with more than {} bytes of text (max_tokenize_bytes{}) \
                 or more than {} tokens (max_model_len) are scored on load only \
                 (degraded, reason prompt_too_large)",
                m.name,
                m.tokenize_cap(),
                match m.max_tokenize_bytes {
                    Some(_) => String::new(),
                    None => format!(" = max_model_len × {TOKENIZE_BYTES_PER_TOKEN}"),
                },
                m.max_model_len,
            ));
        }
        lines.push(format!(
            "tokenize: prompts with more than {} bytes of text are encoded on a blocking \
             thread, at most {} at once; a pick finding them all taken is scored on load only \
             (degraded, reason tokenize_busy)",
            self.tokenize.large_prompt_bytes, self.tokenize.max_concurrent_large
        ));
        lines
    }
}

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

impl ModelConfig {
    /// Prompt text (bytes) beyond which this model's prompts are not tokenized.
    pub fn tokenize_cap(&self) -> u64 {
        self.max_tokenize_bytes
            .unwrap_or(u64::from(self.max_model_len) * TOKENIZE_BYTES_PER_TOKEN)
    }
}

impl WorkerConfig {
    /// The ZeroMQ topic of this worker's events.
    pub fn topic(&self) -> String {
        self.topic
            .clone()
            .unwrap_or_else(|| format!("kv@{}@{}", self.endpoint, self.model))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::redis::RedisConfig;

    const MINIMAL: &str = "
models:
  - name: m
    tokenizer: /tok
workers:
  - name: w1
    endpoint: 127.0.0.1:8001
    model: m
";

    fn err(yaml: &str) -> String {
        Config::from_yaml(yaml).unwrap_err().to_string()
    }

    #[test]
    fn tenant_budgets_are_checked() {
        let tenants = |body: &str| err(&format!("{MINIMAL}tenants:\n{body}"));
        let e = tenants("  overrides:\n    team-b: {budget: {tokens_per_minute: -5}}\n");
        assert!(
            e.contains("invalid YAML") && e.contains("tokens_per_minute"),
            "{e}"
        );
        let e = tenants("  overrides:\n    team-b: {budget: {}}\n");
        assert!(
            e.contains("tenants.overrides[\"team-b\"].budget") && e.contains("sets no limit"),
            "{e}"
        );
        let e = tenants("  default: {budget: {requests_per_minute: 0}}\n");
        assert!(
            e.contains("tenants.default.budget: requests_per_minute"),
            "{e}"
        );
        let e = tenants("  default: {models: {nope: {budget: {max_concurrent: 1}}}}\n");
        assert!(
            e.contains("tenants.default.models") && e.contains("\"nope\""),
            "{e}"
        );
        let e = tenants("  default: {isolation: private}\n");
        assert!(e.contains("isolation"), "{e}");
        let e = tenants("  budget_store: {backend: redis, on_error: retry}\n");
        assert!(e.contains("on_error"), "{e}");
        let ok = Config::from_yaml(&format!(
            "{MINIMAL}tenants:\n  default: {{models: {{m: {{isolation: salted, budget: {{max_concurrent: 3}}}}}}}}\n"
        ));
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn minimal_gets_defaults() {
        let cfg = Config::from_yaml(MINIMAL).unwrap();
        assert_eq!(cfg.grpc_listen, DEFAULT_GRPC_LISTEN);
        assert_eq!(cfg.models[0].block_size, DEFAULT_BLOCK_SIZE);
        assert_eq!(cfg.scoring.policy, Policy::Kvsteer);
        assert_eq!(cfg.workers[0].topic(), "kv@127.0.0.1:8001@m");
    }

    #[test]
    fn example_config_is_valid_and_round_trips() {
        let text = include_str!("../../config.example.yaml");
        let cfg = Config::from_yaml(text).unwrap();
        assert_eq!(cfg.workers.len(), 2);
        let again = Config::from_yaml(&cfg.to_yaml()).unwrap();
        assert_eq!(cfg, again);
    }

    #[test]
    fn size_limits_default_and_validate() {
        let cfg = Config::from_yaml(MINIMAL).unwrap();
        assert_eq!(cfg.grpc.max_message_bytes, 9 << 20);
        assert_eq!(cfg.models[0].max_model_len, DEFAULT_MAX_MODEL_LEN);
        assert_eq!(
            cfg.models[0].tokenize_cap(),
            u64::from(DEFAULT_MAX_MODEL_LEN) * TOKENIZE_BYTES_PER_TOKEN
        );
        let set = Config::from_yaml(&MINIMAL.replace(
            "tokenizer: /tok\n",
            "tokenizer: /tok\n    max_model_len: 1000\n",
        ))
        .unwrap();
        assert_eq!(set.models[0].tokenize_cap(), 8_000);
        let set = Config::from_yaml(&MINIMAL.replace(
            "tokenizer: /tok\n",
            "tokenizer: /tok\n    max_tokenize_bytes: 5000\n",
        ))
        .unwrap();
        assert_eq!(set.models[0].tokenize_cap(), 5_000);
        let e = err(&MINIMAL.replace(
            "tokenizer: /tok\n",
            "tokenizer: /tok\n    max_model_len: 0\n",
        ));
        assert!(e.starts_with("models[0].max_model_len"), "{e}");
        let e = err(&format!("{MINIMAL}grpc:\n  max_message_bytes: 1000\n"));
        assert!(e.starts_with("grpc.max_message_bytes"), "{e}");
        let e = err(&format!("{MINIMAL}tokenize:\n  max_concurrent_large: 0\n"));
        assert!(e.starts_with("tokenize.max_concurrent_large"), "{e}");
    }

    /// `check-config` says which Picks are accepted and which prompts
    /// tokenized, and warns when the gRPC limit is below the filter's body
    /// limit.
    #[test]
    fn explain_tells_how_the_limits_agree() {
        let cfg = Config::from_yaml(MINIMAL).unwrap();
        let lines = cfg.explain();
        assert!(lines[0].starts_with("grpc.max_message_bytes 9437184 (9.0 MiB)"));
        assert!(lines[0].contains("max_body_bytes"), "{lines:?}");
        assert!(!lines.iter().any(|l| l.starts_with("warning")), "{lines:?}");
        assert!(
            lines.iter().any(|l| l.contains("1048576 bytes")
                && l.contains("max_model_len × 8")
                && l.contains("prompt_too_large")),
            "{lines:?}"
        );
        assert!(lines.iter().any(|l| l.contains("tokenize_busy")));
        let small =
            Config::from_yaml(&format!("{MINIMAL}grpc:\n  max_message_bytes: 4194304\n")).unwrap();
        assert!(
            small.explain().iter().any(|l| l.starts_with("warning")),
            "{:?}",
            small.explain()
        );
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let e = err(&format!("{MINIMAL}bogus: 1\n"));
        assert!(e.contains("bogus"), "{e}");
        let e = err(&MINIMAL.replace("model: m\n", "model: m\n    colour: red\n"));
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn errors_name_the_field() {
        let e = err(&MINIMAL.replace("127.0.0.1:8001", "nowhere"));
        assert!(e.starts_with("workers[0].endpoint"), "{e}");
        let e = err(&MINIMAL.replace("model: m\n", "model: other\n"));
        assert!(e.starts_with("workers[0].model"), "{e}");
        let e = err(&format!("{MINIMAL}scoring:\n  cpu_hit_weight: 2\n"));
        assert!(e.starts_with("scoring.cpu_hit_weight"), "{e}");
        let e = err(&format!("{MINIMAL}scoring:\n  novel_spread: -0.5\n"));
        assert!(e.starts_with("scoring.novel_spread"), "{e}");
        let e = err(&format!("{MINIMAL}scoring:\n  recompute_weight: -1\n"));
        assert!(e.starts_with("scoring.recompute_weight"), "{e}");
        let e = err(&format!("{MINIMAL}scoring:\n  policy: magic\n"));
        assert!(e.contains("magic"), "{e}");
        let e = err(&MINIMAL.replace("model: m\n", "model: m\n    kv_events: udp://x\n"));
        assert!(e.starts_with("workers[0].kv_events"), "{e}");
        let e = err(&format!(
            "{MINIMAL}  - name: w1\n    endpoint: 127.0.0.1:8002\n    model: m\n"
        ));
        assert!(e.starts_with("workers[1].name: duplicate"), "{e}");
        assert!(err("models: []\n").starts_with("models: required"));
    }

    #[test]
    fn stream_liveness_keys() {
        let cfg = Config::from_yaml(MINIMAL).unwrap();
        assert_eq!(cfg.streams.reconnect_max_ms, DEFAULT_RECONNECT_MAX_MS);
        assert!(cfg.streams.reconnect_max_ms <= 1_000);
        assert_eq!(cfg.streams.down_grace_ms, DEFAULT_DOWN_GRACE_MS);
        let cfg = Config::from_yaml(&format!(
            "{MINIMAL}streams:\n  reconnect_max_ms: 250\n  down_grace_ms: 0\n"
        ))
        .unwrap();
        assert_eq!(
            (cfg.streams.reconnect_max_ms, cfg.streams.down_grace_ms),
            (250, 0)
        );
        let e = err(&format!("{MINIMAL}streams:\n  reconnect_max_ms: 50\n"));
        assert!(e.starts_with("streams.reconnect_max_ms"), "{e}");
    }

    #[test]
    fn scoring_alone_or_from_a_whole_config() {
        let alone = ScoringConfig::from_yaml("novel_spread: 0.5\nroute_window_s: 30\n").unwrap();
        assert_eq!(alone.novel_spread, 0.5);
        assert_eq!(alone.route_window_s, 30);
        assert_eq!(alone.tie_ratio, DEFAULT_TIE_RATIO);
        let whole = ScoringConfig::from_yaml(include_str!("../../config.example.yaml")).unwrap();
        assert_eq!(
            whole,
            Config::from_yaml(include_str!("../../config.example.yaml"))
                .unwrap()
                .scoring
        );
        assert_eq!(
            ScoringConfig::from_yaml("").unwrap(),
            ScoringConfig::default()
        );
        let e = ScoringConfig::from_yaml("tie_ratio: 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("scoring.tie_ratio"), "{e}");
        let e = ScoringConfig::from_yaml("colour: red\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn redis_backend_takes_nested_settings() {
        let cfg = Config::from_yaml(&format!(
            "{MINIMAL}index:\n  backend: redis\n  redis:\n    url: redis://10.0.0.7:6380\n    key_prefix: prod\n    lookup_timeout_ms: 8\n    writer: false\n"
        ))
        .unwrap();
        assert_eq!(cfg.index.backend, IndexBackend::Redis);
        assert_eq!(cfg.index.redis.url, "redis://10.0.0.7:6380");
        assert_eq!(cfg.index.redis.key_prefix, "prod");
        assert_eq!(cfg.index.redis.lookup_timeout_ms, 8);
        assert_eq!(
            cfg.index.redis.writer,
            crate::index::redis::WriterMode::Never
        );
        assert_eq!(
            cfg.index.redis.write_timeout_ms,
            RedisConfig::default().write_timeout_ms
        );
        let again = Config::from_yaml(&cfg.to_yaml()).unwrap();
        assert_eq!(cfg, again);
    }

    #[test]
    fn the_redis_url_has_one_spelling() {
        let cfg = Config::from_yaml(&format!(
            "{MINIMAL}index:\n  backend: redis\n  redis:\n    url: redis://10.0.0.8:6379\n"
        ))
        .unwrap();
        assert_eq!(cfg.index.redis.url, "redis://10.0.0.8:6379");
        assert_eq!(
            cfg.index.redis.writer,
            crate::index::redis::WriterMode::Auto
        );
        // The old `index.redis_url` shorthand is an unknown field now.
        let e = err(&format!(
            "{MINIMAL}index:\n  backend: redis\n  redis_url: redis://10.0.0.8:6379\n"
        ));
        assert!(e.contains("redis_url"), "{e}");
    }

    #[test]
    fn redis_errors_name_the_nested_field() {
        let e = err(&format!(
            "{MINIMAL}index:\n  backend: redis\n  redis:\n    url: http://x\n"
        ));
        assert!(e.starts_with("index.redis.url"), "{e}");
        let e = err(&format!(
            "{MINIMAL}index:\n  backend: redis\n  redis:\n    lookup_timeout_ms: 0\n"
        ));
        assert!(e.starts_with("index.redis.lookup_timeout_ms"), "{e}");
        let e = err(&format!(
            "{MINIMAL}index:\n  backend: redis\n  redis:\n    colour: red\n"
        ));
        assert!(e.contains("colour"), "{e}");
        let e = err(&format!(
            "{MINIMAL}index:\n  backend: redis\n  redis:\n    lease_ttl_ms: 1\n"
        ));
        assert!(e.starts_with("index.redis.lease_ttl_ms"), "{e}");
        let e = err(&format!(
            "{MINIMAL}index:\n  backend: redis\n  redis:\n    writer: sometimes\n"
        ));
        assert!(e.contains("writer"), "{e}");
        // The memory backend ignores the redis section.
        Config::from_yaml(&format!(
            "{MINIMAL}index:\n  redis:\n    lookup_timeout_ms: 0\n"
        ))
        .unwrap();
    }
}
