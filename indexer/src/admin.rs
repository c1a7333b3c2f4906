//! Admin HTTP (axum): `/metrics`, `/healthz`, `/readyz`, `/debug/workers`,
//! `/debug/score` (a dry-run pick of an OpenAI body). `/debug/*` is open,
//! closed (404) or behind a bearer token (`admin.debug`).

use crate::{
    config::{AdminConfig, DebugAccess},
    discovery::watch::DiscoveryStatus,
    index::{Index, redis::lease::LeaseBoard},
    picker::{Mode, PickInput, Picker},
    prompt::Prompt,
    workers::{Origin, Workers},
};
use axum::{
    Json, Router,
    body::Bytes,
    extract::{Request, State},
    http::{HeaderMap, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use kvsteer_tokenize::{ChatRequest, CompletionPrompt};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use std::sync::Arc;

#[derive(Clone)]
pub struct AdminState {
    pub picker: Arc<Picker>,
    pub workers: Arc<Workers>,
    pub index: Index,
    pub registry: Arc<Registry>,
    pub tenant_header: String,
    pub readiness: Readiness,
    /// Write leases (Redis `writer: auto`), shown by `/debug/workers`.
    pub leases: Option<Arc<LeaseBoard>>,
    /// Kubernetes discovery, when configured.
    pub discovery: Option<Arc<DiscoveryStatus>>,
    pub debug: DebugGate,
}

/// Who may call `/debug/*`, with the token resolved.
#[derive(Clone)]
pub enum DebugGate {
    Open,
    Closed,
    /// The bearer token (never logged: `Debug` prints no secret).
    Bearer(Arc<str>),
}

impl std::fmt::Debug for DebugGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Open => "Open",
            Self::Closed => "Closed",
            Self::Bearer(_) => "Bearer(<redacted>)",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DebugTokenError {
    #[error("admin.token_file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("admin.debug is `token` but {0} is empty")]
    Empty(String),
    #[error("admin.debug is `token` but neither admin.token_file nor {env} is set")]
    Missing { env: &'static str },
}

// === impl DebugGate ===

impl DebugGate {
    /// Resolves `admin.debug`; `env` is the value of `ADMIN_TOKEN_ENV`.
    pub fn from_config(cfg: &AdminConfig, env: Option<String>) -> Result<Self, DebugTokenError> {
        let env_name = crate::config::ADMIN_TOKEN_ENV;
        match cfg.debug {
            DebugAccess::Enabled => Ok(Self::Open),
            DebugAccess::Disabled => Ok(Self::Closed),
            DebugAccess::Token => {
                let (token, from) = match (&cfg.token_file, env) {
                    (Some(path), _) => {
                        let text = std::fs::read_to_string(path).map_err(|source| {
                            DebugTokenError::Read {
                                path: path.display().to_string(),
                                source,
                            }
                        })?;
                        (text, path.display().to_string())
                    }
                    (None, Some(value)) => (value, env_name.to_owned()),
                    (None, None) => return Err(DebugTokenError::Missing { env: env_name }),
                };
                let token = token.trim();
                if token.is_empty() {
                    return Err(DebugTokenError::Empty(from));
                }
                Ok(Self::Bearer(Arc::from(token)))
            }
        }
    }

    /// Whether `headers` may call a `/debug/*` endpoint.
    fn admits(&self, headers: &HeaderMap) -> bool {
        match self {
            Self::Open => true,
            Self::Closed => false,
            Self::Bearer(token) => headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .is_some_and(|given| same_secret(given.trim().as_bytes(), token.as_bytes())),
        }
    }
}

/// Compares without stopping at the first difference (the length is not secret).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn guard_debug(State(gate): State<DebugGate>, req: Request, next: Next) -> Response {
    if gate.admits(req.headers()) {
        return next.run(req).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "a bearer token is required for /debug/*\n",
    )
        .into_response()
}

/// When `/readyz` answers 200.
#[derive(Clone)]
pub enum Readiness {
    /// At once: a Redis reader replica applies no events, it serves what
    /// Redis holds.
    Always,
    /// Once an event stream is live (the memory index starts cold).
    Streams,
    /// Once the first lease round ran (Redis reachable or not) and, if this
    /// replica holds leases, one of their streams is live: a replica that
    /// holds none serves what the holders write.
    Leases(Arc<LeaseBoard>),
}

pub fn router(state: AdminState) -> Router {
    let open = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz));
    let debug = Router::new()
        .route("/debug/workers", get(workers))
        .route("/debug/score", post(score))
        .route_layer(middleware::from_fn_with_state(
            state.debug.clone(),
            guard_debug,
        ));
    match state.debug {
        DebugGate::Closed => open,
        DebugGate::Open | DebugGate::Bearer(_) => open.merge(debug),
    }
    .with_state(state)
}

