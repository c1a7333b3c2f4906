//! The per-request HTTP context: pause, ask the indexer, apply the answer,
//! report the response. Every failure lets the request through untouched.

use std::rc::Rc;
use std::time::{Duration, SystemTime};

use kvsteer_proto::paths;
use kvsteer_proto::v1::{ReportKind, Usage};
use prost::Message;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, GrpcStatusCode, MapType};

use crate::admission::{self, Api, BodyVerdict, HeadersVerdict, RequestHead};
use crate::host::calls::{self, header};
use crate::host::root::Shared;
use crate::metrics::{self, Counter, FailOpenReason, Histogram};
use crate::openai;
use crate::pick::{self, PickOutcome};
use crate::report::{self, ReportTracker, ResponseFacts};
use crate::usage::UsageScanner;

const REQUEST: MapType = MapType::HttpRequestHeaders;
const RESPONSE: MapType = MapType::HttpResponseHeaders;

/// Where the request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not (or no longer) held by the filter.
    Idle,
    /// Headers paused, body being buffered.
    Buffering(Api),
    /// Waiting for the `Pick` answer sent at `sent_at`; the body is `body_len` bytes.
    AwaitingPick {
        token: u32,
        body_len: usize,
        sent_at: Option<SystemTime>,
    },
}

/// A `Pick` call's end, as the host reported it.
struct PickAnswer {
    status: u32,
    size: usize,
    body_len: usize,
    sent_at: Option<SystemTime>,
}

pub(crate) struct KvsteerHttp {
    context_id: u32,
    shared: Option<Rc<Shared>>,
    phase: Phase,
    request_id: String,
    tracker: ReportTracker,
    facts: ResponseFacts,
    resumed_at: Option<SystemTime>,
    usage: UsageScanner,
    /// The terminal report, decided at the response's end and sent from
    /// `on_log`, once the response has reached the client.
    deferred: Option<(ReportKind, Option<Usage>)>,
    /// A first-token report not sent yet, with the milliseconds from resume
    /// to the first body chunk (see `on_http_response_body`).
    deferred_first_token: Option<f64>,
}

impl KvsteerHttp {
    pub(crate) fn new(context_id: u32, shared: Option<Rc<Shared>>) -> Self {
        Self {
            context_id,
            shared,
            phase: Phase::Idle,
            request_id: String::new(),
            tracker: ReportTracker::default(),
            facts: ResponseFacts::default(),
            resumed_at: None,
            usage: UsageScanner::default(),
            deferred: None,
            deferred_first_token: None,
        }
    }

    fn count(&self, counter: Counter) {
        if let Some(shared) = &self.shared {
            shared.metrics.inc(counter);
        }
    }

