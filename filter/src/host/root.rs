//! The root context: parses the plugin configuration once, hands it, with
//! the metric ids, the pick-id generator and the report outbox, to every
//! HTTP context, and sends the queued reports.
//!
//! Reports go out from here, not from the HTTP context that decided them:
//! the SDK delivers a call's answer to the context that dispatched it and
//! drops it once that context is deleted, which is soon after `on_log`. Sent
//! from the root (on a tick armed when the first report is queued), every
//! answer arrives and failures are counted (`report_failed`).
//!
//! The root also owns the `PickStream` (`pick_stream`): it opens, rotates
//! and closes it, hands each streamed answer to the exchange waiting for
//! it, and fails open the picks whose deadline passes or whose stream
//! ends. HTTP contexts send their picks on it directly.
//!
//! One tick serves all of it, at the shortest period any of them needs
//! (`Shared::rearm`).

use std::cell::{Cell, RefCell, RefMut};
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use kvsteer_proto::paths;
use kvsteer_proto::v1::pick_stream_request::Kind;
use kvsteer_proto::v1::{PickRequest, PickResponse, PickStreamRequest, ReportRequest};
use prost::Message;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, GrpcStatusCode};

use crate::config::{FilterConfig, REPLICA_HEADER};
use crate::host::calls::{self, Metrics};
use crate::host::http::{ExchangeHandle, KvsteerHttp, PickResult};
use crate::metrics::Counter;
use crate::outbox::{Outbox, Queued};
use crate::pick_id::PickIds;
use crate::pick_stream::{self, PickStreams, Waiting};
use crate::retry::{self, Answer, Retries};

/// How soon queued reports go out.
const REPORT_TICK: Duration = Duration::from_millis(1);

/// What every HTTP context of one plugin configuration shares.
pub(crate) struct Shared {
    pub(crate) config: FilterConfig,
    /// The upstream of every gRPC call: the cluster name, or a serialized
    /// `GrpcService` naming cluster and authority (`grpc_target`).
    pub(crate) indexer_target: String,
    pub(crate) metrics: Metrics,
    pick_ids: RefCell<PickIds>,
    outbox: RefCell<Outbox>,
    retries: RefCell<Retries>,
    /// `None` when picks are unary calls only (`pick_stream_max_age_ms: 0`).
    streams: Option<RefCell<PickStreams<ExchangeHandle>>>,
    /// The tick period last set.
    tick: Cell<Duration>,
}

// === impl Shared ===

impl Shared {
    /// A fresh pick id; `None` only if the generator is in use (it never is:
    /// proxy-wasm callbacks do not nest).
    pub(crate) fn next_pick_id(&self) -> Option<String> {
        self.pick_ids
            .try_borrow_mut()
            .map(|mut ids| ids.next_id())
            .ok()
    }

    /// Queues a report for the root context to send.
    pub(crate) fn queue_report(&self, report: ReportRequest) {
        let Ok(mut outbox) = self.outbox.try_borrow_mut() else {
            log::warn!("kvsteer-filter: report outbox busy; report dropped");
            self.metrics.inc(Counter::ReportFailed);
            return;
        };
        match outbox.push(report) {
            Queued::First => {
                drop(outbox);
                if !self.rearm() {
                    // Without a tick, send now: the answer is lost but the report is not.
                    self.send_queued();
                }
            }
            Queued::Behind | Queued::Merged => {}
            Queued::Full => {
                log::warn!("kvsteer-filter: report outbox full; report dropped");
                self.metrics.inc(Counter::ReportFailed);
            }
        }
    }

    /// Dispatches every queued report, and the failed terminal reports now
    /// due again, from the running context; keeps the tick going while
    /// retries wait.
    fn send_queued(&self) {
        let reports: Vec<ReportRequest> = match self.outbox.try_borrow_mut() {
            Ok(mut outbox) => outbox.drain().collect(),
            Err(_) => return,
        };
        let due = match (since_epoch(), self.retries.try_borrow_mut()) {
            (Some(now), Ok(mut retries)) => retries.take_due(now),
            _ => Vec::new(),
        };
        for (report, attempt) in reports.into_iter().map(|r| (r, 1)).chain(due) {
            self.send(report, attempt);
        }
    }

