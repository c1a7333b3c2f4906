//! Behaviour of [`Index`] over the memory backend, event by event.

use kvsteer_kv_events::{BlockHash, BlockRemoved, BlockStored, EventBatch, ExtraKey, KvEvent};

use super::*;
use crate::keys::prompt_keys;

const BS: u32 = 4;

fn batch(events: Vec<KvEvent>) -> EventBatch {
    EventBatch {
        ts: 0.0,
        events,
        data_parallel_rank: None,
    }
}

/// Tokens of block `i` of test prompt `p`.
fn toks(p: u32, blocks: u32) -> Vec<u32> {
    (0..blocks * BS).map(|t| p * 1000 + t).collect()
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> BlockStored {
    BlockStored {
        block_hashes: hashes.iter().map(|h| BlockHash::U64(*h)).collect(),
        parent_block_hash: parent.map(BlockHash::U64),
        token_ids: tokens.to_vec(),
        block_size: BS,
        medium: Some("GPU".into()),
        ..BlockStored::default()
    }
}

fn on(mut ev: BlockStored, medium: &str) -> KvEvent {
    ev.medium = Some(medium.into());
    KvEvent::BlockStored(ev)
}

fn gpu(ev: BlockStored) -> KvEvent {
    KvEvent::BlockStored(ev)
}

fn removed(hashes: &[u64], medium: &str) -> KvEvent {
    KvEvent::BlockRemoved(BlockRemoved {
        block_hashes: hashes.iter().map(|h| BlockHash::U64(*h)).collect(),
        medium: Some(medium.into()),
        ..BlockRemoved::default()
    })
}

fn index(workers: u32) -> Index {
    let index = Index::memory(1 << 16);
    for w in 0..workers {
        index.register_worker(w, "m", BS);
    }
    index
}

fn keys(tokens: &[u32]) -> Vec<BlockKey> {
    prompt_keys(&KeyContext::new("m", None, BS), None, tokens)
}

fn m(worker: WorkerId, gpu_blocks: u32, cpu_blocks: u32) -> WorkerMatch {
    WorkerMatch {
        worker,
        gpu_blocks,
        cpu_blocks,
    }
}

#[tokio::test]
async fn events_and_prompts_give_the_same_keys() {
    let index = index(1);
    let t = toks(1, 3);
    let stats = index
        .apply_batch(
            0,
            &batch(vec![
                gpu(stored(&[11, 12], None, &t[..8])),
                gpu(stored(&[13], Some(12), &t[8..])),
            ]),
        )
        .await;
    assert_eq!((stats.stored, stats.skipped), (3, 0));
    let mut prompt = toks(1, 5);
    prompt.push(7); // partial last block
    assert_eq!(
        index.lookup(&keys(&prompt)).await.unwrap(),
        vec![m(0, 3, 3)]
    );
    // A prompt diverging in block 1 matches only block 0.
    let mut other = t.clone();
    other[5] = 99;
    assert_eq!(index.lookup(&keys(&other)).await.unwrap(), vec![m(0, 1, 1)]);
    assert_eq!(index.lookup(&keys(&toks(2, 3))).await.unwrap(), vec![]);
    assert_eq!(index.lookup(&[]).await.unwrap(), vec![]);
    assert_eq!((index.entries(), index.worker_blocks(0)), (3, 3));
}

#[tokio::test]
async fn duplicates_are_removed_with_their_last_copy() {
    let index = index(1);
    let t = toks(1, 1);
    index
        .apply_batch(
            0,
            &batch(vec![
                gpu(stored(&[1], None, &t)),
                gpu(stored(&[1], None, &t)),
            ]),
        )
        .await;
    assert_eq!(index.entries(), 1);
    let stats = index
        .apply_batch(0, &batch(vec![removed(&[1], "GPU")]))
        .await;
    assert_eq!(stats.removed, 1);
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![m(0, 1, 1)]);
    let stats = index
        .apply_batch(0, &batch(vec![removed(&[1], "GPU"), removed(&[1], "GPU")]))
        .await;
    assert_eq!((stats.removed, stats.skipped), (1, 1));
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![]);
    assert_eq!(index.entries(), 0);
}

