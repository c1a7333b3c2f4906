#!/usr/bin/env bash
# kvsteer demo: three simulated vLLM workers, the indexer (in-memory index) and
# Envoy with the kvsteer filter, all on loopback; then a scripted multi-turn
# workload through Envoy that prints, per request, the worker chosen, the cached
# prompt tokens and the time to first token. Stops everything when done.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$KVSTEER_ROOT"

ensure_local_layout_tools
build_all
# The simulated workers behave like L40S GPUs running a 27B FP8 model.
start_local_layout l40s-27b-fp8 1

log "running a multi-turn workload through Envoy: 4 concurrent conversations, 4 turns each"
"$KVSTEER_BIN/kvsteer-sim" converse --target http://127.0.0.1:8080 --model "$KVSTEER_MODEL" \
  --conversations 4 --turns 4 --seed 7

log "the indexer's view of the workers (GET http://127.0.0.1:9091/debug/workers):"
curl -fsS http://127.0.0.1:9091/debug/workers | python3 -m json.tool | grep -E '"(name|indexed_blocks|prefill_rate)"' || true
stop_local_layout
log "done; logs are in .demo/"
