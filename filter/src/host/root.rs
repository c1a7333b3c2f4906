//! The root context: parses the plugin configuration once, hands it, with
//! the metric ids, the pick-id generator and the report outbox, to every
//! HTTP context, and sends the queued reports.
//!
//! Reports go out from here, not from the HTTP context that decided them:
//! the SDK delivers a call's answer to the context that dispatched it and
//! drops it once that context is deleted, which is soon after `on_log`. Sent
//! from the root (on a tick armed when the first report is queued), every
//! answer arrives and failures are counted (`report_failed`).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use kvsteer_proto::paths;
use kvsteer_proto::v1::ReportRequest;
use prost::Message;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, GrpcStatusCode};

use crate::config::{FilterConfig, REPLICA_HEADER};
use crate::host::calls::{self, Metrics};
use crate::host::http::KvsteerHttp;
use crate::metrics::Counter;
use crate::outbox::{Outbox, Queued};
use crate::pick_id::PickIds;
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
                if let Err(status) = hostcalls::set_tick_period(REPORT_TICK) {
                    // Without a tick, send now: the answer is lost but the report is not.
                    log::warn!("kvsteer-filter: cannot arm the report tick: {status:?}");
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
        if self.retries.try_borrow().is_ok_and(|r| r.waiting())
            && let Err(status) = hostcalls::set_tick_period(retry::TICK)
        {
            log::warn!("kvsteer-filter: cannot arm the retry tick: {status:?}");
        }
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
                let idle = self.outbox.try_borrow().is_ok_and(|o| o.is_empty());
                if idle && let Err(status) = hostcalls::set_tick_period(retry::TICK) {
                    log::warn!("kvsteer-filter: cannot arm the retry tick: {status:?}");
                }
            }
            Answer::GaveUp => log::warn!(
                "kvsteer-filter: a terminal report failed {} times; the indexer expires its pick",
                retry::ATTEMPTS
            ),
            Answer::Delivered | Answer::Untracked => {}
        }
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
                self.shared = Some(Rc::new(Shared {
                    indexer_target: config.indexer_target(),
                    config,
                    metrics: Metrics::define(),
                    pick_ids: RefCell::new(PickIds::random(&salt)),
                    outbox: RefCell::new(Outbox::default()),
                    retries: RefCell::new(Retries::default()),
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
        if let Err(status) = hostcalls::set_tick_period(Duration::ZERO) {
            log::debug!("kvsteer-filter: cannot stop the report tick: {status:?}");
        }
        if let Some(shared) = &self.shared {
            shared.send_queued();
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
