//! Where budgets live: in this process, or in Redis shared by every indexer
//! replica (one script call per admission and per settlement, atomic).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{RedisError, Script};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::bucket::{Buckets, Limit, Verdict};
use super::policy::{Budget, BudgetScope};

/// Budgets kept in memory before idle ones are swept.
const SWEEP_ABOVE: usize = 4_096;

/// Admission in Redis, the same arithmetic as [`Buckets::admit`]. KEYS[1]
/// the buckets hash (`t` tokens, `r` requests, `u` updated ms), KEYS[2] the
/// in-flight set (request id → expiry ms). ARGV: tpm, rpm, max concurrent
/// (0: no limit), cost, request id, in-flight ttl ms. Redis's own clock
/// (TIME) is the one clock of every replica. Returns
/// `{admitted, limit, retry_after_ms, tokens_left (floor, or -1 without tpm)}`.
pub const REDIS_ADMIT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tpm, rpm, maxc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cost, id, ttl = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local h = redis.call('HMGET', KEYS[1], 't', 'r', 'u')
local tok, req, upd = tonumber(h[1]) or tpm, tonumber(h[2]) or rpm, tonumber(h[3]) or now
local el = math.max(0, now - upd)
if tpm > 0 then tok = math.min(tpm, tok + el * tpm / 60000) end
if rpm > 0 then req = math.min(rpm, req + el * rpm / 60000) end
if tpm > 0 and cost > tpm then return {0, 'too_large', 0, math.floor(tok)} end
local limit, wait = '', -1
if tpm > 0 and tok < cost then
  limit, wait = 'tokens', math.max(1, math.ceil((cost - tok) * 60000 / tpm))
end
if rpm > 0 and req < 1 then
  local w = math.max(1, math.ceil((1 - req) * 60000 / rpm))
  if w > wait then limit, wait = 'requests', w end
end
if maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= maxc and 1000 > wait then limit, wait = 'concurrency', 1000 end
end
if limit ~= '' then return {0, limit, wait, math.floor(tok)} end
if tpm > 0 then tok = tok - cost end
if rpm > 0 then req = req - 1 end
redis.call('HSET', KEYS[1], 't', tostring(tok), 'r', tostring(req), 'u', now)
local debt = 0
if tpm > 0 and tok < 0 then debt = -tok * 60000 / tpm end
redis.call('PEXPIRE', KEYS[1], 60000 + math.ceil(debt) + 1000)
redis.call('ZADD', KEYS[2], now + ttl, id)
redis.call('PEXPIRE', KEYS[2], ttl)
if tpm > 0 then return {1, '', 0, math.floor(tok)} end
return {1, '', 0, -1}
"#;

/// Settlement in Redis, as [`Buckets::settle`]. KEYS as [`REDIS_ADMIT`];
/// ARGV: tpm, rpm, refund (tokens back; negative takes), request id.
/// Returns the tokens left (floor, -1 without tpm).
pub const REDIS_SETTLE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tpm, rpm, refund, id = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
redis.call('ZREM', KEYS[2], id)
if tpm == 0 then return -1 end
local h = redis.call('HMGET', KEYS[1], 't', 'r', 'u')
local tok, req, upd = tonumber(h[1]) or tpm, tonumber(h[2]) or rpm, tonumber(h[3]) or now
local el = math.max(0, now - upd)
tok = math.min(tpm, math.min(tpm, tok + el * tpm / 60000) + refund)
if rpm > 0 then req = math.min(rpm, req + el * rpm / 60000) end
redis.call('HSET', KEYS[1], 't', tostring(tok), 'r', tostring(req), 'u', now)
local debt = 0
if tok < 0 then debt = -tok * 60000 / tpm end
redis.call('PEXPIRE', KEYS[1], 60000 + math.ceil(debt) + 1000)
return math.floor(tok)
"#;

/// `tenants.budget_store`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetStoreConfig {
    pub backend: BudgetBackend,
    /// Redis URL; empty: the index's (`index.redis.url`).
    pub url: String,
    /// First component of every key; empty: the index's key prefix.
    pub key_prefix: String,
    /// Bound on each script call.
    pub timeout_ms: u64,
    /// What a pick does while Redis cannot answer.
    pub on_error: OnStoreError,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetBackend {
    /// Per replica: each indexer replica enforces the whole budget alone.
    #[default]
    Memory,
    /// Shared by every replica.
    Redis,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// Admit (and count the error).
    #[default]
    FailOpen,
    /// Enforce the budget in this replica's memory until Redis answers.
    Local,
}

impl Default for BudgetStoreConfig {
    fn default() -> Self {
        Self {
            backend: BudgetBackend::Memory,
            url: String::new(),
            key_prefix: String::new(),
            timeout_ms: 50,
            on_error: OnStoreError::FailOpen,
        }
    }
}

/// One budget's identity: whose, and over which models.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BudgetKey {
    pub tenant: String,
    pub scope: BudgetScope,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    #[error("redis: no answer within {0:?}")]
    Timeout(Duration),
    #[error("redis: unexpected reply {0:?}")]
    Reply(String),
}

/// Budgets in this process.
#[derive(Default)]
pub struct MemoryStore {
    buckets: Mutex<HashMap<BudgetKey, (Budget, Buckets)>>,
}

