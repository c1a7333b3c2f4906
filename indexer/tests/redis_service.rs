//! The service on the Redis index backend, end to end over loopback: a real
//! `redis-server` (free port, killed on drop), `kvsteer-sim` engines
//! in-process (real prefix caches publishing real KV events, driven by chat
//! requests), in-process indexers (`app::start`, port 0).
//!
//! - Replicas (`writer: auto`): one lease holder per worker, every replica
//!   answers alike, a late one is warm on its first pick; the holder
//!   crashes, another takes the leases over within the TTL and keeps the
//!   index fed.
//! - Outage: with Redis down picks answer on load only within a bound and
//!   the lease lapses; after Redis restarts empty, the lease is taken again,
//!   the worker purged and replayed, and the index agrees with the engines'
//!   real caches.
//! - `writer: always` (no lease) started with Redis down catches up.

mod common;

use common::{Admin, BLOCK, MODEL, Sim, eventually, pick_request, shared};
use kvsteer_indexer::{
    app::{self, Running},
    config::Config,
    index::redis::testing::RedisServer,
};
use kvsteer_proto::v1 as pb;
use serde_json::{Value, json};
use std::time::Duration;

/// A pick must answer within this even with Redis gone (its lookup budget
/// in these tests is 1 s; a hang would blow it).
const PICK_BOUND: Duration = Duration::from_secs(5);
const LEASE_TTL_MS: u64 = 2_000;
const CACHE_TTL_MS: u64 = 100;

async fn redis() -> RedisServer {
    RedisServer::start()
        .await
        .unwrap_or_else(|e| panic!("these tests need a local redis-server: {e}"))
}

async fn sims(n: usize) -> Vec<Sim> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(Sim::start().await);
    }
    v
}

impl Admin {
    fn of(running: &Running) -> Self {
        Self::new(format!("http://{}", running.admin_addr))
    }

