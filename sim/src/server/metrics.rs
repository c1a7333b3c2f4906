//! `/metrics`: vLLM's metric names and labels (`model_name`, `engine`),
//! registered into a registry handed in.

use std::borrow::Cow;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::engine::{EngineStats, FinishedRequest};

/// vLLM's `time_to_first_token_seconds` buckets.
const TTFT_BUCKETS: [f64; 21] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0,
];
/// vLLM's request-latency buckets.
const E2E_BUCKETS: [f64; 22] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0, 15360.0,
];

#[derive(Debug, Clone)]
pub struct EngineMetrics {
    running: Gauge,
    waiting: Gauge,
    kv_usage: Gauge<f64, AtomicU64>,
    prefix_queries: Counter,
    prefix_hits: Counter,
    preemptions: Counter,
    ttft: Histogram,
    e2e: Histogram,
    last: std::sync::Arc<std::sync::Mutex<EngineStats>>,
}

// === impl EngineMetrics ===

impl EngineMetrics {
    /// Registers the metrics of one engine into `registry`.
    pub fn register(
        registry: &mut Registry,
        model_name: &str,
        block_size: usize,
        num_gpu_blocks: usize,
    ) -> Self {
        let labels = [
            (Cow::Borrowed("engine"), Cow::Borrowed("0")),
            (
                Cow::Borrowed("model_name"),
                Cow::Owned(model_name.to_owned()),
            ),
        ];
        let reg = registry.sub_registry_with_labels(labels.into_iter());
        let m = Self {
            running: Gauge::default(),
            waiting: Gauge::default(),
            kv_usage: Gauge::default(),
            prefix_queries: Counter::default(),
            prefix_hits: Counter::default(),
            preemptions: Counter::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            last: Default::default(),
        };
        reg.register(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            m.running.clone(),
        );
        reg.register(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            m.waiting.clone(),
        );
        reg.register(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            m.kv_usage.clone(),
        );
        reg.register(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            m.prefix_queries.clone(),
        );
        reg.register(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            m.prefix_hits.clone(),
        );
        reg.register(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            m.preemptions.clone(),
        );
        reg.register(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            m.ttft.clone(),
        );
        reg.register(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            m.e2e.clone(),
        );
        let info = Family::<Vec<(String, String)>, Gauge>::default();
        info.get_or_create(&vec![
            ("block_size".to_owned(), block_size.to_string()),
            ("cache_dtype".to_owned(), "auto".to_owned()),
            ("enable_prefix_caching".to_owned(), "True".to_owned()),
            ("num_gpu_blocks".to_owned(), num_gpu_blocks.to_string()),
        ])
        .set(1);
        reg.register(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            info,
        );
        m
    }

    /// Mirrors the engine's gauges and advances the counters by what changed.
    pub fn observe_stats(&self, s: &EngineStats) {
        self.running.set(s.running as i64);
        self.waiting.set(s.waiting as i64);
        self.kv_usage.set(s.kv_usage);
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.prefix_queries.inc_by(
            s.prefix_cache_queries
                .saturating_sub(last.prefix_cache_queries),
        );
        self.prefix_hits
            .inc_by(s.prefix_cache_hits.saturating_sub(last.prefix_cache_hits));
        self.preemptions
            .inc_by(s.preemptions.saturating_sub(last.preemptions));
        *last = *s;
    }

    /// Latencies in simulated seconds.
    pub fn observe_finished(&self, f: &FinishedRequest) {
        self.ttft.observe((f.first_token_at - f.arrival).max(0.0));
        self.e2e.observe((f.finished_at - f.arrival).max(0.0));
    }
}
