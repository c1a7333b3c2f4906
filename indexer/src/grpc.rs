//! The tonic `Router` service: proto in, [`Picker`] calls, proto out.
//!
//! A pick is committed (recorded in flight) as the last step of its
//! handler, and only while its caller still waits for it: Envoy's gRPC
//! client sends the call's timeout as `grpc-timeout` (`Grpc::Common::
//! prepareHeaders` with the call's `timeout`) and resets the stream when
//! it gives up, as it does when the HTTP request behind the call goes
//! away. Hyper drops a handler's future whose stream was reset, and
//! tonic's own timeout drops it once `grpc-timeout` has passed, but both
//! only at an await point: a long tokenization runs to the end in one
//! poll. So the handler yields once before committing (a reset stream is
//! noticed there), and does not commit past its deadline.

use crate::{
    metrics::{AbandonLabels, Metrics},
    picker::{
        Mode, Outcome, PickInput, Picker,
        report::{Report, ReportKind},
    },
    prompt,
    tenancy::{Ending, Refusal, Tenancy},
};
use kvsteer_proto::v1::{
    self as pb,
    router_server::{Router, RouterServer},
};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming, metadata::MetadataMap};

mod stream;

#[derive(Clone)]
pub struct RouterService {
    picker: Arc<Picker>,
    /// This replica's advertised address (`PickResponse.replica`).
    replica: String,
    /// Tenant isolation and budgets; `None`: neither.
    tenancy: Option<Arc<Tenancy>>,
    /// Turns true when the indexer shuts down: pick streams stop taking
    /// picks, answer those in flight and end cleanly (the filter opens its
    /// next stream elsewhere) instead of holding the server's drain.
    shutdown: Option<watch::Receiver<bool>>,
}

/// A budget reservation of a pick still being answered: given back (as
/// never sent) if the handler's future is dropped or returns without
/// committing.
struct Reserved {
    tenancy: Arc<Tenancy>,
    request_id: String,
    armed: bool,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (tenancy, id) = (self.tenancy.clone(), std::mem::take(&mut self.request_id));
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { tenancy.settle(&id, Ending::NotSent).await });
        }
    }
}

/// Counts a pick abandoned unless [`Self::disarm`]ed: when the handler's
/// future is dropped (its caller went away), or returns past its deadline.
struct Abandon<'a> {
    metrics: &'a Metrics,
    deadline: Option<Deadline>,
    armed: bool,
}

/// When a pick's caller stops waiting for it.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    /// Past this, the pick is not committed.
    at: Instant,
    /// A caller gone from here on went for its deadline: its clock started
    /// before ours (the call crossed the wire and was decoded first), and
    /// tonic's own timer, counted from the headers, drops the handler
    /// before `at`. The last tenth of the timeout, as the filter counts a
    /// failure that late as a timeout.
    late_from: Instant,
}

impl Deadline {
    /// A deadline `timeout` from now.
    pub fn after(timeout: Duration) -> Self {
        let now = Instant::now();
        Self {
            at: now + timeout,
            late_from: now + timeout.mul_f64(0.9),
        }
    }
}

// === impl RouterService ===

impl RouterService {
    /// `replica`: this replica's gRPC address as the filter's indexer
    /// cluster knows it (empty: none advertised, reports go anywhere).
    pub fn new(picker: Arc<Picker>, replica: String) -> Self {
        Self {
            picker,
            replica,
            tenancy: None,
            shutdown: None,
        }
    }

    /// Ends pick streams cleanly once `shutdown` turns true.
    pub fn with_shutdown(mut self, shutdown: watch::Receiver<bool>) -> Self {
        self.shutdown = Some(shutdown);
        self
    }

    /// Enforces tenant isolation and budgets at every pick.
    pub fn with_tenancy(mut self, tenancy: Arc<Tenancy>) -> Self {
        self.tenancy = Some(tenancy);
        self
    }

    pub fn into_server(self) -> RouterServer<Self> {
        RouterServer::new(self)
    }

