//! The request ledger under faults, through the real tonic server over
//! loopback: reports that overtake their pick, callers that go away or run
//! out of time while their pick is tokenized, and single-report responses;
//! the same faults for picks on a `PickStream` (cancel message, stream
//! reset, per-pick timeout, half-close).
//!
//! A slow pick is a real slow tokenization: the model's chat template
//! spins `N` × 10,000 loop rounds for a system message whose content is
//! `N`, so a tiny request keeps its handler busy for seconds without any
//! hook in the service. Every prompt counts as large here
//! (`large_prompt_bytes: 0`), so it is rendered on a blocking thread as a
//! slow pick in production is, and a test acts once the
//! `kvsteer_tokenize_large_running` gauge shows the pick being rendered.

mod common;

use common::{Admin, eventually, shared};
use kvsteer_indexer::app;
use kvsteer_proto::v1::{self as pb, router_client::RouterClient};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Streaming, transport::Channel};

const MODEL: &str = "m";
/// Outer rounds of the template's spin for a slow pick (seconds of
/// rendering; 1,000 rounds took under a second once the indexer moved to
/// jemalloc); a test acts within milliseconds of its start.
const SLOW: u32 = 4_000;

/// One service at a time: each slow pick keeps a core busy for seconds,
/// and several at once on a 2-core machine would slow the runtime
/// threads that deliver the cancel or reset a test is about.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Service {
    _serial: tokio::sync::MutexGuard<'static, ()>,
    running: app::Running,
    admin: Admin,
    client: RouterClient<Channel>,
    _tokenizer: tempfile::TempDir,
}

