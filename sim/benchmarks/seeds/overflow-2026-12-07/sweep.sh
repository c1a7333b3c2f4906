#!/usr/bin/env bash
# The twin sweep of BENCHMARKS-DIARY.md, "7 Dec (morning): an overflow worker for long prompts
# past capacity, tried, not kept": mixed traffic (60, 120, 150 rpm) seeds 1-5 and the shared prefix
# with issue 19's sizes (60, 180, 240 rpm) seeds 1-3; kvsteer and sglang_like; about 10 s here.
# usage: sweep.sh BENCH_BINARY NAME [SCORING_YAML]   (JSON into ${TMPDIR:-/tmp}/kv-need/NAME/)
# The variants ran kvsteer-bench built with overflow.diff, `scoring: {overflow_factor: F}` and
# KV_OF_COND=backlog|half (unset: every queue lasted), KV_OF_FORCE=1 (the overflow worker first).
# Runs in table.txt: ofF = F, every queue lasted; h3 = F 3, half of it; bF = F, a request waiting
# everywhere; bfF = the same, the overflow worker first (F 1.5 as 15).
# Compare: python3 table.py base VARIANT...
set -euo pipefail
B=$1; O=${TMPDIR:-/tmp}/kv-need/$2; mkdir -p "$O"
P=(--policies kvsteer,sglang_like --profile l40s-27b-fp8 --quiet)
[ -n "${3:-}" ] && P+=(--scoring "$3")
for s in 1 2 3 4 5; do
  "$B" "${P[@]}" --workload mixed --rates 60,120,150 --duration-s 120 --workers 3 --seed $s --jobs 1 --out "$O/mx-$s.json" &
  [ $((s % 2)) = 0 ] && wait
done
wait
for s in 1 2 3; do
  "$B" "${P[@]}" --workload shared-prefix --groups 12 --users-per-group 8 --prefix-tokens 4000 \
    --question-tokens 1500 --output-tokens 100 --rates 60,180,240 --workers 3 --seed $s --jobs 2 --out "$O/sp-$s.json"
done