    /// Sets the tick to the shortest period anything needs: queued reports,
    /// report retries, stream picks' deadlines and the stream's own
    /// schedule; stops it when nothing does. Returns false if the host
    /// refused. Only a change is passed on: setting the period restarts
    /// Envoy's timer.
    fn rearm(&self) -> bool {
        let reports = self
            .outbox
            .try_borrow()
            .is_ok_and(|o| !o.is_empty())
            .then_some(REPORT_TICK);
        let retries = self
            .retries
            .try_borrow()
            .is_ok_and(|r| r.waiting())
            .then_some(retry::TICK);
        let streams = match (&self.streams, since_epoch()) {
            (Some(streams), Some(now)) => streams.try_borrow().ok().and_then(|s| s.next_tick(now)),
            _ => None,
        };
        let period = [reports, retries, streams]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(Duration::ZERO);
        if period == self.tick.get() {
            return true;
        }
        match hostcalls::set_tick_period(period) {
            Ok(()) => {
                self.tick.set(period);
                true
            }
            Err(status) => {
                log::warn!("kvsteer-filter: cannot set the tick to {period:?}: {status:?}");
                false
            }
        }
    }

    // === PickStream ===

    /// The streams, borrowed; `None` when picks are unary calls only, or
    /// (never in practice: callbacks do not nest) while they are borrowed.
    fn streams(&self) -> Option<RefMut<'_, PickStreams<ExchangeHandle>>> {
        self.streams.as_ref()?.try_borrow_mut().ok()
    }

    /// Sends `pick` on the open stream, for `handle` to get its answer;
    /// false when no stream is open or the send failed (the caller makes
    /// it a unary call).
    pub(crate) fn send_stream_pick(&self, pick: &PickRequest, handle: ExchangeHandle) -> bool {
        let (Some(mut s), Some(now)) = (self.streams(), since_epoch()) else {
            return false;
        };
        let Some(token) = s.stream() else {
            drop(s);
            // A stream is wanted now: the tick opens it.
            self.rearm();
            return false;
        };
        let timeout_ms = u32::try_from(self.config.timeout_ms).unwrap_or(u32::MAX);
        let message = pick_stream::pick_message(pick, timeout_ms);
        if let Err(status) = hostcalls::send_grpc_stream_message(token, Some(&message), false) {
            log::debug!("kvsteer-filter: pick not sent on stream {token}: {status:?}");
            return false;
        }
        let deadline = now + Duration::from_millis(self.config.timeout_ms);
        s.sent(pick.request_id.clone(), handle, token, deadline);
        drop(s);
        self.metrics.inc(Counter::PickStreamed);
        self.rearm();
        true
    }

    /// The client of stream pick `id` went away: the indexer is told, so
    /// it does not commit the pick.
    pub(crate) fn cancel_stream_pick(&self, id: &str) {
        let token = self.streams().and_then(|mut s| s.forget(id));
        if let Some(token) = token {
            send_cancel(token, id);
        }
    }

    /// The stream's housekeeping, from the tick: deadlines, the open
    /// timeout, rotation and (re)opening.
    fn tend_streams(&self) {
        let (Some(mut s), Some(now)) = (self.streams(), since_epoch()) else {
            return;
        };
        let expired = s.expired(now);
        for token in s.open_timed_out(now) {
            log::warn!("kvsteer-filter: pick stream {token} got no headers in time; cancelled");
            if let Err(status) = hostcalls::cancel_grpc_stream(token) {
                log::debug!("kvsteer-filter: cancelling stream {token}: {status:?}");
            }
        }
        for token in s.rotate_due(now) {
            if let Err(status) = hostcalls::close_grpc_stream(token) {
                log::debug!("kvsteer-filter: half-closing stream {token}: {status:?}");
            }
        }
        // Each attempt leaves its slot opening or backing off: this ends.
        while let Some(slot) = s.open_due(now) {
            match hostcalls::open_grpc_stream(
                &self.indexer_target,
                paths::SERVICE,
                paths::PICK_STREAM,
                Vec::new(),
            ) {
                Ok(token) => {
                    s.opening(slot, token, now);
                    self.metrics.inc(Counter::PickStreamOpened);
                }
                Err(status) => {
                    log::warn!("kvsteer-filter: cannot open a pick stream: {status:?}");
                    s.open_failed(slot, now);
                }
            }
        }
        drop(s);
        for (id, waiting) in expired {
            send_cancel(waiting.token, &id);
            self.hand_over(waiting, Err(GrpcStatusCode::DeadlineExceeded as u32));
        }
    }

    /// Gives a stream pick's end to the exchange waiting for it, as that
    /// HTTP context (the effective context for its host calls).
    fn hand_over(&self, waiting: Waiting<ExchangeHandle>, result: PickResult) {
        let (context_id, exchange) = waiting.handle;
        let Some(exchange) = exchange.upgrade() else {
            return;
        };
        if let Err(status) = hostcalls::set_effective_context(context_id) {
            log::debug!("kvsteer-filter: context {context_id} gone: {status:?}");
            return;
        }
        match exchange.try_borrow_mut() {
            Ok(mut exchange) => exchange.on_pick_answer(self, result),
            Err(_) => log::warn!("kvsteer-filter: exchange busy; stream answer dropped"),
        };
    }

    fn stream_answer(&self, token: u32, size: usize) {
        let bytes = calls::buffer(BufferType::GrpcReceiveBuffer, 0, size).unwrap_or_default();
        let answer = match PickResponse::decode(bytes.as_slice()) {
            Ok(answer) => answer,
            Err(error) => {
                log::warn!("kvsteer-filter: undecodable answer on stream {token}: {error}");
                return;
            }
        };
        let waiting = self
            .streams()
            .and_then(|mut s| s.answered(&answer.request_id));
        // None: past its deadline or its client gone; nobody waits.
        // The tick, still at the deadline period, slows down on its own
        // once no pick waits: no host call here on the answer's path.
        if let Some(waiting) = waiting {
            self.hand_over(waiting, Ok(Some(answer)));
        }
    }

    fn stream_established(&self, token: u32) {
        if let (Some(mut s), Some(now)) = (self.streams(), since_epoch()) {
            s.established(token, now);
        }
        self.rearm();
    }

    fn stream_closed(&self, token: u32, status: u32) {
        let (Some(mut s), Some(now)) = (self.streams(), since_epoch()) else {
            return;
        };
        let ended = s.closed(token, status, now);
        drop(s);
        if !ended.is_empty() {
            log::warn!(
                "kvsteer-filter: pick stream {token} closed (gRPC status {status}) with {} picks unanswered",
                ended.len()
            );
        }
        let status = if status == GrpcStatusCode::Ok as u32 {
            GrpcStatusCode::Unavailable as u32
        } else {
            status
        };
        for (_, waiting) in ended {
            self.hand_over(waiting, Err(status));
        }
        self.rearm();
    }

    /// One send of a report (its `attempt`-th).
    fn send(&self, report: ReportRequest, attempt: u8) {
        let timeout = Duration::from_millis(self.config.timeout_ms);
        let message = report.encode_to_vec();
        // To the replica that answered the pick (Envoy's override_host on
        // the indexer cluster); any replica when it advertised none.
        let metadata = if report.replica.is_empty() {
            Vec::new()
        } else {
            vec![(REPLICA_HEADER, report.replica.as_bytes())]
        };
        match calls::grpc_call(
            &self.indexer_target,
            paths::REPORT,
            metadata,
            &message,
            timeout,
        ) {
            Ok(token) => {
                self.metrics.inc(Counter::ReportSent);
                if let Ok(mut retries) = self.retries.try_borrow_mut() {
                    retries.sent(token, report, attempt);
                }
            }
            Err(status) => {
                log::debug!("kvsteer-filter: report not sent: {status:?}");
                self.metrics.inc(Counter::ReportFailed);
            }
        }
    }

    /// The answer to report call `token`.
    fn report_answered(&self, token: u32, status_code: u32) {
        let delivered = status_code == GrpcStatusCode::Ok as u32;
        if !delivered {
            log::debug!("kvsteer-filter: report failed: gRPC status {status_code}");
            self.metrics.inc(Counter::ReportFailed);
        }
        let answer = match (since_epoch(), self.retries.try_borrow_mut()) {
            (Some(now), Ok(mut retries)) => retries.answered(token, delivered, now),
            _ => Answer::Untracked,
        };
        match answer {
            Answer::Retry => {
                self.rearm();
            }
            Answer::GaveUp => log::warn!(
                "kvsteer-filter: a terminal report failed {} times; the indexer expires its pick",
                retry::ATTEMPTS
            ),
            Answer::Delivered | Answer::Untracked => {}
        }
    }
}

