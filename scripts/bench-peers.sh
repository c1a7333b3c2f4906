#!/usr/bin/env bash
# kvsteer live against the real peer routers, in front of the same simulated
# workers: SGLang's router (sglang-router, `smg`, cache_aware), vLLM's router
# (vllm-router, cache_aware and kv_aware on the workers' KV events) and Envoy's
# plain round robin. Every target gets the same seeded arrivals with the
# workers' prefix caches emptied before its run; requests are streamed chat
# completions with text prompts (so every router takes them), TTFT is measured
# at the client (`kvsteer-bench --live --chat`).
#
#   scripts/bench-peers.sh [--quick] [--workloads LIST] [--targets LIST] [--rounds N] [--records] [--out DIR]
#   scripts/bench-peers.sh --overhead [--prompt-tokens N] [--targets LIST] [--rounds N]
#
# Without --quick: three workloads (shared-prefix, mixed, multi-turn; or the
# comma-separated LIST of them; --targets: a subset of kvsteer,
# sglang_cache_aware, vllm_cache_aware, vllm_kv_aware, round_robin), from a light rate to past capacity
# (BENCHMARKS.md, "Live against the peers"); ~65 minutes. --quick: shared-prefix at one rate for 30 s (~3 minutes).
# Results: DIR/<workload>.json (+ PNG plots beside it) and a table on stdout.
# --rounds N: every target runs N times at each rate (taking turns), and the
# comparison is on the median of its runs; the spread of each target's runs
# is printed too. One run is noisy past the knee (BENCHMARKS.md, "How far the
# targets reach"); each round adds the time of a whole run. --records: every
# run's requests, one JSON line each, in DIR/records/ (which requests make a tail).
# Every router is restarted before each of its runs (the bench's --before-run
# calls this script with --restart), as the workers' caches are emptied: no
# run inherits what a router learned in the runs before it.
# --overhead: the latency each router adds at light load, against the same
# request sent straight to a worker (workers with a near-zero step time,
# `kvsteer-bench overhead`, 1,000-token chat prompts or --prompt-tokens N,
# 10 requests/s); with --rounds N the targets take turns N times (runs drift
# by as much as the routers differ, so compare targets within a round) and a
# summary of every round's added p50 ends the output.
# Routers install into .cache/peers/ (own venvs, ~150 MB each, no torch).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$KVSTEER_ROOT"

SGLANG_ROUTER_VERSION=0.3.2
VLLM_ROUTER_VERSION=0.1.17
OUT=sim/benchmarks/peers
QUICK=0
OVERHEAD=0
OVERHEAD_TOKENS=
WORKLOADS=shared-prefix,mixed,multi-turn
ONLY_TARGETS=
ROUNDS=1
RECORDS=0
RESTART=0
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 ;;
    --overhead) OVERHEAD=1 ;;
    --prompt-tokens) OVERHEAD_TOKENS=$2; shift ;;
    --out) OUT=$2; shift ;;
    --workloads) WORKLOADS=$2; shift ;;
    --targets) ONLY_TARGETS=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --records) RECORDS=1 ;;
    --restart) RESTART=1 ;;
    *) die "unknown argument $1 (usage: scripts/bench-peers.sh [--quick] [--workloads LIST] [--targets LIST] [--rounds N] [--records] [--out DIR] | --overhead [--prompt-tokens N] [--targets LIST] [--rounds N])" ;;
  esac
  shift
done
if [ -n "$OVERHEAD_TOKENS" ]; then
  [ "$OVERHEAD" = 1 ] || die "--prompt-tokens goes with --overhead"
  [[ $OVERHEAD_TOKENS =~ ^[1-9][0-9]*$ ]] || die "--prompt-tokens takes a positive number of tokens, not '$OVERHEAD_TOKENS'"
fi
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "--rounds takes a whole number of at least 1, not '$ROUNDS'"

