//! Tenants: cache isolation (a `cache_salt` derived from the tenant) and
//! budgets (tokens and requests per minute, requests at once), enforced at
//! the pick.
//!
//! A pick's way: [`Tenancy::check_tenant`] (a tenant value too long is a
//! 400), [`Tenancy::salt`] (salted tenants get their salt before the
//! prompt is keyed, so steering follows the tenant's own prefixes), the
//! pick, then [`Tenancy::admit`] with the prompt's token count: over budget,
//! the answer is a rejection (HTTP 429 with `Retry-After`) and nothing is
//! committed. The admitted cost (prompt tokens + `max_tokens`, or
//! `reserve_output_tokens` when unset) is reserved; the request's terminal
//! report settles it against the usage it reports ([`Tenancy::settle`]).
//! Reservations whose report never comes are settled as cancelled after
//! `in_flight_ttl_s`.

pub mod bucket;
pub mod metrics;
pub mod policy;
pub mod store;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use ring::hmac;

use bucket::{Limit, Verdict};
pub use metrics::TenancyMetrics;
use policy::{Budget, Isolation, TenantPolicy};
use store::{BudgetBackend, BudgetKey, MemoryStore, OnStoreError, RedisStore};

use crate::config::TenantsConfig;

/// Environment variable holding the salt secret (when no file is named).
pub const SALT_SECRET_ENV: &str = "KVSTEER_SALT_SECRET";
/// Shortest salt secret accepted (bytes).
pub const MIN_SECRET_BYTES: usize = 16;
pub const DEFAULT_MAX_TENANT_BYTES: usize = 256;
pub const DEFAULT_RESERVE_OUTPUT_TOKENS: u32 = 256;

#[derive(Debug, thiserror::Error)]
pub enum TenancyError {
    #[error(
        "tenants: a tenant is salted but no secret is set (tenants.salt_secret_file or ${SALT_SECRET_ENV})"
    )]
    NoSecret,
    #[error("tenants.salt_secret_file {path}: {source}")]
    SecretFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("tenants: the salt secret has {0} bytes; at least {MIN_SECRET_BYTES} are required")]
    ShortSecret(usize),
    #[error("tenants.budget_store: {0}")]
    Store(#[from] store::StoreError),
}

/// What a refused pick answers (HTTP status, OpenAI error, `Retry-After`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u32,
    pub message: String,
    pub error_type: &'static str,
    pub retry_after_s: u32,
}

/// How a request ended, for its settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Finished; the usage its response reported, if any.
    Done { used_tokens: Option<u64> },
    /// Gone before the end (client reset, error); usage if reported.
    Cancelled { used_tokens: Option<u64> },
    /// Never went upstream (the pick was not committed): all comes back.
    NotSent,
}

struct Reservation {
    key: BudgetKey,
    budget: Budget,
    cost: u64,
    prompt_tokens: u64,
    in_redis: bool,
    at: Instant,
}

pub struct Tenancy {
    cfg: TenantsConfig,
    secret: Option<hmac::Key>,
    local: MemoryStore,
    redis: Option<RedisStore>,
    reservations: Mutex<HashMap<String, Reservation>>,
    ttl: Duration,
    metrics: TenancyMetrics,
}

// === impl TenantsConfig ===

impl TenantsConfig {
    pub fn salted_anywhere(&self) -> bool {
        self.default.salted_anywhere() || self.overrides.values().any(TenantPolicy::salted_anywhere)
    }

    pub fn budgets_anywhere(&self) -> bool {
        self.budgets().next().is_some()
    }

    /// Every budget with its config path, and every per-model key.
    pub fn budgets(&self) -> impl Iterator<Item = (String, &Budget)> {
        self.default.budgets("tenants.default".to_owned()).chain(
            self.overrides
                .iter()
                .flat_map(|(t, p)| p.budgets(format!("tenants.overrides[{t:?}]"))),
        )
    }

    /// Models named by per-model levels, with their config path.
    pub fn models(&self) -> impl Iterator<Item = (String, &str)> {
        let default = self
            .default
            .models
            .keys()
            .map(|m| ("tenants.default.models".to_owned(), m.as_str()));
        let own = self.overrides.iter().flat_map(|(t, p)| {
            p.models
                .keys()
                .map(move |m| (format!("tenants.overrides[{t:?}].models"), m.as_str()))
        });
        default.chain(own)
    }
}

// === impl Tenancy ===

