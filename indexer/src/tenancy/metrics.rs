//! Per-tenant budget metrics. Tenants outside the allowlist share the label
//! `other`, so any number of tenant values makes a bounded set of series.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};
use prometheus_client::registry::Registry;

use crate::metrics::TenantAllowlist;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    pub tenant: String,
    /// `tokens`, `requests`, `concurrency`, `too_large`, `invalid_tenant`.
    pub limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreErrorLabels {
    /// `fail_open`, `local` (admission), `settle`.
    pub action: &'static str,
}

#[derive(Clone)]
pub struct TenancyMetrics {
    allow: TenantAllowlist,
    pub admitted_requests: Family<TenantLabel, Counter>,
    pub admitted_tokens: Family<TenantLabel, Counter>,
    pub rejected_requests: Family<RejectLabels, Counter>,
    pub rejected_tokens: Family<RejectLabels, Counter>,
    pub used_tokens: Family<TenantLabel, Counter>,
    pub remaining_tokens: Family<TenantLabel, Gauge>,
    pub store_errors: Family<StoreErrorLabels, Counter>,
    pub reservations: Gauge,
}

impl TenancyMetrics {
    pub fn new(registry: &mut Registry, allowlist: &[String]) -> Self {
        let m = Self {
            allow: TenantAllowlist::new(allowlist),
            admitted_requests: Family::default(),
            admitted_tokens: Family::default(),
            rejected_requests: Family::default(),
            rejected_tokens: Family::default(),
            used_tokens: Family::default(),
            remaining_tokens: Family::default(),
            store_errors: Family::default(),
            reservations: Gauge::default(),
        };
        let r = registry.sub_registry_with_prefix("kvsteer_tenant");
        r.register(
            "admitted_requests",
            "Requests admitted by their tenant's budget",
            m.admitted_requests.clone(),
        );
        r.register(
            "admitted_tokens",
            "Tokens reserved at admission (prompt + max_tokens)",
            m.admitted_tokens.clone(),
        );
        r.register(
            "rejected_requests",
            "Requests refused, by the limit that refused them",
            m.rejected_requests.clone(),
        );
        r.register(
            "rejected_tokens",
            "Tokens of refused requests (prompt + max_tokens)",
            m.rejected_tokens.clone(),
        );
        r.register(
            "used_tokens",
            "Tokens used by admitted requests, as their reports tell",
            m.used_tokens.clone(),
        );
        r.register(
            "budget_remaining_tokens",
            "Tokens left in an allowlisted tenant's budget, as last seen by this replica",
            m.remaining_tokens.clone(),
        );
        r.register(
            "budget_store_errors",
            "Budget store (Redis) calls that failed, by what was done instead",
            m.store_errors.clone(),
        );
        r.register(
            "budget_reservations",
            "Admitted requests waiting for their terminal report",
            m.reservations.clone(),
        );
        m
    }

    /// The tenant's label: itself when allowlisted, `other` otherwise.
    pub fn label(&self, tenant: &str) -> String {
        self.allow.label(tenant)
    }

    pub(super) fn admitted(&self, label: &str, cost: u64, left: Option<f64>) {
        let l = TenantLabel {
            tenant: label.to_owned(),
        };
        self.admitted_requests.get_or_create(&l).inc();
        self.admitted_tokens.get_or_create(&l).inc_by(cost);
        self.remaining(label, left);
    }

    pub(super) fn refused(&self, label: &str, limit: &'static str, cost: u64) {
        let l = RejectLabels {
            tenant: label.to_owned(),
            limit,
        };
        self.rejected_requests.get_or_create(&l).inc();
        self.rejected_tokens.get_or_create(&l).inc_by(cost);
    }

    pub(super) fn used(&self, label: &str, tokens: u64) {
        let l = TenantLabel {
            tenant: label.to_owned(),
        };
        self.used_tokens.get_or_create(&l).inc_by(tokens);
    }

    /// Only allowlisted tenants: one gauge for all of `other` would mix budgets.
    pub(super) fn remaining(&self, label: &str, left: Option<f64>) {
        if let Some(left) = left
            && label != "other"
        {
            let l = TenantLabel {
                tenant: label.to_owned(),
            };
            self.remaining_tokens
                .get_or_create(&l)
                .set(left.floor() as i64);
        }
    }

    pub(super) fn store_error(&self, action: &'static str) {
        self.store_errors
            .get_or_create(&StoreErrorLabels { action })
            .inc();
    }
}