    /// Answers one pick, for the unary call and the stream alike; commits
    /// it as its last step unless `deadline` has passed. Dropping the
    /// future before then (the caller went away) commits nothing.
    pub(crate) async fn answer(
        &self,
        req: pb::PickRequest,
        deadline: Option<Deadline>,
    ) -> Result<pb::PickResponse, Status> {
        let abandon = Abandon::new(self.picker.metrics(), deadline);
        let tenancy = self.tenancy.clone();
        let mut input = pick_input(&req);
        let mut salt = None;
        if let Some(t) = &tenancy {
            if let Err(refusal) = t.check_tenant(&req.tenant) {
                abandon.disarm();
                return Ok(refusal_response(refusal, &self.replica));
            }
            salt = t.salt(&req.tenant, &req.model, input.cache_salt.as_deref());
            if salt.is_some() {
                input.cache_salt.clone_from(&salt);
            }
        }
        let mut out = self.picker.pick(input, Mode::Deferred).await;
        tracing::debug!(
            request_id = %req.request_id,
            client_request_id = %req.client_request_id,
            model = %req.model,
            worker = %out.decision.worker,
            prompt_tokens = out.decision.prompt_tokens,
            matched_tokens = out.decision.matched_tokens,
            predicted_ttft_ms = out.decision.predicted_ttft_ms,
            degraded = out.decision.degraded,
            "pick"
        );
        // Over budget: refused whether or not a worker was chosen (a
        // request left to Envoy's fallback would reach a worker too).
        let mut reserved = None;
        if let Some(t) = &tenancy {
            let admitted = t
                .admit(
                    &req.request_id,
                    &req.tenant,
                    &req.model,
                    out.decision.prompt_tokens,
                    req.max_tokens,
                )
                .await;
            if let Err(refusal) = admitted {
                abandon.disarm();
                tracing::debug!(request_id = %req.request_id, status = refusal.status, "pick refused by the tenant's budget");
                return Ok(refusal_response(refusal, &self.replica));
            }
            reserved = Some(Reserved {
                tenancy: t.clone(),
                request_id: req.request_id.clone(),
                armed: true,
            });
        }
        let response = |out: Outcome| {
            let mut r = pick_response(out, &self.replica);
            r.cache_salt = salt.clone().unwrap_or_default();
            r
        };
        // Nothing to commit (no choice): the answer is all there is. The
        // request still goes upstream (Envoy's fallback) but no report will
        // come: it keeps its whole reservation and frees its slot now.
        let Some(placement) = out.placement.take() else {
            abandon.disarm();
            if let Some(mut r) = reserved {
                r.armed = false;
                let used_tokens = None;
                r.tenancy
                    .settle(&r.request_id, Ending::Done { used_tokens })
                    .await;
            }
            return Ok(response(out));
        };
        if !abandon.expired() {
            // Where a reset stream (the caller gone) drops this future.
            tokio::task::yield_now().await;
        }
        if abandon.expired() {
            tracing::debug!(request_id = %req.request_id, "pick past its deadline: not committed");
            return Err(Status::deadline_exceeded(
                "pick took longer than the call's grpc-timeout",
            ));
        }
        abandon.disarm();
        if let Some(mut r) = reserved {
            r.armed = false;
        }
        self.picker.commit(placement);
        Ok(response(out))
    }
}

pub fn pick_input(req: &pb::PickRequest) -> PickInput {
    PickInput {
        request_id: req.request_id.clone(),
        tenant: req.tenant.clone(),
        model: req.model.clone(),
        prompt: prompt::from_proto(req).map_err(|e| e.to_string()),
        cache_salt: (!req.cache_salt.is_empty()).then(|| req.cache_salt.clone()),
    }
}

pub fn pick_response(out: Outcome, replica: &str) -> pb::PickResponse {
    let d = out.decision;
    pb::PickResponse {
        endpoints: out.endpoints,
        decision: Some(pb::Decision {
            policy: d.policy.to_owned(),
            worker: d.worker,
            prompt_tokens: d.prompt_tokens,
            matched_tokens: d.matched_tokens,
            predicted_ttft_ms: d.predicted_ttft_ms,
            degraded: d.degraded,
            reason: d.reason,
        }),
        replacement_body: None,
        rejection: None,
        replica: replica.to_owned(),
        cache_salt: String::new(),
        request_id: String::new(),
    }
}

/// The answer to a refused pick: the filter replies to the client itself.
pub fn refusal_response(refusal: Refusal, replica: &str) -> pb::PickResponse {
    pb::PickResponse {
        rejection: Some(pb::Rejection {
            status: refusal.status,
            message: refusal.message,
            error_type: refusal.error_type.to_owned(),
            retry_after_s: refusal.retry_after_s,
        }),
        replica: replica.to_owned(),
        ..pb::PickResponse::default()
    }
}

/// The call's `grpc-timeout` (gRPC over HTTP/2: at most 8 digits and a
/// unit); `None` when absent or malformed (no deadline then, as tonic).
pub fn grpc_timeout(metadata: &MetadataMap) -> Option<Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let split = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at(split);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

// === impl Abandon ===

impl<'a> Abandon<'a> {
    fn new(metrics: &'a Metrics, deadline: Option<Deadline>) -> Self {
        Self {
            metrics,
            deadline,
            armed: true,
        }
    }

