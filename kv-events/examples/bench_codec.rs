//! Codec and transport throughput. Run in release mode:
//! `cargo run -p kvsteer-kv-events --release --example bench_codec`
//!
//! Prints figures only; nothing is asserted.

use std::time::{Duration, Instant};

use kvsteer_kv_events::zmq::{
    Publisher, PublisherConfig, StreamItem, SubscriberConfig, spawn_subscriber,
};
use kvsteer_kv_events::{
    BlockHash, BlockStored, Encoding, EventBatch, KvEvent, decode_batch, encode_batch,
};

/// A prefill of `blocks` 16-token blocks, as one BlockStored.
fn prefill_batch(blocks: u64) -> EventBatch {
    EventBatch {
        ts: 1_767_225_600.125,
        events: vec![KvEvent::BlockStored(BlockStored {
            block_hashes: (0..blocks)
                .map(|i| BlockHash::U64(0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i + 1)))
                .collect(),
            parent_block_hash: None,
            token_ids: (0..blocks as u32 * 16)
                .map(|t| (t * 7919) % 151_936)
                .collect(),
            block_size: 16,
            medium: Some("GPU".into()),
            extra_keys: Some(vec![None; blocks as usize]),
            group_idx: Some(0),
            kv_cache_spec_kind: Some("full_attention".into()),
            ..BlockStored::default()
        })],
        data_parallel_rank: Some(0),
    }
}

fn run_for(d: Duration, mut f: impl FnMut()) -> (u64, Duration) {
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < d {
        for _ in 0..100 {
            f();
        }
        n += 100;
    }
    (n, start.elapsed())
}

fn codec() {
    for (name, blocks) in [
        ("1 block", 1),
        ("32 blocks (512 tokens)", 32),
        ("256 blocks (4096 tokens)", 256),
    ] {
        let batch = prefill_batch(blocks);
        for enc in [Encoding::Map, Encoding::Array] {
            let bytes = encode_batch(&batch, enc);
            let (n, t) = run_for(Duration::from_millis(500), || {
                std::hint::black_box(encode_batch(std::hint::black_box(&batch), enc));
            });
            let enc_rate = n as f64 / t.as_secs_f64();
            let (n, t) = run_for(Duration::from_millis(500), || {
                std::hint::black_box(decode_batch(std::hint::black_box(&bytes)).ok());
            });
            let dec_rate = n as f64 / t.as_secs_f64();
            println!(
                "{name:>26} {enc:?}: {} B, encode {:>9.0} batches/s ({:>6.0} MB/s), decode {:>9.0} batches/s ({:>6.0} MB/s)",
                bytes.len(),
                enc_rate,
                enc_rate * bytes.len() as f64 / 1e6,
                dec_rate,
                dec_rate * bytes.len() as f64 / 1e6,
            );
        }
    }
}

async fn transport() {
    const N: u64 = 20_000;
    let p = Publisher::bind(PublisherConfig {
        pub_endpoint: "tcp://127.0.0.1:0".into(),
        replay_endpoint: Some("tcp://127.0.0.1:0".into()),
        replay_buffer_batches: N as usize,
        ..PublisherConfig::default()
    })
    .await
    .expect("bind");
    let (pub_ep, replay_ep) = p.local_endpoints();
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let task = spawn_subscriber(
        SubscriberConfig {
            endpoint: pub_ep,
            replay_endpoint: replay_ep,
            ..SubscriberConfig::default()
        },
        tx,
        stop_rx,
    );
    while rx.recv().await != Some(StreamItem::Connected) {}
    let batch = prefill_batch(32);
    let start = Instant::now();
    let consumer = tokio::spawn(async move {
        let (mut live, mut replayed, mut gaps) = (0u64, 0u64, 0u64);
        while let Ok(Some(item)) = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            match item {
                StreamItem::Batch {
                    seq, replayed: r, ..
                } => {
                    if r {
                        replayed += 1
                    } else {
                        live += 1
                    }
                    if seq + 1 == N {
                        break;
                    }
                }
                StreamItem::Gap { .. } => gaps += 1,
                _ => {}
            }
        }
        (live, replayed, gaps, start.elapsed())
    });
    for _ in 0..N {
        p.publish(&batch).await.expect("publish");
    }
    let publish_time = start.elapsed();
    let (live, replayed, gaps, t) = consumer.await.expect("consumer");
    println!(
        "transport: {N} batches of 32 blocks published in {publish_time:?}; delivered in {t:?} ({:.0} batches/s): {live} live, {replayed} via replay, {gaps} gaps",
        (live + replayed) as f64 / t.as_secs_f64()
    );
    let _ = stop.send(true);
    let _ = task.await;
    p.shutdown().await;
}

#[tokio::main]
async fn main() {
    codec();
    transport().await;
}