    async fn json(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (status, text) = self.call(method, path, body).await;
        assert_eq!(status, 200, "{path}: {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    async fn score(&self, body: &Value) -> Value {
        self.json("POST", "/debug/score", Some(body)).await
    }

    async fn metrics(&self) -> String {
        self.call("GET", "/metrics", None).await.1
    }

    async fn ready(&self) {
        eventually("readyz", || async {
            (self.call("GET", "/readyz", None).await.0 == 200).then_some(())
        })
        .await;
    }

    /// `(held, holder)` of `worker`'s write lease as this replica sees it.
    async fn lease(&self, worker: &str) -> (bool, Option<String>) {
        let l = self.worker(worker).await["stream"]["lease"].clone();
        (
            l["held"].as_bool().unwrap_or(false),
            l["holder"].as_str().map(str::to_owned),
        )
    }
}

fn matched(score: &Value, worker: &str) -> u64 {
    score["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == worker)
        .and_then(|w| w["matched_tokens"].as_u64())
        .unwrap()
}

/// The value of the first sample line starting with `prefix`.
fn sample(metrics: &str, prefix: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A service with one worker per engine (`w1`, `w2`, …) on `redis`.
fn config(redis: &RedisServer, sims: &[Sim], writer: &str) -> Config {
    let workers: String = sims
        .iter()
        .enumerate()
        .map(|(i, s)| s.worker_yaml(&format!("w{}", i + 1)))
        .collect();
    Config::from_yaml(&format!(
        "grpc_listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
models:
  - name: {MODEL}
    tokenizer: '{tok}'
workers:
{workers}index:
  backend: redis
  redis:
    url: {url}
    key_prefix: kvsvc
    writer: {writer}
    lease_ttl_ms: {LEASE_TTL_MS}
    cache_ttl_ms: {CACHE_TTL_MS}
    lookup_timeout_ms: 1000
    write_timeout_ms: 1000
    backoff_max_ms: 100
streams:
  backoff_initial_ms: 20
  backoff_max_ms: 200
",
        tok = shared().join("tokenizers/qwen3").display(),
        url = redis.url(),
    ))
    .expect("config")
}

/// A one-turn conversation whose first block is its own (`tag` comes
/// first), long enough for several blocks.
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

/// Turn 2 of `turn1`, after the engine's `reply` to it.
fn next_turn(turn1: &Value, reply: &Value) -> Value {
    let mut turn2 = turn1.clone();
    let answer = reply["choices"][0]["message"]["content"].as_str().unwrap();
    let msgs = turn2["messages"].as_array_mut().unwrap();
    msgs.push(json!({"role": "assistant", "content": answer}));
    msgs.push(json!({"role": "user", "content": "Thanks. Now add unit tests."}));
    turn2
}

/// Full-block tokens of `body`'s prompt, as `/debug/score` counts them.
async fn full_blocks(admin: &Admin, body: &Value) -> u64 {
    let n = admin.score(body).await["prompt_tokens"].as_u64().unwrap();
    n / BLOCK as u64 * BLOCK as u64
}

/// The index (through `admin`) against the engines' real caches: for every
/// prompt and every engine, the tokens the index says are cached there
/// equal what the engine reports when it runs the prompt. Each
/// `(prompt, engine)` pair is probed once, all index answers first (prompts
/// share no block, so one probe does not change another pair). Call it
/// once the index has converged: it asserts, it does not wait.
async fn assert_index_matches_engines(admin: &Admin, sims: &[Sim], prompts: &[Value]) {
    // Cached answers expire within the documented staleness bound.
    tokio::time::sleep(Duration::from_millis(2 * CACHE_TTL_MS)).await;
    let mut expected = Vec::new();
    for p in prompts {
        let score = admin.score(p).await;
        assert_eq!(score["degraded"], false, "{score}");
        let n = score["prompt_tokens"].as_u64().unwrap();
        for i in 0..sims.len() {
            // The engine recomputes at least the last token: a full hit
            // reports one block less.
            let cap = (n - 1) / BLOCK as u64 * BLOCK as u64;
            expected.push(matched(&score, &format!("w{}", i + 1)).min(cap));
        }
    }
    let mut real = Vec::new();
    for p in prompts {
        for s in sims {
            real.push(s.cached_tokens(admin, p).await);
        }
    }
    assert_eq!(expected, real, "index vs engines, per (prompt, worker)");
    assert!(real.iter().any(|&t| t > 0), "nothing cached: {real:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_leases_fail_over_and_start_warm() {
    let server = redis().await;
    let sims = sims(2).await;
    let a = app::start(config(&server, &sims, "auto"))
        .await
        .expect("start a");
    let b = app::start(config(&server, &sims, "auto"))
        .await
        .expect("start b");
    let (aa, ba) = (Admin::of(&a), Admin::of(&b));
    aa.ready().await;
    ba.ready().await;

    // One holder per worker, and both replicas agree who it is.
    let holders = eventually("leases settled", || async {
        let mut ids = Vec::new();
        for w in ["w1", "w2"] {
            let ((ah, a_id), (bh, b_id)) = (aa.lease(w).await, ba.lease(w).await);
            if a_id.is_none() || a_id != b_id || ah == bh {
                return None;
            }
            ids.push(a_id.unwrap());
        }
        Some(ids)
    })
    .await;
    let a_id = a.leases.as_ref().unwrap().id().to_owned();
    let b_id = b.leases.as_ref().unwrap().id().to_owned();
    assert_ne!(a_id, b_id);
    // The holder's streams are live, the other's on standby.
    for (i, w) in ["w1", "w2"].into_iter().enumerate() {
        let (mine, other) = if holders[i] == a_id {
            (&aa, &ba)
        } else {
            (&ba, &aa)
        };
        eventually("holder stream live", || async {
            (mine.worker(w).await["stream"]["state"] == "live").then_some(())
        })
        .await;
        assert_eq!(other.worker(w).await["stream"]["state"], "standby");
    }

    // Turn 1 runs on w2's engine, which announces the blocks it cached.
    let client = Admin::new(String::new());
    let turn1 = prompt("Replica test conversation");
    let reply = sims[1].chat(&client, &turn1).await;
    let turn2 = next_turn(&turn1, &reply);
    let cached = full_blocks(&aa, &turn1).await;
    assert!(cached >= 4 * BLOCK as u64, "{cached}");
    let from_a = eventually("both replicas see turn 1 on w2, alike", || async {
        let (sa, sb) = (aa.score(&turn2).await, ba.score(&turn2).await);
        (matched(&sa, "w2") >= cached && sa == sb).then_some(sa)
    })
    .await;
    assert_eq!(from_a["chosen"], "w2", "{from_a}");
    assert_eq!(from_a["degraded"], false, "{from_a}");
    assert_eq!(matched(&from_a, "w1"), 0, "{from_a}");

    // A replica started later is warm on its first pick, and holds nothing.
    let c = app::start(config(&server, &sims, "auto"))
        .await
        .expect("start c");
    let ca = Admin::of(&c);
    assert_eq!(ca.score(&turn2).await, from_a);
    ca.ready().await;

    // The holder of w1's lease crashes (nothing released): another replica
    // takes its leases once they lapse in Redis, and keeps the index fed.
    let crashed = holders[0].clone();
    let (survivor, survivor_admin, dead) = if crashed == a_id {
        (b, ba, a)
    } else {
        (a, aa, b)
    };
    let crashed_leases: Vec<&str> = ["w1", "w2"]
        .into_iter()
        .zip(&holders)
        .filter(|(_, h)| **h == crashed)
        .map(|(w, _)| w)
        .collect();
    dead.abort().await;
    let survivors = [&survivor_admin, &ca];
    for w in &crashed_leases {
        eventually("lease taken over", || async {
            let mut held = 0;
            for r in survivors {
                let (h, holder) = r.lease(w).await;
                if holder.as_deref() == Some(crashed.as_str()) {
                    return None;
                }
                held += usize::from(h);
            }
            (held == 1).then_some(())
        })
        .await;
    }
    // What the crashed holder wrote is back (purged and replayed by the
    // new holder) and new events show up.
    let fresh = prompt("After failover");
    let reply = sims[0].chat(&client, &fresh).await;
    let fresh2 = next_turn(&fresh, &reply);
    let fresh_cached = full_blocks(&ca, &fresh).await;
    eventually("both survivors see the new events and turn 1", || async {
        for r in survivors {
            let s = r.score(&fresh2).await;
            let t = r.score(&turn2).await;
            if matched(&s, "w1") < fresh_cached || matched(&t, "w2") < cached {
                return None;
            }
        }
        Some(())
    })
    .await;
    let m = survivor_admin.metrics().await + &ca.metrics().await;
    let acquired: f64 = m
        .lines()
        .filter(|l| l.starts_with("kvsteer_index_redis_lease_acquired_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(acquired >= crashed_leases.len() as f64, "{m}");

    // The survivors' index against the engines' real caches.
    assert_index_matches_engines(&ca, &sims, &[turn2.clone(), fresh2.clone()]).await;

    // A pick over gRPC on the late replica.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", c.grpc_addr))
        .unwrap()
        .connect()
        .await
        .expect("grpc connect");
    let mut grpc = pb::router_client::RouterClient::new(channel);
    let picked = grpc
        .pick(pick_request("r-1", &fresh2))
        .await
        .expect("pick")
        .into_inner();
    assert_eq!(picked.endpoints[0], sims[0].addr.to_string());
    assert!(!picked.decision.unwrap().degraded);

    c.shutdown().await;
    survivor.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_degrades_picks_then_converges_to_the_engines() {
    let mut server = redis().await;
    let sims = sims(2).await;
    let running = app::start(config(&server, &sims, "auto"))
        .await
        .expect("start");
    let admin = Admin::of(&running);
    admin.ready().await;
    let client = Admin::new(String::new());

    // Steady state: a conversation on each engine, indexed.
    let mut sent: Vec<(Value, usize)> = Vec::new();
    for (i, s) in sims.iter().enumerate() {
        let p = prompt(&format!("Before the outage, engine {i}"));
        s.chat(&client, &p).await;
        sent.push((p, i));
    }
    for (p, i) in &sent {
        let full = full_blocks(&admin, p).await;
        let w = format!("w{}", i + 1);
        eventually("indexed before the outage", || async {
            (matched(&admin.score(p).await, &w) == full).then_some(())
        })
        .await;
    }

    // Redis goes away. Load continues: engines keep serving (their events
    // cannot be applied) and picks answer on load only, within a bound.
    server.stop();
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", running.grpc_addr))
        .unwrap()
        .connect()
        .await
        .expect("grpc connect");
    let mut grpc = pb::router_client::RouterClient::new(channel);
    for n in 0..6 {
        let i = n % 2;
        let p = prompt(&format!("During the outage, request {n}"));
        sims[i].chat(&client, &p).await;
        // Never looked up before: no cached answer to fall back on.
        let other = prompt(&format!("Pick while Redis is down {n}"));
        let picked = tokio::time::timeout(PICK_BOUND, grpc.pick(pick_request("down", &other)))
            .await
            .expect("a pick answers while Redis is down")
            .expect("pick")
            .into_inner();
        assert_eq!(picked.endpoints.len(), 2, "{picked:?}");
        let d = picked.decision.unwrap();
        assert!(d.degraded, "{d:?}");
        assert!(d.reason.starts_with("index_unavailable"), "{d:?}");
        sent.push((p, i));
    }
    let metrics = admin.metrics().await;
    let degraded = sample(
        &metrics,
        "kvsteer_degraded_picks_total{reason=\"index_unavailable\"",
    );
    assert!(degraded >= Some(6.0), "{metrics}");
    // Unrenewed for two thirds of the TTL: the lease is dropped, the
    // streams stand by (nobody can hold a lease while Redis is down).
    for w in ["w1", "w2"] {
        eventually("lease dropped while Redis is down", || async {
            let v = admin.worker(w).await;
            (v["stream"]["lease"]["held"] == false && v["stream"]["state"] == "standby")
                .then_some(())
        })
        .await;
    }

    // Redis is back, empty: the lease is taken again, each worker purged
    // and replayed; the index converges to what the engines hold.
    server.restart().await.expect("restart redis");
    for (p, i) in &sent {
        let full = full_blocks(&admin, p).await;
        let w = format!("w{}", i + 1);
        eventually("converged after the outage", || async {
            let s = admin.score(p).await;
            (s["degraded"] == false && matched(&s, &w) == full).then_some(())
        })
        .await;
    }
    let prompts: Vec<Value> = sent.iter().map(|(p, _)| p.clone()).collect();
    assert_index_matches_engines(&admin, &sims, &prompts).await;
    let metrics = admin.metrics().await;
    for w in ["w1", "w2"] {
        let acquired = sample(
            &metrics,
            &format!("kvsteer_index_redis_lease_acquired_total{{worker=\"{w}\"}}"),
        );
        assert!(acquired >= Some(2.0), "{w}: {metrics}");
        let lost = sample(
            &metrics,
            &format!("kvsteer_index_redis_lease_lost_total{{worker=\"{w}\",reason=\"unrenewed\"}}"),
        );
        assert!(lost >= Some(1.0), "{w}: {metrics}");
    }
    running.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_writer_starts_with_redis_down_and_catches_up() {
    let mut server = redis().await;
    server.stop();
    let sims = sims(2).await;
    let running = app::start(config(&server, &sims, "always"))
        .await
        .expect("starts while Redis is down");
    let admin = Admin::of(&running);
    admin.ready().await;
    let client = Admin::new(String::new());
    let turn1 = prompt("Started with Redis down");
    let reply = sims[1].chat(&client, &turn1).await;
    let turn2 = next_turn(&turn1, &reply);
    let score = tokio::time::timeout(PICK_BOUND, admin.score(&turn2))
        .await
        .expect("a dry run answers while Redis is down");
    assert_eq!(score["degraded"], true, "{score}");
    assert_eq!(matched(&score, "w2"), 0, "{score}");
    assert!(admin.worker("w2").await["stream"]["lease"].is_null());

    // The startup purge and the batch failed: both are made good (purge,
    // replay) once Redis answers.
    // The batch may also be applied late, by a write that waited for Redis
    // to come back; the startup purge failed either way, so the resync
    // follows (awaited: it drains the worker's queued batches first).
    server.restart().await.expect("start redis");
    eventually("w2 resynced", || async {
        let metrics = admin.metrics().await;
        (sample(&metrics, "kvsteer_index_resyncs_total{worker=\"w2\"}") >= Some(1.0)).then_some(())
    })
    .await;
    let cached = full_blocks(&admin, &turn1).await;
    eventually("w2 warm after resync", || async {
        let s = admin.score(&turn2).await;
        (s["degraded"] == false && matched(&s, "w2") >= cached).then_some(())
    })
    .await;
    running.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}
