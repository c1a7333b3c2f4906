//! Test support, public so every backend's tests can use it: a differential
//! harness that drives an [`Index`] and a trivial reference model with the
//! same seeded random event streams and checks they agree on every lookup,
//! every [`ApplyStats`] and every entry count, after every operation.
//!
//! The reference model is deliberately naive: per worker a map engine hash →
//! (key, GPU copies, CPU copies), and a linear longest-prefix scan. Its keys
//! come from [`prompt_keys`] over the block's whole token path, so it also
//! checks that event-side chaining equals the prompt side.
//!
//! ```ignore
//! let index = Index::memory(1 << 20); // fresh, large enough that LRU never evicts
//! kvsteer_indexer::index::testing::run_differential(&index, seed, 2_000).await?;
//! ```

use std::collections::HashMap;

use kvsteer_kv_events::{BlockHash, BlockRemoved, BlockStored, EventBatch, ExtraKey, KvEvent};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{ApplyStats, Index, WorkerId, WorkerMatch};
use crate::keys::{BlockKey, KeyContext, prompt_keys};

const BS: u32 = 4;
/// Worker models: worker 3 serves another model, so it never matches.
const MODELS: [&str; 4] = ["m", "m", "m", "m-other"];
/// (LoRA, cache_salt) of a chain root.
const ROOTS: [(Option<&str>, Option<&str>); 5] = [
    (None, None),
    (None, Some("salt-1")),
    (Some("lora-a"), None),
    (Some("lora-a"), Some("salt-1")),
    (None, Some("salt-2")),
];

/// Counts from a successful run, to show the run exercised something.
#[derive(Clone, Debug, Default)]
pub struct DiffReport {
    pub batches: u64,
    pub lookups: u64,
    pub stored: u64,
    pub removed: u64,
    pub skipped: u64,
    pub max_matched_blocks: u32,
}

/// Run `ops` random operations against a FRESH `index` (no worker
/// registered, capacity large enough that nothing is evicted); `Err`
/// describes the first disagreement with the reference model.
pub async fn run_differential(index: &Index, seed: u64, ops: usize) -> Result<DiffReport, String> {
    let mut h = Harness::new(seed);
    for (w, model) in MODELS.iter().enumerate() {
        index.register_worker(w as WorkerId, model, BS);
    }
    for op in 0..ops {
        h.step(index)
            .await
            .map_err(|e| format!("seed {seed}, op {op}: {e}"))?;
    }
    Ok(h.report)
}

/// One block of the engine-side universe (a prefix tree).
struct Node {
    hash: u64,
    root: usize,
    path: Vec<u32>,
    /// Content signature (independent of engine hashes and of our keys).
    sig: u64,
    /// This block carries multimodal extra keys: offset of the "image".
    mm: Option<i64>,
    /// This block or an ancestor carries multimodal keys.
    opaque: bool,
    children: Vec<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum RefKey {
    Known(BlockKey),
    Opaque(u64),
}

#[derive(Default)]
struct RefWorker {
    slots: HashMap<u64, (RefKey, u32, u32)>,
    sliding_seen: bool,
}

struct Harness {
    rng: SmallRng,
    nodes: Vec<Node>,
    by_hash: HashMap<u64, usize>,
    workers: Vec<RefWorker>,
    report: DiffReport,
}

// === impl Harness ===

impl Harness {
    fn new(seed: u64) -> Self {
        Self {
            rng: SmallRng::seed_from_u64(seed),
            nodes: Vec::new(),
            by_hash: HashMap::new(),
            workers: MODELS.iter().map(|_| RefWorker::default()).collect(),
            report: DiffReport::default(),
        }
    }

    async fn step(&mut self, index: &Index) -> Result<(), String> {
        let w = self.rng.random_range(0..MODELS.len()) as WorkerId;
        match self.rng.random_range(0..100) {
            0..2 => {
                index.clear_worker(w).await.map_err(|e| e.to_string())?;
                self.workers[w as usize].slots.clear();
            }
            2..4 => {
                index.remove_worker(w).await.map_err(|e| e.to_string())?;
                if index.worker_blocks(w) != 0 {
                    return Err(format!("worker {w} still has entries after remove_worker"));
                }
                index.register_worker(w, MODELS[w as usize], BS);
                self.workers[w as usize] = RefWorker::default();
            }
            _ => {
                let n = self.rng.random_range(1..=3);
                let mut events = Vec::new();
                let mut want = ApplyStats::default();
                for _ in 0..n {
                    self.event(w, &mut events, &mut want);
                }
                let batch = EventBatch {
                    ts: 0.0,
                    events,
                    data_parallel_rank: None,
                };
                let got = index.apply_batch(w, &batch).await;
                self.report.batches += 1;
                self.report.stored += got.stored;
                self.report.removed += got.removed;
                self.report.skipped += got.skipped;
                let fields =
                    |s: &ApplyStats| (s.stored, s.removed, s.skipped, s.cleared, s.backend_errors);
                if fields(&got) != fields(&want) {
                    return Err(format!(
                        "worker {w}: stats {got:?}, reference {want:?}, batch {batch:?}"
                    ));
                }
            }
        }
        self.check(index).await
    }