/// Withdraws pick `id` on stream `token`.
fn send_cancel(token: u32, id: &str) {
    let message = PickStreamRequest {
        kind: Some(Kind::Cancel(id.to_owned())),
        timeout_ms: 0,
    };
    if let Err(status) =
        hostcalls::send_grpc_stream_message(token, Some(&message.encode_to_vec()), false)
    {
        log::debug!("kvsteer-filter: cancel of {id} not sent on stream {token}: {status:?}");
    }
}

/// The host's clock as time since the epoch.
fn since_epoch() -> Option<Duration> {
    calls::now().and_then(|t| t.duration_since(UNIX_EPOCH).ok())
}

pub(crate) struct KvsteerRoot {
    context_id: u32,
    shared: Option<Rc<Shared>>,
}

impl KvsteerRoot {
    pub(crate) fn new(context_id: u32) -> Self {
        Self {
            context_id,
            shared: None,
        }
    }
}

impl Context for KvsteerRoot {
    /// Answers to the reports sent from `on_tick`.
    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, _response_size: usize) {
        if let Some(shared) = &self.shared {
            shared.report_answered(token_id, status_code);
        }
    }

    fn on_grpc_stream_initial_metadata(&mut self, token_id: u32, _num_elements: u32) {
        if let Some(shared) = &self.shared {
            shared.stream_established(token_id);
        }
    }

    fn on_grpc_stream_message(&mut self, token_id: u32, message_size: usize) {
        if let Some(shared) = &self.shared {
            shared.stream_answer(token_id, message_size);
        }
    }

    fn on_grpc_stream_close(&mut self, token_id: u32, status_code: u32) {
        if let Some(shared) = &self.shared {
            shared.stream_closed(token_id, status_code);
        }
    }
}

