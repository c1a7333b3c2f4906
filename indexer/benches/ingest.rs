//! Prefix index benchmark: event ingestion (blocks/s), lookup latency for
//! 1k/8k/32k-token prompts, and bytes per (block, worker) entry.
//!
//! `cargo bench -p kvsteer-indexer --bench ingest` (release; well under a minute).
//! Workload: 6 workers (block size 16) each holding 8 shared 32k-token
//! documents, 32 shared system prompts, and a FIFO of request chains
//! (8-64 blocks on a system prompt) kept at ~50k blocks by BlockRemoved.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvsteer_indexer::index::memory::MemoryBackend;
use kvsteer_indexer::index::{Index, WorkerId};
use kvsteer_indexer::keys::{BlockKey, KeyContext, prompt_keys};
use kvsteer_kv_events::{BlockHash, BlockRemoved, BlockStored, EventBatch, KvEvent};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const WORKERS: u32 = 6;
const BS: u32 = 16;
const MODEL: &str = "Qwen/Qwen3-8B";
const OCCUPANCY: usize = 50_000;
const DOCS: usize = 8;
const DOC_BLOCKS: usize = 2048;
const SYSTEM_PROMPTS: usize = 32;

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    // Memory first, while the allocator has no freed memory to reuse.
    rt.block_on(memory());
    rt.block_on(throughput_and_latency());
}

/// One worker's engine: the blocks it holds, as a FIFO of request chains.
struct Engine {
    worker: WorkerId,
    rng: SmallRng,
    system: Vec<(u64, usize)>, // (last hash, blocks) of each system prompt
    chains: std::collections::VecDeque<(u64, u64)>, // (first hash, blocks)
    held: usize,
    next_hash: u64,
}

impl Engine {
    fn new(worker: WorkerId) -> Self {
        Self {
            worker,
            rng: SmallRng::seed_from_u64(u64::from(worker)),
            system: Vec::new(),
            chains: Default::default(),
            held: 0,
            next_hash: (u64::from(worker) + 1) << 48,
        }
    }

    fn stored(&mut self, parent: Option<u64>, tokens: &[u32]) -> (KvEvent, Vec<u64>) {
        let n = tokens.len() / BS as usize;
        let hashes: Vec<u64> = (0..n as u64).map(|i| self.next_hash + i).collect();
        self.next_hash += n as u64;
        let ev = KvEvent::BlockStored(BlockStored {
            block_hashes: hashes.iter().map(|h| BlockHash::U64(*h)).collect(),
            parent_block_hash: parent.map(BlockHash::U64),
            token_ids: tokens.to_vec(),
            block_size: BS,
            medium: Some("GPU".into()),
            group_idx: Some(0),
            kv_cache_spec_kind: Some("full_attention".into()),
            ..BlockStored::default()
        });
        (ev, hashes)
    }

    /// Documents and system prompts: the same tokens on every worker.
    fn warmup(&mut self, docs: &[Vec<u32>], system: &[Vec<u32>]) -> Vec<EventBatch> {
        let mut batches = Vec::new();
        for doc in docs {
            batches.push(batch(vec![self.stored(None, doc).0]));
        }
        for prompt in system {
            let (ev, hashes) = self.stored(None, prompt);
            self.system
                .push((*hashes.last().expect("non-empty"), hashes.len()));
            batches.push(batch(vec![ev]));
        }
        batches
    }

    /// One engine step: a new request chain, and removals to stay at occupancy.
    fn step(&mut self) -> EventBatch {
        let (parent, _) = self.system[self.rng.random_range(0..self.system.len())];
        let blocks = self.rng.random_range(8..=64);
        let tokens: Vec<u32> = (0..blocks * BS)
            .map(|_| self.rng.random_range(0..151_000))
            .collect();
        let (ev, hashes) = self.stored(Some(parent), &tokens);
        self.held += hashes.len();
        self.chains.push_back((hashes[0], hashes.len() as u64));
        let mut events = vec![ev];
        while self.held > OCCUPANCY {
            let Some((first, len)) = self.chains.pop_front() else {
                break;
            };
            self.held -= len as usize;
            events.push(KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: (first..first + len).rev().map(BlockHash::U64).collect(),
                medium: Some("GPU".into()),
                group_idx: Some(0),
                ..BlockRemoved::default()
            }));
        }
        batch(events)
    }
}

