//! [`RedisMetrics`]: round-trip latency by operation, errors by kind, the
//! hot cache's hits and misses, write leases (acquired, lost, held).

use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
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
    lease,
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
    /// A write refused by Redis: this replica does not hold the lease.
    fenced,
}

/// A hot-cache lookup's outcome.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum CacheResult {
    hit,
    miss,
}

/// Why a replica stopped holding a worker's lease.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum LossReason {
    /// Another replica holds it.
    taken,
    /// It lapsed in Redis (or Redis restarted empty).
    expired,
    /// No successful renewal for two thirds of the TTL (Redis unreachable).
    unrenewed,
    /// Released at shutdown.
    released,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    pub result: CacheResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    pub worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LossLabels {
    pub worker: String,
    pub reason: LossReason,
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
    cache: Family<CacheLabels, Counter>,
    lease_acquired: Family<LeaseLabels, Counter>,
    lease_lost: Family<LossLabels, Counter>,
    lease_held: Family<LeaseLabels, Gauge>,
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
            cache: Family::default(),
            lease_acquired: Family::default(),
            lease_lost: Family::default(),
            lease_held: Family::default(),
        }
    }
}

impl RedisMetrics {
    /// Registers in `registry`, all prefixed `kvsteer_index_redis_`:
    /// `round_trip_seconds{op}`, `errors_total{op,kind}`,
    /// `cache_lookups_total{result}`, `lease_acquired_total{worker}`,
    /// `lease_lost_total{worker,reason}`, `lease_held{worker}` (1 while this
    /// replica holds the worker's lease).
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
        r.register(
            "cache_lookups",
            "Lookups answered by the in-process hot cache (hit) or by Redis (miss)",
            m.cache.clone(),
        );
        r.register(
            "lease_acquired",
            "Write leases this replica acquired, by worker",
            m.lease_acquired.clone(),
        );
        r.register(
            "lease_lost",
            "Write leases this replica stopped holding, by worker and reason",
            m.lease_lost.clone(),
        );
        r.register(
            "lease_held",
            "1 while this replica holds the worker's write lease",
            m.lease_held.clone(),
        );
        m
    }

    pub fn cache(&self, result: CacheResult) {
        self.cache.get_or_create(&CacheLabels { result }).inc();
    }

    /// Hot-cache lookups counted so far with `result` (tests, benchmarks).
    pub fn cache_count(&self, result: CacheResult) -> u64 {
        self.cache.get_or_create(&CacheLabels { result }).get()
    }

    pub fn lease_acquired(&self, worker: &str) {
        let labels = LeaseLabels {
            worker: worker.to_owned(),
        };
        self.lease_acquired.get_or_create(&labels).inc();
        self.lease_held.get_or_create(&labels).set(1);
    }

    pub fn lease_lost(&self, worker: &str, reason: LossReason) {
        self.lease_lost
            .get_or_create(&LossLabels {
                worker: worker.to_owned(),
                reason,
            })
            .inc();
        self.lease_held
            .get_or_create(&LeaseLabels {
                worker: worker.to_owned(),
            })
            .set(0);
    }

    /// Publish `worker`'s held gauge at 0 (a lease this replica never held).
    pub fn lease_idle(&self, worker: &str) {
        self.lease_held
            .get_or_create(&LeaseLabels {
                worker: worker.to_owned(),
            })
            .set(0);
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
        m.cache(CacheResult::hit);
        m.lease_acquired("w1");
        m.lease_lost("w1", LossReason::taken);
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        for line in [
            "kvsteer_index_redis_cache_lookups_total{result=\"hit\"} 1",
            "kvsteer_index_redis_lease_acquired_total{worker=\"w1\"} 1",
            "kvsteer_index_redis_lease_lost_total{worker=\"w1\",reason=\"taken\"} 1",
            "kvsteer_index_redis_lease_held{worker=\"w1\"} 0",
        ] {
            assert!(out.contains(line), "{line} in {out}");
        }
    }
}
