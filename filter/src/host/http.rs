//! The per-request HTTP context: pause, ask the indexer, apply the answer,
//! report the response. Every failure lets the request through untouched.
//!
//! The request's state is an [`Exchange`] behind an `Rc<RefCell<_>>`: the
//! SDK owns the HTTP context, and a pick answered on the root's
//! `PickStream` is handed to the exchange by the root (under this
//! context's id as the effective context), through a weak handle.

use std::cell::RefCell;
use std::rc::{Rc, Weak};
use std::time::{Duration, SystemTime};

use kvsteer_proto::paths;
use kvsteer_proto::v1::PickResponse;
use prost::Message;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, GrpcStatusCode, MapType};

use crate::admission::{self, Api, BodyStart, BodyVerdict, HeadersVerdict, RequestHead};
use crate::first_output::{self, FirstOutputScanner, Scan};
use crate::host::calls::{self, header};
use crate::host::root::Shared;
use crate::metrics::{self, Counter, FailOpenReason, Histogram};
use crate::openai;
use crate::pick::{self, PickOutcome};
use crate::report::{self, FirstOutput, PickEnd, Report, ReportTracker, ResponseFacts};
use crate::usage::UsageScanner;

const REQUEST: MapType = MapType::HttpRequestHeaders;
const RESPONSE: MapType = MapType::HttpResponseHeaders;

/// Bytes of one response chunk handed to the first-output scanner; a larger
/// chunk that holds no output by then stops the scan.
const SCAN_CHUNK_BYTES: usize = 64 * 1024;

/// Where the request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not (or no longer) held by the filter.
    Idle,
    /// Headers paused, body being buffered; `start` is `None` once the body
    /// is known to start like a JSON object.
    Buffering { api: Api, start: Option<BodyStart> },
    /// Waiting for the pick's answer, sent at `sent_at` as unary call
    /// `call` or (`None`) on the root's stream; the body is `body_len` bytes.
    AwaitingPick {
        api: Api,
        call: Option<u32>,
        body_len: usize,
        sent_at: Option<SystemTime>,
    },
}

/// A pick's end: its answer (`None`: it did not decode), or the gRPC
/// status it failed with.
pub(crate) type PickResult = Result<Option<PickResponse>, u32>;

/// How the root reaches an exchange waiting on its stream.
pub(crate) type ExchangeHandle = (u32, Weak<RefCell<Exchange>>);

/// The HTTP context the SDK holds: callbacks go to its exchange.
pub(crate) struct KvsteerHttp {
    exchange: Rc<RefCell<Exchange>>,
}

pub(crate) struct Exchange {
    context_id: u32,
    /// Itself, for the root to hand it a streamed answer.
    this: Weak<RefCell<Exchange>>,
    shared: Option<Rc<Shared>>,
    phase: Phase,
    /// This stream's pick id (the filter's own, never a client header).
    pick_id: String,
    /// The indexer replica that answered the pick: its reports go there.
    replica: String,
    tracker: ReportTracker,
    facts: ResponseFacts,
    resumed_at: Option<SystemTime>,
    usage: UsageScanner,
    /// Follows a streamed (SSE) response until its first output event.
    scanner: Option<FirstOutputScanner>,
}

impl KvsteerHttp {
    pub(crate) fn new(context_id: u32, shared: Option<Rc<Shared>>) -> Self {
        let exchange = Rc::new_cyclic(|this| {
            RefCell::new(Exchange {
                context_id,
                this: this.clone(),
                shared,
                phase: Phase::Idle,
                pick_id: String::new(),
                replica: String::new(),
                tracker: ReportTracker::default(),
                facts: ResponseFacts::default(),
                resumed_at: None,
                usage: UsageScanner::default(),
                scanner: None,
            })
        });
        Self { exchange }
    }

    /// Runs `f` on the exchange; `otherwise` if it is busy (it never is:
    /// proxy-wasm callbacks do not nest).
    fn with<T>(&self, otherwise: T, f: impl FnOnce(&mut Exchange) -> T) -> T {
        match self.exchange.try_borrow_mut() {
            Ok(mut exchange) => f(&mut exchange),
            Err(_) => {
                log::warn!("kvsteer-filter: exchange busy in a callback");
                otherwise
            }
        }
    }
}