fn batch(events: Vec<KvEvent>) -> EventBatch {
    EventBatch {
        ts: 0.0,
        events,
        data_parallel_rank: None,
    }
}

fn corpus() -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let mut rng = SmallRng::seed_from_u64(7);
    let mut tokens = |blocks: usize| -> Vec<u32> {
        (0..blocks * BS as usize)
            .map(|_| rng.random_range(0..151_000))
            .collect()
    };
    let docs = (0..DOCS).map(|_| tokens(DOC_BLOCKS)).collect();
    let system = (0..SYSTEM_PROMPTS).map(|i| tokens(4 + i % 29)).collect();
    (docs, system)
}

fn new_index(capacity: usize) -> (Index, Arc<MemoryBackend>) {
    let backend = Arc::new(MemoryBackend::new(capacity));
    let index = Index::with_backend(backend.clone());
    for w in 0..WORKERS {
        index.register_worker(w, MODEL, BS);
    }
    (index, backend)
}

/// Fill an index to the steady state, generating and dropping batches as
/// we go; report RSS growth and the structural estimate per entry.
async fn memory() {
    let rss_before = rss_bytes();
    let (docs, system) = corpus();
    let (index, backend) = new_index(8 << 20);
    for w in 0..WORKERS {
        let mut engine = Engine::new(w);
        for b in engine.warmup(&docs, &system) {
            index.apply_batch(w, &b).await;
        }
        while engine.held < OCCUPANCY {
            let b = engine.step();
            index.apply_batch(w, &b).await;
        }
    }
    drop((docs, system));
    let entries = index.entries() as f64;
    let rss = rss_bytes().saturating_sub(rss_before) as f64;
    let backend_bytes = backend.heap_bytes() as f64;
    let ingest_bytes = index.ingest_bytes().await as f64;
    println!(
        "memory: {} (block, worker) entries, {} keys tracked by ingest maps",
        entries,
        {
            let mut t = 0;
            for w in 0..WORKERS {
                t += index.tracked_hashes(w).await;
            }
            t
        }
    );
    println!(
        "  structural estimate: {:.1} B/entry (backend {:.1} + ingest maps {:.1})",
        (backend_bytes + ingest_bytes) / entries,
        backend_bytes / entries,
        ingest_bytes / entries
    );
    println!(
        "  RSS delta:           {:.1} B/entry (includes the corpus and allocator slack)",
        rss / entries
    );
}