    /// Append one random event for worker `w`, applying it to the reference.
    fn event(&mut self, w: WorkerId, events: &mut Vec<KvEvent>, want: &mut ApplyStats) {
        match self.rng.random_range(0..100) {
            0..55 => self.store(w, events, want),
            55..62 => self.placeholder(w, events, want),
            62..97 => self.remove(w, events, want),
            _ => {
                events.push(KvEvent::AllBlocksCleared);
                self.workers[w as usize].slots.clear();
                want.cleared = true;
            }
        }
    }

    fn store(&mut self, w: WorkerId, events: &mut Vec<KvEvent>, want: &mut ApplyStats) {
        // Start at a chain root or below any known node (held by `w` or not:
        // the latter exercises unknown parents).
        let base = if self.nodes.is_empty() || self.rng.random_bool(0.25) {
            None
        } else {
            Some(self.rng.random_range(0..self.nodes.len()))
        };
        let root = match base {
            Some(b) => self.nodes[b].root,
            None => self.rng.random_range(0..ROOTS.len()),
        };
        let len = self.rng.random_range(1..=5);
        let mut chain = Vec::with_capacity(len);
        let mut parent = base;
        for _ in 0..len {
            let node = self.next_node(parent, root);
            chain.push(node);
            parent = Some(node);
        }
        let tier_cpu = self.rng.random_bool(0.3);
        let (lora, salt) = ROOTS[root];
        let mut ev = BlockStored {
            block_hashes: chain
                .iter()
                .map(|&n| BlockHash::U64(self.nodes[n].hash))
                .collect(),
            parent_block_hash: base.map(|b| BlockHash::U64(self.nodes[b].hash)),
            token_ids: chain
                .iter()
                .flat_map(|&n| {
                    self.nodes[n].path[self.nodes[n].path.len() - BS as usize..].to_vec()
                })
                .collect(),
            block_size: BS,
            lora_id: lora.map(|_| 1),
            medium: Some(if tier_cpu { "CPU" } else { "GPU" }.into()),
            lora_name: lora.map(str::to_owned),
            group_idx: Some(0),
            kv_cache_spec_kind: self.rng.random_bool(0.5).then(|| "full_attention".into()),
            ..BlockStored::default()
        };
        let extra: Vec<Option<Vec<ExtraKey>>> = chain
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let mut keys: Vec<ExtraKey> = lora.map(ExtraKey::from).into_iter().collect();
                if let Some(offset) = self.nodes[n].mm {
                    keys.push(ExtraKey::Array(vec![
                        ExtraKey::from("img-1"),
                        ExtraKey::from(offset),
                    ]));
                }
                if base.is_none() && i == 0 {
                    keys.extend(salt.map(ExtraKey::from));
                }
                (!keys.is_empty()).then_some(keys)
            })
            .collect();
        ev.extra_keys = extra.iter().any(Option::is_some).then_some(extra);

