//! Worker death and restart, end to end over loopback: `kvsteer-sim`
//! engines in-process (real HTTP `/metrics`, real prefix caches publishing
//! KV events over ZeroMQ with replay), an in-process indexer on the memory
//! or the Redis backend, default liveness settings.
//!
//! - A killed worker's stream leaves `live` at once, the worker is no
//!   candidate while its blocks are indexed, and they are purged after
//!   `streams.down_grace_ms`.
//! - A worker restarted on the same ports (within the grace, publishing
//!   nothing yet) is found at reconnect by the replay probe; its old blocks
//!   are purged and a pick of the old prompt predicts a cold prefill there.
//!
//! Each test prints its measured times (`LIVENESS …`).

mod common;

use common::{Admin, MODEL, Sim, eventually, shared};
use kvsteer_indexer::{
    app::{self, Running},
    config::Config,
    index::redis::testing::RedisServer,
};
use serde_json::{Value, json};
use std::time::Instant;

#[derive(Clone, Copy, Debug)]
enum Backend {
    Memory,
    Redis,
}

struct Setup {
    sims: Vec<Sim>,
    running: Running,
    admin: Admin,
    _redis: Option<RedisServer>,
}

/// Two engines `w1`, `w2` scraped for `/metrics`, an indexer on `backend`
/// with `streams` (YAML lines under `streams:`) on top of the defaults.
async fn setup(backend: Backend, streams: &str) -> Setup {
    let sims = vec![Sim::start().await, Sim::start().await];
    let workers: String = sims
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "  - {{name: w{n}, endpoint: '{a}', model: {MODEL}, kv_events: '{k}', replay: '{r}', metrics: 'http://{a}/metrics'}}\n",
                n = i + 1,
                a = s.addr,
                k = s.kv,
                r = s.replay,
            )
        })
        .collect();
    let redis = match backend {
        Backend::Memory => None,
        Backend::Redis => Some(
            RedisServer::start()
                .await
                .unwrap_or_else(|e| panic!("this test needs a local redis-server: {e}")),
        ),
    };
    let index = match &redis {
        None => String::new(),
        Some(r) => format!(
            "index:\n  backend: redis\n  redis:\n    url: {}\n    cache_ttl_ms: 50\n",
            r.url()
        ),
    };
    let cfg = Config::from_yaml(&format!(
        "grpc_listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nmodels: [{{name: {MODEL}, tokenizer: '{tok}'}}]\nworkers:\n{workers}{index}streams:\n  channel_capacity: 1024\n{streams}",
        tok = shared().join("tokenizers/qwen3").display(),
    ))
    .expect("config");
    let running = app::start(cfg).await.expect("start indexer");
    let admin = Admin::new(format!("http://{}", running.admin_addr));
    eventually("both streams live", || async {
        let (a, b) = (admin.worker("w1").await, admin.worker("w2").await);
        (a["stream"]["state"] == "live" && b["stream"]["state"] == "live").then_some(())
    })
    .await;
    Setup {
        sims,
        running,
        admin,
        _redis: redis,
    }
}

/// A one-turn conversation long enough for several blocks.
fn prompt(tag: &str) -> Value {
    json!({
        "model": MODEL,
        "max_tokens": 4,
        "stream": false,
        "messages": [{"role": "user", "content": format!(
            "{tag}: {}", "please review this function and explain every branch of it. ".repeat(12)
        )}],
    })
}

async fn score(admin: &Admin, body: &Value) -> Value {
    let (status, v) = admin.call_json("POST", "/debug/score", Some(body)).await;
    assert_eq!(status, 200, "{v}");
    v
}

fn entry<'a>(score: &'a Value, worker: &str) -> &'a Value {
    score["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == worker)
        .unwrap_or_else(|| panic!("{worker} in {score}"))
}

fn matched(score: &Value, worker: &str) -> u64 {
    entry(score, worker)["matched_tokens"].as_u64().unwrap()
}

/// The prompt runs on w2's engine; waits until the index holds it there.
async fn warm_w2(s: &Setup, body: &Value) {
    s.sims[1].chat(&s.admin, body).await;
    eventually("w2 indexed the prompt", || async {
        (matched(&score(&s.admin, body).await, "w2") > 0).then_some(())
    })
    .await;
}