/// The Qwen3 tokenizer with a chat template that spins on the system
/// message's number.
fn slow_tokenizer() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let qwen3 = shared().join("tokenizers/qwen3");
    std::fs::copy(
        qwen3.join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    let mut config: Value = serde_json::from_str(
        &std::fs::read_to_string(qwen3.join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    config["chat_template"] = json!(
        "{%- for m in messages -%}\
         {%- if m.role == 'system' -%}\
         {%- for i in range(m.content | int) -%}{%- for j in range(10000) -%}{%- endfor -%}{%- endfor -%}\
         {%- endif -%}\
         <|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
         {%- endfor -%}\
         {%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
    );
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

async fn start() -> Service {
    let serial = ONE_AT_A_TIME.lock().await;
    let tokenizer = slow_tokenizer();
    let cfg = kvsteer_indexer::config::Config::from_yaml(&format!(
        "grpc_listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
models: [{{name: {MODEL}, tokenizer: '{dir}'}}]
tokenize: {{large_prompt_bytes: 0}}
workers:
  - {{name: w1, endpoint: '127.0.0.1:1', model: {MODEL}}}
  - {{name: w2, endpoint: '127.0.0.1:2', model: {MODEL}}}
",
        dir = tokenizer.path().display(),
    ))
    .expect("config");
    let running = app::start(cfg).await.expect("start");
    let admin = Admin::new(format!("http://{}", running.admin_addr));
    let channel = Channel::from_shared(format!("http://{}", running.grpc_addr))
        .unwrap()
        .connect()
        .await
        .expect("grpc connect");
    Service {
        _serial: serial,
        running,
        admin,
        client: RouterClient::new(channel),
        _tokenizer: tokenizer,
    }
}

/// A chat pick whose template spins `spin` rounds.
fn pick(id: &str, spin: u32) -> pb::PickRequest {
    let text = |role: &str, t: String| pb::ChatMessage {
        role: role.into(),
        content: Some(pb::chat_message::Content::Text(t)),
        ..Default::default()
    };
    pb::PickRequest {
        request_id: id.into(),
        model: MODEL.into(),
        api: pb::ApiKind::Chat as i32,
        messages: vec![
            text("system", spin.to_string()),
            text("user", format!("Question {id}: what is a KV cache?")),
        ],
        add_generation_prompt: Some(true),
        ..Default::default()
    }
}

fn report(id: &str, kind: pb::ReportKind) -> pb::ReportRequest {
    pb::ReportRequest {
        request_id: id.into(),
        kind: kind as i32,
        ..Default::default()
    }
}

/// One `PickStream`: its sending side and its answers.
struct PickStream {
    tx: mpsc::Sender<pb::PickStreamRequest>,
    answers: Streaming<pb::PickResponse>,
}

impl PickStream {
    async fn send_pick(&self, pick: pb::PickRequest, timeout_ms: u32) {
        let message = pb::PickStreamRequest {
            kind: Some(pb::pick_stream_request::Kind::Pick(pick)),
            timeout_ms,
        };
        self.tx.send(message).await.expect("stream open");
    }

    async fn cancel(&self, id: &str) {
        let message = pb::PickStreamRequest {
            kind: Some(pb::pick_stream_request::Kind::Cancel(id.into())),
            timeout_ms: 0,
        };
        self.tx.send(message).await.expect("stream open");
    }

    /// The next answer; `None` when the stream ended.
    async fn answer(&mut self) -> Option<pb::PickResponse> {
        self.answers.message().await.expect("stream healthy")
    }
}

impl Service {
    async fn pick_stream(&self) -> PickStream {
        let (tx, rx) = mpsc::channel(16);
        let answers = self
            .client
            .clone()
            .pick_stream(ReceiverStream::new(rx))
            .await
            .expect("stream opened")
            .into_inner();
        PickStream { tx, answers }
    }

    async fn metrics(&self) -> String {
        let (status, text) = self.admin.call("GET", "/metrics", None).await;
        assert_eq!(status, 200);
        text
    }

    /// The value of the sample `name{labels}` (0 when absent).
    async fn metric(&self, sample: &str) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    /// Waits until the sample `name{labels}` reads `value`.
    async fn wait_metric(&self, sample: &str, value: f64) {
        eventually(sample, || async {
            (self.metric(sample).await == value).then_some(())
        })
        .await;
    }

    /// Waits until a slow pick is being rendered (its handler holds it).
    async fn rendering(&self) {
        self.wait_metric("kvsteer_tokenize_large_running", 1.0)
            .await;
    }

    /// Waits until the pick's fate is known: counted in flight (routed)
    /// or abandoned for any reason.
    async fn settled(&self) {
        eventually("the pick committed or abandoned", || async {
            let m = self.metrics().await;
            let done = m.lines().any(|l| {
                (l.starts_with("kvsteer_picks_total{") && l.contains("outcome=\"routed\""))
                    || l.starts_with("kvsteer_pick_abandoned_total{")
            });
            done.then_some(())
        })
        .await;
    }

    /// (in_flight, unprefilled_tokens, decoding) summed over the workers.
    async fn load(&self) -> (u64, u64, u64) {
        let (_, v) = self.admin.call_json("GET", "/debug/workers", None).await;
        v["workers"]
            .as_array()
            .unwrap()
            .iter()
            .fold((0, 0, 0), |s, w| {
                let n = |k: &str| w[k].as_u64().unwrap();
                (
                    s.0 + n("in_flight"),
                    s.1 + n("unprefilled_tokens"),
                    s.2 + n("decoding"),
                )
            })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_that_overtakes_its_slow_pick_leaves_no_load() {
    let s = start().await;
    let mut picker = s.client.clone();
    let slow = tokio::spawn(async move { picker.pick(pick("a", SLOW)).await });
    s.rendering().await;
    // The filter gave up waiting: its Cancelled reaches the indexer first.
    s.client
        .clone()
        .report(report("a", pb::ReportKind::Cancelled))
        .await
        .expect("report");
    let answer = slow.await.unwrap().expect("the pick is still answered");
    assert_eq!(answer.into_inner().endpoints.len(), 2);
    assert_eq!(s.load().await, (0, 0, 0));
    assert_eq!(
        s.metric("kvsteer_pick_abandoned_total{reason=\"reported\"}")
            .await,
        1.0
    );
    // A late first token for it changes nothing either.
    s.client
        .clone()
        .report(report("a", pb::ReportKind::FirstToken))
        .await
        .expect("report");
    assert_eq!(s.load().await, (0, 0, 0));
    s.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_whose_caller_went_away_is_not_committed() {
    let s = start().await;
    let mut picker = s.client.clone();
    let slow = tokio::spawn(async move { picker.pick(pick("b", SLOW)).await });
    s.rendering().await;
    // The caller goes away: its call is dropped (the stream is reset).
    slow.abort();
    assert!(slow.await.unwrap_err().is_cancelled());
    s.settled().await;
    assert_eq!(s.load().await, (0, 0, 0));
    assert_eq!(
        s.metric("kvsteer_pick_abandoned_total{reason=\"cancelled\"}")
            .await,
        1.0
    );
    s.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_past_its_grpc_deadline_is_not_committed() {
    let s = start().await;
    // The caller waits 1 s (as Envoy sends its call timeout); the pick
    // takes seconds.
    let mut request = tonic::Request::new(pick("c", SLOW));
    request.set_timeout(Duration::from_secs(1));
    let answer = s.client.clone().pick(request).await;
    assert!(answer.is_err(), "{answer:?}");
    s.settled().await;
    assert_eq!(s.load().await, (0, 0, 0));
    assert_eq!(
        s.metric("kvsteer_pick_abandoned_total{reason=\"deadline\"}")
            .await,
        1.0
    );
    // A pick within its deadline is committed.
    let mut request = tonic::Request::new(pick("c2", 0));
    request.set_timeout(Duration::from_secs(30));
    s.client.clone().pick(request).await.expect("pick");
    assert_eq!(s.load().await.0, 1);
    s.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_with_its_first_token_releases_and_calibrates_only_when_measured() {
    let s = start().await;
    let mut client = s.client.clone();
    for id in ["measured", "whole", "first-unmeasured"] {
        client.pick(pick(id, 0)).await.expect("pick");
    }
    let (in_flight, unprefilled, _) = s.load().await;
    assert_eq!(in_flight, 3);
    assert!(unprefilled > 0);
    // A streamed single-chunk response, reported once.
    let done = |id: &str, measured: bool| pb::ReportRequest {
        elapsed_ms: 180.0,
        first_token_ms: Some(120.0),
        ttft_measured: measured,
        ..report(id, pb::ReportKind::Done)
    };
    client.report(done("measured", true)).await.expect("report");
    // A whole (non-streamed) response: its first bytes came with the end.
    client.report(done("whole", false)).await.expect("report");
    // An unmeasured first token, then its done.
    let first = pb::ReportRequest {
        elapsed_ms: 90.0,
        ..report("first-unmeasured", pb::ReportKind::FirstToken)
    };
    client.report(first).await.expect("report");
    client
        .report(report("first-unmeasured", pb::ReportKind::Done))
        .await
        .expect("report");
    assert_eq!(s.load().await, (0, 0, 0));
    assert_eq!(
        s.metric("kvsteer_observed_ttft_seconds_count{tenant=\"other\"}")
            .await,
        1.0
    );
    assert_eq!(
        s.metric("kvsteer_observed_ttft_seconds_sum{tenant=\"other\"}")
            .await,
        0.12
    );
    s.running.shutdown().await;
}

/// The filter's DONE (or CANCELLED after output) repeats a first token it
/// reported alone: the two are separate calls, handled in either order.
/// Each request is one observed TTFT, its first report's, and a first
/// token after its end counts as such, not as unmatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_token_and_its_end_count_once_in_either_order() {
    let s = start().await;
    let mut client = s.client.clone();
    for id in ["in-order", "overtaken", "cancelled"] {
        client.pick(pick(id, 0)).await.expect("pick");
    }
    let first = |id: &str| pb::ReportRequest {
        elapsed_ms: 50.0,
        ttft_measured: true,
        ..report(id, pb::ReportKind::FirstToken)
    };
    let done = |id: &str| pb::ReportRequest {
        elapsed_ms: 300.0,
        first_token_ms: Some(50.0),
        ttft_measured: true,
        ..report(id, pb::ReportKind::Done)
    };
    client.report(first("in-order")).await.expect("report");
    client.report(done("in-order")).await.expect("report");
    client.report(done("overtaken")).await.expect("report");
    client.report(first("overtaken")).await.expect("report");
    let cancel = pb::ReportRequest {
        kind: pb::ReportKind::Cancelled as i32,
        ..done("cancelled")
    };
    client.report(cancel).await.expect("report");
    client.report(first("cancelled")).await.expect("report");
    assert_eq!(s.load().await, (0, 0, 0));
    assert_eq!(
        s.metric("kvsteer_observed_ttft_seconds_count{tenant=\"other\"}")
            .await,
        3.0
    );
    let sum = s
        .metric("kvsteer_observed_ttft_seconds_sum{tenant=\"other\"}")
        .await;
    assert!((sum - 0.15).abs() < 1e-9, "{sum}");
    // The two first tokens their ends overtook, told apart from reports
    // for ids never seen.
    assert_eq!(
        s.metric("kvsteer_reports_after_end_total{kind=\"first_token\"}")
            .await,
        2.0
    );
    client.report(first("never-picked")).await.expect("report");
    assert_eq!(
        s.metric("kvsteer_reports_unmatched_total{kind=\"first_token\"}")
            .await,
        1.0
    );
    s.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_without_a_model_uses_the_only_one_served() {
    let s = start().await;
    let mut request = pick("no-model", 0);
    request.model.clear();
    let answer = s
        .client
        .clone()
        .pick(request)
        .await
        .expect("pick")
        .into_inner();
    assert_eq!(answer.endpoints.len(), 2);
    let d = answer.decision.unwrap();
    assert!(!d.degraded && d.prompt_tokens > 0, "{d:?}");
    assert_eq!(s.load().await.0, 1);
    assert_eq!(s.metric("kvsteer_model_defaulted_total").await, 1.0);
    s.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_picks_are_answered_by_request_id_and_committed() {
    let s = start().await;
    let mut stream = s.pick_stream().await;
    assert_eq!(s.metric("kvsteer_pick_streams").await, 1.0);
    stream.send_pick(pick("s1", 0), 1_000).await;
    stream.send_pick(pick("s2", 0), 0).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let answer = stream.answer().await.expect("an answer");
        assert_eq!(answer.endpoints.len(), 2, "{answer:?}");
        ids.push(answer.request_id);
    }
    ids.sort();
    assert_eq!(ids, ["s1", "s2"]);
    assert_eq!(s.load().await.0, 2);
    // The stream's end takes no committed pick with it.
    drop(stream);
    s.wait_metric("kvsteer_pick_streams", 0.0).await;
    assert_eq!(s.load().await.0, 2);
    s.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_stream_pick_is_not_committed_and_others_go_on() {
    let s = start().await;
    let mut stream = s.pick_stream().await;
    stream.send_pick(pick("slow", SLOW), 0).await;
    s.rendering().await;
    stream.cancel("slow").await;
    stream.send_pick(pick("fast", 0), 0).await;
    let answer = stream.answer().await.expect("an answer");
    assert_eq!(answer.request_id, "fast");
    s.settled().await;
    s.wait_metric("kvsteer_pick_abandoned_total{reason=\"cancelled\"}", 1.0)
        .await;
    assert_eq!(s.load().await.0, 1, "only the fast pick is in flight");
    // Closing our side ends the stream with no answer for the cancelled one.
    drop(stream.tx);
    assert!(stream.answers.message().await.expect("clean end").is_none());
    s.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_pick_past_its_timeout_is_not_committed_or_answered() {
    let s = start().await;
    let mut stream = s.pick_stream().await;
    stream.send_pick(pick("late", SLOW), 1_000).await;
    stream.send_pick(pick("in-time", 0), 30_000).await;
    let answer = stream.answer().await.expect("an answer");
    assert_eq!(answer.request_id, "in-time");
    s.wait_metric("kvsteer_pick_abandoned_total{reason=\"deadline\"}", 1.0)
        .await;
    assert_eq!(s.load().await.0, 1);
    drop(stream.tx);
    assert!(stream.answers.message().await.expect("clean end").is_none());
    s.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_stream_abandons_its_running_picks() {
    let s = start().await;
    let stream = s.pick_stream().await;
    stream.send_pick(pick("orphan", SLOW), 0).await;
    s.rendering().await;
    // The filter's Envoy worker went away: both sides dropped (a reset).
    drop(stream);
    s.settled().await;
    assert_eq!(s.load().await, (0, 0, 0));
    assert_eq!(
        s.metric("kvsteer_pick_abandoned_total{reason=\"cancelled\"}")
            .await,
        1.0
    );
    s.wait_metric("kvsteer_pick_streams", 0.0).await;
    s.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_stream_still_gets_the_answers_it_is_owed() {
    let s = start().await;
    let stream = s.pick_stream().await;
    stream.send_pick(pick("owed", 100), 0).await;
    // No more picks from this stream (the filter rotated it).
    let PickStream { tx, mut answers } = stream;
    drop(tx);
    let answer = answers
        .message()
        .await
        .expect("healthy")
        .expect("owed answer");
    assert_eq!(answer.request_id, "owed");
    assert!(answers.message().await.expect("clean end").is_none());
    assert_eq!(s.load().await.0, 1);
    s.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_cleanly_when_the_indexer_shuts_down() {
    let s = start().await;
    let mut stream = s.pick_stream().await;
    stream.send_pick(pick("before", 0), 0).await;
    let answer = stream.answer().await.expect("an answer");
    assert_eq!(answer.request_id, "before");
    // The stream stays open on the filter's side; the indexer stops.
    let Service { running, .. } = s;
    let stopping = tokio::spawn(running.shutdown());
    let end = stream.answers.message().await;
    assert!(matches!(end, Ok(None)), "a clean end, not a reset: {end:?}");
    stopping.await.unwrap();
}