impl Tenancy {
    /// `redis_url`/`redis_prefix`: the index's, used when the budget store
    /// names none. `in_flight_ttl`: how long a reservation waits for its report.
    pub fn new(
        cfg: TenantsConfig,
        redis_url: Option<&str>,
        redis_prefix: &str,
        in_flight_ttl: Duration,
        metrics: TenancyMetrics,
    ) -> Result<Self, TenancyError> {
        let secret = if cfg.salted_anywhere() {
            Some(load_secret(cfg.salt_secret_file.as_deref())?)
        } else {
            None
        };
        let redis = match cfg.budget_store.backend {
            BudgetBackend::Memory => None,
            BudgetBackend::Redis => {
                let s = &cfg.budget_store;
                let url = if s.url.is_empty() {
                    redis_url.unwrap_or("redis://127.0.0.1:6379")
                } else {
                    &s.url
                };
                let prefix = if s.key_prefix.is_empty() {
                    redis_prefix
                } else {
                    &s.key_prefix
                };
                Some(RedisStore::new(
                    url,
                    prefix,
                    Duration::from_millis(s.timeout_ms),
                )?)
            }
        };
        Ok(Self {
            cfg,
            secret,
            local: MemoryStore::default(),
            redis,
            reservations: Mutex::new(HashMap::new()),
            ttl: in_flight_ttl,
            metrics,
        })
    }

    /// No isolation, no budgets (tests and benchmarks).
    pub fn disabled(metrics: TenancyMetrics) -> Self {
        Self {
            cfg: TenantsConfig::default(),
            secret: None,
            local: MemoryStore::default(),
            redis: None,
            reservations: Mutex::new(HashMap::new()),
            ttl: Duration::from_secs(600),
            metrics,
        }
    }

    /// A tenant value the indexer accepts; the refusal otherwise.
    pub fn check_tenant(&self, tenant: &str) -> Result<(), Refusal> {
        if tenant.len() <= self.cfg.max_tenant_bytes {
            return Ok(());
        }
        self.metrics.refused("other", "invalid_tenant", 0);
        Err(Refusal {
            status: 400,
            message: format!(
                "tenant: {} bytes, longer than the {} accepted",
                tenant.len(),
                self.cfg.max_tenant_bytes
            ),
            error_type: "invalid_request_error",
            retry_after_s: 0,
        })
    }

    /// The `cache_salt` this request gets: the tenant's when it is salted
    /// and the client set none of its own.
    pub fn salt(&self, tenant: &str, model: &str, client_salt: Option<&str>) -> Option<String> {
        if client_salt.is_some_and(|s| !s.is_empty()) {
            return None;
        }
        let key = self.secret.as_ref()?;
        let resolved = policy::resolve(&self.cfg.default, &self.cfg.overrides, tenant, model);
        (resolved.isolation == Isolation::Salted).then(|| derive_salt(key, tenant))
    }

    /// Admits `request_id` against its tenant's budget, reserving its cost.
    pub async fn admit(
        &self,
        request_id: &str,
        tenant: &str,
        model: &str,
        prompt_tokens: u32,
        max_tokens: Option<u32>,
    ) -> Result<(), Refusal> {
        let resolved = policy::resolve(&self.cfg.default, &self.cfg.overrides, tenant, model);
        let Some((budget, scope)) = resolved.budget else {
            return Ok(());
        };
        let key = BudgetKey {
            tenant: tenant.to_owned(),
            scope,
        };
        let output = max_tokens.unwrap_or(self.cfg.reserve_output_tokens);
        let cost = u64::from(prompt_tokens) + u64::from(output);
        let label = self.metrics.label(tenant);
        let (verdict, in_redis) = match &self.redis {
            None => (
                self.local.admit(&key, &budget, cost, store::now_ms()),
                false,
            ),
            Some(redis) => match redis.admit(&key, &budget, cost, request_id, self.ttl).await {
                Ok(v) => (v, true),
                Err(e) => match self.cfg.budget_store.on_error {
                    OnStoreError::FailOpen => {
                        tracing::warn!(error = %e, "budget store unavailable: admitting");
                        self.metrics.store_error("fail_open");
                        return Ok(());
                    }
                    OnStoreError::Local => {
                        tracing::warn!(error = %e, "budget store unavailable: this replica's budget");
                        self.metrics.store_error("local");
                        (
                            self.local.admit(&key, &budget, cost, store::now_ms()),
                            false,
                        )
                    }
                },
            },
        };
        match verdict {
            Verdict::Admit { tokens_left } => {
                self.metrics.admitted(&label, cost, tokens_left);
                let mut reservations = self.reservations.lock();
                reservations.insert(
                    request_id.to_owned(),
                    Reservation {
                        key,
                        budget,
                        cost,
                        prompt_tokens: u64::from(prompt_tokens),
                        in_redis,
                        at: Instant::now(),
                    },
                );
                self.metrics.reservations.set(reservations.len() as i64);
                Ok(())
            }
            Verdict::Reject {
                limit,
                retry_after_ms,
            } => {
                self.metrics.refused(&label, limit.as_str(), cost);
                Err(refusal(tenant, &budget, limit, cost, retry_after_ms))
            }
        }
    }

