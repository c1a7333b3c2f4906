#!/usr/bin/env bash
# The chaos soak of issue 18: the local layout (three simulated workers, the
# indexer on its own Redis, Envoy with the filter) under steady mixed traffic
# while the indexer, a worker and Redis are killed and restarted, a worker
# and the indexer are SIGSTOPped and clients reset mid-pick. Prints the
# results table; exits non-zero when a check fails. See RELIABILITY.md.
#
#   scripts/chaos-soak.sh                  # 10 minutes
#   scripts/chaos-soak.sh --ci             # 60 s of traffic (what a CI run can afford)
#   scripts/chaos-soak.sh --duration 300   # any length; other flags go to kvsteer-chaos
#
# The layout uses fixed ports (8080/9901, 9090/9091, 8001-8003, 5557-5569):
# the soak holds /tmp/kvsteer-e2e.lock like the end-to-end tests (it takes
# the lock itself: running it under another `flock` of that file deadlocks).
# KVSTEER_SOAK_NO_BUILD=1 skips the build (when the caller just built).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$KVSTEER_ROOT"

target=${CARGO_TARGET_DIR:-$KVSTEER_ROOT/target}
if [ "${KVSTEER_SOAK_NO_BUILD:-}" != 1 ]; then
  ensure_rust
  ensure_envoy
  ensure_apt redis-server:redis-server
  build_all
  log "building kvsteer-chaos"
  cargo build --quiet -p kvsteer-e2e --bin kvsteer-chaos
fi

export KVSTEER_ENVOY=${KVSTEER_ENVOY:-$KVSTEER_ROOT/.venv/bin/envoy}
export KVSTEER_BIN_DIR=${KVSTEER_BIN_DIR:-$target/debug}
export KVSTEER_WASM=${KVSTEER_WASM:-$target/wasm32-wasip1/release/kvsteer_filter.wasm}
log "chaos soak ($*)"
exec flock /tmp/kvsteer-e2e.lock "$target/debug/kvsteer-chaos" "$@"
