//! Worker discovery: the vLLM pods of Kubernetes, watched (list, then
//! watch) per pool, become workers while they are Ready and leave when they
//! are deleted, turn unready or change IP or uid.
//!
//! ```yaml
//! discovery:
//!   kubernetes:
//!     namespace: kvsteer               # default: the indexer pod's own
//!     pools:
//!       - model: Qwen/Qwen3-8B         # a models[].name
//!         selector: "app=vllm,kvsteer.io/pool=qwen3-8b"
//!         ports: {http: http, kv_events: kv-events, replay: kv-replay}
//! ```
//!
//! [`pods`] turns one pod into its workers (pure); [`watch`] runs one
//! watcher per pool and hands joins and leaves to the [`crate::fleet`].

pub mod pods;
pub mod selector;
pub mod watch;

use serde::{Deserialize, Serialize};

/// Workers a cluster adds at most by default (slots of the per-worker
/// tables beyond the static workers).
pub const DEFAULT_MAX_WORKERS: usize = 256;

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesConfig {
    /// The namespace watched; default: the indexer pod's own (its service
    /// account's), else the kubeconfig context's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// A kubeconfig file to use instead of the standard lookup (in-cluster
    /// service account, else `KUBECONFIG`, else `~/.kube/config`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<std::path::PathBuf>,
    pub pools: Vec<PoolConfig>,
    /// Discovered workers at most (each rank of a data-parallel pod is one).
    pub max_workers: usize,
    /// Seconds a watch request stays open before the API server ends it
    /// (the watcher then resumes from its resourceVersion).
    pub watch_timeout_s: u32,
}

/// One served model's worker pods (like an InferencePool).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// A `models[].name` (a label value cannot hold `/`, so the model's
    /// name lives here, not on the pods).
    pub model: String,
    /// Label selector of the pool's pods (`k=v`, `k!=v`, `k in (a,b)`,
    /// `k notin (a)`, `k`, `!k`, comma-separated).
    pub selector: String,
    pub ports: PoolPorts,
    /// The event topic; default `kv@<podIP>:<http port>@<model>` (what the
    /// vLLM flags of `deploy/` publish). `""` subscribes to every topic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
}

/// Container ports of a pool's pods, by name or number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolPorts {
    pub http: PortRef,
    /// The KV events PUB port; `null`: the pods publish none (load only).
    pub kv_events: Option<PortRef>,
    /// The replay ROUTER port; `null`: none.
    pub replay: Option<PortRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PortRef {
    Number(u16),
    Name(String),
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            namespace: None,
            kubeconfig: None,
            pools: Vec::new(),
            max_workers: DEFAULT_MAX_WORKERS,
            watch_timeout_s: 290,
        }
    }
}

impl Default for PoolPorts {
    fn default() -> Self {
        Self {
            http: PortRef::Name("http".into()),
            kv_events: Some(PortRef::Name("kv-events".into())),
            replay: Some(PortRef::Name("kv-replay".into())),
        }
    }
}

impl std::fmt::Display for PortRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Name(s) => write!(f, "{s:?}"),
        }
    }
}

// === validation ===

/// What is wrong with a `discovery` section: the field and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct DiscoveryError {
    pub field: String,
    pub reason: String,
}

impl DiscoveryConfig {
    /// Workers discovery may add at most (0 without discovery).
    pub fn max_workers(&self) -> usize {
        self.kubernetes.as_ref().map_or(0, |k| k.max_workers)
    }

