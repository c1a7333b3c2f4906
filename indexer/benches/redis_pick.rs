//! The Redis backend next to the memory backend, over loopback to a
//! `redis-server` this benchmark starts: lookup latency of an 8k-token warm
//! prompt (512 keys of 16 tokens) and ingestion throughput.
//!
//! Rows: `memory` (in-process index), `redis-pipeline` / `redis-script`
//! (the raw Redis lookup, every call a round trip), `redis-cached` (the
//! service's path: the hot cache in front of the pipeline lookup, default
//! 250 ms TTL; the same prompt repeated, so nearly every call is a hit; its
//! hit rate is printed). Then whole picks (tokenize → keys → lookup →
//! score) of the next turn of an 8k-token conversation on a memory index
//! and on the service's Redis index, where the new turn misses the hot cache.
//!
//! `cargo bench -p kvsteer-indexer --bench redis_pick` (needs `redis-server`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsteer_indexer::app::{build_index, build_picker_on};
use kvsteer_indexer::index::memory::MemoryBackend;
use kvsteer_indexer::index::redis::cache::{CachedLookups, HotCache};
use kvsteer_indexer::index::redis::metrics::CacheResult;
use kvsteer_indexer::index::redis::testing::RedisServer;
use kvsteer_indexer::index::redis::{LookupMode, RedisBackend, RedisConfig, RedisMetrics};
use kvsteer_indexer::index::{IndexBackend, KeyOp, Tier, WorkerId};
use kvsteer_indexer::keys::{BlockKey, KeyContext, prompt_keys};
use kvsteer_indexer::picker::Mode;
use kvsteer_indexer::picker::report::Report;
use kvsteer_tokenize::PromptTokenizer;
use prometheus_client::registry::Registry;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

mod common;
use common::{MODEL, chat_input, config, conversation, next_turn, percentiles, shared, stored};

const WORKERS: u32 = 8;
const BLOCK: u32 = 16;
const PROMPT_TOKENS: usize = 8_192;
/// Background blocks per worker (a realistic keyspace, not an empty one).
const NOISE_BLOCKS: usize = 20_000;
/// Blocks per apply call (one `BlockStored` of a 1k-token prefill).
const BATCH: usize = 64;
const LOOKUPS: usize = 2_000;
const PICKS: usize = 500;

fn tokens(rng: &mut SmallRng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..150_000)).collect()
}

fn adds(keys: &[BlockKey]) -> Vec<KeyOp> {
    keys.iter().map(|k| KeyOp::Add(*k, Tier::Gpu)).collect()
}

/// Ingest `NOISE_BLOCKS` per worker in `BATCH`-block applies, workers in
/// parallel (each worker's applies in order, as the service does).
async fn ingest(backend: Arc<dyn IndexBackend>, seed: u64) -> (f64, u64) {
    let ctx = KeyContext::new("bench", None, BLOCK);
    let mut rng = SmallRng::seed_from_u64(seed);
    let per_worker: Vec<Vec<Vec<KeyOp>>> = (0..WORKERS)
        .map(|_| {
            let keys = prompt_keys(&ctx, None, &tokens(&mut rng, NOISE_BLOCKS * BLOCK as usize));
            adds(&keys).chunks(BATCH).map(<[KeyOp]>::to_vec).collect()
        })
        .collect();
    let start = Instant::now();
    let tasks: Vec<_> = per_worker
        .into_iter()
        .enumerate()
        .map(|(w, batches)| {
            let backend = backend.clone();
            tokio::spawn(async move {
                let mut errors = 0;
                for ops in batches {
                    if backend.apply(w as WorkerId, &ops).await.is_err() {
                        errors += 1;
                    }
                }
                errors
            })
        })
        .collect();
    let mut errors = 0;
    for t in tasks {
        errors += t.await.expect("ingest task");
    }
    let blocks = (WORKERS as usize * NOISE_BLOCKS) as f64;
    (blocks / start.elapsed().as_secs_f64(), errors)
}