impl Exchange {
    fn count(&self, counter: Counter) {
        if let Some(shared) = &self.shared {
            shared.metrics.inc(counter);
        }
    }

    fn fail_open(&mut self, reason: FailOpenReason) {
        log::debug!(
            "kvsteer-filter[{}]: fail open ({}), pick id {:?}",
            self.context_id,
            reason.as_str(),
            self.pick_id
        );
        self.phase = Phase::Idle;
        self.count(Counter::FailOpen(reason));
    }

    fn resume(&mut self) {
        self.phase = Phase::Idle;
        self.resumed_at = calls::now();
        if let Err(status) = hostcalls::resume_http_request() {
            log::warn!("kvsteer-filter: resuming the request failed: {status:?}");
        }
    }

    /// Milliseconds since the request was forwarded (0 before that).
    fn elapsed_ms(&self) -> f64 {
        calls::elapsed_ms(self.resumed_at)
    }

    /// Hands a report to the root context, which sends it.
    fn queue(&self, report: Option<Report>) {
        let (Some(report), Some(shared)) = (report, &self.shared) else {
            return;
        };
        if !shared.config.report {
            return;
        }
        let usage = self.usage.usage();
        let mut request = report::report_request(&self.pick_id, &report, &self.facts, usage);
        request.replica.clone_from(&self.replica);
        shared.queue_report(request);
    }

    // === request ===

    /// Reads the body's first bytes until they tell whether it is JSON.
    fn sniff(&self, start: Option<BodyStart>, body_size: usize) -> Option<BodyStart> {
        if start != Some(BodyStart::Blank) {
            return start;
        }
        let len = body_size.min(admission::SNIFF_BYTES);
        let prefix = calls::buffer(BufferType::HttpRequestBody, 0, len).unwrap_or_default();
        match admission::body_start(&prefix) {
            BodyStart::Object => None,
            // That much leading whitespace: leave it to the parser.
            BodyStart::Blank if prefix.len() >= admission::SNIFF_BYTES => None,
            other => Some(other),
        }
    }

    /// The whole body is buffered: build the pick and send it.
    fn ask_indexer(&mut self, shared: &Shared, api: Api, body_len: usize) -> Action {
        let started = calls::now();
        let Some(body) = calls::buffer(BufferType::HttpRequestBody, 0, body_len) else {
            self.fail_open(FailOpenReason::HostError);
            return Action::Continue;
        };
        let mut request = match openai::parse_pick_request(api, &body) {
            Ok(request) => request,
            Err(error) => {
                log::debug!("kvsteer-filter: {error}");
                self.fail_open(FailOpenReason::MalformedBody);
                return Action::Continue;
            }
        };
        let Some(pick_id) = shared.next_pick_id() else {
            self.fail_open(FailOpenReason::HostError);
            return Action::Continue;
        };
        self.pick_id = pick_id;
        request.request_id.clone_from(&self.pick_id);
        request.client_request_id = header(REQUEST, "x-request-id").unwrap_or_default();
        let tenant = header(REQUEST, &shared.config.tenant_header);
        request.tenant =
            admission::tenant_of(&shared.config, tenant.as_deref()).unwrap_or_else(|error| {
                log::info!("kvsteer-filter: {error}");
                String::new()
            });
        let timeout = Duration::from_millis(shared.config.timeout_ms);
        let sent_at = calls::now();
        let handle: ExchangeHandle = (self.context_id, self.this.clone());
        let sent = if shared.send_stream_pick(&request, handle) {
            Ok(None)
        } else {
            // No stream open (or it just broke): a call of its own.
            calls::grpc_call(
                &shared.indexer_target,
                paths::PICK,
                Vec::new(),
                &request.encode_to_vec(),
                timeout,
            )
            .map(Some)
        };
        match sent {
            Ok(call) => {
                if let (Some(from), Some(to)) = (started, sent_at) {
                    shared
                        .metrics
                        .record(Histogram::PrepareUs, metrics::micros(from, to));
                }
                if let (Some(from), Some(to)) = (sent_at, calls::now()) {
                    shared
                        .metrics
                        .record(Histogram::DispatchUs, metrics::micros(from, to));
                }
                self.tracker.pick_sent();
                self.phase = Phase::AwaitingPick {
                    api,
                    call,
                    body_len,
                    sent_at,
                };
                Action::Pause
            }
            Err(status) => {
                log::warn!(
                    "kvsteer-filter: cannot call {} on cluster {}: {status:?}",
                    paths::PICK,
                    shared.config.indexer_cluster
                );
                self.fail_open(FailOpenReason::DispatchFailed);
                Action::Continue
            }
        }
    }