# The workers: three, L40S profile with a 27B FP8 model, compressed in time
# by TIME_SCALE (engines run that much faster; the bench scales its clock
# alike, so figures read in the profile's seconds). vLLM's block hashes
# (sha256_cbor) so that vllm-router's kv_aware can match its events.
PROFILE=l40s-27b-fp8
TIME_SCALE=${KVSTEER_PEERS_TIME_SCALE:-2}
SEED=${KVSTEER_PEERS_SEED:-1}
WORKERS=(http://127.0.0.1:8001 http://127.0.0.1:8002 http://127.0.0.1:8003)
EVENTS=(tcp://127.0.0.1:5557 tcp://127.0.0.1:5558 tcp://127.0.0.1:5559)
REPLAYS=(tcp://127.0.0.1:5567 tcp://127.0.0.1:5568 tcp://127.0.0.1:5569)
SGLANG_PORT=30001
VLLM_CACHE_PORT=30002
VLLM_KV_PORT=30003

# --restart (the bench's --before-run hook, run before each target's run):
# restarts the router of the target $KVSTEER_BENCH_TARGET and waits until it
# is ready again. Envoy's round robin keeps no memory.
if [ "$RESTART" = 1 ]; then
  case ${KVSTEER_BENCH_TARGET:?--restart is run by the bench, which names the target} in
    kvsteer) restart_supervised indexer http://127.0.0.1:9091/readyz ;;
    sglang_cache_aware) restart_supervised sglang-router "http://127.0.0.1:$SGLANG_PORT/readiness" ;;
    vllm_cache_aware) restart_supervised vllm-router-cache "http://127.0.0.1:$VLLM_CACHE_PORT/health" ;;
    vllm_kv_aware) restart_supervised vllm-router-kv "http://127.0.0.1:$VLLM_KV_PORT/health" ;;
    round_robin) ;;
    *) die "--restart: no router is named $KVSTEER_BENCH_TARGET" ;;
  esac
  exit 0
fi

# time_scaled_config BASE SCALE OUT: BASE (an indexer configuration with a
# top-level `scoring:` section) with kvsteer's time knobs for workers SCALE
# times faster than their profile. BASE must not set those knobs itself.
time_scaled_config() {
  python3 - "$1" "$2" "$3" <<'EOF' || die "cannot write a time-scaled indexer configuration from $1"
import sys
base, scale, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
lines = open(base).read().splitlines()
knobs = {  # indexer defaults (indexer/src/config), compressed by the scale
    "route_window_s": max(1, round(60 / scale)),
    "placement_window_s": max(1, round(600 / scale)),
    "lasting_queue_s": 10 / scale,
    "decode_ms_per_running": 0.5 / scale,
    "prefill_rate_prior": 8000 * scale,
}
scrape_ms = max(1, round(1000 / scale))
text = "\n".join(lines)
for k in list(knobs) + ["interval_ms", "scrape:"]:
    if k in text:
        sys.exit(f"{base} already sets {k.rstrip(':')}: give a configuration without it")
if "scoring:" not in lines:
    sys.exit(f"{base} has no top-level scoring: section")
at = lines.index("scoring:") + 1
lines[at:at] = [f"  {k}: {v}" for k, v in knobs.items()]
lines += ["scrape:", f"  interval_ms: {scrape_ms}"]
header = f"# {base}, time knobs for workers {scale:g}x faster than their profile (scripts/bench-peers.sh)"
open(out, "w").write(header + "\n" + "\n".join(lines) + "\n")
EOF
}

# Dies naming the process when a port the routers need is taken (a router
# left over from an earlier run would otherwise fail with its reason only in
# its log).
ports_free() {
  local port holder
  for port in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      holder=$(ss -ltnpH "sport = :$port" 2>/dev/null | grep -o 'users:(([^)]*' | head -1 || true)
      die "127.0.0.1:$port is taken${holder:+ by ${holder#users:((}}: stop it first (a router from an earlier run?)"
    fi
  done
}