impl RootContext for KvsteerRoot {
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        // Follow Envoy's level for the wasm logger (`--component-log-level wasm:debug`).
        if let Ok(level) = hostcalls::get_log_level() {
            proxy_wasm::set_log_level(level);
        }
        let bytes = match hostcalls::get_buffer(
            BufferType::PluginConfiguration,
            0,
            plugin_configuration_size,
        ) {
            Ok(bytes) => bytes.unwrap_or_default(),
            Err(status) => {
                log::error!("kvsteer-filter: cannot read the plugin configuration: {status:?}");
                return false;
            }
        };
        match FilterConfig::from_json(&bytes) {
            Ok(config) => {
                log::info!(
                    "kvsteer-filter: configured: indexer cluster {} (authority {}), timeout {} ms, paths {:?}",
                    config.indexer_cluster,
                    config
                        .indexer_authority
                        .as_deref()
                        .unwrap_or("the cluster name"),
                    config.timeout_ms,
                    config.paths
                );
                let now_ns =
                    since_epoch().map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
                let salt = [now_ns, u64::from(self.context_id)];
                let streams = (config.pick_stream_max_age_ms > 0).then(|| {
                    let max_age = Duration::from_millis(config.pick_stream_max_age_ms);
                    RefCell::new(PickStreams::new(config.pick_streams, max_age))
                });
                self.shared = Some(Rc::new(Shared {
                    indexer_target: config.indexer_target(),
                    config,
                    metrics: Metrics::define(),
                    pick_ids: RefCell::new(PickIds::random(&salt)),
                    outbox: RefCell::new(Outbox::default()),
                    retries: RefCell::new(Retries::default()),
                    streams,
                    tick: Cell::new(Duration::ZERO),
                }));
                true
            }
            Err(error) => {
                log::error!("kvsteer-filter: rejecting configuration: {error}");
                false
            }
        }
    }

    fn on_tick(&mut self) {
        if let Some(shared) = &self.shared {
            shared.send_queued();
            shared.tend_streams();
            shared.rearm();
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Always a context (the SDK panics on None); without a configuration it
        // lets everything through.
        Some(Box::new(KvsteerHttp::new(context_id, self.shared.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
