//! The Redis backend against a real `redis-server` (started per test on a
//! free loopback port, killed on drop): the differential harness, failure
//! and recovery, two backends sharing one Redis, purge and TTLs.

use std::sync::Arc;
use std::time::Duration;

use kvsteer_indexer::index::memory::MemoryBackend;
use kvsteer_indexer::index::redis::metrics::{ErrorKind, Op};
use kvsteer_indexer::index::redis::testing::RedisServer;
use kvsteer_indexer::index::redis::{LookupMode, RedisBackend, RedisConfig, RedisMetrics};
use kvsteer_indexer::index::testing::run_differential;
use kvsteer_indexer::index::{Index, IndexBackend, KeyOp, Tier, WorkerId};
use kvsteer_indexer::keys::BlockKey;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Bound on any single wait, so a broken test fails instead of hanging.
const WAIT: Duration = Duration::from_secs(20);
const PREFIX: &str = "kvt";

async fn server() -> RedisServer {
    RedisServer::start()
        .await
        .unwrap_or_else(|e| panic!("these tests need a local redis-server: {e}"))
}

/// Budgets generous enough for debug builds on a busy machine: these tests
/// check behaviour, not speed (that is `benches/redis_pick.rs`).
fn config(server: &RedisServer, lookup: LookupMode) -> RedisConfig {
    RedisConfig {
        url: server.url(),
        key_prefix: PREFIX.into(),
        lookup,
        lookup_timeout_ms: 2_000,
        write_timeout_ms: 2_000,
        ..RedisConfig::default()
    }
}

async fn backend(cfg: RedisConfig) -> Arc<RedisBackend> {
    Arc::new(
        RedisBackend::new(cfg, RedisMetrics::default())
            .await
            .unwrap(),
    )
}

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    // No response timeout: `DEBUG SLEEP` holds the reply on purpose.
    let cfg = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
        .unwrap()
}

async fn keys(con: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(pattern)
        .query_async(con)
        .await
        .unwrap()
}

/// Random chains over a small key universe (shared prefixes, both tiers,
/// duplicates, removals and purges), one worker per call.
fn random_ops(rng: &mut SmallRng, n: usize) -> Vec<KeyOp> {
    let mut ops = Vec::with_capacity(n);
    while ops.len() < n {
        let start = rng.random_range(0..4u64);
        let len = rng.random_range(1..8u64);
        let tier = if rng.random_bool(0.3) {
            Tier::Cpu
        } else {
            Tier::Gpu
        };
        for d in 0..len {
            let key = chain_key(start, d);
            ops.push(match rng.random_range(0..10) {
                0..7 => KeyOp::Add(key, tier),
                7..9 => KeyOp::Remove(key, tier),
                _ => KeyOp::Purge(key),
            });
        }
    }
    ops
}