    fn expired(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d.at)
    }

    /// Whether a caller gone now went for its deadline.
    fn late(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d.late_from)
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let reason = if self.late() { "deadline" } else { "cancelled" };
        self.metrics
            .pick_abandoned
            .get_or_create(&AbandonLabels { reason })
            .inc();
        tracing::debug!(reason, "pick not committed");
    }
}

#[tonic::async_trait]
impl Router for RouterService {
    async fn pick(
        &self,
        request: Request<pb::PickRequest>,
    ) -> Result<Response<pb::PickResponse>, Status> {
        // From here: the body is in, so the caller's clock started a little
        // earlier (tonic's own timeout counts from the headers).
        let deadline = grpc_timeout(request.metadata()).map(Deadline::after);
        self.answer(request.into_inner(), deadline)
            .await
            .map(Response::new)
    }

    type PickStreamStream = stream::Answers;

    async fn pick_stream(
        &self,
        request: Request<Streaming<pb::PickStreamRequest>>,
    ) -> Result<Response<Self::PickStreamStream>, Status> {
        Ok(Response::new(stream::serve(
            self.clone(),
            request.into_inner(),
        )))
    }

    async fn report(
        &self,
        request: Request<pb::ReportRequest>,
    ) -> Result<Response<pb::ReportResponse>, Status> {
        let r = request.into_inner();
        let kind = match pb::ReportKind::try_from(r.kind) {
            Ok(pb::ReportKind::FirstToken) => ReportKind::FirstToken,
            Ok(pb::ReportKind::Done) => ReportKind::Done,
            Ok(pb::ReportKind::Cancelled) => ReportKind::Cancelled,
            _ => {
                return Err(Status::invalid_argument(format!(
                    "kind: unsupported report kind {}",
                    r.kind
                )));
            }
        };
        if r.request_id.is_empty() {
            return Err(Status::invalid_argument("request_id: empty"));
        }
        let report = Report {
            request_id: &r.request_id,
            kind,
            elapsed_ms: r.elapsed_ms,
            ttft_measured: r.ttft_measured,
            first_token_ms: if kind == ReportKind::FirstToken {
                None
            } else {
                r.first_token_ms
            },
        };
        self.picker.report(&report, Instant::now());
        if let Some(t) = &self.tenancy {
            let used_tokens = r
                .usage
                .map(|u| u64::from(u.prompt_tokens) + u64::from(u.completion_tokens))
                .filter(|&n| n > 0);
            match kind {
                ReportKind::FirstToken => {}
                ReportKind::Done => t.settle(&r.request_id, Ending::Done { used_tokens }).await,
                ReportKind::Cancelled => {
                    t.settle(&r.request_id, Ending::Cancelled { used_tokens })
                        .await;
                }
            }
        }
        Ok(Response::new(pb::ReportResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(value: &str) -> Option<Duration> {
        let mut m = MetadataMap::new();
        m.insert("grpc-timeout", value.parse().unwrap());
        grpc_timeout(&m)
    }

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        assert_eq!(timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(
            timeout("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(timeout("5n"), Some(Duration::from_nanos(5)));
        for bad in ["", "m", "123456789m", "12x", "-1m", "1.5S", "+5m"] {
            assert_eq!(timeout(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&MetadataMap::new()), None);
    }

    /// Abandoned picks by reason, after dropping one armed `Abandon` with
    /// each deadline.
    fn abandoned(deadlines: &[Option<Deadline>]) -> (u64, u64) {
        let metrics = Metrics::new(&mut prometheus_client::registry::Registry::default(), &[]);
        for d in deadlines {
            drop(Abandon::new(&metrics, *d));
        }
        Abandon::new(&metrics, None).disarm();
        let count = |reason| {
            metrics
                .pick_abandoned
                .get_or_create(&AbandonLabels { reason })
                .get()
        };
        (count("deadline"), count("cancelled"))
    }

    #[test]
    fn a_caller_gone_in_the_last_tenth_of_its_timeout_went_for_its_deadline() {
        let now = Instant::now();
        let hour = Duration::from_secs(3600);
        let (passed, late, early) = (
            Deadline {
                at: now,
                late_from: now,
            },
            // Its clock started before ours: gone before `at`, after `late_from`.
            Deadline {
                at: now + hour,
                late_from: now,
            },
            Deadline::after(hour),
        );
        assert_eq!(abandoned(&[Some(passed), Some(late)]), (2, 0));
        assert_eq!(abandoned(&[Some(early), None]), (0, 2));
        let d = Deadline::after(Duration::from_millis(200));
        assert_eq!(d.at - d.late_from, Duration::from_millis(20));
    }
}