async fn metrics(State(s): State<AdminState>) -> Response {
    s.picker
        .metrics()
        .index_entries
        .set(s.index.entries() as i64);
    let mut out = String::new();
    match prometheus_client::encoding::text::encode(&mut out, &s.registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            out,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn readyz(State(s): State<AdminState>) -> (StatusCode, &'static str) {
    let ready = match &s.readiness {
        Readiness::Always => Ok(()),
        Readiness::Streams if s.workers.any_live() => Ok(()),
        Readiness::Streams => Err("no live event stream yet\n"),
        Readiness::Leases(board) if board.rounds() == 0 => Err("no lease round yet\n"),
        Readiness::Leases(board) => {
            let held: Vec<_> = board
                .managed()
                .into_iter()
                .filter(|w| board.view(*w).is_some_and(|v| v.held))
                .collect();
            let live = held.iter().any(|w| {
                s.workers
                    .by_id(*w)
                    .is_some_and(|w| w.stream.state().is_live())
            });
            if held.is_empty() || live {
                Ok(())
            } else {
                Err("no live event stream for the leases held yet\n")
            }
        }
    };
    match ready {
        Ok(()) => (StatusCode::OK, "ready\n"),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

async fn workers(State(s): State<AdminState>) -> Json<Value> {
    let loads = s.picker.ledger().snapshot();
    let ledger = s.picker.ledger().stats();
    let down_after = s.picker.down_after();
    let list: Vec<Value> = s
        .workers
        .iter()
        .map(|w| {
            let l = loads.get(w.slot).copied().unwrap_or_default();
            let h = w.health.get();
            json!({
                "name": w.cfg.name,
                "endpoint": w.cfg.endpoint,
                "model": w.cfg.model,
                "source": source(&w.origin),
                "adapters": *w.adapters(),
                "retiring": w.is_retired(),
                "stream": {
                    "state": w.stream.state().as_str(),
                    "last_seq": w.stream.last_seq(),
                    "batches": w.stream.batches.load(std::sync::atomic::Ordering::Relaxed),
                    "gaps": w.stream.gaps.load(std::sync::atomic::Ordering::Relaxed),
                    "replayed": w.stream.replayed.load(std::sync::atomic::Ordering::Relaxed),
                    "resets": w.stream.resets.load(std::sync::atomic::Ordering::Relaxed),
                    "lease": s.leases.as_ref().and_then(|b| {
                        let v = b.view(w.id)?;
                        Some(json!({"held": v.held, "holder": v.holder, "replica": b.id()}))
                    }),
                },
                "indexed_blocks": s.index.worker_blocks(w.id),
                "in_flight": l.in_flight,
                "unprefilled_tokens": l.unprefilled_tokens,
                "decoding": l.decoding,
                "up": w.is_up(down_after),
                "scraped": h.load.map(|x| json!({
                    "waiting": x.waiting, "running": x.running, "kv_usage": x.kv_usage,
                })),
                "scrape_error": h.last_error,
                "prefill_rate": l.prefill_rate,
            })
        })
        .collect();
    let discovery = s.discovery.as_ref().map(|d| {
        json!({
            "kind": "kubernetes",
            "namespace": d.namespace,
            "synced": d.synced(),
            "stale": d.is_stale(),
            "last_error": d.last_error(),
        })
    });
    Json(json!({
        "workers": list,
        "discovery": discovery,
        "ledger": {
            "entries": ledger.entries,
            "tombstones": ledger.tombstones,
            "held_blocks": ledger.held_blocks,
            "held_dropped": ledger.held_dropped,
            "expired": ledger.expired,
            "late_picks": ledger.late_picks,
            "tombstones_evicted": ledger.tombstones_evicted,
        },
    }))
}

async fn score(State(s): State<AdminState>, headers: HeaderMap, body: Bytes) -> Response {
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("body is not JSON: {e}")),
    };
    let Some(model) = body.get("model").and_then(Value::as_str) else {
        return bad_request("`model` is required".into());
    };
    let prompt = if body.get("messages").is_some() {
        ChatRequest::from_openai(&body).map(Prompt::Chat)
    } else if body.get("prompt").is_some() {
        CompletionPrompt::from_openai(&body).map(|prompt| Prompt::Completion {
            prompt,
            add_special_tokens: body.get("add_special_tokens").and_then(Value::as_bool),
        })
    } else {
        return bad_request("body has neither `messages` nor `prompt`".into());
    };
    let tenant = headers
        .get(&s.tenant_header)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let input = PickInput {
        request_id: String::new(),
        tenant: tenant.to_owned(),
        model: model.to_owned(),
        prompt: prompt.map_err(|e| e.to_string()),
        cache_salt: body
            .get("cache_salt")
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    let out = s.picker.pick(input, Mode::DryRun).await;
    let workers: Vec<Value> = out
        .candidates
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "endpoint": c.endpoint,
                "matched_tokens": c.matched_tokens,
                "predicted_ttft_ms": c.prediction.ttft_ms,
                "queue_ms": c.prediction.queue_ms,
                "prefill_ms": c.prediction.prefill_ms,
                "in_flight": c.in_flight,
                "queue_age_s": c.queue_age_s,
                "routed_tokens": c.routed_tokens,
                "evicted_tokens": c.prediction.evicted_tokens,
            })
        })
        .collect();
    let d = out.decision;
    Json(json!({
        "policy": d.policy,
        "prompt_tokens": d.prompt_tokens,
        "degraded": d.degraded,
        "reason": d.reason,
        "chosen": (!d.worker.is_empty()).then_some(d.worker),
        "endpoints": out.endpoints,
        "workers": workers,
    }))
    .into_response()
}

