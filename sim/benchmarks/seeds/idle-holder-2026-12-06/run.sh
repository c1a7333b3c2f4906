#!/usr/bin/env bash
# The 6-worker multi-turn sweep of BENCHMARKS-DIARY.md, "6 Dec (evening): an idle
# holder first, adopted": seeds 1-5 at 2-20 rpm, kvsteer and sglang_like, rewriting
# multi-$NAME-$seed.json here (~5 s per seed). NAME=idle with the default scoring
# since 64a2412; NAME=default with the rule reverted (`git diff 64a2412~1 64a2412 --
# indexer/src/scoring/kvsteer.rs | git apply -R`, then `cargo build --release -p
# kvsteer-bench`). Compare with compare.py (from the repository's root).
cd "$(dirname "$0")/../../../.."
B=${B:-target/release/kvsteer-bench}
for seed in 1 2 3 4 5; do
  $B --workload multi-turn --policies kvsteer,sglang_like --rates 2,4,6,8,10,12,14,16,18,20 \
    --duration-s 3600 --workers 6 --profile l40s-27b-fp8 --seed $seed --quiet --jobs 2 \
    --plot-dir "${TMPDIR:-/tmp}" --out sim/benchmarks/seeds/idle-holder-2026-12-06/multi-${NAME:-idle}-$seed.json
done
