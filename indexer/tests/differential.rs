//! The memory backend against the reference model of
//! `kvsteer_indexer::index::testing`, over many seeded random streams.
//! Another backend reuses the harness by passing its own fresh `Index`.

use kvsteer_indexer::index::Index;
use kvsteer_indexer::index::testing::run_differential;

/// Large enough that the LRU bound never evicts (LRU has its own tests).
const CAPACITY: usize = 1 << 20;

#[tokio::test]
async fn memory_backend_agrees_with_the_reference() {
    for seed in 0..12 {
        let index = Index::memory(CAPACITY);
        let report = run_differential(&index, seed, 1_500)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // The streams must exercise every path, or the agreement means little.
        assert!(report.stored > 500, "seed {seed}: {report:?}");
        assert!(report.removed > 100, "seed {seed}: {report:?}");
        assert!(report.skipped > 100, "seed {seed}: {report:?}");
        assert!(report.max_matched_blocks >= 5, "seed {seed}: {report:?}");
    }
}

#[tokio::test]
async fn sharded_memory_backend_agrees_with_the_reference() {
    use kvsteer_indexer::index::memory::MemoryBackend;
    use std::sync::Arc;
    for seed in 100..104 {
        let index = Index::with_backend(Arc::new(MemoryBackend::with_shards(CAPACITY, 16)));
        run_differential(&index, seed, 1_500)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
