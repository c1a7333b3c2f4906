//! Bounded work per pick, through the gRPC server (`app::start`, port 0):
//! - a prompt with more text than its model's `max_tokenize_bytes` is not
//!   tokenized and is scored on load only (`prompt_too_large`);
//! - a 5 MiB Pick (the filter buffers up to 8 MiB) is accepted: tonic's
//!   default 4 MB decode limit refused it;
//! - a large prompt arriving while every large-prompt permit is taken is
//!   scored on load only at once (`tokenize_busy`), not queued.

mod common;

use common::{Admin, MODEL, eventually, shared};
use kvsteer_indexer::{
    app::{self, Running},
    config::Config,
};
use kvsteer_proto::v1 as pb;
use std::time::Duration;

async fn start(extra: &str) -> Running {
    let cfg = Config::from_yaml(&format!(
        "grpc_listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
models:
  - name: {MODEL}
    tokenizer: {tok}
{extra}
workers:
  - {{name: w1, endpoint: '127.0.0.1:18101', model: {MODEL}}}
  - {{name: w2, endpoint: '127.0.0.1:18102', model: {MODEL}}}
",
        tok = shared().join("tokenizers/qwen3").display(),
    ))
    .expect("config");
    app::start(cfg).await.expect("start")
}

async fn client(running: &Running) -> pb::router_client::RouterClient<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", running.grpc_addr))
        .unwrap()
        .connect()
        .await
        .expect("grpc connect");
    pb::router_client::RouterClient::new(channel)
}

/// A chat Pick whose one user message has at least `bytes` bytes of
/// distinct words (`salt` keeps them out of the segment cache).
fn pick(id: &str, bytes: usize, salt: &str) -> pb::PickRequest {
    let mut text = String::with_capacity(bytes + 16);
    let mut i = 0u64;
    while text.len() < bytes {
        text.push_str(&format!("{salt}{i} "));
        i += 1;
    }
    pb::PickRequest {
        request_id: id.into(),
        model: MODEL.into(),
        api: pb::ApiKind::Chat as i32,
        messages: vec![pb::ChatMessage {
            role: "user".into(),
            content: Some(pb::chat_message::Content::Text(text)),
            ..Default::default()
        }],
        ..Default::default()
    }
}

async fn metrics(admin: &Admin) -> String {
    admin.call("GET", "/metrics", None).await.1
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_above_the_cap_is_scored_on_load_only() {
    let running = start("    max_tokenize_bytes: 65536").await;
    let admin = Admin::new(format!("http://{}", running.admin_addr));
    let mut client = client(&running).await;

    let under = client
        .pick(pick("r-under", 60_000, "u"))
        .await
        .expect("pick")
        .into_inner();
    let d = under.decision.unwrap();
    assert!(!d.degraded, "{d:?}");
    assert!(d.prompt_tokens > 10_000, "{d:?}");

    let over = client
        .pick(pick("r-over", 70_000, "o"))
        .await
        .expect("pick")
        .into_inner();
    let d = over.decision.unwrap();
    assert!(d.degraded, "{d:?}");
    assert!(d.reason.starts_with("prompt_too_large"), "{d:?}");
    assert_eq!(d.prompt_tokens, 0);
    // Load only: both workers, the one holding r-under last.
    assert_eq!(over.endpoints.len(), 2);
    assert_eq!(over.endpoints[1], under.endpoints[0]);
    let text = metrics(&admin).await;
    assert!(
        text.contains(
            r#"kvsteer_degraded_picks_total{reason="prompt_too_large",tenant="other"} 1"#
        ),
        "{text}"
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5_mib_pick_is_accepted() {
    // Default limits: grpc.max_message_bytes 9 MiB, max_tokenize_bytes
    // 1 MiB (max_model_len 131072 × 8).
    let running = start("").await;
    let mut client = client(&running).await;
    let req = pick("r-5mib", 5 << 20, "m");
    assert!(prost::Message::encoded_len(&req) > 5 << 20);
    let out = client
        .pick(req)
        .await
        .expect("a 5 MiB Pick is accepted")
        .into_inner();
    let d = out.decision.unwrap();
    assert!(d.reason.starts_with("prompt_too_large"), "{d:?}");
    assert_eq!(out.endpoints.len(), 2);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_tokenizations_beyond_the_limit_degrade_instead_of_queueing() {
    let running = start(
        "    max_tokenize_bytes: 4194304
    max_model_len: 4194304
tokenize:
  large_prompt_bytes: 1024
  max_concurrent_large: 1",
    )
    .await;
    let admin = Admin::new(format!("http://{}", running.admin_addr));
    let mut client = client(&running).await;

    // A 1 MB prompt takes the only permit for a while (hundreds of ms).
    let mut big = client.clone();
    let first = tokio::spawn(async move { big.pick(pick("r-big", 1 << 20, "b")).await });
    let running_gauge = "kvsteer_tokenize_large_running";
    tokio::time::timeout(common::WAIT, async {
        while metric(&metrics(&admin).await, running_gauge) != Some(1.0) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the large tokenization starts");
    // Large prompts sent while it runs are answered at once, on load only.
    let mut busy = 0;
    let mut i = 0;
    while !first.is_finished() {
        let out = client
            .pick(pick(&format!("r-{i}"), 4_096, "s"))
            .await
            .expect("pick")
            .into_inner();
        let d = out.decision.unwrap();
        if d.degraded {
            assert!(d.reason.starts_with("tokenize_busy"), "{d:?}");
            assert_eq!(out.endpoints.len(), 2);
            busy += 1;
        }
        i += 1;
    }
    let d = first.await.unwrap().expect("pick").into_inner().decision;
    assert!(!d.as_ref().unwrap().degraded, "{d:?}");
    assert!(busy >= 1, "{i} picks sent while the large one ran");
    let text = metrics(&admin).await;
    assert_eq!(metric(&text, running_gauge), Some(0.0), "{text}");
    assert!(
        text.contains(&format!(
            r#"kvsteer_degraded_picks_total{{reason="tokenize_busy",tenant="other"}} {busy}"#
        )),
        "{text}"
    );
    // With the permit back, a large prompt is tokenized again.
    let out = client.pick(pick("r-after", 4_096, "a")).await.unwrap();
    assert!(!out.into_inner().decision.unwrap().degraded);
    eventually("nothing left running", || async {
        (metric(&metrics(&admin).await, running_gauge) == Some(0.0)).then_some(())
    })
    .await;
    running.shutdown().await;
}
