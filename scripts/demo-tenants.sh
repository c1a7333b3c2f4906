#!/usr/bin/env bash
# kvsteer tenants demo: the local layout with two tenant policies,
#   team-a  isolation: salted  (its prompts share no cached blocks with anyone)
#   team-b  budget: 4000 tokens a minute (over it: HTTP 429 + Retry-After)
# then a few requests through Envoy showing both. Stops everything when done.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$KVSTEER_ROOT"

ensure_local_layout_tools
build_all
mkdir -p "$KVSTEER_RUN"
# The salt secret: any 16+ bytes, the same on every indexer replica.
python3 -c 'import secrets; print(secrets.token_hex(32))' >"$KVSTEER_RUN/salt-secret"
python3 - "$KVSTEER_RUN" <<'PY'
import sys
run = sys.argv[1]
text = open("envoy/local/indexer.yaml").read()
tenants = f"""tenants:
  salt_secret_file: {run}/salt-secret
  overrides:
    team-a: {{isolation: salted}}
    team-b: {{budget: {{tokens_per_minute: 4000}}}}
"""
assert "tenants:\n" in text
open(f"{run}/indexer-tenants.yaml", "w").write(text.replace("tenants:\n", tenants, 1))
PY
export KVSTEER_INDEXER_CONFIG="$KVSTEER_RUN/indexer-tenants.yaml"
# The tenant header counts only from a trusted hop: here connections from
# 127.0.0.2 (envoy/trusted-hop/envoy.yaml; envoy/jwt/ verifies tokens instead).
export KVSTEER_ENVOY_CONFIG=envoy/trusted-hop/envoy.yaml
start_local_layout tiny-cpu 4

log "one long prompt, sent by team-c (shared), team-a (salted), then team-c again, then team-a again"
python3 - <<'PY'
import http.client, json

def ask(tenant, question, max_tokens=8):
    system = "You are the support assistant.\n" + "".join(
        f"Policy {i}: answer briefly, cite rule {i}.\n" for i in range(120))
    body = json.dumps({"model": "Qwen/Qwen3-8B", "max_tokens": max_tokens, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question}]}).encode()
    # From the trusted hop's address: the tenant header counts.
    conn = http.client.HTTPConnection("127.0.0.1", 8080, timeout=60, source_address=("127.0.0.2", 0))
    conn.request("POST", "/v1/chat/completions", body,
                 {"content-type": "application/json", "x-tenant-id": tenant})
    r = conn.getresponse()
    data = json.load(r)
    if r.status == 200:
        usage = data["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        print(f"  {tenant}: 200 from {r.getheader('x-kvsteer-worker')}, "
              f"{cached} of {usage['prompt_tokens']} prompt tokens cached")
    else:
        err = data["error"]
        print(f"  {tenant}: {r.status} Retry-After={r.getheader('retry-after')} {err['type']}: {err['message']}")
    conn.close()

ask("team-c", "How do I reset my password?")
ask("team-a", "How do I reset my password?")   # salted: nothing of team-c's is a hit
ask("team-c", "And my e-mail address?")         # team-c hits its own prefix
ask("team-a", "And my e-mail address?")         # team-a hits its own (salted) prefix
print("team-b: 4000 tokens a minute, ~1.7k tokens per request (shared: it may hit team-c's prefix)")
for q in ["Where is my invoice?", "And the one before?", "And last year's?"]:
    ask("team-b", q)
PY
log "per-tenant budget metrics (GET http://127.0.0.1:9091/metrics):"
curl -fsS http://127.0.0.1:9091/metrics | grep -E '^kvsteer_tenant_(admitted|rejected)_requests' || true
stop_local_layout
log "done; logs are in .demo/"