fn chain_key(start: u64, depth: u64) -> BlockKey {
    BlockKey((start << 32 | depth).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

fn chain(start: u64, len: u64) -> Vec<BlockKey> {
    (0..len).map(|d| chain_key(start, d)).collect()
}

#[tokio::test]
async fn redis_backend_agrees_with_the_reference() {
    let server = server().await;
    for (seed, lookup) in [
        (1, LookupMode::Pipeline),
        (2, LookupMode::Script),
        (3, LookupMode::Pipeline),
    ] {
        let mut cfg = config(&server, lookup);
        cfg.key_prefix = format!("diff{seed}");
        // Small script chunks so batches span several script calls.
        cfg.ops_per_script = 3;
        let index = Index::with_backend(backend(cfg).await);
        let report = tokio::time::timeout(WAIT * 3, run_differential(&index, seed, 600))
            .await
            .expect("differential run hung")
            .unwrap_or_else(|e| panic!("{lookup:?}: {e}"));
        assert!(report.stored > 200, "seed {seed}: {report:?}");
        assert!(report.removed > 50, "seed {seed}: {report:?}");
        assert!(report.max_matched_blocks >= 5, "seed {seed}: {report:?}");
    }
}

#[tokio::test]
async fn pipeline_and_script_lookups_agree_with_memory() {
    let server = server().await;
    let pipe = backend(config(&server, LookupMode::Pipeline)).await;
    let script = backend(config(&server, LookupMode::Script)).await;
    let memory = MemoryBackend::new(1 << 16);
    let mut rng = SmallRng::seed_from_u64(9);
    for round in 0..40 {
        let worker = rng.random_range(0..5) as WorkerId;
        let ops = random_ops(&mut rng, 30);
        pipe.apply(worker, &ops).await.unwrap();
        memory.apply_sync(worker, &ops);
        for start in 0..4 {
            let keys = chain(start, 8);
            let want = memory.lookup_sync(&keys);
            assert_eq!(pipe.lookup(&keys).await.unwrap(), want, "round {round}");
            assert_eq!(script.lookup(&keys).await.unwrap(), want, "round {round}");
        }
        assert_eq!(pipe.entries(), memory.entries(), "round {round}");
        for w in 0..5 {
            assert_eq!(pipe.worker_blocks(w), memory.worker_blocks(w));
        }
    }
    assert!(memory.entries() > 0);
}

#[tokio::test]
async fn two_backends_on_one_redis_see_the_same_index() {
    let server = server().await;
    let writer = backend(config(&server, LookupMode::Pipeline)).await;
    let reader = backend(config(&server, LookupMode::Script)).await;
    let mut rng = SmallRng::seed_from_u64(3);
    for worker in 0..4 {
        writer
            .apply(worker, &random_ops(&mut rng, 60))
            .await
            .unwrap();
    }
    let mut matched = 0;
    for start in 0..4 {
        let keys = chain(start, 8);
        let a = writer.lookup(&keys).await.unwrap();
        let b = reader.lookup(&keys).await.unwrap();
        assert_eq!(a, b);
        matched += a.len();
    }
    assert!(matched > 0, "the ops must leave something to match");
    // The reader's counters come from Redis on refresh.
    assert_eq!(reader.entries(), 0);
    reader.refresh_stats().await.unwrap();
    assert_eq!(reader.entries(), writer.entries());
    for w in 0..4 {
        assert_eq!(reader.worker_blocks(w), writer.worker_blocks(w));
    }
    // The periodic refresh picks up later writes.
    let refresher = reader.spawn_stats_refresh(Duration::from_millis(20));
    writer.purge_worker(0).await.unwrap();
    let want = writer.entries();
    let converged = tokio::time::timeout(WAIT, async {
        while reader.entries() != want || reader.worker_blocks(0) != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(converged.is_ok(), "reader stuck at {}", reader.entries());
    refresher.abort();
}

#[tokio::test]
async fn purge_leaves_nothing_of_the_worker_and_every_key_has_a_ttl() {
    let server = server().await;
    let b = backend(config(&server, LookupMode::Pipeline)).await;
    let mut con = raw(&server).await;
    let adds = |start: u64| -> Vec<KeyOp> {
        chain(start, 2_500)
            .into_iter()
            .map(|k| KeyOp::Add(k, Tier::Gpu))
            .collect()
    };
    // More than one purge chunk for worker 1; worker 2 shares chain 0.
    b.apply(1, &adds(0)).await.unwrap();
    b.apply(1, &adds(1)).await.unwrap();
    b.apply(2, &adds(0)).await.unwrap();
    assert_eq!((b.worker_blocks(1), b.worker_blocks(2)), (5_000, 2_500));

    let all = keys(&mut con, &format!("{PREFIX}:*")).await;
    assert_eq!(
        all.len(),
        5_000 + 2 + 1,
        "blocks, two worker sets, registry"
    );
    for key in &all {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }

    b.purge_worker(1).await.unwrap();
    assert_eq!(
        (b.worker_blocks(1), b.worker_blocks(2), b.entries()),
        (0, 2_500, 2_500)
    );
    let blocks = keys(&mut con, &format!("{PREFIX}:b:*")).await;
    assert_eq!(blocks.len(), 2_500, "chain 1 was worker 1's alone");
    for key in &blocks {
        let fields: Vec<String> = redis::cmd("HKEYS")
            .arg(key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(fields, vec!["2".to_string()], "{key}");
    }
    assert!(keys(&mut con, &format!("{PREFIX}:w:1")).await.is_empty());
    assert_eq!(b.lookup(&chain(0, 3)).await.unwrap().len(), 1);
    assert!(b.lookup(&chain(1, 3)).await.unwrap().is_empty());
}

#[tokio::test]
async fn index_remove_worker_purges_through_the_backend() {
    let server = server().await;
    let b = backend(config(&server, LookupMode::Pipeline)).await;
    let index = Index::with_backend(b.clone());
    // Fill it through the differential harness, then remove every worker.
    run_differential(&index, 11, 200).await.unwrap();
    for w in 0..4 {
        index.remove_worker(w).await.unwrap();
    }
    assert_eq!(index.entries(), 0);
    let mut con = raw(&server).await;
    let left = keys(&mut con, &format!("{PREFIX}:[bw]:*")).await;
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test]
async fn down_redis_fails_within_the_budget_and_recovers() {
    let mut server = server().await;
    let cfg = RedisConfig {
        lookup_timeout_ms: 100,
        write_timeout_ms: 300,
        backoff_max_ms: 200,
        ..config(&server, LookupMode::Pipeline)
    };
    let b = backend(cfg).await;
    let keys = chain(0, 4);
    let ops: Vec<KeyOp> = keys.iter().map(|k| KeyOp::Add(*k, Tier::Gpu)).collect();
    b.apply(0, &ops).await.unwrap();
    assert_eq!(b.lookup(&keys).await.unwrap().len(), 1);

    server.stop();
    for _ in 0..3 {
        let got = tokio::time::timeout(WAIT, b.lookup(&keys)).await;
        assert!(matches!(got, Ok(Err(_))), "{got:?}");
        let got = tokio::time::timeout(WAIT, b.apply(0, &ops)).await;
        assert!(matches!(got, Ok(Err(_))), "{got:?}");
    }
    let m = b.metrics();
    let failures: u64 = [ErrorKind::io, ErrorKind::timeout]
        .iter()
        .map(|k| m.error_count(Op::lookup, *k))
        .sum();
    assert!(failures >= 3, "lookup failures counted: {failures}");

    server.restart().await.unwrap();
    // The connection manager reconnects in the background; bounded retries.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if b.apply(0, &ops).await.is_ok() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no reconnect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The restarted Redis is empty; the fresh write is visible.
    let got = b.lookup(&keys).await.unwrap();
    assert_eq!((got.len(), got[0].gpu_blocks), (1, 4));
}

#[tokio::test]
async fn slow_redis_times_out_instead_of_hanging() {
    let server = server().await;
    let cfg = RedisConfig {
        lookup_timeout_ms: 50,
        connections: 1,
        ..config(&server, LookupMode::Script)
    };
    let b = backend(cfg).await;
    let keys = chain(0, 4);
    b.lookup(&keys).await.unwrap();
    // Block the server for 2 s from another connection.
    let mut con = raw(&server).await;
    let sleeper = tokio::spawn(async move {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(2)
            .query_async::<()>(&mut con)
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let got = tokio::time::timeout(WAIT, b.lookup(&keys)).await;
    assert!(matches!(got, Ok(Err(_))), "{got:?}");
    assert_eq!(b.metrics().error_count(Op::lookup, ErrorKind::timeout), 1);
    tokio::time::timeout(WAIT, sleeper)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    b.lookup(&keys).await.unwrap();
}

#[tokio::test]
async fn saturation_fails_fast() {
    let server = server().await;
    let cfg = RedisConfig {
        max_in_flight: 1,
        ..config(&server, LookupMode::Pipeline)
    };
    let b = backend(cfg).await;
    let mut con = raw(&server).await;
    let sleeper = tokio::spawn(async move {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(1)
            .query_async::<()>(&mut con)
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let keys = chain(0, 2);
    // The first lookup holds the only permit while Redis sleeps.
    let (first, second) = tokio::join!(b.lookup(&keys), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        b.lookup(&keys).await
    });
    assert!(first.is_ok(), "{first:?}");
    assert!(second.is_err(), "{second:?}");
    assert_eq!(b.metrics().error_count(Op::lookup, ErrorKind::saturated), 1);
    sleeper.await.unwrap().unwrap();
}

#[tokio::test]
async fn leases_are_exclusive_and_fence_writes() {
    let server = server().await;
    let mut cfg = config(&server, LookupMode::Pipeline);
    cfg.lease_ttl_ms = 60_000;
    let (a, b) = (backend(cfg.clone()).await, backend(cfg).await);
    a.enable_fencing("replica-a");
    b.enable_fencing("replica-b");
    let keys = chain(1, 4);
    let adds: Vec<KeyOp> = keys.iter().map(|k| KeyOp::Add(*k, Tier::Gpu)).collect();

    // Without the lease, Redis refuses the write and changes nothing.
    assert!(a.apply(0, &adds).await.is_err());
    assert_eq!(a.metrics().error_count(Op::apply, ErrorKind::fenced), 1);
    assert_eq!(a.lookup(&keys).await.unwrap(), vec![]);

    // One holder per worker: a takes 0 and 1, b gets only what is free.
    let holders = a.lease_round(&[(0, true), (1, true)], "replica-a").await;
    assert_eq!(
        holders.unwrap(),
        vec![Some("replica-a".into()), Some("replica-a".into())]
    );
    let holders = b.lease_round(&[(0, true), (2, true)], "replica-b").await;
    assert_eq!(
        holders.unwrap(),
        vec![Some("replica-a".into()), Some("replica-b".into())]
    );
    a.apply(0, &adds).await.unwrap();
    assert_eq!(a.lookup(&keys).await.unwrap().len(), 1);
    assert!(b.apply(0, &adds).await.is_err(), "b does not hold worker 0");
    assert!(b.purge_worker(0).await.is_err(), "purges are fenced too");
    assert_eq!(b.metrics().error_count(Op::purge, ErrorKind::fenced), 1);
    // Renew-only does not take a free lease; the lease keys expire.
    let holders = b.lease_round(&[(3, false)], "replica-b").await;
    assert_eq!(holders.unwrap(), vec![None]);
    let mut con = raw(&server).await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(format!("{PREFIX}:lease:0"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(pttl > 0 && pttl <= 60_000, "{pttl}");

    // a releases (compare-and-delete: b's lease stays), b takes over.
    assert_eq!(a.release_leases(&[0, 1, 2], "replica-a").await.unwrap(), 2);
    let holders = b.lease_round(&[(0, true), (2, false)], "replica-b").await;
    assert_eq!(
        holders.unwrap(),
        vec![Some("replica-b".into()), Some("replica-b".into())]
    );
    assert!(a.apply(0, &adds).await.is_err(), "a no longer writes 0");
    b.purge_worker(0).await.unwrap();
    assert_eq!(b.lookup(&keys).await.unwrap(), vec![]);
}
