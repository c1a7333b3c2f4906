//! The indexer's Prometheus metrics (`kvsteer_` prefix), registered into a
//! registry handed in.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use std::{collections::HashSet, sync::atomic::AtomicU64};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PickLabels {
    pub policy: &'static str,
    /// `routed`, `no_workers`, `unknown_model`.
    pub outcome: &'static str,
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AbandonLabels {
    /// `deadline`, `cancelled` (the caller went away), `reported` (its
    /// terminal report came first), `worker_gone` (its worker left before
    /// the commit).
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabels {
    pub worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    pub worker: String,
    pub state: &'static str,
}

/// Tenants with their own metric label; every other tenant value is
/// `other`, so any number of values makes a bounded set of series.
#[derive(Clone, Debug, Default)]
pub struct TenantAllowlist(HashSet<String>);

impl TenantAllowlist {
    pub fn new(tenants: &[String]) -> Self {
        Self(tenants.iter().cloned().collect())
    }

    /// The tenant's label: itself when allowlisted, `other` otherwise.
    pub fn label(&self, tenant: &str) -> String {
        if self.0.contains(tenant) {
            tenant.to_owned()
        } else {
            "other".to_owned()
        }
    }
}

pub struct Metrics {
    tenants: TenantAllowlist,
    pub picks: Family<PickLabels, Counter>,
    pub degraded: Family<ReasonLabels, Counter>,
    pub pick_latency: Histogram,
    pub tokenize_latency: Histogram,
    /// Large tokenizations stopped because their pick's caller was gone.
    pub tokenize_cancelled: Counter,
    /// Large tokenizations running (at most `tokenize.max_concurrent_large`).
    pub tokenize_large_running: Gauge,
    pub prompt_tokens: Histogram,
    pub matched_ratio: Histogram,
    pub predicted_ttft: Histogram,
    pub observed_ttft: Family<TenantLabels, Histogram>,
    /// observed / predicted TTFT, fine around 1 (calibrated predictions
    /// land within ±20 %).
    pub ttft_error_ratio: Histogram,
    pub reports: Family<KindLabels, Counter>,
    pub in_flight_expired: Counter,
    pub in_flight: Family<WorkerLabels, Gauge>,
    pub index_entries: Gauge,
    pub indexed_blocks: Family<WorkerLabels, Gauge>,
    pub events_received: Family<WorkerLabels, Counter>,
    pub events_applied: Family<WorkerLabels, Counter>,
    pub events_skipped: Family<WorkerLabels, Counter>,
    pub malformed: Family<WorkerLabels, Counter>,
    pub gaps: Family<WorkerLabels, Counter>,
    pub replays: Family<WorkerLabels, Counter>,
    pub resets: Family<WorkerLabels, Counter>,
    /// Key operations the index backend failed to apply.
    pub index_write_errors: Family<WorkerLabels, Counter>,
    /// Worker entries purged and its events replayed after failed writes.
    pub index_resyncs: Family<WorkerLabels, Counter>,
    pub stream_state: Family<StreamLabels, Gauge>,
    /// Workers given up (unreachable beyond `streams.down_grace_ms`).
    pub engines_lost: Family<WorkerLabels, Counter>,
    pub worker_up: Family<WorkerLabels, Gauge>,
    pub prefill_rate: Family<WorkerLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Picks answered (or not) but not recorded in the ledger, by reason.
    pub pick_abandoned: Family<AbandonLabels, Counter>,
    /// `PickStream` streams open now (the filter keeps a few per Envoy worker).
    pub pick_streams: Gauge,
    /// Reports that matched no ledger entry (or a finished one), by kind.
    pub reports_unmatched: Family<KindLabels, Counter>,
    pub reports_after_end: Family<KindLabels, Counter>,
    pub ledger_entries: Gauge,
    pub ledger_tombstones: Gauge,
    /// Prompt blocks the ledger counts as held by requests in flight.
    pub ledger_held_blocks: Gauge,
    /// Prompts whose blocks stopped counting as held before their end.
    pub ledger_held_dropped: Counter,
    /// How far back the route window reaches (seconds; 0: nothing in it).
    pub route_window_seconds: Gauge<f64, AtomicU64>,
    /// Tombstones dropped by their capacity bound before their TTL.
    pub tombstones_evicted: Counter,
    /// Picks without a model, steered as the only model served.
    pub model_defaulted: Counter,
    /// The tokenizers' caches (every model's, summed; refreshed by the
    /// encoder at most once a second): token ids held and entries in the
    /// segment cache, and in the fast path's word cache.
    pub tokenize_cache_tokens: Gauge,
    pub tokenize_cache_entries: Gauge,
    pub tokenize_word_cache_tokens: Gauge,
    pub tokenize_word_cache_entries: Gauge,
}

fn seconds_buckets() -> impl Iterator<Item = f64> {
    // 50 µs .. ~26 s
    prometheus_client::metrics::histogram::exponential_buckets(0.00005, 2.0, 20)
}

/// Bounds of the observed / predicted TTFT histogram.
pub const TTFT_ERROR_BUCKETS: [f64; 13] = [
    0.125, 0.25, 0.5, 0.667, 0.8, 0.9, 1.0, 1.111, 1.25, 1.5, 2.0, 4.0, 8.0,
];

fn ttft_hist() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.005, 2.0, 14,
    ))
}