async fn lookups(backend: &dyn IndexBackend, keys: &[BlockKey]) -> ([Duration; 3], u64, u32) {
    let mut took = Vec::with_capacity(LOOKUPS);
    let mut errors = 0;
    let mut best = 0;
    for _ in 0..LOOKUPS {
        let start = Instant::now();
        match backend.lookup(keys).await {
            Ok(m) => best = m.iter().map(|m| m.gpu_blocks).max().unwrap_or(0),
            Err(_) => errors += 1,
        }
        took.push(start.elapsed());
    }
    (percentiles(took), errors, best)
}

/// Redis-side microseconds spent in commands since the last reset.
async fn server_usec(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .unwrap_or_default();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_hgetall:") || l.starts_with("cmdstat_evalsha:"))
        .filter_map(|l| {
            l.split(",usec=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Redis process CPU seconds (user + sys), command execution and I/O.
async fn server_cpu(con: &mut redis::aio::MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(con)
        .await
        .unwrap_or_default();
    info.lines()
        .filter(|l| l.starts_with("used_cpu_user:") || l.starts_with("used_cpu_sys:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum()
}

async fn reset_stats(con: &mut redis::aio::MultiplexedConnection) {
    let _ = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(con)
        .await;
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run());
}

async fn run() {
    let server = RedisServer::start()
        .await
        .unwrap_or_else(|e| panic!("the benchmark needs a local redis-server: {e}"));
    let cfg = |lookup| RedisConfig {
        url: server.url(),
        lookup,
        // Measure the whole distribution instead of cutting it at 5 ms.
        lookup_timeout_ms: 1_000,
        write_timeout_ms: 1_000,
        ..RedisConfig::default()
    };
    let new = |lookup| {
        let cfg = cfg(lookup);
        async move {
            Arc::new(
                RedisBackend::new(cfg, RedisMetrics::default())
                    .await
                    .expect("redis backend"),
            )
        }
    };
    let redis_pipe = new(LookupMode::Pipeline).await;
    let redis_script = new(LookupMode::Script).await;
    let defaults = RedisConfig::default();
    let cache_metrics = RedisMetrics::default();
    let redis_cached = Arc::new(CachedLookups::new(
        redis_pipe.clone(),
        HotCache::new(defaults.cache_entries, defaults.cache_ttl()),
        cache_metrics.clone(),
    ));
    let memory = Arc::new(MemoryBackend::new(4_000_000));

    println!(
        "ingestion: {WORKERS} workers in parallel, {NOISE_BLOCKS} blocks each, {BATCH}-block applies"
    );
    for (name, backend) in [
        ("memory", memory.clone() as Arc<dyn IndexBackend>),
        ("redis", redis_pipe.clone() as Arc<dyn IndexBackend>),
    ] {
        let (rate, errors) = ingest(backend.clone(), 1).await;
        println!(
            "  {name:<8} {rate:>12.0} blocks/s   ({} entries, {errors} failed applies)",
            backend.entries()
        );
    }

    // The warm prompt: worker 2 holds all of it, every worker its first 1k
    // tokens (a shared system prompt), worker 5 the first half.
    let ctx = KeyContext::new("bench", None, BLOCK);
    let mut rng = SmallRng::seed_from_u64(2);
    let keys = prompt_keys(&ctx, None, &tokens(&mut rng, PROMPT_TOKENS));
    let setup: Vec<(WorkerId, &[BlockKey])> = (0..WORKERS)
        .map(|w| (w, &keys[..64]))
        .chain([(2, &keys[64..]), (5, &keys[64..256])])
        .collect();
    for (w, part) in setup {
        let ops = adds(part);
        memory.apply(w, &ops).await.expect("memory apply");
        redis_pipe.apply(w, &ops).await.expect("redis apply");
    }
    // A prompt that diverges after 64 blocks: the script stops walking there.
    let mut diverging = keys[..64].to_vec();
    diverging.extend(prompt_keys(
        &ctx,
        None,
        &tokens(&mut rng, PROMPT_TOKENS - 1_024),
    ));

    let mut stats = redis::Client::open(server.url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("stats connection");
    println!(
        "lookup of an {PROMPT_TOKENS}-token prompt ({} keys), {WORKERS} workers, {LOOKUPS} lookups: p50 p90 p99",
        keys.len()
    );
    let one = keys[..1].to_vec();
    for (label, chain) in [
        ("warm", &keys),
        ("diverging@64", &diverging),
        ("one key", &one),
    ] {
        for (name, backend) in [
            ("memory", memory.clone() as Arc<dyn IndexBackend>),
            (
                "redis-pipeline",
                redis_pipe.clone() as Arc<dyn IndexBackend>,
            ),
            (
                "redis-script",
                redis_script.clone() as Arc<dyn IndexBackend>,
            ),
            (
                "redis-cached",
                redis_cached.clone() as Arc<dyn IndexBackend>,
            ),
        ] {
            // Warm up connections and the script cache.
            let _ = backend.lookup(chain).await;
            reset_stats(&mut stats).await;
            let cpu_before = server_cpu(&mut stats).await;
            let hits_before = cache_metrics.cache_count(CacheResult::hit);
            let misses_before = cache_metrics.cache_count(CacheResult::miss);
            let ([p50, p90, p99], errors, best) = lookups(backend.as_ref(), chain).await;
            let server = match name {
                "memory" => String::new(),
                "redis-cached" => {
                    let hits = cache_metrics.cache_count(CacheResult::hit) - hits_before;
                    let misses = cache_metrics.cache_count(CacheResult::miss) - misses_before;
                    format!(
                        "hot cache: {:.1}% hits, {misses} lookups went to Redis; ",
                        100.0 * hits as f64 / (hits + misses).max(1) as f64
                    )
                }
                _ => format!(
                    "redis: commands {:.0} µs, process {:.0} µs per lookup; ",
                    server_usec(&mut stats).await as f64 / LOOKUPS as f64,
                    (server_cpu(&mut stats).await - cpu_before) * 1e6 / LOOKUPS as f64
                ),
            };
            println!(
                "  {label:<13} {name:<15} {p50:>10.3?} {p90:>10.3?} {p99:>10.3?}   ({server}best match {best} blocks, {errors} errors)"
            );
        }
    }
    picks(&server).await;
}

/// Whole picks (tokenize → keys → lookup → score) of the next turn of an
/// 8k-token conversation whose previous turn is indexed on one worker: the
/// memory index against the service's Redis index (hot cache in front; each
/// turn is a new prompt, so every lookup goes to Redis).
async fn picks(server: &RedisServer) {
    let redis_index = format!(
        "index:\n  backend: redis\n  redis:\n    url: {}\n    key_prefix: kvpickbench\n    lookup_timeout_ms: 1000\n",
        server.url()
    );
    let tok = Arc::new(
        PromptTokenizer::from_dir(&shared().join("tokenizers/qwen3")).expect("Qwen3 tokenizer"),
    );
    let mut rng = SmallRng::seed_from_u64(9);
    let prev = conversation(&tok, &mut rng, PROMPT_TOKENS);
    let ids = tok.chat_token_ids(&prev).expect("tokenize");
    println!(
        "pick of the next turn of a {}-token conversation (previous turn indexed on w3), {WORKERS} workers, {PICKS} picks: p50 p90 p99",
        ids.len()
    );
    for (name, extra) in [("memory", String::new()), ("redis", redis_index)] {
        let cfg = config(WORKERS as usize, &extra);
        let mut registry = Registry::default();
        let (index, _) = build_index(&cfg, &mut registry).await.expect("index");
        let tokenizers = HashMap::from([(MODEL.to_owned(), tok.clone())]);
        let picker = build_picker_on(&cfg, tokenizers, &mut registry, index);
        let index = picker.index().clone();
        index.apply_batch(2, &stored(&ids, 1)).await;
        let mut took = Vec::with_capacity(PICKS);
        let (mut matched, mut degraded) = (0, 0);
        for i in 0..PICKS {
            let id = format!("{name}-{i}");
            let input = chat_input(id.clone(), next_turn(&prev, &mut rng));
            let start = Instant::now();
            let out = picker.pick(input, Mode::Commit).await;
            took.push(start.elapsed());
            matched = out.decision.matched_tokens;
            degraded += u32::from(out.decision.degraded);
            picker.report(&Report::done(&id, 0.0), Instant::now());
        }
        let [p50, p90, p99] = percentiles(took);
        println!(
            "  {name:<8} {p50:>10.3?} {p90:>10.3?} {p99:>10.3?}   ({matched} tokens matched, {degraded} degraded)"
        );
    }
}
