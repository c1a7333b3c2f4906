#!/usr/bin/env bash
# The novel_spread sweep of BENCHMARKS-DIARY.md, "6 Dec (afternoon): a narrower
# novel_spread band on issue 19's twin": default, 0 and 0.5 on issue 19's twin,
# seeds 1-10 (SEEDS=n for fewer), rewriting the JSON files here (~40 s).
# Read them with misses.py and lead.py (from the repository's root).
# The `idle` files: kvsteer with idle-holder.patch applied (`git apply` it,
# `cargo build --release -p kvsteer-bench`), then SETTINGS=idle run.sh.
cd "$(dirname "$0")/../../../.."
B=${B:-target/release/kvsteer-bench}
SHARED=(--workload shared-prefix --groups 12 --users-per-group 8 --prefix-tokens 4000 --question-tokens 1500 --output-tokens 100)
for seed in $(seq 1 ${SEEDS:-10}); do
  for s in ${SETTINGS:-default ns0 ns05}; do
    sc=(); [ $s != default ] && [ $s != idle ] && sc=(--scoring sim/benchmarks/seeds/novel-spread-2026-12-06/$s.yaml)
    pol=kvsteer; [ $s = default ] && pol=kvsteer,sglang_like
    $B --workload mixed --policies $pol --rates 60,120,150 --duration-s 120 --workers 3 --profile l40s-27b-fp8 --seed $seed --quiet --jobs 1 "${sc[@]}" --plot-dir "${TMPDIR:-/tmp}" --out sim/benchmarks/seeds/novel-spread-2026-12-06/mixed-$s-$seed.json >/dev/null 2>&1 || echo "fail mixed $s $seed"
    $B "${SHARED[@]}" --policies $pol --rates 60,180,240 --duration-s 120 --workers 3 --profile l40s-27b-fp8 --seed $seed --quiet --jobs 1 "${sc[@]}" --plot-dir "${TMPDIR:-/tmp}" --out sim/benchmarks/seeds/novel-spread-2026-12-06/shared-$s-$seed.json >/dev/null 2>&1 || echo "fail shared $s $seed"
    $B --workload multi-turn --policies $pol --rates 8,24 --duration-s 600 --workers 3 --profile l40s-27b-fp8 --seed $seed --quiet --jobs 1 "${sc[@]}" --plot-dir "${TMPDIR:-/tmp}" --out sim/benchmarks/seeds/novel-spread-2026-12-06/multi-$s-$seed.json >/dev/null 2>&1 || echo "fail multi $s $seed"
  done
  echo "seed $seed done $(date +%T)"
done
echo SWEEP_DONE
