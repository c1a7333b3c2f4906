//! [`RedisConfig`]: every field has a default, unknown fields are rejected,
//! [`RedisConfig::validate`] names the field that is wrong. Meant to be
//! embedded in the service configuration under `index:`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

// === defaults ===

pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";
pub const DEFAULT_KEY_PREFIX: &str = "kvsteer";
/// A pick waits at most this long for Redis, then scores on load only.
pub const DEFAULT_LOOKUP_TIMEOUT_MS: u64 = 5;
/// Budget of one write round trip (apply, purge, stats refresh).
pub const DEFAULT_WRITE_TIMEOUT_MS: u64 = 250;
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 1_000;
pub const DEFAULT_CONNECTIONS: usize = 2;
/// Redis calls in flight at once; beyond it calls fail fast.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;
/// Every key lives this long after its last write.
pub const DEFAULT_ENTRY_TTL_S: u64 = 3_600;
/// Cap of the reconnect backoff.
pub const DEFAULT_BACKOFF_MAX_MS: u64 = 1_000;
/// Key operations per apply script call (bounds the time Redis is blocked).
pub const DEFAULT_OPS_PER_SCRIPT: usize = 1_024;
/// A worker's write lease lives this long in Redis unless renewed (every
/// third of it); the holder stops applying after two thirds without renewal.
pub const DEFAULT_LEASE_TTL_MS: u64 = 5_000;
/// Lookup results the in-process hot cache keeps (0 disables it).
pub const DEFAULT_CACHE_ENTRIES: usize = 8_192;
/// A cached lookup result is served at most this long after Redis answered it.
pub const DEFAULT_CACHE_TTL_MS: u64 = 250;
/// Upper bounds checked by `validate`.
const MIN_LEASE_TTL_MS: u64 = 30;
const MAX_CACHE_TTL_MS: u64 = 10_000;
const MAX_CONNECTIONS: usize = 64;
const MAX_OPS_PER_SCRIPT: usize = 8_192;

// === types ===

/// Who applies a worker's KV events to Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WriterMode {
    /// Per worker, the replica holding the worker's lease
    /// (`{prefix}:lease:{worker}`) writes; the others read. Failover within
    /// the lease TTL.
    #[default]
    Auto,
    /// This replica writes every worker, no lease (a single-writer
    /// deployment; two `always` replicas would double-count).
    Always,
    /// This replica never writes: a pure reader.
    Never,
}

/// How a lookup walks the prefix chain; both are one round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LookupMode {
    /// A pipeline of `HGETALL` over the whole chain; the walk runs here.
    #[default]
    Pipeline,
    /// A read-only Lua script walks the chain in Redis and stops at the
    /// first miss (`#!lua flags=no-writes`: needs Redis >= 7).
    Script,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user:pass@]host:port[/db]` (or `rediss://`, `unix://`).
    pub url: String,
    /// First component of every key (`{prefix}:b:…`); lets several
    /// deployments share one Redis.
    pub key_prefix: String,
    pub lookup: LookupMode,
    pub lookup_timeout_ms: u64,
    pub write_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    /// Multiplexed connections, used round robin.
    pub connections: usize,
    pub max_in_flight: usize,
    pub entry_ttl_s: u64,
    pub backoff_max_ms: u64,
    pub ops_per_script: usize,
    /// `auto` (per-worker leases), `always` or `never`; `true`/`false` are
    /// read as `always`/`never`.
    pub writer: WriterMode,
    /// Lease lifetime in Redis (`writer: auto`); renewed every third.
    pub lease_ttl_ms: u64,
    /// Lookup results kept by the in-process hot cache; 0 disables it.
    pub cache_entries: usize,
    /// Age limit of a cached lookup result: the staleness bound.
    pub cache_ttl_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RedisConfigError {
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

// === impl WriterMode ===

impl<'de> Deserialize<'de> for WriterMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Flag(bool),
            Name(String),
        }
        match Repr::deserialize(d)? {
            Repr::Flag(true) => Ok(Self::Always),
            Repr::Flag(false) => Ok(Self::Never),
            Repr::Name(n) => match n.as_str() {
                "auto" => Ok(Self::Auto),
                "always" => Ok(Self::Always),
                "never" => Ok(Self::Never),
                other => Err(serde::de::Error::custom(format!(
                    "writer: {other:?} is not one of auto, always, never"
                ))),
            },
        }
    }
}

impl WriterMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Always => "always",
            Self::Never => "never",
        }
    }
}

// === impl RedisConfig ===

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: DEFAULT_URL.into(),
            key_prefix: DEFAULT_KEY_PREFIX.into(),
            lookup: LookupMode::default(),
            lookup_timeout_ms: DEFAULT_LOOKUP_TIMEOUT_MS,
            write_timeout_ms: DEFAULT_WRITE_TIMEOUT_MS,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            connections: DEFAULT_CONNECTIONS,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            entry_ttl_s: DEFAULT_ENTRY_TTL_S,
            backoff_max_ms: DEFAULT_BACKOFF_MAX_MS,
            ops_per_script: DEFAULT_OPS_PER_SCRIPT,
            writer: WriterMode::default(),
            lease_ttl_ms: DEFAULT_LEASE_TTL_MS,
            cache_entries: DEFAULT_CACHE_ENTRIES,
            cache_ttl_ms: DEFAULT_CACHE_TTL_MS,
        }
    }
}