#[tokio::test]
async fn two_engine_hashes_for_one_key_are_counted_together() {
    // e.g. lookahead tokens change vLLM's hash but not the block's tokens.
    let index = index(1);
    let t = toks(1, 1);
    index
        .apply_batch(
            0,
            &batch(vec![
                gpu(stored(&[1], None, &t)),
                gpu(stored(&[2], None, &t)),
            ]),
        )
        .await;
    assert_eq!(index.entries(), 1);
    index
        .apply_batch(0, &batch(vec![removed(&[1], "GPU")]))
        .await;
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![m(0, 1, 1)]);
    index
        .apply_batch(0, &batch(vec![removed(&[2], "GPU")]))
        .await;
    assert_eq!(index.entries(), 0);
}

#[tokio::test]
async fn tiers_are_reported_separately() {
    let index = index(2);
    let t = toks(1, 3);
    // Worker 0: block 0 on GPU, blocks 1-2 on CPU. Worker 1: everything on both.
    index
        .apply_batch(
            0,
            &batch(vec![
                gpu(stored(&[1], None, &t[..4])),
                on(stored(&[1, 2, 3], None, &t), "CPU"),
            ]),
        )
        .await;
    index
        .apply_batch(
            1,
            &batch(vec![
                gpu(stored(&[1, 2, 3], None, &t)),
                on(stored(&[1, 2, 3], None, &t), "CPU"),
            ]),
        )
        .await;
    let got = index.lookup(&keys(&t)).await.unwrap();
    assert_eq!(got, vec![m(0, 1, 3), m(1, 3, 3)]);
    // A CPU removal leaves the GPU copy and vice versa.
    index
        .apply_batch(1, &batch(vec![removed(&[2], "CPU")]))
        .await;
    index
        .apply_batch(0, &batch(vec![removed(&[1], "GPU")]))
        .await;
    assert_eq!(
        index.lookup(&keys(&t)).await.unwrap(),
        vec![m(0, 0, 3), m(1, 3, 3)]
    );
    // Removing a tier that holds no copy is skipped.
    let stats = index
        .apply_batch(0, &batch(vec![removed(&[3], "GPU")]))
        .await;
    assert_eq!((stats.removed, stats.skipped), (0, 1));
    // Worker 1: block 1 only on GPU, block 2 only on CPU.
    index
        .apply_batch(1, &batch(vec![removed(&[3], "GPU")]))
        .await;
    assert_eq!(index.lookup(&keys(&t)).await.unwrap()[1], m(1, 2, 3));
    // Block 1 gone from both tiers ends both runs.
    index
        .apply_batch(1, &batch(vec![removed(&[2], "GPU")]))
        .await;
    assert_eq!(index.lookup(&keys(&t)).await.unwrap()[1], m(1, 1, 1));
}

#[tokio::test]
async fn only_full_attention_groups_are_indexed() {
    let index = index(1);
    let t = toks(1, 2);
    let mut full = stored(&[1, 2], None, &t);
    full.group_idx = Some(0);
    full.kv_cache_spec_kind = Some("full_attention".into());
    let mut sliding = full.clone();
    sliding.group_idx = Some(1);
    sliding.kv_cache_spec_kind = Some("sliding_window".into());
    sliding.kv_cache_spec_sliding_window = Some(128);
    let stats = index
        .apply_batch(0, &batch(vec![gpu(full), gpu(sliding)]))
        .await;
    assert_eq!((stats.stored, stats.skipped), (2, 2));
    // The sliding-window group dropping its copy does not touch group 0's.
    let mut drop_sw = BlockRemoved {
        block_hashes: vec![BlockHash::U64(1), BlockHash::U64(2)],
        medium: Some("GPU".into()),
        group_idx: Some(1),
        ..BlockRemoved::default()
    };
    let stats = index
        .apply_batch(0, &batch(vec![KvEvent::BlockRemoved(drop_sw.clone())]))
        .await;
    assert_eq!((stats.removed, stats.skipped), (0, 2));
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![m(0, 2, 2)]);
    drop_sw.group_idx = Some(0);
    let stats = index
        .apply_batch(0, &batch(vec![KvEvent::BlockRemoved(drop_sw)]))
        .await;
    assert_eq!(stats.removed, 2);
    assert_eq!(index.entries(), 0);
}