start_peers() {
  local w args=()
  ports_free "$SGLANG_PORT" "$VLLM_CACHE_PORT" "$VLLM_KV_PORT" 30011 30012 30013
  log "starting sglang-router $SGLANG_ROUTER_VERSION (cache_aware, 127.0.0.1:$SGLANG_PORT)"
  supervise sglang-router .cache/peers/sglang/bin/smg launch --host 127.0.0.1 --port "$SGLANG_PORT" \
    --worker-urls "${WORKERS[@]}" --policy cache_aware --prometheus-host 127.0.0.1 --prometheus-port 30011
  log "starting vllm-router $VLLM_ROUTER_VERSION (cache_aware, 127.0.0.1:$VLLM_CACHE_PORT)"
  supervise vllm-router-cache .cache/peers/vllm-router/bin/vllm-router --host 127.0.0.1 --port "$VLLM_CACHE_PORT" \
    --worker-urls "${WORKERS[@]}" --policy cache_aware \
    --prometheus-host 127.0.0.1 --prometheus-port 30012
  for w in 0 1 2; do
    args+=(--kv-event-source "${WORKERS[$w]}=${EVENTS[$w]}" --kv-event-replay-source "${WORKERS[$w]}=${REPLAYS[$w]}")
  done
  log "starting vllm-router $VLLM_ROUTER_VERSION (kv_aware on the workers' KV events, 127.0.0.1:$VLLM_KV_PORT)"
  supervise vllm-router-kv .cache/peers/vllm-router/bin/vllm-router --host 127.0.0.1 --port "$VLLM_KV_PORT" \
    --worker-urls "${WORKERS[@]}" --policy kv_aware "${args[@]}" --kv-event-model "$KVSTEER_MODEL" \
    --prometheus-host 127.0.0.1 --prometheus-port 30013
  wait_http "http://127.0.0.1:$SGLANG_PORT/readiness" "sglang-router"
  wait_http "http://127.0.0.1:$VLLM_CACHE_PORT/health" "vllm-router (cache_aware)"
  wait_http "http://127.0.0.1:$VLLM_KV_PORT/health" "vllm-router (kv_aware)"
}

