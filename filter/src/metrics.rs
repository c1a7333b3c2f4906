//! The filter's counters, by name. The host glue defines each one once per VM
//! (`define_metric`) and increments it by index.
//!
//! Envoy prefixes wasm metrics with `wasmcustom.`; the shipped Envoy configs
//! turn the last segment of `kvsteer_filter_failopen.<reason>` into a
//! `reason` tag, so Prometheus sees
//! `envoy_wasmcustom_kvsteer_filter_failopen{reason="timeout"}`.

/// Why a steerable request went on to Envoy's fallback load balancing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailOpenReason {
    /// The `Pick` call hit its deadline.
    Timeout,
    /// The `Pick` call ended with another gRPC error (indexer down, ...).
    GrpcError,
    /// Envoy refused to start the `Pick` call (unknown cluster, ...).
    DispatchFailed,
    /// The indexer's answer did not decode or made no sense.
    BadAnswer,
    /// The indexer had no opinion (no endpoints).
    NoEndpoints,
    /// The body starts like a JSON object but is not valid JSON or not an
    /// OpenAI request.
    MalformedBody,
    /// The body does not start like a JSON object (whatever its content type).
    NotJson,
    /// The body is larger than `max_body_bytes`.
    BodyTooLarge,
    /// The request's framing was odd (bad content-length, trailers).
    BadRequest,
    /// A host call failed (header or body unavailable).
    HostError,
}

/// Every counter the filter keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Requests whose destination the indexer chose.
    Steered,
    /// Requests the indexer rejected with a local reply.
    Rejected,
    FailOpen(FailOpenReason),
    /// Reports dispatched.
    ReportSent,
    /// Reports that could not be dispatched or came back with an error.
    ReportFailed,
    /// Picks sent as messages on the `PickStream` (the rest: unary calls).
    PickStreamed,
    /// `PickStream` streams opened (the first, replacements, rotations).
    PickStreamOpened,
}

/// Every histogram the filter records, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Histogram {
    /// From the buffered body to the pick built: body copy, JSON parse and
    /// field extraction inside the VM (its encoding is part of the send).
    PrepareUs,
    /// From the `Pick` dispatch to its answer: Envoy's gRPC client, the
    /// network and the indexer's pick.
    PickUs,
    /// The part of [`Self::PickUs`] spent inside the host call that sends
    /// the pick: for a unary call Envoy's `dispatch_grpc_call` (the call's
    /// HTTP/2 stream set up, routed to the indexer cluster, its headers and
    /// message encoded); on the `PickStream` the message send alone.
    DispatchUs,
}

impl Histogram {
    pub const ALL: [Self; 3] = [Self::PrepareUs, Self::PickUs, Self::DispatchUs];

    pub fn index(self) -> usize {
        match self {
            Self::PrepareUs => 0,
            Self::PickUs => 1,
            Self::DispatchUs => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::PrepareUs => "kvsteer_filter_prepare_us",
            Self::PickUs => "kvsteer_filter_pick_us",
            Self::DispatchUs => "kvsteer_filter_dispatch_us",
        }
    }
}

/// Whole microseconds from `from` to `to` (0 when the clock went back).
pub fn micros(from: std::time::SystemTime, to: std::time::SystemTime) -> u64 {
    to.duration_since(from)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

// === impl FailOpenReason ===

impl FailOpenReason {
    pub const ALL: [Self; 10] = [
        Self::Timeout,
        Self::GrpcError,
        Self::DispatchFailed,
        Self::BadAnswer,
        Self::NoEndpoints,
        Self::MalformedBody,
        Self::NotJson,
        Self::BodyTooLarge,
        Self::BadRequest,
        Self::HostError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::GrpcError => "grpc_error",
            Self::DispatchFailed => "dispatch_failed",
            Self::BadAnswer => "bad_answer",
            Self::NoEndpoints => "no_endpoints",
            Self::MalformedBody => "malformed_body",
            Self::NotJson => "not_json",
            Self::BodyTooLarge => "body_too_large",
            Self::BadRequest => "bad_request",
            Self::HostError => "host_error",
        }
    }
}

// === impl Counter ===

impl Counter {
    pub const COUNT: usize = 6 + FailOpenReason::ALL.len();

    /// All counters, in index order.
    pub fn all() -> impl Iterator<Item = Self> {
        [
            Self::Steered,
            Self::Rejected,
            Self::ReportSent,
            Self::ReportFailed,
            Self::PickStreamed,
            Self::PickStreamOpened,
        ]
        .into_iter()
        .chain(FailOpenReason::ALL.into_iter().map(Self::FailOpen))
    }

    /// Dense index into a table of `COUNT` metric ids.
    pub fn index(self) -> usize {
        match self {
            Self::Steered => 0,
            Self::Rejected => 1,
            Self::ReportSent => 2,
            Self::ReportFailed => 3,
            Self::PickStreamed => 4,
            Self::PickStreamOpened => 5,
            Self::FailOpen(reason) => {
                6 + FailOpenReason::ALL
                    .iter()
                    .position(|r| *r == reason)
                    .unwrap_or_default()
            }
        }
    }

    /// The metric name handed to `define_metric`.
    pub fn name(self) -> String {
        match self {
            Self::Steered => "kvsteer_filter_steered".to_owned(),
            Self::Rejected => "kvsteer_filter_rejected".to_owned(),
            Self::ReportSent => "kvsteer_filter_report_sent".to_owned(),
            Self::ReportFailed => "kvsteer_filter_report_failed".to_owned(),
            Self::PickStreamed => "kvsteer_filter_pick_streamed".to_owned(),
            Self::PickStreamOpened => "kvsteer_filter_pick_stream_opened".to_owned(),
            Self::FailOpen(reason) => format!("kvsteer_filter_failopen.{}", reason.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn indexes_are_dense_and_names_unique() {
        let all: Vec<Counter> = Counter::all().collect();
        assert_eq!(all.len(), Counter::COUNT);
        for (i, counter) in all.iter().enumerate() {
            assert_eq!(counter.index(), i, "{counter:?}");
        }
        let names: HashSet<String> = all.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), Counter::COUNT);
        assert_eq!(
            Counter::FailOpen(FailOpenReason::Timeout).name(),
            "kvsteer_filter_failopen.timeout"
        );
    }

    #[test]
    fn histograms_are_dense_and_distinct_from_counters() {
        for (i, h) in Histogram::ALL.iter().enumerate() {
            assert_eq!(h.index(), i);
            assert!(Counter::all().all(|c| c.name() != h.name()));
        }
        let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(5);
        assert_eq!(micros(t - std::time::Duration::from_micros(1500), t), 1500);
        assert_eq!(micros(t, t - std::time::Duration::from_micros(1)), 0);
    }

    #[test]
    fn names_are_plain_stat_segments() {
        let histograms = Histogram::ALL.iter().map(|h| h.name().to_owned());
        for name in Counter::all().map(Counter::name).chain(histograms) {
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_' || b == b'.'),
                "{name}"
            );
        }
    }
}
