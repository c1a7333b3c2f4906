//! Calibration against the simulator: three `kvsteer-sim` engines with the
//! same timing profile (`tiny-cpu`, real time), steered by the indexer's
//! Pick over gRPC; each streamed response's first generated chunk is timed
//! by the client (as the filter does) and reported as a measured first
//! token. From a prior 1.5× off, the calibrated prefill rates of the
//! identical workers end nearer the profile's true rate than the prior and
//! near each other, and once calibrated most predictions are within 20 %
//! of what is observed (`kvsteer_ttft_error_ratio`).
//!
//! The engines run in real time beside the indexer and the clients on a
//! shared machine, so the first tokens carry the HTTP exchange, the
//! engine's tokenizing and scheduling noise: the bounds here leave room
//! for it (see the figures below). How closely calibration converges is measured
//! in virtual time by `kvsteer-bench` (`calibrated_prefill_rates`,
//! `prediction_error_p50_s`; `sim/BENCHMARKS.md`) and by the unit tests of
//! `scoring::calibrate`.
//!
//! Each prompt (~18.7k tokens) is prefilled in one step: with a budget
//! below it (16,384 tokens, two chunks) 2 and 6 of 36 first tokens came
//! 1.27–1.86× later than predicted, the rate of the worker they fell on was
//! dragged down with them, and CI once failed on 28 of 36 within 20 %;
//! in one step, 36 of 36 in each of 7 runs on a 2-core machine (6 with a
//! cargo build beside, 3 with the client loops started apart, which changed
//! nothing; rates 4–10 % under the truth, at most 6 % apart).
//!
//! Every fifth request repeats the one before: the engine has its prompt
//! cached, the index (no KV events here, as when they lag) does not, so
//! its first token comes far sooner than any prefill rate explains. Such
//! samples used to drag the rate to the upper clamp.

mod common;

use bytes::Bytes;
use common::{Admin, MODEL, free_port, pick_request, shared};
use http_body_util::{BodyExt, Full};
use kvsteer_indexer::{app, config::Config, metrics::TTFT_ERROR_BUCKETS};
use kvsteer_proto::v1 as pb;
use kvsteer_sim::{engine::EngineConfig, profile::TimingProfile, server};
use serde_json::{Value, json};
use std::time::Instant;

type Router = pb::router_client::RouterClient<tonic::transport::Channel>;

const WORKERS: usize = 3;
/// Requests per client loop in each phase (one loop per worker).
const ROUNDS: usize = 15;
const PRIOR: f64 = 25_000.0;

/// An engine with the `tiny-cpu` profile in real time, prefilling a whole
/// prompt in one step (a budget above the document's tokens: no chunking,
/// one step overhead per prefill).
async fn sim() -> server::ServerHandle {
    for attempt in 0.. {
        let listen = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut engine = EngineConfig::new(TimingProfile::by_name("tiny-cpu").unwrap());
        engine.max_num_batched_tokens = 32_768;
        let started = server::ServerHandle::start(server::ServerConfig {
            listen,
            served_model_name: MODEL.into(),
            tokenizer_dir: shared().join("tokenizers/qwen3"),
            kv_events: None,
            engine,
            time_scale: 1.0,
            worker_id: listen.to_string(),
            lora_modules: Vec::new(),
        })
        .await;
        match started {
            Ok(handle) => return handle,
            Err(e) if attempt < 5 => eprintln!("retrying sim start: {e}"),
            Err(e) => panic!("start sim: {e}"),
        }
    }
    unreachable!()
}

/// A conversation nobody sent before: a unique system message first (so no
/// block is cached anywhere), then the same long document (so its text is
/// in the tokenizers' segment caches and encoding costs nothing).
fn request(nonce: &str, document: &str) -> Value {
    json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": format!("Session {nonce}.")},
            {"role": "user", "content": document},
        ],
        "max_tokens": 3,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// Streams `body` to `endpoint`, reporting the first chunk that carries
