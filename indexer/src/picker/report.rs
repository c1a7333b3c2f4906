//! Reports from the filter: first token, done, cancelled. They move the
//! request's ledger entry to its end (releasing its load) and, when the
//! filter measured a streamed first token, feed the observed-TTFT
//! histograms and calibrate the worker's prefill rate.
//!
//! Only measured first tokens calibrate: a whole (non-streamed) response's
//! first bytes come with its end, and its time says nothing about the
//! prefill. An end (`done` or `cancelled`) without a first token before it
//! counts as both; its `first_token_ms` is that first token. The filter
//! puts it on every done (and on a cancel after output), also after a
//! first token reported alone, so an end that overtakes its first-token
//! report (separate calls, separate tasks) or outlives a lost one still
//! counts it, once; a first token after its end is counted as such
//! (`kvsteer_reports_after_end_total`), apart from the unmatched ones.

use crate::{
    ledger::{Entry, Finished},
    metrics::{KindLabels, Metrics, TenantLabels},
    picker::Picker,
    scoring::calibrate,
};
use prometheus_client::metrics::counter::Counter;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportKind {
    FirstToken,
    Done,
    Cancelled,
}

/// One report, in domain terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report<'a> {
    pub request_id: &'a str,
    pub kind: ReportKind,
    /// The filter's measure of the event, from forwarding (ms); not
    /// positive: the time since the pick stands in.
    pub elapsed_ms: f64,
    /// The time to first token (`elapsed_ms` of a first token,
    /// `first_token_ms` of an end) was measured on a streamed, successful
    /// response: it may calibrate.
    pub ttft_measured: bool,
    /// Done or cancelled only: the first token's time, counted if no
    /// first-token report came before.
    pub first_token_ms: Option<f64>,
}

/// What a first-token time was taken from.
enum FirstToken {
    /// The report's own `elapsed_ms`.
    Elapsed,
    /// An end's `first_token_ms`.
    WithEnd(f64),
}

impl ReportKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FirstToken => "first_token",
            Self::Done => "done",
            Self::Cancelled => "cancelled",
        }
    }
}

// === impl Report ===

impl<'a> Report<'a> {
    /// A first token at `elapsed_ms`, measured (streamed) or not.
    pub fn first_token(request_id: &'a str, elapsed_ms: f64, measured: bool) -> Self {
        Self {
            request_id,
            kind: ReportKind::FirstToken,
            elapsed_ms,
            ttft_measured: measured,
            first_token_ms: None,
        }
    }

    /// The end of a response (its first token reported before, or never).
    pub fn done(request_id: &'a str, elapsed_ms: f64) -> Self {
        Self {
            request_id,
            kind: ReportKind::Done,
            elapsed_ms,
            ttft_measured: false,
            first_token_ms: None,
        }
    }

    /// The end of a response with its first token (reported before, or
    /// only here).
    pub fn done_with_first_token(
        request_id: &'a str,
        elapsed_ms: f64,
        first_token_ms: f64,
        measured: bool,
    ) -> Self {
        Self {
            first_token_ms: Some(first_token_ms),
            ttft_measured: measured,
            ..Self::done(request_id, elapsed_ms)
        }
    }

    /// A request that ended without a response.
    pub fn cancelled(request_id: &'a str) -> Self {
        Self {
            kind: ReportKind::Cancelled,
            ..Self::done(request_id, 0.0)
        }
    }
}

// === impl Picker ===

impl Picker {
    /// Applies a report at `now`. A first token for an id without an entry
    /// (ended, expired, not ours) changes nothing; a terminal report for
    /// one leaves a tombstone, so that its pick, if it commits later, is
    /// not counted.
    pub fn report(&self, r: &Report<'_>, now: Instant) {
        let kind = KindLabels {
            kind: r.kind.as_str(),
        };
        self.metrics.reports.get_or_create(&kind).inc();
        match r.kind {
            ReportKind::FirstToken => match self.ledger.first_token(r.request_id, now) {
                Some(entry) if r.ttft_measured => {
                    self.observe_ttft(&entry, r, FirstToken::Elapsed, now);
                }
                Some(_) => {}
                // Its end overtook it and carried its first token.
                None if self.ledger.ended(r.request_id) => {
                    self.metrics.reports_after_end.get_or_create(&kind).inc();
                }
                None => {
                    self.metrics.reports_unmatched.get_or_create(&kind).inc();
                }
            },
            ReportKind::Done | ReportKind::Cancelled => {
                match self.ledger.finish(r.request_id, now) {
                    Finished::Closed(entry) => {
                        let first = entry.first_token_at.is_none();
                        if let (true, true, Some(ms)) = (first, r.ttft_measured, r.first_token_ms) {
                            self.observe_ttft(&entry, r, FirstToken::WithEnd(ms), now);
                        }
                    }
                    Finished::Tombstoned | Finished::AlreadyTombstoned => {
                        self.metrics.reports_unmatched.get_or_create(&kind).inc();
                    }
                }
            }
        }
    }

