//! [`RedisMetrics`]: round-trip latency by operation, errors by kind.

use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Op {
    lookup,
    apply,
    purge,
    refresh,
    ping,
}

/// Why a Redis call failed.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ErrorKind {
    /// No answer within the budget.
    timeout,
    /// Connection refused, reset or dropped.
    io,
    /// Unexpected reply, server or script error.
    protocol,
    /// `max_in_flight` calls were already waiting: failed fast.
    saturated,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: Op,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub op: Op,
    pub kind: ErrorKind,
}

/// Cheap to clone (families are `Arc`s inside).
#[derive(Clone, Debug)]
pub struct RedisMetrics {
    round_trip: Family<OpLabels, Histogram>,
    errors: Family<ErrorLabels, Counter>,
}

fn round_trip_histogram() -> Histogram {
    // 25 µs .. ~0.8 s
    Histogram::new(exponential_buckets(0.000_025, 2.0, 16))
}

// === impl RedisMetrics ===

impl Default for RedisMetrics {
    /// Metrics registered nowhere (tests, benchmarks).
    fn default() -> Self {
        Self {
            round_trip: Family::new_with_constructor(round_trip_histogram),
            errors: Family::default(),
        }
    }
}

impl RedisMetrics {
    /// Registers `kvsteer_index_redis_round_trip_seconds{op}` and
    /// `kvsteer_index_redis_errors_total{op,kind}` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("kvsteer_index_redis");
        r.register(
            "round_trip_seconds",
            "Redis round trips that succeeded, by operation",
            m.round_trip.clone(),
        );
        r.register(
            "errors",
            "Redis calls that failed, by operation and kind",
            m.errors.clone(),
        );
        m
    }

    pub fn observe(&self, op: Op, elapsed: Duration) {
        self.round_trip
            .get_or_create(&OpLabels { op })
            .observe(elapsed.as_secs_f64());
    }

    pub fn error(&self, op: Op, kind: ErrorKind) {
        self.errors.get_or_create(&ErrorLabels { op, kind }).inc();
    }

    /// Errors counted so far for `op` and `kind` (tests, admin).
    pub fn error_count(&self, op: Op, kind: ErrorKind) -> u64 {
        self.errors.get_or_create(&ErrorLabels { op, kind }).get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn registered_names_and_labels() {
        let mut registry = Registry::default();
        let m = RedisMetrics::register(&mut registry);
        m.observe(Op::lookup, Duration::from_micros(300));
        m.error(Op::apply, ErrorKind::timeout);
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        assert!(
            out.contains("kvsteer_index_redis_round_trip_seconds_count{op=\"lookup\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("kvsteer_index_redis_errors_total{op=\"apply\",kind=\"timeout\"} 1"),
            "{out}"
        );
        assert_eq!(m.error_count(Op::apply, ErrorKind::timeout), 1);
    }
}
