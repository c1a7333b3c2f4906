//! The golden vLLM event vectors (`shared/vllm-events`) through [`Index`].

use kvsteer_kv_events::{EventBatch, KvEvent, decode_batch};

use super::*;
use crate::keys::prompt_keys;

use kvsteer_e2e::shared_dir;

fn vector(name: &str) -> EventBatch {
    let path = shared_dir()
        .join("vllm-events")
        .join(format!("{name}.msgpack"));
    let payload = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let decoded = decode_batch(&payload).unwrap();
    assert!(decoded.skipped.is_empty(), "{name}: {:?}", decoded.skipped);
    decoded.batch
}

/// All token ids the vector's BlockStored events carry, in order.
fn tokens(batch: &EventBatch) -> Vec<u32> {
    batch
        .events
        .iter()
        .filter_map(|e| match e {
            KvEvent::BlockStored(s) => Some(s.token_ids.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn ctx() -> KeyContext {
    KeyContext::new("Qwen/Qwen3-8B", None, 16)
}

fn index() -> Index {
    let index = Index::memory(1 << 16);
    for w in 0..8 {
        index.register_worker(w, "Qwen/Qwen3-8B", 16);
    }
    index
}

fn m(worker: WorkerId, gpu_blocks: u32, cpu_blocks: u32) -> WorkerMatch {
    WorkerMatch {
        worker,
        gpu_blocks,
        cpu_blocks,
    }
}

/// Single block + 3-block chain: the prompt of all 64 tokens.
async fn gpu_prompt(index: &Index, worker: WorkerId) -> Vec<BlockKey> {
    let single = vector("v033_stored_single_block");
    let chain = vector("v033_stored_chain_3_blocks");
    for b in [&single, &chain] {
        let stats = index.apply_batch(worker, b).await;
        assert_eq!(stats.skipped, 0);
    }
    let mut t = tokens(&single);
    t.extend(tokens(&chain));
    prompt_keys(&ctx(), None, &t)
}

#[tokio::test]
async fn u64_and_bytes_hashes_and_array_form() {
    let index = index();
    let keys = gpu_prompt(&index, 0).await;
    assert_eq!(keys.len(), 4);
    for name in ["v023_stored_single_block", "v023_stored_chain_3_blocks"] {
        index.apply_batch(1, &vector(name)).await;
    }
    let stats = index.apply_batch(2, &vector("v033_bytes_hashes")).await;
    assert_eq!((stats.stored, stats.removed, stats.skipped), (4, 1, 0));
    assert_eq!(
        index.lookup(&keys).await.unwrap(),
        vec![m(0, 4, 4), m(1, 4, 4), m(2, 3, 3)]
    );
    let stats = index
        .apply_batch(0, &vector("v033_removed_and_cleared"))
        .await;
    assert!(stats.cleared);
    assert_eq!(index.worker_blocks(0), 0);
}

#[tokio::test]
async fn cpu_offload_self_describing() {
    let index = index();
    let keys = gpu_prompt(&index, 0).await;
    let stats = index.apply_batch(3, &vector("v033_cpu_offload")).await;
    assert_eq!((stats.stored, stats.removed, stats.skipped), (4, 2, 0));
    assert_eq!(
        index.lookup(&keys).await.unwrap(),
        vec![m(0, 4, 4), m(3, 0, 2)]
    );
}

#[tokio::test]
async fn cpu_offload_placeholder() {
    let index = index();
    let keys = gpu_prompt(&index, 0).await;
    let placeholder = vector("v033_cpu_offload_placeholder");
    let stats = index.apply_batch(0, &placeholder).await;
    assert_eq!((stats.stored, stats.removed, stats.skipped), (2, 1, 0));
    // Without the GPU copies there is nothing to attach the hashes to.
    let stats = index.apply_batch(4, &placeholder).await;
    assert_eq!((stats.stored, stats.removed, stats.skipped), (0, 0, 3));
    assert_eq!(index.lookup(&keys).await.unwrap(), vec![m(0, 4, 4)]);
}

#[tokio::test]
async fn lora_with_cache_salt() {
    let index = index();
    let batch = vector("v033_lora_cache_salt");
    let stats = index.apply_batch(0, &batch).await;
    assert_eq!(stats.stored, 2);
    let lora = ctx().with_lora(Some("sql-lora"));
    let t = tokens(&batch);
    assert_eq!(
        index
            .lookup(&prompt_keys(&lora, Some("tenant-a"), &t))
            .await
            .unwrap(),
        vec![m(0, 2, 2)]
    );
    assert!(
        index
            .lookup(&prompt_keys(&lora, None, &t))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        index
            .lookup(&prompt_keys(&ctx(), Some("tenant-a"), &t))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn hybrid_sliding_window_group_is_skipped() {
    let index = index();
    let batch = vector("v033_hybrid_sliding_window");
    let stats = index.apply_batch(0, &batch).await;
    assert_eq!((stats.stored, stats.skipped), (3, 3));
    let keys = prompt_keys(&ctx(), None, &tokens(&batch)[..48]);
    assert_eq!(index.lookup(&keys).await.unwrap(), vec![m(0, 3, 3)]);
}

#[tokio::test]
async fn multimodal_blocks_do_not_match_text() {
    let index = index();
    let batch = vector("v033_multimodal_extra_keys");
    let stats = index.apply_batch(0, &batch).await;
    assert_eq!(stats.stored, 3);
    let keys = prompt_keys(&ctx(), None, &tokens(&batch));
    assert!(index.lookup(&keys).await.unwrap().is_empty());
}

#[tokio::test]
async fn other_vectors_apply_cleanly() {
    for name in [
        "v033_hashes_ge_2pow63",
        "v033_session_lookahead",
        "v033_dp_rank_1",
        "v033_no_dp_rank",
    ] {
        let index = index();
        let batch = vector(name);
        // These chain from parents in earlier vectors or not: either way no panic,
        // and every block is accounted for.
        let stats = index.apply_batch(0, &batch).await;
        let blocks = ingest::batch_blocks(&batch);
        assert_eq!(
            stats.stored + stats.removed + stats.skipped,
            blocks,
            "{name}"
        );
    }
}