# The targets (--targets: a subset), for the live runs and --overhead alike.
TARGETS=(
  kvsteer=http://127.0.0.1:8080
  sglang_cache_aware=http://127.0.0.1:$SGLANG_PORT
  vllm_cache_aware=http://127.0.0.1:$VLLM_CACHE_PORT
  vllm_kv_aware=http://127.0.0.1:$VLLM_KV_PORT
  round_robin=http://127.0.0.1:8081
)
if [ -n "$ONLY_TARGETS" ]; then
  chosen=()
  for t in "${TARGETS[@]}"; do
    case ",$ONLY_TARGETS," in *",${t%%=*},"*) chosen+=("$t") ;; esac
  done
  [ ${#chosen[@]} -gt 0 ] || die "--targets $ONLY_TARGETS names none of: ${TARGETS[*]%%=*}"
  TARGETS=("${chosen[@]}")
fi

ensure_local_layout_tools
install_peer sglang "sglang-router==$SGLANG_ROUTER_VERSION" smg
install_peer vllm-router "vllm-router==$VLLM_ROUTER_VERSION" vllm-router
build_all release
if [ "$OVERHEAD" = 1 ]; then
  # KV caches large enough for every session: every target sees warm caches.
  RUST_LOG=warn KVSTEER_SIM_ARGS="--num-gpu-blocks 32768 --prefix-caching-hash-algo sha256_cbor" \
    start_local_layout test 1 roundrobin
  start_peers
  summary=()
  for round in $(seq 1 "$ROUNDS"); do
    for t in "${TARGETS[@]}"; do
      log "overhead, round $round of $ROUNDS: ${t%%=*} against the worker directly"
      # Shown as it comes (tee; appending, so a log file that stderr goes
      # to is not truncated each round) and kept for the summary; a failed
      # run stops the script, as a failed target should.
      out=$("$KVSTEER_BIN/kvsteer-bench" overhead --kvsteer "${t#*=}" --baseline "${WORKERS[0]}" \
        --model "$KVSTEER_MODEL" --prompt-tokens "${OVERHEAD_TOKENS:-1000}" --rate 10 --requests 300 | tee -a /dev/stderr)
      # The table row: rate, tokens, then p50/p99 through it, direct, added.
      summary+=("$(awk -v r="$round" -v n="${t%%=*}" '$1 ~ /^[0-9.]+$/ && NF >= 13 {
        printf "round %s  %-20s added p50 %s ms  p99 %s ms  failed %s\n", r, n, $11, $13, $15 }' <<<"$out")")
    done
  done
  log "added latency, every round (p50 over a direct request to a worker)"
  printf '%s\n' "${summary[@]}"
  exit 0
fi
# kvsteer's clocks run in wall time, the workers TIME_SCALE times faster than
# the profile: its time knobs are compressed alike, as they run in profile
# seconds in the virtual twin (windows, lasting-queue age, scrape interval and
# decode time per running request divided by TIME_SCALE, the prefill-rate
# prior multiplied by it). Without this, at scale 2 a 10 s burst of the
# profile counted as a 5 s one and the route window reached back 120 s.
mkdir -p "$OUT"
if [ "$TIME_SCALE" != 1 ]; then
  time_scaled_config "${KVSTEER_INDEXER_CONFIG:-envoy/local/indexer.yaml}" "$TIME_SCALE" "$OUT/indexer.yaml"
  export KVSTEER_INDEXER_CONFIG=$OUT/indexer.yaml
fi
RUST_LOG=warn KVSTEER_RESTARTABLE=1 KVSTEER_SIM_ARGS="--prefix-caching-hash-algo sha256_cbor" \
  start_local_layout "$PROFILE" "$TIME_SCALE" roundrobin
start_peers


# run NAME RATES BENCH-ARGS…: one workload, every target at every rate.
run() {
  local name=$1 rates=$2 records=()
  shift 2
  [ "$RECORDS" = 0 ] || records=(--records "$OUT/records")
  log "live: $name at $rates rpm against ${#TARGETS[@]} targets"
  "$KVSTEER_BIN/kvsteer-bench" --live --chat --tokenizer .cache/tokenizers/qwen3 \
    --live-time-scale "$TIME_SCALE" --model "$KVSTEER_MODEL" --target "${TARGETS[@]}" \
    --reset-worker "${WORKERS[@]}" --workers 3 --profile "$PROFILE" --seed "$SEED" \
    --rates "$rates" --repeats "$ROUNDS" "${records[@]}" --out "$OUT/$name.json" \
    --before-run "$(printf '%q' "$KVSTEER_ROOT/scripts/bench-peers.sh") --restart" "$@"
}

# Sizes and rates: 3 workers of this profile serve ~190-200 rpm of SHARED
# (virtual time); light, heavy (the best peer's p90 several times its light
# figure) and past capacity. BENCHMARKS.md "Live against the peers".
SHARED=(--workload shared-prefix --groups 12 --users-per-group 8 --prefix-tokens 4000 --question-tokens 1500 --output-tokens 100)
MULTI=(--workload multi-turn)
MIXED=(--workload mixed)
if [ "$QUICK" = 1 ]; then
  run shared-prefix-quick 60 "${SHARED[@]}" --duration-s 30
else
  for w in ${WORKLOADS//,/ }; do
    case $w in
      shared-prefix) run shared-prefix "${PEERS_SHARED_RATES:-60,180,240}" "${SHARED[@]}" --duration-s 120 ;;
      mixed) run mixed "${PEERS_MIXED_RATES:-60,120,150}" "${MIXED[@]}" --duration-s 120 ;;
      # Closed-loop sessions build up over minutes: 600 s (8 rpm is light,
      # 24 rpm past the knee in virtual time). BENCHMARKS.md's figures ran
      # it alone at KVSTEER_PEERS_TIME_SCALE=4.
      multi-turn) run multi-turn "${PEERS_MULTI_RATES:-8,24}" "${MULTI[@]}" --duration-s 600 ;;
      *) die "unknown workload $w (shared-prefix, mixed, multi-turn)" ;;
    esac
  done
fi
log "results in $OUT/"
