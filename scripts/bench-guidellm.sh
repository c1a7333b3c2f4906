#!/usr/bin/env bash
# GuideLLM 0.8.1 (the seed's client) against kvsteer's Envoy and against
# Envoy's plain round robin, in front of the same three simulated workers,
# and the virtual twin of the same workload beside it (sim/GUIDELLM.md).
#
#   scripts/bench-guidellm.sh [--rates RPM,…] [--duration-s S] [--out DIR]
#
# Workload: GuideLLM's synthetic text with shared prefixes (12 prefixes of
# 4,000 tokens, 1,500-token questions, 100 output tokens; the sizes of
# bench-peers.sh's shared-prefix workload), Poisson arrivals, chat
# completions, streamed. One `guidellm run` per rate and target, each with
# its own seed (the same seed for both targets at a rate, so both get the
# same prompts), `samples` bounded to the rate × the duration, the workers'
# prefix caches emptied before each run. SLO: TTFT ≤ 8 s (GuideLLM's
# goodput objective, reported as the share of requests within it).
# Defaults: 60,180,240 rpm (light, heavy, past capacity), 300 s each
# (~40 minutes in all; --duration-s 180: ~25). GuideLLM installs torch (~5 GB, into
# .cache/peers/guidellm); kept out of CI.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$KVSTEER_ROOT"

GUIDELLM_VERSION=0.8.1
PROFILE=l40s-27b-fp8
RATES=60,180,240
DURATION_S=300
SEED=${KVSTEER_GUIDELLM_SEED:-1}
OUT=sim/benchmarks/guidellm
while [ $# -gt 0 ]; do
  case $1 in
    --rates) RATES=$2; shift ;;
    --duration-s) DURATION_S=$2; shift ;;
    --out) OUT=$2; shift ;;
    *) die "unknown argument $1 (usage: scripts/bench-guidellm.sh [--rates RPM,…] [--duration-s S] [--out DIR])" ;;
  esac
  shift
done
WORKERS=(http://127.0.0.1:8001 http://127.0.0.1:8002 http://127.0.0.1:8003)
PREFIXES=12 PREFIX_TOKENS=4000 QUESTION_TOKENS=1500 OUTPUT_TOKENS=100
SLO_TTFT_MS=8000

VENV=.cache/peers/guidellm
install_peer guidellm "guidellm==$GUIDELLM_VERSION" guidellm # pulls torch, ~5 GB
ensure_local_layout_tools
build_all release
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# The virtual twin first (seconds): the same sizes, both policies, and as
# many users per group as keep every question fresh (GuideLLM draws a new
# question for every request; the bench cycles its fixed prompts).
max_rpm=$(tr , '\n' <<<"$RATES" | sort -n | tail -1)
users=$(python3 -c "import math; print(math.ceil($max_rpm / 60 * $DURATION_S / $PREFIXES) + 1)")
log "virtual twin: kvsteer and round_robin at $RATES rpm"
"$KVSTEER_BIN/kvsteer-bench" --workload shared-prefix --groups "$PREFIXES" --users-per-group "$users" \
  --prefix-tokens "$PREFIX_TOKENS" --question-tokens "$QUESTION_TOKENS" --output-tokens "$OUTPUT_TOKENS" \
  --policies kvsteer,round_robin --rates "$RATES" --duration-s "$DURATION_S" --workers 3 \
  --profile "$PROFILE" --seed "$SEED" --quiet --out "$OUT/virtual-twin.json"

RUST_LOG=warn start_local_layout "$PROFILE" 1 roundrobin

# Empties every worker's prefix cache, waiting for running requests to end.
reset_workers() {
  local w outcome
  for w in "${WORKERS[@]}"; do
    for _ in $(seq 1 600); do
      outcome=$(curl -fsS -X POST -D - -o /dev/null "$w/reset_prefix_cache" | tr -d '\r' |
        sed -n 's/^x-kvsteer-reset: //Ip')
      [ "$outcome" = cleared ] && continue 2
      sleep 0.5
    done
    die "$w kept blocks in use for 5 minutes"
  done
}

i=0
for rpm in ${RATES//,/ }; do
  i=$((i + 1))
  rps=$(python3 -c "print($rpm / 60)")
  samples=$(python3 -c "print(max(1, round($rpm / 60 * $DURATION_S)))")
  for target in kvsteer=http://127.0.0.1:8080 round_robin=http://127.0.0.1:8081; do
    name=${target%%=*}
    reset_workers
    log "guidellm: $name at $rpm rpm ($samples requests, seed $((SEED * 1000 + i)))"
    HF_HUB_OFFLINE=1 "$VENV/bin/guidellm" run \
      --backend "kind=openai_http,target=${target#*=},model=$KVSTEER_MODEL,request_format=/v1/chat/completions" \
      --profile "kind=poisson,rate=$rps" \
      --data "kind=synthetic_text,prompt_tokens=$QUESTION_TOKENS,output_tokens=$OUTPUT_TOKENS,prefix_count=$PREFIXES,prefix_tokens=$PREFIX_TOKENS" \
      --data-loader "kind=pytorch,samples=$samples" \
      --tokenizer "kind=huggingface_auto,model=$KVSTEER_ROOT/.cache/tokenizers/qwen3" \
      --seed "kind=static,value=$((SEED * 1000 + i))" \
      --metrics "{\"kind\":\"generative\",\"slo\":{\"ttft_ms\":$SLO_TTFT_MS}}" \
      --output "kind=json,path=$OUT/$name-$rpm.json" \
      --disable-console-interactive >"$KVSTEER_RUN/guidellm-$name-$rpm.log" 2>&1 ||
      die "guidellm failed for $name at $rpm rpm (log: $KVSTEER_RUN/guidellm-$name-$rpm.log)"
  done
done
"$VENV/bin/python" scripts/guidellm-table.py "$OUT" "$RATES" "$SLO_TTFT_MS"
log "results in $OUT/"
