#!/usr/bin/env bash
# The deep-overload check of BENCHMARKS-DIARY.md, "7 Dec (late morning): a queue that lasts
# through short dry spells, tried in the twin, not kept": the shared prefix with issue 19's
# sizes at 270 and 300 rpm (past what the twin's three workers serve), seeds 1-3, kvsteer and
# sglang_like, with every request's record; then each run's moves and TTFT
# (../../peers/2026-12-07/shared-240-moves/moves.py). About 20 s here.
# usage: overload.sh BENCH_BINARY NAME [SCORING_YAML]   (into ${TMPDIR:-/tmp}/dry-spell/NAME-SEED/)
# The variants ran kvsteer-bench built with dry-spell.diff and `scoring: {dry_spell_s: S}`.
set -euo pipefail
B=$1; O=${TMPDIR:-/tmp}/dry-spell/$2
P=(--policies kvsteer,sglang_like --profile l40s-27b-fp8 --quiet)
[ -n "${3:-}" ] && P+=(--scoring "$3")
for s in 1 2 3; do
  mkdir -p "$O-$s"
  "$B" "${P[@]}" --workload shared-prefix --groups 12 --users-per-group 8 --prefix-tokens 4000 \
    --question-tokens 1500 --output-tokens 100 --rates 270,300 --workers 3 --seed $s --jobs 2 \
    --out "$O-$s/sp.json" --records "$O-$s" &
done
wait
M=$(dirname "$0")/../../peers/2026-12-07/shared-240-moves/moves.py
for s in 1 2 3; do python3 "$M" --rate 270 "$O-$s"; python3 "$M" --rate 300 "$O-$s"; done
