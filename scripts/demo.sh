#!/usr/bin/env bash
# kvsteer demo: three simulated vLLM workers, the indexer (in-memory index) and
# Envoy with the kvsteer filter, all on loopback; then a scripted multi-turn
# workload through Envoy that prints, per request, the worker chosen, the cached
# prompt tokens and the time to first token. Stops everything when done.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$KVSTEER_ROOT"

ensure_rust
ensure_envoy
ensure_tokenizer
ensure_apt curl:curl
build_all

run=$KVSTEER_ROOT/.demo
mkdir -p "$run"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

wait_http() {
  local url=$1 what=$2
  for _ in $(seq 1 300); do
    curl -fsS -o /dev/null "$url" 2>/dev/null && return 0
    sleep 0.1
  done
  die "$what did not come up (logs in .demo/)"
}

bin=$KVSTEER_ROOT/target/debug
model=Qwen/Qwen3-8B
log "starting three simulated workers (127.0.0.1:8001..8003)"
for i in 1 2 3; do
  "$bin/kvsteer-sim" engine --listen "127.0.0.1:800$i" --served-model-name "$model" \
    --tokenizer .cache/tokenizers/qwen3 \
    --kv-events-endpoint "tcp://127.0.0.1:555$((6 + i))" --replay-endpoint "tcp://127.0.0.1:556$((6 + i))" \
    --profile l40s-27b-fp8 --time-scale 1 --seed "$i" --worker-id "w$i" >"$run/sim-w$i.log" 2>&1 &
  pids+=($!)
done
for i in 1 2 3; do wait_http "http://127.0.0.1:800$i/health" "worker w$i"; done

log "starting the indexer (gRPC 127.0.0.1:9090, admin 127.0.0.1:9091)"
RUST_LOG=info "$bin/kvsteer-indexer" serve --config envoy/local/indexer.yaml >"$run/indexer.log" 2>&1 &
pids+=($!)
wait_http http://127.0.0.1:9091/readyz "the indexer"

log "starting Envoy with the kvsteer filter (127.0.0.1:8080)"
.venv/bin/envoy -c envoy/local/envoy.yaml --disable-hot-restart --log-level warn >"$run/envoy.log" 2>&1 &
pids+=($!)
wait_http http://127.0.0.1:9901/ready "Envoy"

log "running a multi-turn workload through Envoy"
"$bin/kvsteer-sim" converse --target http://127.0.0.1:8080 --model "$model" \
  --conversations 4 --turns 4 --seed 7

log "indexer view of the workers (GET /debug/workers):"
curl -fsS http://127.0.0.1:9091/debug/workers | python3 -m json.tool | head -60 || true
log "done; logs are in .demo/"