// === impl Metrics ===

impl Metrics {
    /// Registers every metric under `kvsteer_` in `registry`.
    pub fn new(registry: &mut Registry, tenant_allowlist: &[String]) -> Self {
        let m = Self {
            tenants: TenantAllowlist::new(tenant_allowlist),
            picks: Family::default(),
            degraded: Family::default(),
            pick_latency: Histogram::new(seconds_buckets()),
            tokenize_latency: Histogram::new(seconds_buckets()),
            tokenize_cancelled: Counter::default(),
            tokenize_large_running: Gauge::default(),
            prompt_tokens: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(16.0, 2.0, 14),
            ),
            matched_ratio: Histogram::new([
                0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0,
            ]),
            predicted_ttft: ttft_hist(),
            observed_ttft: Family::new_with_constructor(ttft_hist),
            ttft_error_ratio: Histogram::new(TTFT_ERROR_BUCKETS),
            reports: Family::default(),
            in_flight_expired: Counter::default(),
            in_flight: Family::default(),
            index_entries: Gauge::default(),
            indexed_blocks: Family::default(),
            events_received: Family::default(),
            events_applied: Family::default(),
            events_skipped: Family::default(),
            malformed: Family::default(),
            gaps: Family::default(),
            replays: Family::default(),
            resets: Family::default(),
            index_write_errors: Family::default(),
            index_resyncs: Family::default(),
            stream_state: Family::default(),
            engines_lost: Family::default(),
            worker_up: Family::default(),
            prefill_rate: Family::default(),
            pick_abandoned: Family::default(),
            pick_streams: Gauge::default(),
            reports_unmatched: Family::default(),
            reports_after_end: Family::default(),
            ledger_entries: Gauge::default(),
            ledger_tombstones: Gauge::default(),
            ledger_held_blocks: Gauge::default(),
            ledger_held_dropped: Counter::default(),
            route_window_seconds: Gauge::default(),
            tombstones_evicted: Counter::default(),
            model_defaulted: Counter::default(),
            tokenize_cache_tokens: Gauge::default(),
            tokenize_cache_entries: Gauge::default(),
            tokenize_word_cache_tokens: Gauge::default(),
            tokenize_word_cache_entries: Gauge::default(),
        };
        let r = registry.sub_registry_with_prefix("kvsteer");
        r.register(
            "picks",
            "Picks by policy, outcome and tenant",
            m.picks.clone(),
        );
        r.register(
            "degraded_picks",
            "Picks scored on load only, by reason",
            m.degraded.clone(),
        );
        r.register(
            "pick_latency_seconds",
            "Time to answer a pick (tokenize, lookup, score)",
            m.pick_latency.clone(),
        );
        r.register(
            "tokenize_latency_seconds",
            "Time to tokenize a prompt",
            m.tokenize_latency.clone(),
        );
        r.register(
            "tokenize_cancelled",
            "Large tokenizations stopped because the pick's caller was gone",
            m.tokenize_cancelled.clone(),
        );
        r.register(
            "tokenize_large_running",
            "Large prompts being tokenized (bounded by tokenize.max_concurrent_large)",
            m.tokenize_large_running.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt length of picked requests",
            m.prompt_tokens.clone(),
        );
        r.register(
            "matched_token_ratio",
            "Share of the prompt cached on the chosen worker",
            m.matched_ratio.clone(),
        );
        r.register(
            "predicted_ttft_seconds",
            "Predicted time to first token of the chosen worker",
            m.predicted_ttft.clone(),
        );
        r.register(
            "observed_ttft_seconds",
            "Observed time to first token (filter reports)",
            m.observed_ttft.clone(),
        );
        r.register(
            "ttft_error_ratio",
            "Observed / predicted time to first token",
            m.ttft_error_ratio.clone(),
        );
        r.register("reports", "Reports by kind", m.reports.clone());
        r.register(
            "in_flight_expired",
            "In-flight entries dropped after the TTL without a report",
            m.in_flight_expired.clone(),
        );
        r.register(
            "in_flight",
            "Requests picked and not done",
            m.in_flight.clone(),
        );
        r.register(
            "index_entries",
            "Entries in the prefix index",
            m.index_entries.clone(),
        );
        r.register(
            "indexed_blocks",
            "Blocks indexed per worker",
            m.indexed_blocks.clone(),
        );
        r.register(
            "events_received",
            "KV events received",
            m.events_received.clone(),
        );
        r.register(
            "events_applied",
            "KV events applied to the index",
            m.events_applied.clone(),
        );
        r.register(
            "events_skipped",
            "KV events skipped (unknown parent, other group, ...)",
            m.events_skipped.clone(),
        );
        r.register(
            "malformed_batches",
            "Event batches that failed to decode",
            m.malformed.clone(),
        );
        r.register("stream_gaps", "Sequence gaps detected", m.gaps.clone());
        r.register(
            "stream_replays",
            "Batches received by replay",
            m.replays.clone(),
        );
        r.register(
            "stream_resets",
            "Publisher restarts (sequence went back)",
            m.resets.clone(),
        );
        r.register(
            "index_write_errors",
            "Key operations the index backend failed to apply (the worker is resynced)",
            m.index_write_errors.clone(),
        );
        r.register(
            "index_resyncs",
            "Workers purged from the index and replayed after failed writes",
            m.index_resyncs.clone(),
        );
        r.register(
            "stream_state",
            "1 for the current state of each worker's event stream",
            m.stream_state.clone(),
        );
        r.register(
            "stream_engines_lost",
            "Workers given up after streams.down_grace_ms unreachable (their blocks purged)",
            m.engines_lost.clone(),
        );
        r.register(
            "worker_up",
            "1 when the worker's metrics answer",
            m.worker_up.clone(),
        );
        r.register(
            "prefill_rate_tokens_per_second",
            "Calibrated prefill rate",
            m.prefill_rate.clone(),
        );
        r.register(
            "pick_abandoned",
            "Picks not recorded in flight: deadline passed, caller gone, or terminal report first",
            m.pick_abandoned.clone(),
        );
        r.register(
            "pick_streams",
            "PickStream streams open (picks as messages on long-lived streams, a few per Envoy worker)",
            m.pick_streams.clone(),
        );
        r.register(
            "reports_unmatched",
            "Reports for a request without a ledger entry (expired, not picked yet, another replica's, unknown)",
            m.reports_unmatched.clone(),
        );
        r.register(
            "reports_after_end",
            "First-token reports that came after their request's end (the end overtook them and carried the first token)",
            m.reports_after_end.clone(),
        );
        r.register(
            "ledger_entries",
            "Requests in the ledger (picked, no terminal report yet)",
            m.ledger_entries.clone(),
        );
        r.register(
            "route_window_seconds",
            "How far back the route window reaches: route_window_s, or less where the routes within it exceed the workers' KV caches",
            m.route_window_seconds.clone(),
        );
        r.register(
            "ledger_tombstones",
            "Terminal reports kept for picks that have not committed yet",
            m.ledger_tombstones.clone(),
        );
        r.register(
            "ledger_held_blocks",
            "Prompt blocks held by requests in flight, as the ledger counts them (bounded; per block and request)",
            m.ledger_held_blocks.clone(),
        );
        r.register(
            "ledger_held_dropped",
            "Prompts whose blocks stopped counting as held before their end (the ledger's bound on held blocks)",
            m.ledger_held_dropped.clone(),
        );
        r.register(
            "ledger_tombstones_evicted",
            "Tombstones dropped by the capacity bound before their TTL",
            m.tombstones_evicted.clone(),
        );
        r.register(
            "model_defaulted",
            "Picks without a model steered as the only model served",
            m.model_defaulted.clone(),
        );
        r.register(
            "tokenize_cache_tokens",
            "Token ids held by the tokenizers' segment caches (bounded, 4M per model by default)",
            m.tokenize_cache_tokens.clone(),
        );
        r.register(
            "tokenize_cache_entries",
            "Text pieces held by the tokenizers' segment caches",
            m.tokenize_cache_entries.clone(),
        );
        r.register(
            "tokenize_word_cache_tokens",
            "Token ids held by the tokenizers' word caches (fast path; bounded, ~1M per model)",
            m.tokenize_word_cache_tokens.clone(),
        );
        r.register(
            "tokenize_word_cache_entries",
            "Words held by the tokenizers' word caches (fast path)",
            m.tokenize_word_cache_entries.clone(),
        );
        m
    }

    /// The tenant's label: itself when allowlisted, `other` otherwise.
    pub fn tenant_label(&self, tenant: &str) -> String {
        self.tenants.label(tenant)
    }

    pub fn worker(name: &str) -> WorkerLabels {
        WorkerLabels {
            worker: name.to_owned(),
        }
    }

    /// Drops every series of a worker that left (pods come and go: their
    /// names must not pile up in the exposition).
    pub fn forget_worker(&self, name: &str) {
        let labels = Self::worker(name);
        for family in [&self.in_flight, &self.indexed_blocks, &self.worker_up] {
            family.remove(&labels);
        }
        for family in [
            &self.events_received,
            &self.events_applied,
            &self.events_skipped,
            &self.malformed,
            &self.gaps,
            &self.replays,
            &self.resets,
            &self.index_write_errors,
            &self.index_resyncs,
            &self.engines_lost,
        ] {
            family.remove(&labels);
        }
        self.prefill_rate.remove(&labels);
        for state in crate::streams::StreamState::ALL {
            self.stream_state.remove(&StreamLabels {
                worker: name.to_owned(),
                state: state.as_str(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_labels_are_bounded_and_encoded() {
        let mut reg = Registry::default();
        let m = Metrics::new(&mut reg, &["team-a".to_owned()]);
        assert_eq!(m.tenant_label("team-a"), "team-a");
        assert_eq!(m.tenant_label("team-b"), "other");
        assert_eq!(m.tenant_label(""), "other");
        m.picks
            .get_or_create(&PickLabels {
                policy: "kvsteer",
                outcome: "routed",
                tenant: m.tenant_label("team-z"),
            })
            .inc();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(
            out.contains(
                r#"kvsteer_picks_total{policy="kvsteer",outcome="routed",tenant="other"} 1"#
            ),
            "{out}"
        );
        assert!(out.contains("kvsteer_pick_latency_seconds_bucket"));
    }
}