    /// Settles the reservation of `request_id` (unknown ids: nothing).
    pub async fn settle(&self, request_id: &str, ending: Ending) {
        let r = {
            let mut reservations = self.reservations.lock();
            let Some(r) = reservations.remove(request_id) else {
                return;
            };
            self.metrics.reservations.set(reservations.len() as i64);
            r
        };
        // Without usage: a finished request keeps its whole reservation; a
        // cancelled one pays its prompt (its output is unknown and was cut).
        let used = match ending {
            Ending::Done { used_tokens } => used_tokens.unwrap_or(r.cost),
            Ending::Cancelled { used_tokens } => used_tokens.unwrap_or(r.prompt_tokens),
            Ending::NotSent => 0,
        };
        let label = self.metrics.label(&r.key.tenant);
        if !matches!(ending, Ending::NotSent) {
            self.metrics.used(&label, used);
        }
        let refund = r.cost as f64 - used as f64;
        let left = match (&self.redis, r.in_redis) {
            (Some(redis), true) => {
                match redis.settle(&r.key, &r.budget, refund, request_id).await {
                    Ok(left) => left,
                    Err(e) => {
                        // The in-flight entry expires in Redis; the tokens stay taken.
                        tracing::debug!(error = %e, "budget settlement failed");
                        self.metrics.store_error("settle");
                        None
                    }
                }
            }
            _ => self
                .local
                .settle(&r.key, &r.budget, refund, store::now_ms()),
        };
        self.metrics.remaining(&label, left);
    }

    /// Settles reservations older than the in-flight TTL (their report
    /// never came) as cancelled without usage: the prompt stays spent, the
    /// output reservation comes back, the concurrency slot is freed.
    pub async fn expire(&self, now: Instant) {
        let expired: Vec<String> = self
            .reservations
            .lock()
            .iter()
            .filter(|(_, r)| now.duration_since(r.at) >= self.ttl)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.settle(&id, Ending::Cancelled { used_tokens: None })
                .await;
        }
    }

    pub fn reservations(&self) -> usize {
        self.reservations.lock().len()
    }

    pub fn budgets_enabled(&self) -> bool {
        self.cfg.budgets_anywhere()
    }
}

fn refusal(tenant: &str, b: &Budget, limit: Limit, cost: u64, retry_after_ms: u64) -> Refusal {
    let message = match limit {
        Limit::TooLarge => format!(
            "Request too large for tenant {tenant:?}: it needs {cost} tokens (prompt + max_tokens), the limit is {} tokens per minute.",
            b.tokens_per_minute.unwrap_or(0)
        ),
        Limit::Tokens => format!(
            "Rate limit reached for tenant {tenant:?} on tokens per minute: limit {}, requested {cost}. Please try again later.",
            b.tokens_per_minute.unwrap_or(0)
        ),
        Limit::Requests => format!(
            "Rate limit reached for tenant {tenant:?} on requests per minute: limit {}. Please try again later.",
            b.requests_per_minute.unwrap_or(0)
        ),
        Limit::Concurrency => format!(
            "Too many concurrent requests for tenant {tenant:?}: limit {}. Please try again later.",
            b.max_concurrent.unwrap_or(0)
        ),
    };
    Refusal {
        status: 429,
        message,
        error_type: "rate_limit_error",
        retry_after_s: retry_after_ms.div_ceil(1000).min(u64::from(u32::MAX)) as u32,
    }
}

/// The salt of `tenant`: HMAC-SHA256 under the secret, 128 bits in hex.
/// Without the secret it cannot be computed, so no client can name another
/// tenant's salt.
fn derive_salt(key: &hmac::Key, tenant: &str) -> String {
    let tag = hmac::sign(key, format!("kvsteer-cache-salt\0{tenant}").as_bytes());
    let hex: String = tag.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("kvsteer-{hex}")
}

fn load_secret(file: Option<&std::path::Path>) -> Result<hmac::Key, TenancyError> {
    let bytes = match file {
        Some(path) => std::fs::read(path).map_err(|source| TenancyError::SecretFile {
            path: path.to_owned(),
            source,
        })?,
        None => std::env::var(SALT_SECRET_ENV)
            .map_err(|_| TenancyError::NoSecret)?
            .into_bytes(),
    };
    let trimmed = bytes.trim_ascii();
    if trimmed.len() < MIN_SECRET_BYTES {
        return Err(TenancyError::ShortSecret(trimmed.len()));
    }
    Ok(hmac::Key::new(hmac::HMAC_SHA256, trimmed))
}

#[cfg(test)]
mod tests;
