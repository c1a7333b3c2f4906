//! The policies a benchmark run compares: the indexer's own five (scored by
//! `kvsteer_indexer::scoring::rank`, the function the service runs), two
//! peer-inspired ones implemented here ([`super::peers`]) and, on request, a
//! Kubernetes Service reached through a keep-alive client ([`super::service`])
//! the greedy oracle that foresees every worker's first token
//! ([`super::oracle`]) and the placement search with hindsight
//! ([`super::search`]).

use std::fmt;
use std::str::FromStr;

use kvsteer_indexer::config::Policy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BenchPolicy {
    /// One of the indexer's policies.
    Indexer(IndexerPolicy),
    /// NVIDIA Dynamo KV router's cost: prefill blocks + active decode blocks.
    DynamoLike,
    /// SGLang router's cache-aware policy: cache affinity unless the load
    /// is imbalanced, then shortest queue.
    SglangLike,
    /// A Kubernetes Service: a random pod per client connection (not in the
    /// default list).
    K8sService,
    /// The worker where the request's first token truly comes soonest, from
    /// copies of the engines run forward ([`super::oracle`]; not in the
    /// default list).
    Oracle,
    /// The best placement of the whole run a search with hindsight finds
    /// ([`super::search`]; not in the default list).
    Search,
}

/// `kvsteer_indexer::config::Policy`, orderable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IndexerPolicy {
    Random,
    RoundRobin,
    LeastRequest,
    PrefixOnly,
    Kvsteer,
}

/// The default list: every policy but `k8s_service`.
pub const ALL_POLICIES: &str =
    "random,round_robin,least_request,prefix_only,kvsteer,dynamo_like,sglang_like";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy {0:?} (known: {ALL_POLICIES},k8s_service,oracle,search)")]
pub struct UnknownPolicy(pub String);

// === impl BenchPolicy ===

impl BenchPolicy {
    pub fn name(self) -> &'static str {
        match self {
            Self::Indexer(p) => kvsteer_indexer::picker::policy_name(p.into()),
            Self::DynamoLike => "dynamo_like",
            Self::SglangLike => "sglang_like",
            Self::K8sService => "k8s_service",
            Self::Oracle => "oracle",
            Self::Search => "search",
        }
    }

    /// Parses a comma-separated list, keeping its order, without duplicates.
    pub fn parse_list(s: &str) -> Result<Vec<Self>, UnknownPolicy> {
        let mut out: Vec<Self> = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let p = name.parse()?;
            if !out.contains(&p) {
                out.push(p);
            }
        }
        Ok(out)
    }
}

impl FromStr for BenchPolicy {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "random" => Self::Indexer(IndexerPolicy::Random),
            "round_robin" => Self::Indexer(IndexerPolicy::RoundRobin),
            "least_request" => Self::Indexer(IndexerPolicy::LeastRequest),
            "prefix_only" => Self::Indexer(IndexerPolicy::PrefixOnly),
            "kvsteer" => Self::Indexer(IndexerPolicy::Kvsteer),
            "dynamo_like" => Self::DynamoLike,
            "sglang_like" => Self::SglangLike,
            "k8s_service" => Self::K8sService,
            "oracle" => Self::Oracle,
            "search" => Self::Search,
            other => return Err(UnknownPolicy(other.to_owned())),
        })
    }
}

impl fmt::Display for BenchPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<IndexerPolicy> for Policy {
    fn from(p: IndexerPolicy) -> Policy {
        match p {
            IndexerPolicy::Random => Policy::Random,
            IndexerPolicy::RoundRobin => Policy::RoundRobin,
            IndexerPolicy::LeastRequest => Policy::LeastRequest,
            IndexerPolicy::PrefixOnly => Policy::PrefixOnly,
            IndexerPolicy::Kvsteer => Policy::Kvsteer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_named() {
        let all = BenchPolicy::parse_list(ALL_POLICIES).unwrap();
        assert_eq!(all.len(), 7);
        let names: Vec<_> = all.iter().map(|p| p.name()).collect();
        assert_eq!(names.join(","), ALL_POLICIES);
        assert_eq!(
            BenchPolicy::parse_list("kvsteer, random,kvsteer")
                .unwrap()
                .len(),
            2
        );
        let err = BenchPolicy::parse_list("kvsteer,p2c").unwrap_err();
        assert_eq!(err, UnknownPolicy("p2c".into()));
        assert!(err.to_string().contains("sglang_like"));
        assert!(err.to_string().contains("k8s_service"));
        assert!(err.to_string().contains("oracle"));
        assert!(err.to_string().contains("search"));
        assert_eq!(
            BenchPolicy::parse_list("oracle").unwrap(),
            vec![BenchPolicy::Oracle]
        );
        assert_eq!(
            BenchPolicy::parse_list("search").unwrap(),
            vec![BenchPolicy::Search]
        );
        assert_eq!(
            BenchPolicy::parse_list("k8s_service").unwrap(),
            vec![BenchPolicy::K8sService]
        );
    }
}
