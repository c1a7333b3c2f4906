//! Reports from the filter: first token, done, cancelled. They release the
//! in-flight load, feed the observed-TTFT histograms and calibrate the
//! worker's prefill rate.

use crate::{
    metrics::{KindLabels, Metrics, TenantLabels},
    picker::Picker,
    scoring::calibrate,
};
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportKind {
    FirstToken,
    Done,
    Cancelled,
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

// === impl Picker ===

impl Picker {
    /// Applies a report. `elapsed_ms` is the filter's measure (time from
    /// forwarding to the event); when it is not positive the time since the
    /// pick is used. Unknown request ids are ignored (expired or not ours).
    pub fn report(&self, request_id: &str, kind: ReportKind, elapsed_ms: f64, now: Instant) {
        self.metrics
            .reports
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .inc();
        // Prefilled (or ended): a request queued behind it no longer waits
        // for its prefix.
        self.routes.prefilled(request_id);
        match kind {
            ReportKind::FirstToken => {
                let Some(p) = self.load.on_first_token(request_id, now) else {
                    return;
                };
                let observed_ms = if elapsed_ms.is_finite() && elapsed_ms > 0.0 {
                    elapsed_ms
                } else {
                    now.saturating_duration_since(p.picked_at).as_secs_f64() * 1000.0
                };
                self.metrics
                    .observed_ttft
                    .get_or_create(&TenantLabels {
                        tenant: p.tenant.clone(),
                    })
                    .observe(observed_ms / 1000.0);
                if p.prediction.ttft_ms > 0.0 {
                    self.metrics
                        .ttft_error_ratio
                        .observe(observed_ms / p.prediction.ttft_ms);
                }
                let current = self
                    .load
                    .snapshot()
                    .get(p.worker)
                    .map_or(self.scoring.prefill_rate_prior, |l| l.prefill_rate);
                let next = calibrate(&self.scoring, current, &p.prediction, observed_ms);
                if next != current {
                    self.load.set_rate(p.worker, next);
                    if let Some(w) = self.workers.get(p.worker) {
                        self.metrics
                            .prefill_rate
                            .get_or_create(&Metrics::worker(&w.cfg.name))
                            .set(next);
                    }
                }
            }
            ReportKind::Done | ReportKind::Cancelled => {
                self.load.on_finish(request_id);
            }
        }
    }
}
