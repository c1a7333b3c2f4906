#!/usr/bin/env bash
# The twin sweep of BENCHMARKS-DIARY.md, "6 Dec (late night): cached blocks nothing holds
# count in the KV need, adopted": multi-turn on 3 workers (8, 24 rpm) and 6 workers (4-20
# rpm), mixed traffic (60, 120, 150 rpm), seeds 1-10; the shared prefix with issue 19's
# sizes (60, 180, 240 rpm), seeds 1-6; kvsteer and sglang_like; 40 s on this machine.
# usage: sweep.sh BENCH_BINARY NAME   (JSON into ${TMPDIR:-/tmp}/kv-need/NAME/)
# Runs compared: base (kvsteer-bench at a74456f), held (the commit that adopted it), tok
# (held with the holder's discount on the token queue only: in scoring/kvsteer.rs rank,
# `keep * r.prediction.queue_ms` ->
# `keep * (r.prediction.queued_tokens * r.prediction.ms_per_token()).min(r.prediction.queue_ms)`).
# Compare: python3 summary.py base held tok; python3 ../kv-need-2026-12-06/cmp.py base held.
set -euo pipefail
B=$1; O=${TMPDIR:-/tmp}/kv-need/$2; mkdir -p "$O"
P=(--policies kvsteer,sglang_like --profile l40s-27b-fp8 --quiet)
for s in $(seq 1 10); do
  "$B" "${P[@]}" --workload multi-turn --rates 8,24 --duration-s 600 --workers 3 --seed $s --out "$O/mt-$s.json" &
  "$B" "${P[@]}" --workload multi-turn --rates 4,8,12,16,20 --duration-s 3600 --workers 6 --seed $s --jobs 1 --out "$O/mt6-$s.json"
  "$B" "${P[@]}" --workload mixed --rates 60,120,150 --duration-s 120 --workers 3 --seed $s --jobs 1 --out "$O/mx-$s.json"
  wait
done
for s in 1 2 3 4 5 6; do
  "$B" "${P[@]}" --workload shared-prefix --groups 12 --users-per-group 8 --prefix-tokens 4000 \
    --question-tokens 1500 --output-tokens 100 --rates 60,180,240 --workers 3 --seed $s --jobs 2 --out "$O/sp-$s.json"
done