/// generated text as a measured first token, then done. Returns the
/// prompt tokens the engine had cached and the first token's milliseconds.
async fn run(
    router: &mut Router,
    http: &Admin,
    id: &str,
    endpoint: &str,
    body: &Value,
) -> (u64, f64) {
    let req = http::Request::post(format!("http://{endpoint}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let start = Instant::now();
    let resp = http.client.request(req).await.expect("worker answers");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let (mut buf, mut ttft, mut cached) = (Vec::new(), None, None);
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.expect("stream").into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let chunk: Value = serde_json::from_str(data.trim()).unwrap_or(Value::Null);
            if let Some(n) = chunk.pointer("/usage/prompt_tokens_details/cached_tokens") {
                cached = n.as_u64();
            }
            let text = chunk.pointer("/choices/0/delta/content");
            if ttft.is_none() && text.and_then(Value::as_str).is_some_and(|t| !t.is_empty()) {
                let ms = start.elapsed().as_secs_f64() * 1000.0;
                ttft = Some(ms);
                report(router, id, pb::ReportKind::FirstToken, ms).await;
            }
        }
    }
    let e2e = start.elapsed().as_secs_f64() * 1000.0;
    report(router, id, pb::ReportKind::Done, e2e).await;
    let ttft = ttft.expect("a chunk with generated text");
    (cached.expect("usage"), ttft)
}

async fn report(router: &mut Router, id: &str, kind: pb::ReportKind, elapsed_ms: f64) {
    router
        .report(pb::ReportRequest {
            request_id: id.into(),
            kind: kind as i32,
            elapsed_ms,
            status: 200,
            ttft_measured: kind == pb::ReportKind::FirstToken,
            ..Default::default()
        })
        .await
        .expect("report");
}

/// One request as sent.
struct Sent {
    worker: String,
    repeat: bool,
    cached_tokens: u64,
    predicted_ms: f64,
    observed_ms: f64,
}

/// `ROUNDS` requests in sequence: pick, stream, report; every fifth one
/// repeats the prompt before it.
async fn client_loop(mut router: Router, http: Admin, phase: &str, lane: usize) -> Vec<Sent> {
    let document = document();
    let mut sent = Vec::new();
    let mut body = Value::Null;
    for round in 0..ROUNDS {
        let id = format!("{phase}-{lane}-{round}");
        let repeat = round % 5 == 4;
        if !repeat {
            body = request(&id, &document);
        }
        let picked = router
            .pick(pick_request(&id, &body))
            .await
            .expect("pick")
            .into_inner();
        let d = picked.decision.expect("decision");
        assert!(!d.degraded, "{d:?}");
        let (cached_tokens, observed_ms) =
            run(&mut router, &http, &id, &picked.endpoints[0], &body).await;
        sent.push(Sent {
            worker: d.worker,
            repeat,
            cached_tokens,
            predicted_ms: d.predicted_ttft_ms,
            observed_ms,
        });
    }
    sent
}

/// ~18.7k tokens of text (a prefill of about half a second at the
/// profile's rate).
fn document() -> String {
    (0..2_200)
        .map(|i| format!("Paragraph {i} says little. "))
        .collect()
}

/// `kvsteer_ttft_error_ratio` bucket counts (cumulative, by bound) and count.
fn error_ratio(metrics: &str) -> (Vec<f64>, f64) {
    let value = |line: &str| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap();
    let bucket = |le: f64| {
        metrics.lines().find_map(|l| {
            let rest = l.strip_prefix("kvsteer_ttft_error_ratio_bucket{le=\"")?;
            let (bound, _) = rest.split_once('"')?;
            (bound.parse::<f64>().ok()? == le).then(|| value(l))
        })
    };
    let buckets = TTFT_ERROR_BUCKETS
        .iter()
        .map(|&le| bucket(le).unwrap_or_else(|| panic!("no bucket {le} in {metrics}")))
        .collect();
    let count = metrics
        .lines()
        .find(|l| l.starts_with("kvsteer_ttft_error_ratio_count"))
        .map_or(0.0, value);
    (buckets, count)
}