impl RedisConfig {
    /// Field names are relative (`url`, `entry_ttl_s`); prefix them with
    /// where the struct is embedded.
    pub fn validate(&self) -> Result<(), RedisConfigError> {
        let invalid = |field, reason: &str| {
            Err(RedisConfigError::Invalid {
                field,
                reason: reason.into(),
            })
        };
        if let Err(e) = ::redis::Client::open(self.url.as_str()) {
            return Err(RedisConfigError::Invalid {
                field: "url",
                reason: e.to_string(),
            });
        }
        let prefix_ok = !self.key_prefix.is_empty()
            && self.key_prefix.len() <= 64
            && self
                .key_prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.{}".contains(&b));
        if !prefix_ok {
            return invalid("key_prefix", "1..=64 of [A-Za-z0-9-_.{}]");
        }
        for (field, v) in [
            ("lookup_timeout_ms", self.lookup_timeout_ms),
            ("write_timeout_ms", self.write_timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("entry_ttl_s", self.entry_ttl_s),
            ("backoff_max_ms", self.backoff_max_ms),
        ] {
            if v == 0 {
                return invalid(field, "must be > 0");
            }
        }
        if self.entry_ttl_s > i64::MAX as u64 / 1_000 {
            return invalid("entry_ttl_s", "too large");
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.connections) {
            return invalid("connections", &format!("must be in 1..={MAX_CONNECTIONS}"));
        }
        if self.max_in_flight == 0 {
            return invalid("max_in_flight", "must be > 0");
        }
        if !(1..=MAX_OPS_PER_SCRIPT).contains(&self.ops_per_script) {
            return invalid(
                "ops_per_script",
                &format!("must be in 1..={MAX_OPS_PER_SCRIPT}"),
            );
        }
        if self.lease_ttl_ms < MIN_LEASE_TTL_MS || self.lease_ttl_ms > i64::MAX as u64 {
            return invalid("lease_ttl_ms", &format!("must be >= {MIN_LEASE_TTL_MS}"));
        }
        if self.cache_entries > 0 && !(1..=MAX_CACHE_TTL_MS).contains(&self.cache_ttl_ms) {
            return invalid(
                "cache_ttl_ms",
                &format!("must be in 1..={MAX_CACHE_TTL_MS} (cache_entries: 0 disables the cache)"),
            );
        }
        Ok(())
    }

    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }

    pub fn cache_ttl(&self) -> Duration {
        Duration::from_millis(self.cache_ttl_ms)
    }

    pub fn lookup_timeout(&self) -> Duration {
        Duration::from_millis(self.lookup_timeout_ms)
    }

    pub fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.write_timeout_ms)
    }

    pub fn entry_ttl(&self) -> Duration {
        Duration::from_secs(self.entry_ttl_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_round_trip_through_yaml() {
        let c = RedisConfig::default();
        c.validate().unwrap();
        let yaml = serde_norway::to_string(&c).unwrap();
        let back: RedisConfig = serde_norway::from_str(&yaml).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn partial_yaml_takes_defaults() {
        let c: RedisConfig =
            serde_norway::from_str("url: redis://10.0.0.1:6380\nlookup: script\n").unwrap();
        assert_eq!(c.url, "redis://10.0.0.1:6380");
        assert_eq!(c.lookup, LookupMode::Script);
        assert_eq!(c.key_prefix, DEFAULT_KEY_PREFIX);
        assert_eq!(c.lookup_timeout(), Duration::from_millis(5));
        c.validate().unwrap();
    }

    #[test]
    fn writer_modes_and_legacy_flags() {
        let w = |y: &str| serde_norway::from_str::<RedisConfig>(y).map(|c| c.writer);
        assert_eq!(w("{}").unwrap(), WriterMode::Auto);
        assert_eq!(w("writer: auto").unwrap(), WriterMode::Auto);
        assert_eq!(w("writer: always").unwrap(), WriterMode::Always);
        assert_eq!(w("writer: never").unwrap(), WriterMode::Never);
        assert_eq!(w("writer: true").unwrap(), WriterMode::Always);
        assert_eq!(w("writer: false").unwrap(), WriterMode::Never);
        let e = w("writer: sometimes").unwrap_err().to_string();
        assert!(e.contains("writer"), "{e}");
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(serde_norway::from_str::<RedisConfig>("urll: x\n").is_err());
    }

    #[test]
    fn validate_names_the_field() {
        let field = |c: RedisConfig| match c.validate() {
            Err(RedisConfigError::Invalid { field, .. }) => field,
            Ok(()) => "ok",
        };
        let d = RedisConfig::default;
        assert_eq!(
            field(RedisConfig {
                url: "http://x".into(),
                ..d()
            }),
            "url"
        );
        assert_eq!(
            field(RedisConfig {
                key_prefix: "a b".into(),
                ..d()
            }),
            "key_prefix"
        );
        assert_eq!(
            field(RedisConfig {
                key_prefix: String::new(),
                ..d()
            }),
            "key_prefix"
        );
        assert_eq!(
            field(RedisConfig {
                lookup_timeout_ms: 0,
                ..d()
            }),
            "lookup_timeout_ms"
        );
        assert_eq!(
            field(RedisConfig {
                entry_ttl_s: 0,
                ..d()
            }),
            "entry_ttl_s"
        );
        assert_eq!(
            field(RedisConfig {
                connections: 0,
                ..d()
            }),
            "connections"
        );
        assert_eq!(
            field(RedisConfig {
                max_in_flight: 0,
                ..d()
            }),
            "max_in_flight"
        );
        assert_eq!(
            field(RedisConfig {
                ops_per_script: 0,
                ..d()
            }),
            "ops_per_script"
        );
        assert_eq!(
            field(RedisConfig {
                lease_ttl_ms: 5,
                ..d()
            }),
            "lease_ttl_ms"
        );
        assert_eq!(
            field(RedisConfig {
                cache_ttl_ms: 0,
                ..d()
            }),
            "cache_ttl_ms"
        );
        assert_eq!(
            field(RedisConfig {
                cache_entries: 0,
                cache_ttl_ms: 0,
                ..d()
            }),
            "ok"
        );
    }
}
