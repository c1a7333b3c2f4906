#!/usr/bin/env bash
# The twin sweep of BENCHMARKS-DIARY.md, "6 Dec (night): the 24-rpm p99 traced; a
# KV-block need with the cached prefix, tried, not kept": multi-turn on 3 workers (8, 24
# rpm, seeds 1-5) and 6 workers (4-20 rpm, seeds 1-5), the shared prefix with issue 19's
# sizes and mixed traffic (seeds 1-3), kvsteer and sglang_like, ~30 s in all.
# usage: sweep.sh BENCH_BINARY NAME   (JSON into ${TMPDIR:-/tmp}/kv-need/NAME/)
# The variant: in indexer/src/scoring/kvsteer.rs `predict`, kv_wait_ms's need
# `queued_tokens + uncached_tokens` plus `f64::from(w.gpu_hit_tokens.min(prompt_tokens))`;
# then `cargo build --release -p kvsteer-bench`. Compare: cmp.py base variant.
set -euo pipefail
B=$1; O=${TMPDIR:-/tmp}/kv-need/$2; mkdir -p "$O"
P=(--policies kvsteer,sglang_like --profile l40s-27b-fp8 --quiet --plot-dir "$O")
for s in 1 2 3 4 5; do
  "$B" "${P[@]}" --workload multi-turn --rates 8,24 --duration-s 600 --workers 3 --seed $s --out "$O/mt-$s.json"
  "$B" "${P[@]}" --workload multi-turn --rates 4,8,12,16,20 --duration-s 3600 --workers 6 --seed $s --jobs 2 --out "$O/mt6-$s.json"
done
for s in 1 2 3; do
  "$B" "${P[@]}" --workload shared-prefix --groups 12 --users-per-group 8 --prefix-tokens 4000 \
    --question-tokens 1500 --output-tokens 100 --rates 60,180,240 --workers 3 --seed $s --jobs 2 --out "$O/sp-$s.json"
  "$B" "${P[@]}" --workload mixed --rates 60,120,150 --duration-s 120 --workers 3 --seed $s --jobs 2 --out "$O/mx-$s.json"
done