    /// The pick's end, from its call or (by way of the root) its stream.
    pub(crate) fn on_pick_answer(&mut self, shared: &Shared, result: PickResult) {
        let Phase::AwaitingPick {
            api,
            body_len,
            sent_at,
            ..
        } = self.phase
        else {
            return;
        };
        if let (Some(from), Some(to)) = (sent_at, calls::now()) {
            shared
                .metrics
                .record(Histogram::PickUs, metrics::micros(from, to));
        }
        let outcome = match result {
            Ok(Some(answer)) => pick::decide_response(answer, api.error_shape()),
            Ok(None) => PickOutcome::FailOpen(FailOpenReason::BadAnswer),
            Err(status) => return self.pick_failed(shared, status, sent_at),
        };
        let end = match outcome {
            PickOutcome::Reject {
                status,
                body,
                retry_after_s,
            } => {
                let retry_after = retry_after_s.to_string();
                let mut headers = vec![("content-type", "application/json")];
                if retry_after_s > 0 {
                    headers.push(("retry-after", retry_after.as_str()));
                }
                match hostcalls::send_http_response(status, headers, Some(&body)) {
                    Ok(()) => {
                        self.phase = Phase::Idle;
                        self.count(Counter::Rejected);
                        self.tracker.pick_answered(PickEnd::Unchosen);
                        return;
                    }
                    Err(status) => {
                        log::warn!("kvsteer-filter: local reply failed: {status:?}");
                        self.fail_open(FailOpenReason::HostError);
                        PickEnd::Unchosen
                    }
                }
            }
            PickOutcome::FailOpen(reason) => {
                self.fail_open(reason);
                PickEnd::Abandoned
            }
            PickOutcome::Forward {
                destination,
                replacement_body,
                replica,
                cache_salt,
            } => {
                self.replica = replica.unwrap_or_default();
                let salted = match (&replacement_body, cache_salt) {
                    (None, Some(salt)) => {
                        let body = calls::buffer(BufferType::HttpRequestBody, 0, body_len)
                            .and_then(|body| pick::with_cache_salt(&body, &salt));
                        if body.is_none() {
                            // Unsalted, the prompt could share another
                            // tenant's blocks: refuse rather than leak.
                            return self.refuse_unsalted();
                        }
                        body
                    }
                    _ => None,
                };
                if let Some(body) = replacement_body.or(salted) {
                    self.replace_body(body_len, &body);
                }
                match destination {
                    Some(endpoints)
                        if calls::set_header(
                            REQUEST,
                            &shared.config.destination_header,
                            &endpoints,
                        ) =>
                    {
                        self.count(Counter::Steered);
                        PickEnd::Steered
                    }
                    Some(_) => {
                        self.fail_open(FailOpenReason::HostError);
                        PickEnd::Abandoned
                    }
                    None => {
                        self.fail_open(FailOpenReason::NoEndpoints);
                        PickEnd::Unchosen
                    }
                }
            }
        };
        let report = self.tracker.pick_answered(end);
        self.queue(report);
        self.resume();
    }

    /// The pick failed with gRPC `status` (its call, its stream, or its
    /// deadline on the stream): the request goes on untouched.
    fn pick_failed(&mut self, shared: &Shared, status: u32, sent_at: Option<SystemTime>) {
        let elapsed_ms = calls::elapsed_ms(sent_at);
        let reason = pick::call_failure(status, elapsed_ms, shared.config.timeout_ms);
        log::debug!("kvsteer-filter: pick failed: gRPC status {status} after {elapsed_ms:.1} ms");
        self.fail_open(reason);
        // The indexer may have counted a pick it answered too late or
        // whose answer was lost.
        let report = self.tracker.pick_answered(PickEnd::Abandoned);
        self.queue(report);
        self.resume();
    }