    fn fail_open(&mut self, reason: FailOpenReason) {
        log::debug!(
            "kvsteer-filter[{}]: fail open ({}), request id {:?}",
            self.context_id,
            reason.as_str(),
            self.request_id
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

    // === request ===

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
        self.request_id = header(REQUEST, "x-request-id").unwrap_or_default();
        request.request_id.clone_from(&self.request_id);
        request.tenant = header(REQUEST, &shared.config.tenant_header).unwrap_or_default();
        let timeout = Duration::from_millis(shared.config.timeout_ms);
        let message = request.encode_to_vec();
        let sent_at = calls::now();
        match calls::grpc_call(
            &shared.config.indexer_cluster,
            paths::PICK,
            &message,
            timeout,
        ) {
            Ok(token) => {
                if let (Some(from), Some(to)) = (started, sent_at) {
                    shared
                        .metrics
                        .record(Histogram::PrepareUs, metrics::micros(from, to));
                }
                self.phase = Phase::AwaitingPick {
                    token,
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

    fn on_pick_answer(&mut self, shared: &Shared, answer: PickAnswer) {
        let PickAnswer {
            status,
            size,
            body_len,
            sent_at,
        } = answer;
        if let (Some(from), Some(to)) = (sent_at, calls::now()) {
            shared
                .metrics
                .record(Histogram::PickUs, metrics::micros(from, to));
        }
        if status != GrpcStatusCode::Ok as u32 {
            let elapsed_ms = calls::elapsed_ms(sent_at);
            let reason = pick::call_failure(status, elapsed_ms, shared.config.timeout_ms);
            log::debug!(
                "kvsteer-filter: pick failed: gRPC status {status} after {elapsed_ms:.1} ms"
            );
            self.fail_open(reason);
            if reason == FailOpenReason::Timeout {
                // The indexer may have counted the pick it answered too late.
                self.send_report(shared, ReportKind::Cancelled, None, 0.0);
            }
            return self.resume();
        }
        let answer = calls::buffer(BufferType::GrpcReceiveBuffer, 0, size).unwrap_or_default();
        match pick::decide(&answer) {
            PickOutcome::Reject { status, body } => {
                let headers = vec![("content-type", "application/json")];
                match hostcalls::send_http_response(status, headers, Some(&body)) {
                    Ok(()) => {
                        self.phase = Phase::Idle;
                        self.count(Counter::Rejected);
                    }
                    Err(status) => {
                        log::warn!("kvsteer-filter: local reply failed: {status:?}");
                        self.fail_open(FailOpenReason::HostError);
                        self.resume();
                    }
                }
            }
            PickOutcome::FailOpen(reason) => {
                self.fail_open(reason);
                self.resume();
            }
            PickOutcome::Forward {
                destination,
                replacement_body,
            } => {
                if let Some(body) = replacement_body {
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
                        if shared.config.report && !self.request_id.is_empty() {
                            self.tracker.picked();
                        }
                    }
                    Some(_) => self.fail_open(FailOpenReason::HostError),
                    None => self.fail_open(FailOpenReason::NoEndpoints),
                }
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

    /// A dispatch here would sit on the response path (the host call runs
    /// before Envoy forwards the last chunk), so the report waits for `on_log`.
    fn report_end(&mut self) {
        if let Some(kind) = self.tracker.on_end() {
            self.deferred = Some((kind, self.usage.usage()));
        }
    }

    /// Sends the first-token report held back by `on_http_response_body`.
    fn flush_first_token(&mut self, shared: &Shared) {
        if let Some(elapsed_ms) = self.deferred_first_token.take() {
            self.send_report(shared, ReportKind::FirstToken, None, elapsed_ms);
        }
    }

    /// Fire and forget: the answer only counts failures. `elapsed_ms` is the
    /// time from resuming the request to the event reported.
    fn send_report(
        &self,
        shared: &Shared,
        kind: ReportKind,
        usage: Option<Usage>,
        elapsed_ms: f64,
    ) {
        if !shared.config.report || self.request_id.is_empty() {
            return;
        }
        let request =
            report::report_request(&self.request_id, kind, &self.facts, elapsed_ms, usage);
        let timeout = Duration::from_millis(shared.config.timeout_ms);
        let message = request.encode_to_vec();
        match calls::grpc_call(
            &shared.config.indexer_cluster,
            paths::REPORT,
            &message,
            timeout,
        ) {
            Ok(_) => self.count(Counter::ReportSent),
            Err(status) => {
                log::debug!("kvsteer-filter: report not sent: {status:?}");
                self.count(Counter::ReportFailed);
            }
        }
    }
}

impl Context for KvsteerHttp {
    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, response_size: usize) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        match self.phase {
            Phase::AwaitingPick {
                token,
                body_len,
                sent_at,
            } if token == token_id => {
                let answer = PickAnswer {
                    status: status_code,
                    size: response_size,
                    body_len,
                    sent_at,
                };
                self.on_pick_answer(&shared, answer);
            }
            // A report's answer (reports are dispatched on the root context, so
            // this only arrives while the stream is still alive).
            _ if status_code != GrpcStatusCode::Ok as u32 => self.count(Counter::ReportFailed),
            _ => {}
        }
    }
}

impl HttpContext for KvsteerHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        for name in admission::headers_to_strip(&shared.config) {
            calls::remove_header(REQUEST, name);
        }
        let method = header(REQUEST, ":method");
        let path = header(REQUEST, ":path");
        let content_type = header(REQUEST, "content-type");
        let content_length = header(REQUEST, "content-length");
        let head = RequestHead {
            method: method.as_deref(),
            path: path.as_deref(),
            content_type: content_type.as_deref(),
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
                self.phase = Phase::Buffering(api);
                Action::Pause
            }
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let (Phase::Buffering(api), Some(shared)) = (self.phase, self.shared.clone()) else {
            return Action::Continue;
        };
        match admission::on_body(&shared.config, body_size, end_of_stream) {
            BodyVerdict::Wait => Action::Pause,
            BodyVerdict::Complete => self.ask_indexer(&shared, api, body_size),
            BodyVerdict::TooLarge => {
                self.fail_open(FailOpenReason::BodyTooLarge);
                Action::Continue
            }
        }
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        if matches!(self.phase, Phase::Buffering(_)) {
            self.fail_open(FailOpenReason::BadRequest);
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if self.tracker.wants_response() {
            self.facts.status = header(RESPONSE, ":status")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            self.facts.upstream = calls::property(vec!["upstream", "address"]).unwrap_or_default();
            if end_of_stream {
                self.report_end();
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.tracker.wants_response() {
            return Action::Continue;
        }
        if let Some(shared) = self.shared.clone() {
            // The first token's report is held back to the next callback
            // (next chunk, trailers or `on_log`): dispatching a call here
            // would delay this very chunk on its way to the client.
            self.flush_first_token(&shared);
            if self.tracker.on_body(body_size).is_some() {
                self.deferred_first_token = Some(calls::elapsed_ms(self.resumed_at));
            }
        }
        if body_size > 0 {
            let wanted = self.usage.wanted(body_size);
            if let Some(tail) =
                calls::buffer(BufferType::HttpResponseBody, body_size - wanted, wanted)
            {
                self.usage.push(&tail);
            }
        }
        if end_of_stream {
            self.report_end();
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        if let Some(shared) = self.shared.clone() {
            self.flush_first_token(&shared);
        }
        self.report_end();
        Action::Continue
    }

    fn on_log(&mut self) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        self.flush_first_token(&shared);
        let elapsed_ms = calls::elapsed_ms(self.resumed_at);
        if let Some((kind, usage)) = self.deferred.take() {
            self.send_report(&shared, kind, usage, elapsed_ms);
        } else if let Some(kind) = self.tracker.on_close() {
            self.send_report(&shared, kind, None, elapsed_ms);
        }
    }
}