    /// Checks the section; `models` are the configured model names.
    pub fn validate<'a>(&self, models: impl Fn(&str) -> bool + 'a) -> Result<(), DiscoveryError> {
        let Some(k) = &self.kubernetes else {
            return Ok(());
        };
        let err = |field: String, reason: String| DiscoveryError { field, reason };
        let base = "discovery.kubernetes";
        if k.pools.is_empty() {
            return Err(err(format!("{base}.pools"), "at least one pool".into()));
        }
        if let Some(ns) = &k.namespace
            && !selector::is_dns_label(ns)
        {
            return Err(err(
                format!("{base}.namespace"),
                format!("{ns:?} is not a namespace name (a DNS label)"),
            ));
        }
        if k.max_workers == 0 || k.max_workers > 4096 {
            return Err(err(
                format!("{base}.max_workers"),
                "must be in 1..=4096".into(),
            ));
        }
        if k.watch_timeout_s == 0 {
            return Err(err(format!("{base}.watch_timeout_s"), "must be > 0".into()));
        }
        for (i, p) in k.pools.iter().enumerate() {
            let f = |key: &str| format!("{base}.pools[{i}].{key}");
            if p.model.is_empty() {
                return Err(err(f("model"), "missing".into()));
            }
            if !models(&p.model) {
                return Err(err(
                    f("model"),
                    format!("unknown model {:?} (not in models[])", p.model),
                ));
            }
            selector::parse(&p.selector).map_err(|reason| err(f("selector"), reason))?;
            let ports = [
                ("ports.http", Some(&p.ports.http)),
                ("ports.kv_events", p.ports.kv_events.as_ref()),
                ("ports.replay", p.ports.replay.as_ref()),
            ];
            for (key, port) in ports {
                match port {
                    Some(PortRef::Number(0)) => {
                        return Err(err(f(key), "port 0".into()));
                    }
                    Some(PortRef::Name(n)) if !selector::is_port_name(n) => {
                        return Err(err(
                            f(key),
                            format!("{n:?} is not a container port name (IANA_SVC_NAME)"),
                        ));
                    }
                    _ => {}
                }
            }
            if p.ports.replay.is_some() && p.ports.kv_events.is_none() {
                return Err(err(f("ports.replay"), "needs ports.kv_events".into()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<DiscoveryConfig, String> {
        let cfg: DiscoveryConfig = serde_norway::from_str(yaml).map_err(|e| e.to_string())?;
        cfg.validate(|m| m == "Qwen/Qwen3-8B")
            .map_err(|e| e.to_string())?;
        Ok(cfg)
    }

    #[test]
    fn the_documented_shape_parses_with_names_or_numbers() {
        let cfg = parse(
            r#"
kubernetes:
  namespace: kvsteer
  pools:
    - model: Qwen/Qwen3-8B
      selector: "app=vllm,kvsteer.io/pool=qwen3-8b"
      ports: {http: http, kv_events: 5557, replay: kv-replay}
"#,
        )
        .unwrap();
        let k = cfg.kubernetes.unwrap();
        assert_eq!(k.max_workers, DEFAULT_MAX_WORKERS);
        let p = &k.pools[0];
        assert_eq!(p.ports.http, PortRef::Name("http".into()));
        assert_eq!(p.ports.kv_events, Some(PortRef::Number(5557)));
        // Defaults: the port names of deploy/'s vLLM pods.
        let cfg = parse(
            "kubernetes: {pools: [{model: Qwen/Qwen3-8B, selector: app=vllm, ports: {kv_events: null, replay: null}}]}",
        )
        .unwrap();
        let p = &cfg.kubernetes.unwrap().pools[0];
        assert_eq!(p.ports.http, PortRef::Name("http".into()));
        assert_eq!(p.ports.kv_events, None);
    }

    #[test]
    fn bad_pools_say_which_field() {
        let cases = [
            ("kubernetes: {pools: []}", "discovery.kubernetes.pools"),
            (
                "kubernetes: {pools: [{model: other, selector: app=vllm}]}",
                "pools[0].model: unknown model \"other\"",
            ),
            (
                "kubernetes: {pools: [{model: Qwen/Qwen3-8B, selector: 'app in (a'}]}",
                "pools[0].selector",
            ),
            (
                "kubernetes: {pools: [{model: Qwen/Qwen3-8B, selector: app=vllm, ports: {http: 'no such'}}]}",
                "pools[0].ports.http",
            ),
            (
                "kubernetes: {pools: [{model: Qwen/Qwen3-8B, selector: app=vllm, ports: {kv_events: null}}]}",
                "pools[0].ports.replay: needs ports.kv_events",
            ),
            (
                "kubernetes: {namespace: Kv_Steer, pools: [{model: Qwen/Qwen3-8B, selector: app=vllm}]}",
                "discovery.kubernetes.namespace",
            ),
            (
                "kubernetes: {max_workers: 0, pools: [{model: Qwen/Qwen3-8B, selector: app=vllm}]}",
                "max_workers",
            ),
        ];
        for (yaml, want) in cases {
            let e = parse(yaml).expect_err(yaml);
            assert!(e.contains(want), "{yaml}: {e}");
        }
        assert!(
            parse("kubernetes: {pools: [{model: Qwen/Qwen3-8B, selector: app=vllm, extra: 1}]}")
                .is_err()
        );
    }
}