    /// The housekeeping tick: expires ledger entries and tombstones past
    /// their TTL and route memory entries past their windows (the only
    /// places they expire; picks never do), and refreshes the ledger's
    /// gauges.
    pub fn housekeep(&self, now: Instant) {
        let reach = self.routes.expire(now, self.held_blocks());
        self.metrics
            .route_window_seconds
            .set(reach.map_or(0.0, |d| d.as_secs_f64()));
        let expired = self.ledger.expire(now);
        if expired.entries > 0 {
            tracing::debug!(
                entries = expired.entries,
                "in-flight entries expired without a terminal report"
            );
        }
        self.metrics
            .in_flight_expired
            .inc_by(expired.entries as u64);
        let stats = self.ledger.stats();
        self.metrics.ledger_entries.set(stats.entries as i64);
        self.metrics.ledger_tombstones.set(stats.tombstones as i64);
        catch_up(&self.metrics.tombstones_evicted, stats.tombstones_evicted);
        self.metrics
            .ledger_held_blocks
            .set(stats.held_blocks as i64);
        catch_up(&self.metrics.ledger_held_dropped, stats.held_dropped);
        let loads = self.ledger.snapshot();
        for w in self.workers.iter() {
            let in_flight = loads.get(w.slot).map_or(0, |l| l.in_flight);
            self.metrics
                .in_flight
                .get_or_create(&Metrics::worker(&w.cfg.name))
                .set(i64::from(in_flight));
        }
    }

    /// The blocks the workers' KV caches hold together, from their last
    /// scrapes (`None` when some worker's cache size is unknown: it does
    /// not export it, or was never scraped).
    fn held_blocks(&self) -> Option<u64> {
        let mut held = 0u64;
        for w in self.workers.iter().filter(|w| !w.is_retired()) {
            let tokens = w.health.load()?.kv_capacity_tokens;
            let block_size = self.models.get(&w.cfg.model)?.block_size;
            if tokens <= 0.0 || block_size == 0 {
                return None;
            }
            held += (tokens / f64::from(block_size)) as u64;
        }
        (held > 0).then_some(held)
    }

    /// A measured first token of `entry`: the observed-TTFT histograms and
    /// the worker's calibrated rate.
    fn observe_ttft(&self, entry: &Entry, r: &Report<'_>, from: FirstToken, now: Instant) {
        let measured = match from {
            FirstToken::Elapsed => r.elapsed_ms,
            FirstToken::WithEnd(ms) => ms,
        };
        let observed_ms = if measured.is_finite() && measured > 0.0 {
            measured
        } else {
            now.saturating_duration_since(entry.picked_at).as_secs_f64() * 1000.0
        };
        self.metrics
            .observed_ttft
            .get_or_create(&TenantLabels {
                tenant: entry.tenant.clone(),
            })
            .observe(observed_ms / 1000.0);
        if entry.prediction.ttft_ms > 0.0 {
            self.metrics
                .ttft_error_ratio
                .observe(observed_ms / entry.prediction.ttft_ms);
        }
        let current = self
            .ledger
            .rate(entry.worker)
            .unwrap_or(self.scoring.prefill_rate_prior);
        let next = calibrate(&self.scoring, current, &entry.prediction, observed_ms);
        if next != current {
            self.ledger.set_rate(entry.worker, next);
            if let Some(w) = self.workers.get(entry.worker) {
                self.metrics
                    .prefill_rate
                    .get_or_create(&Metrics::worker(&w.cfg.name))
                    .set(next);
            }
        }
    }
}

/// Moves `counter` up to `total`, a count the ledger keeps itself.
fn catch_up(counter: &Counter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}
