#!/usr/bin/env bash
# The latency kvsteer's filter + indexer add over the same Envoy with plain
# round robin: both Envoys in front of the same three simulated workers (with
# a near-zero step time), requests alternating between them at a fixed rate.
# Extra arguments go to `kvsteer-bench overhead` (e.g. --rate 20 --requests 500).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$KVSTEER_ROOT"

ensure_local_layout_tools
build_all release
# KV caches large enough for every session on every worker: both targets
# then see the same cache state and only the proxy path differs.
KVSTEER_SIM_ARGS="--num-gpu-blocks 32768" RUST_LOG=warn start_local_layout test 1 roundrobin
"$KVSTEER_BIN/kvsteer-bench" overhead --kvsteer http://127.0.0.1:8080 --baseline http://127.0.0.1:8081 \
  --model "$KVSTEER_MODEL" "$@"
stop_local_layout
