//! Per-tenant policy as configured: cache isolation and budgets, a default
//! with per-model overrides, and per-tenant overrides of both.
//!
//! ```yaml
//! tenants:
//!   salt_secret_file: /etc/kvsteer/salt-secret   # or $KVSTEER_SALT_SECRET
//!   default:
//!     isolation: shared
//!     budget: {tokens_per_minute: 200000}
//!     models:
//!       Qwen/Qwen3-8B: {budget: {tokens_per_minute: 100000}}
//!   overrides:
//!     team-a: {isolation: salted}
//!     team-b:
//!       budget: {tokens_per_minute: 20000, requests_per_minute: 60, max_concurrent: 4}
//! ```
//!
//! Resolution for (tenant, model), later wins field by field: `default`,
//! `default.models[model]`, `overrides[tenant]`, `overrides[tenant].models[model]`.
//! A budget is one set of limits: the most specific level that sets a
//! `budget` gives all of it (limits are not mixed across levels).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Whether a tenant's prompts may share cached blocks with other tenants'.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// Prefix blocks are shared across tenants (vLLM's default).
    #[default]
    Shared,
    /// The request gets a `cache_salt` derived from the tenant: its blocks
    /// are never a hit for another tenant (nor another's for it).
    Salted,
}

/// Limits per minute and at once; an absent limit is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Prompt tokens plus `max_tokens` reserved at the pick, corrected to
    /// the reported usage when the request ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
}

/// One level of policy; unset fields fall through to the level below.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyLevel {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
}

/// A tenant's (or the default) policy with its per-model overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantPolicy {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, PolicyLevel>,
}

/// What applies to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub isolation: Isolation,
    /// The limits and the scope they are counted in.
    pub budget: Option<(Budget, BudgetScope)>,
}

/// Which requests share one budget: the tenant's across models, or the
/// tenant's on one model (when a per-model level set the budget).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BudgetScope {
    AllModels,
    Model(String),
}

/// Why a budget is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("sets no limit (give tokens_per_minute, requests_per_minute or max_concurrent)")]
    Empty,
    #[error("{0}: must be at least 1 (omit it for no limit)")]
    Zero(&'static str),
}

// === impl Budget ===

impl Budget {
    pub fn validate(&self) -> Result<(), BudgetError> {
        if self.tokens_per_minute == Some(0) {
            return Err(BudgetError::Zero("tokens_per_minute"));
        }
        if self.requests_per_minute == Some(0) {
            return Err(BudgetError::Zero("requests_per_minute"));
        }
        if self.max_concurrent == Some(0) {
            return Err(BudgetError::Zero("max_concurrent"));
        }
        if *self == Self::default() {
            return Err(BudgetError::Empty);
        }
        Ok(())
    }
}

// === impl TenantPolicy ===

impl TenantPolicy {
    /// Every budget of this policy with its config path below `at`.
    pub fn budgets(&self, at: String) -> impl Iterator<Item = (String, &Budget)> + '_ {
        let own = self.budget.iter().map({
            let at = at.clone();
            move |b| (format!("{at}.budget"), b)
        });
        let per_model = self.models.iter().filter_map(move |(m, level)| {
            level
                .budget
                .as_ref()
                .map(|b| (format!("{at}.models[{m:?}].budget"), b))
        });
        own.chain(per_model)
    }

    pub fn salted_anywhere(&self) -> bool {
        self.isolation == Some(Isolation::Salted)
            || self
                .models
                .values()
                .any(|l| l.isolation == Some(Isolation::Salted))
    }
}

/// Resolves (tenant, model) through the four levels.
pub fn resolve(
    default: &TenantPolicy,
    overrides: &BTreeMap<String, TenantPolicy>,
    tenant: &str,
    model: &str,
) -> Resolved {
    let own = overrides.get(tenant);
    let levels = [
        (default.isolation, default.budget, false),
        model_level(default, model),
        own.map_or((None, None, false), |p| (p.isolation, p.budget, false)),
        own.map_or((None, None, false), |p| model_level(p, model)),
    ];
    let mut isolation = Isolation::Shared;
    let mut budget = None;
    for (iso, b, per_model) in levels {
        if let Some(iso) = iso {
            isolation = iso;
        }
        if let Some(b) = b {
            let scope = if per_model {
                BudgetScope::Model(model.to_owned())
            } else {
                BudgetScope::AllModels
            };
            budget = Some((b, scope));
        }
    }
    Resolved { isolation, budget }
}

fn model_level(p: &TenantPolicy, model: &str) -> (Option<Isolation>, Option<Budget>, bool) {
    p.models
        .get(model)
        .map_or((None, None, false), |l| (l.isolation, l.budget, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tpm(n: u64) -> Budget {
        Budget {
            tokens_per_minute: Some(n),
            ..Budget::default()
        }
    }

    #[test]
    fn later_levels_win_field_by_field() {
        let default = TenantPolicy {
            isolation: None,
            budget: Some(tpm(100)),
            models: [(
                "m".to_owned(),
                PolicyLevel {
                    isolation: None,
                    budget: Some(tpm(50)),
                },
            )]
            .into(),
        };
        let overrides: BTreeMap<_, _> = [
            (
                "a".to_owned(),
                TenantPolicy {
                    isolation: Some(Isolation::Salted),
                    ..TenantPolicy::default()
                },
            ),
            (
                "b".to_owned(),
                TenantPolicy {
                    budget: Some(tpm(7)),
                    ..TenantPolicy::default()
                },
            ),
        ]
        .into();
        let r = resolve(&default, &overrides, "a", "m");
        assert_eq!(r.isolation, Isolation::Salted);
        assert_eq!(r.budget, Some((tpm(50), BudgetScope::Model("m".into()))));
        let r = resolve(&default, &overrides, "a", "other-model");
        assert_eq!(r.budget, Some((tpm(100), BudgetScope::AllModels)));
        // A tenant's own budget beats the default's per-model one.
        let r = resolve(&default, &overrides, "b", "m");
        assert_eq!(
            (r.isolation, r.budget),
            (Isolation::Shared, Some((tpm(7), BudgetScope::AllModels)))
        );
        let r = resolve(&TenantPolicy::default(), &BTreeMap::new(), "x", "m");
        assert_eq!(
            r,
            Resolved {
                isolation: Isolation::Shared,
                budget: None
            }
        );
    }

    #[test]
    fn budgets_must_set_a_positive_limit() {
        assert_eq!(Budget::default().validate(), Err(BudgetError::Empty));
        assert_eq!(
            tpm(0).validate(),
            Err(BudgetError::Zero("tokens_per_minute"))
        );
        let b = Budget {
            max_concurrent: Some(0),
            ..tpm(5)
        };
        assert_eq!(b.validate(), Err(BudgetError::Zero("max_concurrent")));
        assert_eq!(tpm(1).validate(), Ok(()));
    }

    #[test]
    fn negative_or_misspelt_limits_do_not_parse() {
        let bad = [
            "tokens_per_minute: -5",
            "tokens_per_minte: 5",
            "max_concurrent: 1.5",
        ];
        for text in bad {
            assert!(serde_norway::from_str::<Budget>(text).is_err(), "{text}");
        }
        let ok: Budget = serde_norway::from_str("requests_per_minute: 3").unwrap();
        assert_eq!(ok.requests_per_minute, Some(3));
    }
}
