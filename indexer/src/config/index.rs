//! The `index:` section: the memory index or the Redis one.

use super::{ConfigError, DEFAULT_INDEX_CAPACITY, invalid};
use crate::index::redis::{RedisConfig, RedisConfigError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexBackend {
    #[default]
    Memory,
    Redis,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IndexConfig {
    pub backend: IndexBackend,
    /// Blocks the memory index holds before evicting.
    pub capacity: usize,
    /// The Redis backend (`backend: redis`).
    pub redis: RedisConfig,
}

// === impl IndexConfig ===

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            backend: IndexBackend::default(),
            capacity: DEFAULT_INDEX_CAPACITY,
            redis: RedisConfig::default(),
        }
    }
}

impl IndexConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        match self.backend {
            IndexBackend::Redis => redis_invalid(self.redis.validate()),
            IndexBackend::Memory if self.capacity == 0 => {
                Err(invalid("index.capacity", "must be > 0"))
            }
            IndexBackend::Memory => Ok(()),
        }
    }
}

fn redis_invalid(r: Result<(), RedisConfigError>) -> Result<(), ConfigError> {
    r.map_err(
        |RedisConfigError::Invalid { field, reason }| ConfigError::Invalid {
            field: format!("index.redis.{field}"),
            reason,
        },
    )
}
