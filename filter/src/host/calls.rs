//! Thin wrappers over `proxy_wasm::hostcalls` that log failures and return
//! plain options, so callbacks never unwrap.

use std::time::{Duration, SystemTime};

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, MetricType, Status};

use crate::metrics::{Counter, Histogram};

pub(crate) fn header(map: MapType, name: &str) -> Option<String> {
    hostcalls::get_map_value(map, name).unwrap_or_else(|status| {
        log::warn!("kvsteer-filter: reading header {name} failed: {status:?}");
        None
    })
}

pub(crate) fn remove_header(map: MapType, name: &str) {
    if let Err(status) = hostcalls::remove_map_value(map, name) {
        log::warn!("kvsteer-filter: removing header {name} failed: {status:?}");
    }
}

pub(crate) fn set_header(map: MapType, name: &str, value: &str) -> bool {
    match hostcalls::set_map_value(map, name, Some(value)) {
        Ok(()) => true,
        Err(status) => {
            log::warn!("kvsteer-filter: setting header {name} failed: {status:?}");
            false
        }
    }
}

/// `len` bytes of a buffer from `start`; `None` when unavailable.
pub(crate) fn buffer(kind: BufferType, start: usize, len: usize) -> Option<Vec<u8>> {
    match hostcalls::get_buffer(kind, start, len) {
        Ok(bytes) => bytes,
        Err(status) => {
            log::warn!("kvsteer-filter: reading {kind:?} failed: {status:?}");
            None
        }
    }
}

pub(crate) fn property(path: Vec<&str>) -> Option<String> {
    match hostcalls::get_property(path) {
        Ok(bytes) => bytes.and_then(|b| String::from_utf8(b).ok()),
        Err(_) => None,
    }
}

pub(crate) fn now() -> Option<SystemTime> {
    hostcalls::get_current_time().ok()
}

/// Milliseconds from `since` to now, 0 when unknown.
pub(crate) fn elapsed_ms(since: Option<SystemTime>) -> f64 {
    match (since, now()) {
        (Some(since), Some(now)) => now
            .duration_since(since)
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or(0.0),
        _ => 0.0,
    }
}

/// Starts a unary gRPC call to `kvsteer.v1.Router/<method>` on `cluster`,
/// with `metadata` as initial metadata (request headers).
pub(crate) fn grpc_call(
    cluster: &str,
    method: &str,
    metadata: Vec<(&str, &[u8])>,
    message: &[u8],
    timeout: Duration,
) -> Result<u32, Status> {
    hostcalls::dispatch_grpc_call(
        cluster,
        kvsteer_proto::paths::SERVICE,
        method,
        metadata,
        Some(message),
        timeout,
    )
}

// === Metrics ===

/// Metric ids of every [`Counter`] and [`Histogram`], defined once per
/// plugin configuration.
pub(crate) struct Metrics {
    ids: Vec<Option<u32>>,
    histograms: Vec<Option<u32>>,
}

fn define(kind: MetricType, name: &str) -> Option<u32> {
    hostcalls::define_metric(kind, name)
        .map_err(|status| {
            log::warn!("kvsteer-filter: defining metric {name} failed: {status:?}");
        })
        .ok()
}

impl Metrics {
    pub(crate) fn define() -> Self {
        Self {
            ids: Counter::all()
                .map(|c| define(MetricType::Counter, &c.name()))
                .collect(),
            histograms: Histogram::ALL
                .iter()
                .map(|h| define(MetricType::Histogram, h.name()))
                .collect(),
        }
    }

    pub(crate) fn record(&self, histogram: Histogram, value: u64) {
        if let Some(Some(id)) = self.histograms.get(histogram.index())
            && let Err(status) = hostcalls::record_metric(*id, value)
        {
            log::debug!("kvsteer-filter: recording {histogram:?} failed: {status:?}");
        }
    }

    pub(crate) fn inc(&self, counter: Counter) {
        if let Some(Some(id)) = self.ids.get(counter.index())
            && let Err(status) = hostcalls::increment_metric(*id, 1)
        {
            log::debug!("kvsteer-filter: incrementing {counter:?} failed: {status:?}");
        }
    }
}
