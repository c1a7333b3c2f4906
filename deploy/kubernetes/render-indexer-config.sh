#!/usr/bin/env bash
# Rewrites the `workers:` list of the indexer's ConfigMap from the vLLM pods
# that exist now (name + pod IP), then restarts the indexer so it loads it.
# The indexer reads its worker list once at start; run this after scaling the
# StatefulSet or after any worker pod was recreated (its IP changed).
#
#   deploy/kubernetes/render-indexer-config.sh            # apply + restart
#   DRY_RUN=1 deploy/kubernetes/render-indexer-config.sh  # print indexer.yaml only
#
# Everything but `workers:` is kept as it is in the ConfigMap. IPv4 pod IPs
# are assumed (the default event topic is kv@<ip>:<port>@<model>).
set -euo pipefail

NAMESPACE=${NAMESPACE:-kvsteer}
STATEFULSET=${STATEFULSET:-vllm-qwen3}          # also the headless Service name
MODEL=${MODEL:-Qwen/Qwen3-8B}
PORT=${PORT:-8000}
EVENTS_PORT=${EVENTS_PORT:-5557}
REPLAY_PORT=${REPLAY_PORT:-5558}
CONFIGMAP=${CONFIGMAP:-kvsteer-indexer-config}
DEPLOYMENT=${DEPLOYMENT:-kvsteer-indexer}
DRY_RUN=${DRY_RUN:-0}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

kubectl -n "$NAMESPACE" get configmap "$CONFIGMAP" -o jsonpath='{.data.indexer\.yaml}' >"$work/current.yaml"
grep -q '^workers:' "$work/current.yaml" || {
  echo "ConfigMap $CONFIGMAP has no top-level workers: key" >&2
  exit 1
}

kubectl -n "$NAMESPACE" get pods -l "app.kubernetes.io/name=$STATEFULSET" \
  -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.podIP}{"\n"}{end}' |
  sort -V >"$work/pods"

{
  echo "workers:"
  count=0
  while read -r name ip; do
    [ -n "$name" ] || continue
    if [ -z "${ip:-}" ]; then
      echo "warning: $name has no pod IP yet; left out (run again once it is scheduled)" >&2
      continue
    fi
    host="$name.$STATEFULSET.$NAMESPACE.svc.cluster.local"
    cat <<EOF
  - name: $name
    endpoint: $ip:$PORT
    model: $MODEL
    kv_events: tcp://$host:$EVENTS_PORT
    replay: tcp://$host:$REPLAY_PORT
    metrics: http://$host:$PORT/metrics
EOF
    count=$((count + 1))
  done <"$work/pods"
  [ "$count" -gt 0 ] || {
    echo "no pod of $STATEFULSET has an IP" >&2
    exit 1
  }
  echo
} >"$work/workers.yaml"

# Replace the old workers block (up to the next top-level key) with the new one.
awk -v block="$work/workers.yaml" '
  /^workers:/ { while ((getline line < block) > 0) print line; skipping = 1; next }
  skipping && /^[^[:space:]#]/ { skipping = 0 }
  !skipping { print }
' "$work/current.yaml" >"$work/indexer.yaml"

if command -v kvsteer-indexer >/dev/null; then
  kvsteer-indexer check-config --config "$work/indexer.yaml" >/dev/null
fi

if [ "$DRY_RUN" = 1 ]; then
  cat "$work/indexer.yaml"
  exit 0
fi

kubectl -n "$NAMESPACE" create configmap "$CONFIGMAP" \
  --from-file=indexer.yaml="$work/indexer.yaml" --dry-run=client -o yaml |
  kubectl label --local -f - -o yaml \
    app.kubernetes.io/name=kvsteer-indexer app.kubernetes.io/part-of=kvsteer |
  kubectl apply -f -
kubectl -n "$NAMESPACE" rollout restart "deployment/$DEPLOYMENT"
kubectl -n "$NAMESPACE" rollout status "deployment/$DEPLOYMENT" --timeout=5m