#[tokio::test]
async fn unknown_parent_is_skipped_and_nothing_stops() {
    let index = index(1);
    let t = toks(1, 3);
    let mut bad_size = stored(&[7], None, &t[..4]);
    bad_size.block_size = 8;
    let stats = index
        .apply_batch(
            0,
            &batch(vec![
                gpu(stored(&[2, 3], Some(1), &t[4..])), // parent 1 never seen
                gpu(stored(&[5], None, &t[..3])),       // 3 tokens for a 4-token block
                gpu(bad_size),
                on(stored(&[6], None, &t[..4]), "DISK"),
                removed(&[42], "GPU"),
                gpu(stored(&[1], None, &t[..4])),
            ]),
        )
        .await;
    assert_eq!((stats.stored, stats.skipped), (1, 6));
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![m(0, 1, 1)]);
    // Now the parent is known: the chain extends.
    index
        .apply_batch(0, &batch(vec![gpu(stored(&[2, 3], Some(1), &t[4..]))]))
        .await;
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![m(0, 3, 3)]);
}

#[tokio::test]
async fn all_blocks_cleared_and_clear_worker_forget_one_worker() {
    let index = index(2);
    let t = toks(1, 2);
    for w in 0..2 {
        index
            .apply_batch(w, &batch(vec![gpu(stored(&[1, 2], None, &t))]))
            .await;
    }
    let stats = index
        .apply_batch(0, &batch(vec![KvEvent::AllBlocksCleared]))
        .await;
    assert!(stats.cleared);
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![m(1, 2, 2)]);
    assert_eq!((index.worker_blocks(0), index.worker_blocks(1)), (0, 2));
    // Old hashes are unknown after a clear.
    let stats = index
        .apply_batch(0, &batch(vec![gpu(stored(&[3], Some(2), &toks(2, 1)))]))
        .await;
    assert_eq!(stats.skipped, 1);
    index.clear_worker(1).await.unwrap();
    assert_eq!(index.entries(), 0);
    // Still registered.
    let stats = index
        .apply_batch(1, &batch(vec![gpu(stored(&[1], None, &t[..4]))]))
        .await;
    assert_eq!(stats.stored, 1);
}

#[tokio::test]
async fn reset_worker_purges_one_worker_and_forgets_its_hashes() {
    let index = index(2);
    let t = toks(1, 2);
    for w in 0..2 {
        index
            .apply_batch(w, &batch(vec![gpu(stored(&[1, 2], None, &t))]))
            .await;
    }
    index.reset_worker(0).await.unwrap();
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![m(1, 2, 2)]);
    assert_eq!((index.worker_blocks(0), index.worker_blocks(1)), (0, 2));
    assert_eq!(index.tracked_hashes(0).await, 0);
    // A replay from scratch stores the blocks again.
    let stats = index
        .apply_batch(0, &batch(vec![gpu(stored(&[1, 2], None, &t))]))
        .await;
    assert_eq!(stats.stored, 2);
    assert_eq!(
        index.lookup(&keys(&t)).await.unwrap(),
        vec![m(0, 2, 2), m(1, 2, 2)]
    );
    // An unregistered worker is purged too.
    index.reset_worker(7).await.unwrap();
}