/// Where a worker came from, for `/debug/workers`.
fn source(origin: &Origin) -> Value {
    match origin {
        Origin::Static => json!({ "kind": "static" }),
        Origin::Pod {
            namespace,
            name,
            uid,
            ip,
        } => json!({
            "kind": "kubernetes",
            "namespace": namespace,
            "pod": name,
            "uid": uid,
            "pod_ip": ip,
        }),
    }
}

fn bad_request(msg: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "error": msg }))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token_config() -> AdminConfig {
        AdminConfig {
            debug: DebugAccess::Token,
            token_file: None,
        }
    }

    #[test]
    fn token_comes_from_the_environment_without_a_file() {
        let gate = DebugGate::from_config(&token_config(), Some(" tok \n".into())).unwrap();
        let mut headers = HeaderMap::new();
        assert!(!gate.admits(&headers));
        headers.insert(header::AUTHORIZATION, "Bearer tok".parse().unwrap());
        assert!(gate.admits(&headers));
        headers.insert(header::AUTHORIZATION, "Basic tok".parse().unwrap());
        assert!(!gate.admits(&headers));
        assert_eq!(format!("{gate:?}"), "Bearer(<redacted>)");
    }

    #[test]
    fn token_mode_without_a_token_is_refused() {
        let missing = DebugGate::from_config(&token_config(), None).unwrap_err();
        assert!(
            missing.to_string().contains("KVSTEER_ADMIN_TOKEN"),
            "{missing}"
        );
        let empty = DebugGate::from_config(&token_config(), Some("  ".into())).unwrap_err();
        assert!(empty.to_string().contains("is empty"), "{empty}");
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"ab", b"abc"));
        assert!(!same_secret(b"", b"a"));
    }
}