    /// The tenant's cache salt could not be added to the body: a 500, and
    /// the indexer's pick is cancelled.
    fn refuse_unsalted(&mut self) {
        log::warn!("kvsteer-filter: cannot add the tenant's cache_salt to the body");
        let report = self.tracker.pick_answered(PickEnd::Abandoned);
        self.queue(report);
        let (status, body) = pick::rejection_reply(&kvsteer_proto::v1::Rejection {
            status: 500,
            message: "the request could not be isolated for its tenant".into(),
            ..Default::default()
        })
        .unwrap_or((500, Vec::new()));
        let headers = vec![("content-type", "application/json")];
        match hostcalls::send_http_response(status, headers, Some(&body)) {
            Ok(()) => self.phase = Phase::Idle,
            Err(status) => {
                log::warn!("kvsteer-filter: local reply failed: {status:?}");
                self.fail_open(FailOpenReason::HostError);
                self.resume();
            }
        }
    }

    fn replace_body(&mut self, old_len: usize, body: &[u8]) {
        match hostcalls::set_buffer(BufferType::HttpRequestBody, 0, old_len, body) {
            Ok(()) => {
                for (name, value) in pick::replaced_body_headers(body.len()) {
                    calls::set_header(REQUEST, name, &value);
                }
            }
            Err(status) => log::warn!("kvsteer-filter: replacing the body failed: {status:?}"),
        }
    }

    // === response ===

    /// Feeds a body chunk of `body_size` bytes to the usage tail and, for a
    /// stream, the first-output scanner; returns whether output was seen.
    fn read_chunk(&mut self, body_size: usize) -> bool {
        let scanning = self
            .scanner
            .as_ref()
            .is_some_and(|s| s.state() == Scan::Scanning);
        if !scanning {
            let wanted = self.usage.wanted(body_size);
            if let Some(tail) =
                calls::buffer(BufferType::HttpResponseBody, body_size - wanted, wanted)
            {
                self.usage.push(&tail);
            }
            return false;
        }
        let len = body_size.min(SCAN_CHUNK_BYTES);
        let Some(bytes) = calls::buffer(BufferType::HttpResponseBody, 0, len) else {
            if let Some(scanner) = &mut self.scanner {
                scanner.give_up();
            }
            return false;
        };
        let Some(scanner) = &mut self.scanner else {
            return false;
        };
        let found = scanner.push(&bytes) == Scan::Output;
        if !found && bytes.len() < body_size {
            scanner.give_up();
        }
        let wanted = self.usage.wanted(body_size);
        if bytes.len() == body_size {
            self.usage.push(&bytes[body_size - wanted..]);
        } else if let Some(tail) =
            calls::buffer(BufferType::HttpResponseBody, body_size - wanted, wanted)
        {
            self.usage.push(&tail);
        }
        found
    }

    /// The response ended: DONE, with its first token (also when it was
    /// reported on its own).
    fn end(&mut self) {
        let report = self.tracker.end(self.elapsed_ms());
        self.queue(report);
    }

    /// The stream is going away; a request that still owes a terminal
    /// report (pick outstanding, response unfinished) is cancelled.
    fn close(&mut self) {
        if let (Phase::AwaitingPick { call: None, .. }, Some(shared)) = (self.phase, &self.shared) {
            self.phase = Phase::Idle;
            shared.cancel_stream_pick(&self.pick_id);
        }
        let report = self.tracker.close(self.elapsed_ms());
        if report.is_some() {
            log::debug!(
                "kvsteer-filter[{}]: stream closed early, cancelling pick {}",
                self.context_id,
                self.pick_id
            );
        }
        self.queue(report);
    }
}

// === callbacks ===