#[tokio::test]
async fn remove_worker_purges_and_unregisters() {
    let index = index(2);
    let t = toks(1, 2);
    for w in 0..2 {
        index
            .apply_batch(w, &batch(vec![gpu(stored(&[1, 2], None, &t))]))
            .await;
    }
    index.remove_worker(0).await.unwrap();
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![m(1, 2, 2)]);
    assert_eq!((index.entries(), index.worker_blocks(0)), (2, 0));
    let stats = index
        .apply_batch(0, &batch(vec![gpu(stored(&[1], None, &t[..4]))]))
        .await;
    assert_eq!((stats.stored, stats.skipped), (0, 1));
    index.remove_worker(7).await.unwrap(); // unknown: no-op
}

#[tokio::test]
async fn reregistering_with_another_model_drops_old_keys() {
    let index = index(1);
    let t = toks(1, 1);
    index
        .apply_batch(0, &batch(vec![gpu(stored(&[1], None, &t))]))
        .await;
    index.register_worker(0, "m", BS); // same: keeps
    index.apply_batch(0, &batch(vec![])).await;
    assert_eq!(index.entries(), 1);
    index.register_worker(0, "m2", BS);
    index
        .apply_batch(0, &batch(vec![gpu(stored(&[1], None, &t))]))
        .await;
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![]);
    let m2 = prompt_keys(&KeyContext::new("m2", None, BS), None, &t);
    assert_eq!(index.lookup(&m2).await.unwrap(), vec![m(0, 1, 1)]);
    assert_eq!(index.entries(), 1);
}

#[tokio::test]
async fn lora_and_cache_salt_enter_the_chain() {
    let index = index(1);
    let t = toks(1, 2);
    let lora = ExtraKey::from("sql-lora");
    let mut ev = stored(&[1, 2], None, &t);
    ev.lora_id = Some(1);
    ev.lora_name = Some("sql-lora".into());
    // vLLM: the salt only in the first block's extra keys.
    ev.extra_keys = Some(vec![
        Some(vec![lora.clone(), ExtraKey::from("tenant-a")]),
        Some(vec![lora.clone()]),
    ]);
    let stats = index.apply_batch(0, &batch(vec![gpu(ev)])).await;
    assert_eq!(stats.stored, 2);
    let ctx = KeyContext::new("m", Some("sql-lora"), BS);
    let hit = prompt_keys(&ctx, Some("tenant-a"), &t);
    assert_eq!(index.lookup(&hit).await.unwrap(), vec![m(0, 2, 2)]);
    for miss in [
        prompt_keys(&ctx, None, &t),
        prompt_keys(&ctx, Some("tenant-b"), &t),
        prompt_keys(&KeyContext::new("m", None, BS), Some("tenant-a"), &t),
    ] {
        assert_eq!(index.lookup(&miss).await.unwrap(), vec![]);
    }
    // A child event (parent known) carries only the LoRA; it chains on.
    let more = toks(1, 3);
    let mut child = stored(&[3], Some(2), &more[8..]);
    child.lora_name = Some("sql-lora".into());
    child.extra_keys = Some(vec![Some(vec![lora])]);
    index.apply_batch(0, &batch(vec![gpu(child)])).await;
    let hit = prompt_keys(&ctx, Some("tenant-a"), &more);
    assert_eq!(index.lookup(&hit).await.unwrap(), vec![m(0, 3, 3)]);
}

#[tokio::test]
async fn multimodal_blocks_never_match_a_text_prompt() {
    let index = index(1);
    let t = toks(1, 3);
    let mm = |offset: i64| {
        Some(vec![ExtraKey::Array(vec![
            ExtraKey::from("img"),
            ExtraKey::from(offset),
        ])])
    };
    let mut ev = stored(&[1, 2, 3], None, &t);
    ev.extra_keys = Some(vec![None, mm(2), mm(-2)]);
    index.apply_batch(0, &batch(vec![gpu(ev)])).await;
    // The text-only block before the image still matches.
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![m(0, 1, 1)]);
    assert_eq!(index.entries(), 3);
}