/// `kvsteer_stream_state{worker,state}` as exported.
async fn stream_state_metric(admin: &Admin, worker: &str, state: &str) -> Option<f64> {
    let text = admin.call("GET", "/metrics", None).await.1;
    let prefix = format!("kvsteer_stream_state{{worker=\"{worker}\",state=\"{state}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

fn ms(d: std::time::Duration) -> u128 {
    d.as_millis()
}

async fn killed_worker_goes_down_and_is_purged(backend: Backend) {
    let mut s = setup(backend, "").await;
    let body = prompt("killed");
    warm_w2(&s, &body).await;
    assert_eq!(score(&s.admin, &body).await["chosen"], "w2");

    // The engine closes its ZeroMQ sockets last: times count from there.
    s.sims.pop().unwrap().shutdown().await;
    let killed = Instant::now();
    eventually("w2 stream down", || async {
        (s.admin.worker("w2").await["stream"]["state"] == "down").then_some(())
    })
    .await;
    let down = killed.elapsed();
    // Not a candidate while its blocks are still indexed.
    let w = s.admin.worker("w2").await;
    assert!(w["up"] == false || w["indexed_blocks"] == 0, "{w}");
    eventually("w2 purged", || async {
        let w = s.admin.worker("w2").await;
        let sc = score(&s.admin, &body).await;
        (w["indexed_blocks"] == 0 && matched(&sc, "w2") == 0).then_some(())
    })
    .await;
    let purged = killed.elapsed();
    eprintln!(
        "LIVENESS {backend:?} kill->down_ms={} kill->purged_ms={}",
        ms(down),
        ms(purged)
    );

    // The dead worker is never shown live, and its scrape takes it out.
    eventually("w2 not up", || async {
        (s.admin.worker("w2").await["up"] == false).then_some(())
    })
    .await;
    let w = s.admin.worker("w2").await;
    assert_eq!(w["stream"]["state"], "down", "{w}");
    assert_eq!(stream_state_metric(&s.admin, "w2", "down").await, Some(1.0));
    assert_eq!(stream_state_metric(&s.admin, "w2", "live").await, Some(0.0));
    let sc = score(&s.admin, &body).await;
    assert_eq!(sc["chosen"], "w1", "{sc}");

    s.running.shutdown().await;
    for sim in s.sims {
        sim.shutdown().await;
    }
}

async fn restart_is_found_at_reconnect(backend: Backend) {
    // A grace far beyond the test: only the reconnect can purge.
    let mut s = setup(backend, "  down_grace_ms: 600000\n").await;
    let body = prompt("restarted");
    warm_w2(&s, &body).await;
    let resets_before = s.admin.worker("w2").await["stream"]["resets"]
        .as_u64()
        .unwrap();

    let old = s.sims.pop().unwrap();
    let (addr, kv, replay) = (old.addr, old.kv.clone(), old.replay.clone());
    old.shutdown().await;
    let handle = eventually("w2 engine restarted on its ports", || async {
        Sim::try_start(addr, &kv, &replay).await.ok()
    })
    .await;
    let restarted = Instant::now();
    let new = Sim {
        addr,
        kv,
        replay,
        handle,
    };
    // Nothing runs on the new engine: no live batch can reveal it.
    eventually("w2 restart found and purged", || async {
        let w = s.admin.worker("w2").await;
        let sc = score(&s.admin, &body).await;
        (w["stream"]["resets"].as_u64() > Some(resets_before)
            && w["indexed_blocks"] == 0
            && matched(&sc, "w2") == 0)
            .then_some(())
    })
    .await;
    let purged = restarted.elapsed();
    eventually("w2 live again", || async {
        (s.admin.worker("w2").await["stream"]["state"] == "live").then_some(())
    })
    .await;
    eprintln!(
        "LIVENESS {backend:?} restart->purged_ms={} restart->live_ms={}",
        ms(purged),
        ms(restarted.elapsed())
    );
    // The pick predicts a cold prefill on w2, as the engine's real cache is.
    let sc = score(&s.admin, &body).await;
    assert_eq!(matched(&sc, "w2"), 0, "{sc}");
    assert_eq!(new.cached_tokens(&s.admin, &body).await, 0);

    s.running.shutdown().await;
    new.shutdown().await;
    for sim in s.sims {
        sim.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_goes_down_and_is_purged_memory() {
    killed_worker_goes_down_and_is_purged(Backend::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_is_found_at_reconnect_memory() {
    restart_is_found_at_reconnect(Backend::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_goes_down_and_is_purged_redis() {
    killed_worker_goes_down_and_is_purged(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_is_found_at_reconnect_redis() {
    restart_is_found_at_reconnect(Backend::Redis).await;
}