/// Budgets in Redis.
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    timeout: Duration,
    admit: Script,
    settle: Script,
}

// === impl MemoryStore ===

impl MemoryStore {
    pub fn admit(&self, key: &BudgetKey, b: &Budget, cost: u64, now: u64) -> Verdict {
        let mut map = self.buckets.lock();
        if map.len() > SWEEP_ABOVE {
            map.retain(|_, (b, s)| !s.idle(b, now));
        }
        let (_, state) = map
            .entry(key.clone())
            .or_insert_with(|| (*b, Buckets::full(b, now)));
        state.admit(b, cost, now)
    }

    /// Tokens left after the settlement (`None`: no token limit or unknown).
    pub fn settle(&self, key: &BudgetKey, b: &Budget, refund: f64, now: u64) -> Option<f64> {
        let mut map = self.buckets.lock();
        let (_, state) = map.get_mut(key)?;
        state.settle(b, refund, now);
        b.tokens_per_minute.map(|_| state.tokens)
    }

    pub fn len(&self) -> usize {
        self.buckets.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// === impl RedisStore ===

impl RedisStore {
    /// A lazy connection: the indexer starts while Redis is down.
    pub fn new(url: &str, prefix: &str, timeout: Duration) -> Result<Self, StoreError> {
        let client = ::redis::Client::open(url)?;
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(200))))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2);
        Ok(Self {
            conn: ConnectionManager::new_lazy_with_config(client, cfg)?,
            prefix: prefix.to_owned(),
            timeout,
            admit: Script::new(REDIS_ADMIT),
            settle: Script::new(REDIS_SETTLE),
        })
    }

    /// Both keys of a budget share one hash tag (one cluster slot). The
    /// tenant is hex-encoded: any byte may appear in a header value.
    fn keys(&self, key: &BudgetKey) -> [String; 2] {
        let scope = match &key.scope {
            BudgetScope::AllModels => "*".to_owned(),
            BudgetScope::Model(m) => hex(m.as_bytes()),
        };
        let tag = format!(
            "{}:budget:{{{}/{}}}",
            self.prefix,
            hex(key.tenant.as_bytes()),
            scope
        );
        [format!("{tag}:b"), format!("{tag}:c")]
    }

    pub async fn admit(
        &self,
        key: &BudgetKey,
        b: &Budget,
        cost: u64,
        request_id: &str,
        ttl: Duration,
    ) -> Result<Verdict, StoreError> {
        let [bk, ck] = self.keys(key);
        let mut inv = self.admit.key(bk);
        inv.key(ck)
            .arg(b.tokens_per_minute.unwrap_or(0))
            .arg(b.requests_per_minute.unwrap_or(0))
            .arg(b.max_concurrent.unwrap_or(0))
            .arg(cost)
            .arg(request_id)
            .arg(ttl.as_millis() as u64);
        let mut conn = self.conn.clone();
        let reply: (i64, String, i64, i64) =
            tokio::time::timeout(self.timeout, inv.invoke_async(&mut conn))
                .await
                .map_err(|_| StoreError::Timeout(self.timeout))??;
        let (admitted, limit, wait, left) = reply;
        if admitted == 1 {
            return Ok(Verdict::Admit {
                tokens_left: b.tokens_per_minute.map(|_| left as f64),
            });
        }
        let limit = Limit::parse(&limit).ok_or_else(|| StoreError::Reply(limit.clone()))?;
        Ok(Verdict::Reject {
            limit,
            retry_after_ms: wait.max(0) as u64,
        })
    }

    pub async fn settle(
        &self,
        key: &BudgetKey,
        b: &Budget,
        refund: f64,
        request_id: &str,
    ) -> Result<Option<f64>, StoreError> {
        let [bk, ck] = self.keys(key);
        let mut inv = self.settle.key(bk);
        inv.key(ck)
            .arg(b.tokens_per_minute.unwrap_or(0))
            .arg(b.requests_per_minute.unwrap_or(0))
            .arg(refund.round() as i64)
            .arg(request_id);
        let mut conn = self.conn.clone();
        let left: i64 = tokio::time::timeout(self.timeout, inv.invoke_async(&mut conn))
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))??;
        Ok(b.tokens_per_minute.map(|_| left as f64))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_budgets_are_swept_once_many() {
        let store = MemoryStore::default();
        let b = Budget {
            requests_per_minute: Some(10),
            ..Budget::default()
        };
        let key = |i: usize| BudgetKey {
            tenant: format!("t{i}"),
            scope: BudgetScope::AllModels,
        };
        for i in 0..=SWEEP_ABOVE {
            assert!(matches!(
                store.admit(&key(i), &b, 1, 0),
                Verdict::Admit { .. }
            ));
            store.settle(&key(i), &b, 0.0, 0);
        }
        // A second later nothing has refilled yet: a sweep keeps all.
        assert!(matches!(
            store.admit(&key(0), &b, 1, 1_000),
            Verdict::Admit { .. }
        ));
        assert_eq!(store.len(), SWEEP_ABOVE + 1);
        // A minute later all are full again but key 0, still in flight.
        assert!(matches!(
            store.admit(&key(99_999), &b, 1, 61_000),
            Verdict::Admit { .. }
        ));
        assert_eq!(store.len(), 2);
    }
}