async fn phase(router: &Router, http: &Admin, name: &str) -> Vec<Sent> {
    let loops: Vec<_> = (0..WORKERS)
        .map(|lane| {
            let http = Admin {
                base: http.base.clone(),
                client: http.client.clone(),
            };
            let (router, name) = (router.clone(), name.to_owned());
            tokio::spawn(async move { client_loop(router, http, &name, lane).await })
        })
        .collect();
    let mut workers = Vec::new();
    for l in loops {
        workers.extend(l.await.expect("client loop"));
    }
    workers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_workers_calibrate_to_the_profiles_rate() {
    let profile = TimingProfile::by_name("tiny-cpu").unwrap();
    assert_eq!(profile.attention_s_per_pair, 0.0, "prefill is linear");
    assert_eq!(profile.weight_read_s, 0.0, "and compute bound");
    let true_rate = 1.0 / profile.linear_s_per_token;

    let mut sims = Vec::new();
    for _ in 0..WORKERS {
        sims.push(sim().await);
    }
    let workers: String = sims
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "  - {{name: w{i}, endpoint: '{}', model: {MODEL}}}\n",
                s.addr
            )
        })
        .collect();
    let cfg = Config::from_yaml(&format!(
        "grpc_listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
models:
  - name: {MODEL}
    tokenizer: {tok}
workers:
{workers}scoring:
  prefill_rate_prior: {PRIOR}
",
        tok = shared().join("tokenizers/qwen3").display(),
    ))
    .expect("config");
    let running = app::start(cfg).await.expect("start");
    let admin = Admin::new(format!("http://{}", running.admin_addr));
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", running.grpc_addr))
        .unwrap()
        .connect()
        .await
        .expect("grpc connect");
    let router = Router::new(channel);

    let mut placed = phase(&router, &admin, "warm").await;
    let (warm_buckets, warm_count) = error_ratio(&admin.call("GET", "/metrics", None).await.1);
    assert_eq!(warm_count, (WORKERS * ROUNDS) as f64);
    placed.extend(phase(&router, &admin, "calibrated").await);
    let (buckets, count) = error_ratio(&admin.call("GET", "/metrics", None).await.1);

    // Every worker took its share of the samples, and repeats did hit
    // the engines' caches (fresh prompts did not).
    for i in 0..WORKERS {
        let n = placed
            .iter()
            .filter(|s| s.worker == format!("w{i}"))
            .count();
        assert!(n >= ROUNDS, "w{i} served {n} of {}", placed.len());
    }
    let hits = |repeat: bool| {
        placed
            .iter()
            .filter(|s| s.repeat == repeat && s.cached_tokens > 1_000)
            .count()
    };
    assert_eq!(hits(false), 0);
    assert!(hits(true) >= WORKERS, "{} repeats hit a cache", hits(true));
    let (_, v) = admin.call_json("GET", "/debug/workers", None).await;
    // Every request reported its end: nothing is left in flight or held.
    assert_eq!(v["ledger"]["entries"], 0, "{}", v["ledger"]);
    assert_eq!(v["ledger"]["held_blocks"], 0, "{}", v["ledger"]);
    let rates: Vec<f64> = v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["prefill_rate"].as_f64().unwrap())
        .collect();
    eprintln!("calibrated rates {rates:?}, true {true_rate}");
    // Each moved from the prior toward the truth and no further past it
    // than the prior was short of it (repeats once dragged the rate to
    // the upper clamp, 4× the prior).
    for r in &rates {
        assert!(
            (r - true_rate).abs() < (PRIOR - true_rate).abs(),
            "rates {rates:?}, true {true_rate}, prior {PRIOR}"
        );
    }
    let (min, max) = rates
        .iter()
        .fold((f64::MAX, 0.0_f64), |(a, b), &r| (a.min(r), b.max(r)));
    assert!(max / min < 1.2, "rates {rates:?}");

    // Calibrated: the second phase's predictions of fresh prompts are
    // within 20 % of what was observed (observed / predicted in
    // (0.8, 1.25]) for at least 80 % of them (36 of 36 measured).
    assert_eq!(count - warm_count, (WORKERS * ROUNDS) as f64);
    let fresh = placed[WORKERS * ROUNDS..]
        .iter()
        .filter(|s| !s.repeat)
        .count() as f64;
    let at = |le: f64| TTFT_ERROR_BUCKETS.iter().position(|&b| b == le).unwrap();
    let within = |b: &[f64]| b[at(1.25)] - b[at(0.8)];
    let late = within(&buckets) - within(&warm_buckets);
    eprintln!("{late} of {fresh} calibrated predictions within 20 %");
    for s in &placed[WORKERS * ROUNDS..] {
        eprintln!(
            "{} repeat={} cached={} predicted {:.0} ms observed {:.0} ms ratio {:.2}",
            s.worker,
            s.repeat,
            s.cached_tokens,
            s.predicted_ms,
            s.observed_ms,
            s.observed_ms / s.predicted_ms
        );
    }
    assert!(
        late >= 0.8 * fresh,
        "{late} of {fresh} within 20 %: warm {warm_buckets:?}, all {buckets:?}"
    );

    running.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}
