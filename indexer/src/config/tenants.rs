//! The `tenants:` section: where the tenant comes from, its metric label,
//! and every tenant's policy (isolation, budgets).

use super::{ConfigError, DEFAULT_TENANT_HEADER, invalid};
use crate::tenancy::policy::TenantPolicy;
use crate::tenancy::store::BudgetStoreConfig;
use crate::tenancy::{DEFAULT_MAX_TENANT_BYTES, DEFAULT_RESERVE_OUTPUT_TOKENS};
use serde::{Deserialize, Serialize};
use std::{collections::BTreeMap, path::PathBuf};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantsConfig {
    pub header: String,
    /// Tenants with their own metric label; everyone else is `other`.
    pub metrics_allowlist: Vec<String>,
    /// File holding the secret tenant salts are derived with; unset: the
    /// `KVSTEER_SALT_SECRET` environment variable. Required when any tenant
    /// is salted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub salt_secret_file: Option<PathBuf>,
    /// Policy of every tenant (isolation, budget), with per-model levels.
    pub default: TenantPolicy,
    /// Per-tenant policy over `default`.
    pub overrides: BTreeMap<String, TenantPolicy>,
    pub budget_store: BudgetStoreConfig,
    /// Output tokens reserved for a request that sets no `max_tokens`
    /// (corrected by its reported usage).
    pub reserve_output_tokens: u32,
    /// Longer tenant values are refused (400).
    pub max_tenant_bytes: usize,
}

// === impl TenantsConfig ===

impl Default for TenantsConfig {
    fn default() -> Self {
        Self {
            header: DEFAULT_TENANT_HEADER.into(),
            metrics_allowlist: Vec::new(),
            salt_secret_file: None,
            default: TenantPolicy::default(),
            overrides: BTreeMap::new(),
            budget_store: BudgetStoreConfig::default(),
            reserve_output_tokens: DEFAULT_RESERVE_OUTPUT_TOKENS,
            max_tenant_bytes: DEFAULT_MAX_TENANT_BYTES,
        }
    }
}

impl TenantsConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let ok = !self.header.is_empty()
            && self
                .header
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !ok {
            return Err(invalid(
                "tenants.header",
                "must be a lowercase HTTP header name",
            ));
        }
        if self.metrics_allowlist.iter().any(|t| t == "other") {
            return Err(invalid(
                "tenants.metrics_allowlist",
                "`other` is reserved for tenants not listed",
            ));
        }
        for (path, budget) in self.budgets() {
            budget
                .validate()
                .map_err(|e| invalid(&path, &e.to_string()))?;
        }
        if self.max_tenant_bytes == 0 {
            return Err(invalid("tenants.max_tenant_bytes", "must be at least 1"));
        }
        if self.budget_store.timeout_ms == 0 {
            return Err(invalid(
                "tenants.budget_store.timeout_ms",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}