async fn throughput_and_latency() {
    let (docs, system) = corpus();
    let (index, _backend) = new_index(8 << 20);
    let mut engines: Vec<Engine> = (0..WORKERS).map(Engine::new).collect();
    for e in &mut engines {
        for b in e.warmup(&docs, &system) {
            index.apply_batch(e.worker, &b).await;
        }
        while e.held < OCCUPANCY {
            let b = e.step();
            index.apply_batch(e.worker, &b).await;
        }
    }

    // Ingestion: pre-generated steady-state batches, round-robin over workers.
    let mut batches = Vec::new();
    let mut blocks_named = 0u64;
    while blocks_named < 1_500_000 {
        for e in &mut engines {
            let b = e.step();
            blocks_named += kvsteer_indexer::index::ingest::batch_blocks(&b);
            batches.push((e.worker, b));
        }
    }
    let start = Instant::now();
    let (mut stored, mut removed, mut skipped) = (0u64, 0u64, 0u64);
    for (w, b) in &batches {
        let s = index.apply_batch(*w, b).await;
        stored += s.stored;
        removed += s.removed;
        skipped += s.skipped;
    }
    let secs = start.elapsed().as_secs_f64();
    drop(batches);
    println!(
        "ingest: {} blocks named by events, {stored} stored + {removed} removed blocks ({skipped} skipped) in {secs:.3}s",
        blocks_named
    );
    println!(
        "  {:.2} M blocks/s (stored+removed), {:.2} M stored blocks/s; index now {} entries",
        (stored + removed) as f64 / secs / 1e6,
        stored as f64 / secs / 1e6,
        index.entries()
    );

    concurrent(&index, &mut engines, &docs).await;

    // Lookups: full hits on all 6 workers (documents), and partial hits.
    let ctx = KeyContext::new(MODEL, None, BS);
    let mut rng = SmallRng::seed_from_u64(99);
    for blocks in [64usize, 512, 2048] {
        let tokens = blocks * BS as usize;
        let mut key_times = Vec::new();
        let mut full = Vec::new();
        let mut partial = Vec::new();
        for i in 0..600 {
            let doc = &docs[i % DOCS];
            let t0 = Instant::now();
            let keys = prompt_keys(&ctx, None, &doc[..tokens]);
            key_times.push(t0.elapsed());
            full.push(time_lookup(&index, &keys, WORKERS as usize).await);
            // A system prompt followed by unseen tokens.
            let mut prompt = system[rng.random_range(0..SYSTEM_PROMPTS)].clone();
            prompt.extend((prompt.len()..tokens).map(|_| rng.random_range(0..151_000u32)));
            let keys = prompt_keys(&ctx, None, &prompt);
            partial.push(time_lookup(&index, &keys, WORKERS as usize).await);
        }
        println!(
            "lookup {tokens:>5} tokens ({blocks:>4} keys): full hit x6 workers p50 {:>8.1?} p99 {:>8.1?} | partial p50 {:>7.1?} p99 {:>7.1?} | prompt_keys p50 {:>8.1?}",
            pct(&mut full, 0.50),
            pct(&mut full, 0.99),
            pct(&mut partial, 0.50),
            pct(&mut partial, 0.99),
            pct(&mut key_times, 0.50),
        );
    }
}

/// Ingest on this thread while another thread looks up 8k-token prompts
/// without pause: the pick path and the event path sharing the shards.
async fn concurrent(index: &Index, engines: &mut [Engine], docs: &[Vec<u32>]) {
    let mut batches = Vec::new();
    let mut named = 0u64;
    while named < 600_000 {
        for e in engines.iter_mut() {
            let b = e.step();
            named += kvsteer_indexer::index::ingest::batch_blocks(&b);
            batches.push((e.worker, b));
        }
    }
    let ctx = KeyContext::new(MODEL, None, BS);
    let keys: Vec<Vec<BlockKey>> = docs
        .iter()
        .map(|d| prompt_keys(&ctx, None, &d[..512 * BS as usize]))
        .collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (index, stop) = (index.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut times = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let k = &keys[times.len() % keys.len()];
                let t0 = Instant::now();
                let m = futures::executor::block_on(index.lookup(k)).expect("lookup");
                times.push(t0.elapsed());
                assert_eq!(m.len(), WORKERS as usize);
            }
            times
        })
    };
    let start = Instant::now();
    let mut blocks = 0;
    for (w, b) in &batches {
        let s = index.apply_batch(*w, b).await;
        blocks += s.stored + s.removed;
    }
    let secs = start.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut times = reader.join().expect("reader thread");
    println!(
        "concurrent: ingest {:.2} M blocks/s while {} lookups (512 keys, full hit x6) ran: p50 {:.1?} p99 {:.1?}",
        blocks as f64 / secs / 1e6,
        times.len(),
        pct(&mut times, 0.50),
        pct(&mut times, 0.99),
    );
}

async fn time_lookup(index: &Index, keys: &[BlockKey], expect_workers: usize) -> Duration {
    let t0 = Instant::now();
    let matches = index.lookup(keys).await.expect("memory lookup");
    let elapsed = t0.elapsed();
    assert_eq!(
        matches.len(),
        expect_workers,
        "every worker holds the prefix"
    );
    elapsed
}

fn pct(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

/// Resident set size from /proc (Linux); 0 elsewhere.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}