#[tokio::test]
async fn cpu_placeholders_reuse_the_gpu_key() {
    let index = index(1);
    let t = toks(1, 2);
    let placeholder = |hashes: &[u64]| {
        let mut ev = stored(hashes, None, &[]);
        ev.block_size = 0;
        on(ev, "CPU")
    };
    let stats = index.apply_batch(0, &batch(vec![placeholder(&[2])])).await;
    assert_eq!((stats.stored, stats.skipped), (0, 1)); // unknown hash
    index
        .apply_batch(
            0,
            &batch(vec![gpu(stored(&[1, 2], None, &t)), placeholder(&[1, 2])]),
        )
        .await;
    index
        .apply_batch(0, &batch(vec![removed(&[1, 2], "GPU")]))
        .await;
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![m(0, 0, 2)]);
    index
        .apply_batch(0, &batch(vec![removed(&[2], "CPU")]))
        .await;
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![m(0, 0, 1)]);
    assert_eq!(index.tracked_hashes(0).await, 1);
}

#[tokio::test]
async fn bytes_hashes_work_like_ints() {
    let index = index(1);
    let t = toks(1, 2);
    let h = |b: u8| BlockHash::Bytes(vec![b; 32]);
    let mut ev = stored(&[], None, &t);
    ev.block_hashes = vec![h(1)];
    ev.token_ids = t[..4].to_vec();
    let mut child = stored(&[], None, &t[4..]);
    child.block_hashes = vec![h(2)];
    child.parent_block_hash = Some(h(1));
    let stats = index
        .apply_batch(0, &batch(vec![gpu(ev), gpu(child)]))
        .await;
    assert_eq!(stats.stored, 2);
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![m(0, 2, 2)]);
}

#[tokio::test]
async fn unregistered_workers_events_are_skipped() {
    let index = index(0);
    let stats = index
        .apply_batch(
            3,
            &batch(vec![
                gpu(stored(&[1, 2], None, &toks(1, 2))),
                removed(&[9], "GPU"),
            ]),
        )
        .await;
    assert_eq!((stats.stored, stats.skipped), (0, 3));
    assert_eq!(index.entries(), 0);
}

#[tokio::test]
async fn the_capacity_bound_holds_and_evicts_chain_tails_first() {
    let index = Index::memory(4);
    index.register_worker(0, "m", BS);
    let t = toks(1, 6);
    index
        .apply_batch(0, &batch(vec![gpu(stored(&[1, 2, 3, 4, 5, 6], None, &t))]))
        .await;
    assert_eq!((index.entries(), index.evicted()), (4, 2));
    // The tail (blocks 4, 5) went; the prefix stays useful.
    assert_eq!(index.lookup(&keys(&t)).await.unwrap(), vec![m(0, 4, 4)]);
    assert_eq!(index.lookup(&keys(&t)[4..]).await.unwrap(), vec![]);
    // The ingest map still knows evicted blocks: removals and children work.
    let stats = index
        .apply_batch(0, &batch(vec![removed(&[5], "GPU")]))
        .await;
    assert_eq!((stats.removed, index.entries()), (1, 4));
    let more = toks(1, 7);
    let stats = index
        .apply_batch(0, &batch(vec![gpu(stored(&[7], Some(6), &more[24..]))]))
        .await;
    assert_eq!(stats.stored, 1);
    // Block 6 is the newest; block 3, the deepest the lookup touched, the oldest.
    assert_eq!(index.entries(), 4);
    assert_eq!(index.lookup(&keys(&more)).await.unwrap(), vec![m(0, 3, 3)]);
    assert_eq!(
        index.lookup(&keys(&more)[6..]).await.unwrap(),
        vec![m(0, 1, 1)]
    );
}