        let model = MODELS[w as usize];
        let keys: Vec<RefKey> = chain.iter().map(|&n| self.ref_key(n, model)).collect();
        let rw = &mut self.workers[w as usize];
        let parent_known = base.is_none_or(|b| rw.slots.contains_key(&self.nodes[b].hash));
        if parent_known {
            for (&n, key) in chain.iter().zip(keys) {
                let slot = rw.slots.entry(self.nodes[n].hash).or_insert((key, 0, 0));
                if tier_cpu {
                    slot.2 += 1;
                } else {
                    slot.1 += 1;
                }
                want.stored += 1;
            }
        } else {
            want.skipped += chain.len() as u64;
        }
        if self.rng.random_bool(0.1) {
            // The same blocks in a sliding-window group of a hybrid model.
            let mut twin = ev.clone();
            twin.group_idx = Some(1);
            twin.kv_cache_spec_kind = Some("sliding_window".into());
            twin.kv_cache_spec_sliding_window = Some(8);
            rw.sliding_seen = true;
            want.skipped += chain.len() as u64;
            events.push(KvEvent::BlockStored(ev));
            events.push(KvEvent::BlockStored(twin));
        } else {
            events.push(KvEvent::BlockStored(ev));
        }
    }

    /// A child of `parent` (a root of `root` when `None`): an existing one
    /// (shared prefixes, duplicates) or a new one.
    fn next_node(&mut self, parent: Option<usize>, root: usize) -> usize {
        let siblings: Vec<usize> = match parent {
            Some(p) => self.nodes[p].children.clone(),
            None => (0..self.nodes.len())
                .filter(|&n| self.nodes[n].path.len() == BS as usize && self.nodes[n].root == root)
                .collect(),
        };
        if !siblings.is_empty() && self.rng.random_bool(0.5) {
            return siblings[self.rng.random_range(0..siblings.len())];
        }
        let block: Vec<u32> = (0..BS).map(|_| self.rng.random_range(0..50)).collect();
        let mm = self
            .rng
            .random_bool(0.05)
            .then(|| self.rng.random_range(-8..4));
        // A variant hash for the same content (vLLM's lookahead keys do this).
        let variant = u64::from(self.rng.random_bool(0.05)) * self.rng.random_range(1..4);
        let (parent_hash, parent_sig, mut path, parent_opaque) = match parent {
            Some(p) => {
                let p = &self.nodes[p];
                (p.hash, p.sig, p.path.clone(), p.opaque)
            }
            None => (
                0,
                xxh3_64_with_seed(format!("{:?}", ROOTS[root]).as_bytes(), 1),
                Vec::new(),
                false,
            ),
        };
        let mut bytes: Vec<u8> = block.iter().flat_map(|t| t.to_le_bytes()).collect();
        bytes.extend(mm.unwrap_or(i64::MIN).to_le_bytes());
        let sig = xxh3_64_with_seed(&bytes, parent_sig);
        bytes.extend(variant.to_le_bytes());
        let hash = xxh3_64_with_seed(&bytes, parent_hash ^ 0x5eed);
        if let Some(&n) = self.by_hash.get(&hash) {
            return n;
        }
        path.extend_from_slice(&block);
        self.nodes.push(Node {
            hash,
            root,
            path,
            sig,
            mm,
            opaque: parent_opaque || mm.is_some(),
            children: Vec::new(),
        });
        let n = self.nodes.len() - 1;
        self.by_hash.insert(hash, n);
        if let Some(p) = parent {
            self.nodes[p].children.push(n);
        }
        n
    }

    fn ref_key(&self, n: usize, model: &str) -> RefKey {
        let node = &self.nodes[n];
        if node.opaque {
            return RefKey::Opaque(xxh3_64_with_seed(model.as_bytes(), node.sig));
        }
        let (lora, salt) = ROOTS[node.root];
        let keys = prompt_keys(&KeyContext::new(model, lora, BS), salt, &node.path);
        RefKey::Known(*keys.last().expect("a node has at least one block"))
    }

    fn random_hashes(&mut self, w: WorkerId) -> Vec<u64> {
        let held: Vec<u64> = self.workers[w as usize].slots.keys().copied().collect();
        let n = self.rng.random_range(1..=4);
        (0..n)
            .map(|_| match self.rng.random_range(0..10) {
                0 => self.rng.random(),
                1..3 if !self.nodes.is_empty() => {
                    self.nodes[self.rng.random_range(0..self.nodes.len())].hash
                }
                _ if !held.is_empty() => held[self.rng.random_range(0..held.len())],
                _ => self.rng.random(),
            })
            .collect()
    }

    fn placeholder(&mut self, w: WorkerId, events: &mut Vec<KvEvent>, want: &mut ApplyStats) {
        let hashes = self.random_hashes(w);
        let rw = &mut self.workers[w as usize];
        for h in &hashes {
            match rw.slots.get_mut(h) {
                Some(slot) => {
                    slot.2 += 1;
                    want.stored += 1;
                }
                None => want.skipped += 1,
            }
        }
        events.push(KvEvent::BlockStored(BlockStored {
            block_hashes: hashes.into_iter().map(BlockHash::U64).collect(),
            medium: Some("CPU".into()),
            group_idx: Some(0),
            ..BlockStored::default()
        }));
    }

    fn remove(&mut self, w: WorkerId, events: &mut Vec<KvEvent>, want: &mut ApplyStats) {
        let hashes = self.random_hashes(w);
        let cpu = self.rng.random_bool(0.3);
        let group = if self.rng.random_bool(0.1) { 1 } else { 0 };
        let rw = &mut self.workers[w as usize];
        if group == 1 && rw.sliding_seen {
            want.skipped += hashes.len() as u64;
        } else {
            for h in &hashes {
                let Some(slot) = rw.slots.get_mut(h) else {
                    want.skipped += 1;
                    continue;
                };
                let count = if cpu { &mut slot.2 } else { &mut slot.1 };
                if *count == 0 {
                    want.skipped += 1;
                    continue;
                }
                *count -= 1;
                want.removed += 1;
                if slot.1 == 0 && slot.2 == 0 {
                    rw.slots.remove(h);
                }
            }
        }
        events.push(KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes.into_iter().map(BlockHash::U64).collect(),
            medium: Some(if cpu { "CPU" } else { "GPU" }.into()),
            group_idx: Some(group),
            ..BlockRemoved::default()
        }));
    }

    /// Compare entry counts and a few lookups.
    async fn check(&mut self, index: &Index) -> Result<(), String> {
        let held: Vec<HashMap<RefKey, (u32, u32)>> = self
            .workers
            .iter()
            .map(|rw| {
                let mut held: HashMap<RefKey, (u32, u32)> = HashMap::new();
                for (key, gpu, cpu) in rw.slots.values() {
                    let e = held.entry(*key).or_default();
                    e.0 += gpu;
                    e.1 += cpu;
                }
                held
            })
            .collect();
        let total: usize = held.iter().map(HashMap::len).sum();
        if index.entries() != total as u64 {
            return Err(format!("entries {} != reference {total}", index.entries()));
        }
        for (w, h) in held.iter().enumerate() {
            let got = index.worker_blocks(w as WorkerId);
            if got != h.len() as u64 {
                return Err(format!(
                    "worker {w}: worker_blocks {got} != reference {}",
                    h.len()
                ));
            }
        }
        for _ in 0..3 {
            let (keys, tokens) = self.probe();
            let got = index.lookup(&keys).await.map_err(|e| e.to_string())?;
            let want = reference_lookup(&held, &keys);
            self.report.lookups += 1;
            let best = got.iter().map(|m| m.cpu_blocks).max().unwrap_or(0);
            self.report.max_matched_blocks = self.report.max_matched_blocks.max(best);
            if got != want {
                return Err(format!(
                    "lookup of {tokens:?}: got {got:?}, reference {want:?}"
                ));
            }
        }
        Ok(())
    }

    /// Keys of a prompt: a known path (sometimes extended or altered) under
    /// its own root context, or random tokens.
    fn probe(&mut self) -> (Vec<BlockKey>, Vec<u32>) {
        if self.nodes.is_empty() || self.rng.random_bool(0.1) {
            let tokens: Vec<u32> = (0..self.rng.random_range(0..24))
                .map(|_| self.rng.random_range(0..50))
                .collect();
            return (
                prompt_keys(&KeyContext::new("m", None, BS), None, &tokens),
                tokens,
            );
        }
        let node = &self.nodes[self.rng.random_range(0..self.nodes.len())];
        let (lora, salt) = ROOTS[node.root];
        let mut tokens = node.path.clone();
        let extra = self.rng.random_range(0..9);
        tokens.extend((0..extra).map(|_| self.rng.random_range(0..50)));
        if self.rng.random_bool(0.1) {
            let i = self.rng.random_range(0..tokens.len());
            tokens[i] = 1000;
        }
        let model = if self.rng.random_bool(0.1) {
            "m-other"
        } else {
            "m"
        };
        (
            prompt_keys(&KeyContext::new(model, lora, BS), salt, &tokens),
            tokens,
        )
    }
}

/// The naive longest-prefix scan.
fn reference_lookup(held: &[HashMap<RefKey, (u32, u32)>], keys: &[BlockKey]) -> Vec<WorkerMatch> {
    let mut out = Vec::new();
    for (w, held) in held.iter().enumerate() {
        let copies = |k: &BlockKey| held.get(&RefKey::Known(*k)).copied().unwrap_or_default();
        let gpu_blocks = keys.iter().take_while(|k| copies(k).0 > 0).count() as u32;
        let cpu_blocks = keys.iter().take_while(|k| copies(k) != (0, 0)).count() as u32;
        if cpu_blocks > 0 {
            out.push(WorkerMatch {
                worker: w as WorkerId,
                gpu_blocks,
                cpu_blocks,
            });
        }
    }
    out
}