impl Exchange {
    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, response_size: usize) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        // Only picks are dispatched from here (reports go out from the root).
        if let Phase::AwaitingPick {
            call: Some(token), ..
        } = self.phase
            && token == token_id
        {
            let result = if status_code == GrpcStatusCode::Ok as u32 {
                let bytes = calls::buffer(BufferType::GrpcReceiveBuffer, 0, response_size)
                    .unwrap_or_default();
                Ok(PickResponse::decode(bytes.as_slice()).ok())
            } else {
                Err(status_code)
            };
            self.on_pick_answer(&shared, result);
        }
    }

    fn on_http_request_headers(&mut self, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        for name in admission::headers_to_strip(&shared.config) {
            calls::remove_header(REQUEST, name);
        }
        let method = header(REQUEST, ":method");
        let path = header(REQUEST, ":path");
        let content_length = header(REQUEST, "content-length");
        let head = RequestHead {
            method: method.as_deref(),
            path: path.as_deref(),
            content_length: content_length.as_deref(),
            end_of_stream,
        };
        match admission::classify(&shared.config, &head) {
            HeadersVerdict::PassThrough => Action::Continue,
            HeadersVerdict::FailOpen(reason) => {
                self.fail_open(reason);
                Action::Continue
            }
            HeadersVerdict::Buffer(api) => {
                self.phase = Phase::Buffering {
                    api,
                    start: Some(BodyStart::Blank),
                };
                Action::Pause
            }
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let (Phase::Buffering { api, start }, Some(shared)) = (self.phase, self.shared.clone())
        else {
            return Action::Continue;
        };
        let start = self.sniff(start, body_size);
        self.phase = Phase::Buffering { api, start };
        match admission::on_body(&shared.config, body_size, end_of_stream, start) {
            BodyVerdict::Wait => Action::Pause,
            BodyVerdict::Complete => self.ask_indexer(&shared, api, body_size),
            BodyVerdict::TooLarge => {
                self.fail_open(FailOpenReason::BodyTooLarge);
                Action::Continue
            }
            BodyVerdict::NotJson => {
                self.fail_open(FailOpenReason::NotJson);
                Action::Continue
            }
        }
    }

    fn on_http_request_trailers(&mut self) -> Action {
        if matches!(self.phase, Phase::Buffering { .. }) {
            self.fail_open(FailOpenReason::BadRequest);
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, end_of_stream: bool) -> Action {
        if self.tracker.wants_response() {
            self.facts.status = header(RESPONSE, ":status")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            self.facts.upstream = calls::property(vec!["upstream", "address"]).unwrap_or_default();
            let streamed = header(RESPONSE, "content-type")
                .is_some_and(|ct| first_output::is_event_stream(&ct));
            if streamed {
                self.scanner = Some(FirstOutputScanner::default());
            }
            if end_of_stream {
                self.end();
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.tracker.wants_response() {
            return Action::Continue;
        }
        let at_ms = self.elapsed_ms();
        if body_size > 0 {
            self.tracker.response_bytes(at_ms);
            let success = (200..300).contains(&self.facts.status);
            let first = if self.scanner.is_some() {
                // A stream: its first output event is the first token.
                self.read_chunk(body_size).then_some(FirstOutput {
                    at_ms,
                    measured: success,
                    alone: success,
                })
            } else {
                // A whole body: its first bytes come with the end.
                self.read_chunk(body_size);
                Some(FirstOutput {
                    at_ms,
                    measured: false,
                    alone: false,
                })
            };
            if let Some(first) = first {
                self.tracker.output(first);
            }
        }
        if end_of_stream {
            self.end();
        } else {
            let report = self.tracker.flush_first_token();
            self.queue(report);
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self) -> Action {
        self.end();
        Action::Continue
    }
}

impl Context for KvsteerHttp {
    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, response_size: usize) {
        self.with((), |e| {
            e.on_grpc_call_response(token_id, status_code, response_size);
        });
    }

    /// Envoy destroys the filter (after `on_log`, or without it on some
    /// paths): a last chance to cancel.
    fn on_done(&mut self) -> bool {
        self.with((), Exchange::close);
        true
    }
}

impl HttpContext for KvsteerHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.with(Action::Continue, |e| {
            e.on_http_request_headers(end_of_stream)
        })
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.with(Action::Continue, |e| {
            e.on_http_request_body(body_size, end_of_stream)
        })
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        self.with(Action::Continue, Exchange::on_http_request_trailers)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.with(Action::Continue, |e| {
            e.on_http_response_headers(end_of_stream)
        })
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.with(Action::Continue, |e| {
            e.on_http_response_body(body_size, end_of_stream)
        })
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        self.with(Action::Continue, Exchange::on_http_response_trailers)
    }

    fn on_log(&mut self) {
        self.with((), Exchange::close);
    }
}
