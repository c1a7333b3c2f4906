//! The plugin configuration: the JSON string in the Envoy config's
//! `configuration` field, parsed once in `on_configure`.
//!
//! Every field has a default, unknown fields are rejected, and `validate`
//! explains what is wrong with a value.

use serde::Deserialize;

/// The initial-metadata header naming the indexer replica a report goes to
/// (`PickResponse.replica`): the indexer cluster's `override_host` policy
/// must read it (see `envoy/local/envoy.yaml`).
pub const REPLICA_HEADER: &str = "x-kvsteer-replica";

use crate::admission::Api;
use crate::grpc_target;

pub const DEFAULT_INDEXER_CLUSTER: &str = "kvsteer_indexer";
pub const DEFAULT_TIMEOUT_MS: u64 = 200;
pub const DEFAULT_PATHS: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/messages"];
pub const DEFAULT_TENANT_HEADER: &str = "x-tenant-id";
/// A client-sent tenant header is removed unless an earlier Envoy filter
/// (jwt_authn, a trusted-hop rule) is known to have replaced it: see the
/// README's "Security model".
pub const DEFAULT_TRUST_TENANT_HEADER: bool = false;
/// Longest tenant value the filter forwards; a longer one is dropped (the
/// pick goes out with no tenant), so no client can inflate picks, logs or
/// metric label sets through it.
pub const MAX_TENANT_BYTES: usize = 128;
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
pub const DEFAULT_DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
pub const DEFAULT_REPORT: bool = true;
/// How long picks ride one `PickStream` before it is replaced (so streams
/// spread over indexer replicas that came up later).
pub const DEFAULT_PICK_STREAM_MAX_AGE_MS: u64 = 60_000;
/// `PickStream`s per Envoy worker: each goes to the replica the indexer
/// cluster's load balancer chose for it.
pub const DEFAULT_PICK_STREAMS: usize = 2;
pub const MAX_PICK_STREAMS: usize = 16;
/// Accepted stream ages (besides 0, no stream).
pub const PICK_STREAM_MAX_AGE_RANGE_MS: std::ops::RangeInclusive<u64> = 1_000..=3_600_000;

/// Longest accepted indexer timeout: a pick slower than this costs more than it saves.
pub const MAX_TIMEOUT_MS: u64 = 10_000;
/// Largest accepted body limit (the filter holds the body in the VM's memory).
pub const MAX_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilterConfig {
    /// Envoy cluster of the indexer's gRPC server.
    pub indexer_cluster: String,
    /// `:authority` of the calls to the indexer (`host[:port]`). Unset,
    /// Envoy sends the cluster name, which is fine for a cluster of one's
    /// own but not for Istio's `outbound|PORT||HOST` clusters: their `|` is
    /// not a valid authority and the indexer refuses every call. Istio
    /// configs set it to the indexer Service's `HOST:PORT`.
    pub indexer_authority: Option<String>,
    /// Deadline of a `Pick` call; past it the request fails open.
    pub timeout_ms: u64,
    /// Request paths (without query string) whose bodies are inspected.
    pub paths: Vec<String>,
    /// Header naming the tenant, sent along in `Pick`.
    pub tenant_header: String,
    /// When false (the default), the tenant header is removed before the
    /// filter reads it: the pick goes out with no tenant. Set it true only
    /// when an Envoy filter ahead of this one removes the client's copy and
    /// writes a verified value (jwt_authn `claim_to_headers`, a trusted hop);
    /// `envoy/jwt/` and `envoy/trusted-hop/` show both.
    pub trust_tenant_header: bool,
    /// Bodies larger than this pass through unrouted. One setting with the
    /// indexer's `grpc.max_message_bytes`, which must be at least this plus
    /// headroom for the `Pick` encoding (headers, field tags): otherwise the
    /// indexer refuses the large picks the filter waits for, and they fail
    /// open as `grpc_error`. The `Pick` of a body is about as large as the
    /// body or smaller (strings lose their JSON quotes and escapes, token ids
    /// become varints, the keys are gone); the headroom covers the rest. The
    /// filter cannot see the indexer's setting: the docs (README, `envoy/`)
    /// keep the two together, defaults 8 MiB here and 8 MiB plus headroom there.
    pub max_body_bytes: usize,
    /// Header read by Envoy's override_host load balancer.
    pub destination_header: String,
    /// Send first-token / done / cancelled reports to the indexer.
    pub report: bool,
    /// Picks go as messages on one long-lived `PickStream` per Envoy
    /// worker, replaced after this many milliseconds; 0: every pick is its
    /// own unary `Pick` call. Picks take the unary call anyway while no
    /// stream is open (the first ones, an indexer without `PickStream`).
    pub pick_stream_max_age_ms: u64,
    /// Streams per Envoy worker, taken in turn: a worker's picks spread
    /// over at most this many indexer replicas at a time (rotation moves
    /// them). At least the replica count spreads them evenly.
    pub pick_streams: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("plugin configuration is not valid JSON for kvsteer-filter: {0}")]
    Json(#[from] serde_json::Error),
    #[error("plugin configuration must be a JSON object")]
    NotAnObject,
    #[error("plugin configuration field `{field}`: {reason}")]
    Invalid { field: &'static str, reason: String },
}

// === impl FilterConfig ===

impl Default for FilterConfig {
    fn default() -> Self {
        Self {
            indexer_cluster: DEFAULT_INDEXER_CLUSTER.to_owned(),
            indexer_authority: None,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            paths: DEFAULT_PATHS.iter().map(|p| (*p).to_owned()).collect(),
            tenant_header: DEFAULT_TENANT_HEADER.to_owned(),
            trust_tenant_header: DEFAULT_TRUST_TENANT_HEADER,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            destination_header: DEFAULT_DESTINATION_HEADER.to_owned(),
            report: DEFAULT_REPORT,
            pick_stream_max_age_ms: DEFAULT_PICK_STREAM_MAX_AGE_MS,
            pick_streams: DEFAULT_PICK_STREAMS,
        }
    }
}

impl FilterConfig {
    /// Parses and validates the plugin configuration. An empty (or all
    /// whitespace) configuration means "all defaults".
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        let config = match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
            None => Self::default(),
            // serde would also build the struct from a JSON array.
            Some(b'{') => serde_json::from_slice::<Self>(bytes)?,
            Some(_) => return Err(ConfigError::NotAnObject),
        };
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.indexer_cluster.trim().is_empty() {
            return Err(invalid("indexer_cluster", "must name an Envoy cluster"));
        }
        if let Err(error) =
            grpc_target::encode(&self.indexer_cluster, self.indexer_authority.as_deref())
        {
            return Err(invalid("indexer_authority", error.to_string()));
        }
        if self.timeout_ms == 0 || self.timeout_ms > MAX_TIMEOUT_MS {
            return Err(invalid(
                "timeout_ms",
                format!(
                    "must be within 1..={MAX_TIMEOUT_MS}, got {}",
                    self.timeout_ms
                ),
            ));
        }
        let age = self.pick_stream_max_age_ms;
        if age != 0 && !PICK_STREAM_MAX_AGE_RANGE_MS.contains(&age) {
            return Err(invalid(
                "pick_stream_max_age_ms",
                format!(
                    "must be 0 (no stream) or within {}..={}, got {age}",
                    PICK_STREAM_MAX_AGE_RANGE_MS.start(),
                    PICK_STREAM_MAX_AGE_RANGE_MS.end()
                ),
            ));
        }
        if !(1..=MAX_PICK_STREAMS).contains(&self.pick_streams) {
            return Err(invalid(
                "pick_streams",
                format!(
                    "must be within 1..={MAX_PICK_STREAMS}, got {}",
                    self.pick_streams
                ),
            ));
        }
        if self.paths.is_empty() {
            return Err(invalid("paths", "must list at least one path"));
        }
        for (i, path) in self.paths.iter().enumerate() {
            if !path.starts_with('/') || path.contains(['?', '#', ' ']) {
                return Err(invalid(
                    "paths",
                    format!("`{path}` must start with `/` and hold no query, fragment or space"),
                ));
            }
            if Api::for_path(path).is_none() {
                return Err(invalid(
                    "paths",
                    format!(
                        "`{path}` must end with `/chat/completions`, `/completions` or `/messages`"
                    ),
                ));
            }
            if self.paths[..i].contains(path) {
                return Err(invalid("paths", format!("`{path}` is listed twice")));
            }
        }
        check_header_name("tenant_header", &self.tenant_header)?;
        check_header_name("destination_header", &self.destination_header)?;
        if self.tenant_header == self.destination_header {
            return Err(invalid(
                "tenant_header",
                "must differ from destination_header",
            ));
        }
        if self.max_body_bytes == 0 || self.max_body_bytes > MAX_MAX_BODY_BYTES {
            return Err(invalid(
                "max_body_bytes",
                format!(
                    "must be within 1..={MAX_MAX_BODY_BYTES}, got {}",
                    self.max_body_bytes
                ),
            ));
        }
        Ok(())
    }

    /// The upstream of the filter's gRPC calls (`grpc_target`): the cluster
    /// name, or cluster and authority as a serialized `GrpcService`. Falls
    /// back to the cluster name only for a configuration `validate` refuses.
    pub fn indexer_target(&self) -> String {
        grpc_target::encode(&self.indexer_cluster, self.indexer_authority.as_deref())
            .unwrap_or_else(|_| self.indexer_cluster.clone())
    }

    /// The API served at `path` (already stripped of its query), when the
    /// filter inspects it.
    pub fn api_for(&self, path: &str) -> Option<Api> {
        if self.paths.iter().any(|p| p == path) {
            Api::for_path(path)
        } else {
            None
        }
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// Envoy keeps header names lower case; a name with upper case letters would
/// never match.
fn check_header_name(field: &'static str, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && !name.starts_with(':')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("`{name}` must be a lower-case header name (a-z, 0-9, `-`, `_`, `.`)"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(json: &str) -> String {
        FilterConfig::from_json(json.as_bytes())
            .expect_err("config must be rejected")
            .to_string()
    }

    #[test]
    fn empty_configuration_means_defaults() {
        assert_eq!(
            FilterConfig::from_json(b"").unwrap(),
            FilterConfig::default()
        );
        assert_eq!(
            FilterConfig::from_json(b" \n").unwrap(),
            FilterConfig::default()
        );
        assert_eq!(
            FilterConfig::from_json(b"{}").unwrap(),
            FilterConfig::default()
        );
    }

    #[test]
    fn full_configuration_round_trips() {
        let json = r#"{"indexer_cluster": "idx", "timeout_ms": 50,
            "paths": ["/v1/chat/completions", "/openai/v1/completions"],
            "tenant_header": "x-team", "trust_tenant_header": true,
            "max_body_bytes": 1024, "destination_header": "x-dest", "report": false,
            "pick_stream_max_age_ms": 0, "pick_streams": 3}"#;
        let config = FilterConfig::from_json(json.as_bytes()).unwrap();
        assert_eq!(config.indexer_cluster, "idx");
        assert_eq!(config.timeout_ms, 50);
        assert_eq!(
            config.api_for("/openai/v1/completions"),
            Some(Api::Completions)
        );
        assert_eq!(config.api_for("/v1/chat/completions"), Some(Api::Chat));
        assert_eq!(config.api_for("/v1/completions"), None);
        assert_eq!(config.tenant_header, "x-team");
        assert!(config.trust_tenant_header);
        assert_eq!(config.max_body_bytes, 1024);
        assert_eq!(config.destination_header, "x-dest");
        assert!(!config.report);
        assert_eq!(config.pick_stream_max_age_ms, 0);
        assert_eq!(config.pick_streams, 3);
    }

    #[test]
    fn an_authority_turns_the_target_into_a_grpc_service() {
        let plain = FilterConfig::from_json(br#"{"indexer_cluster": "idx"}"#).unwrap();
        assert_eq!(plain.indexer_authority, None);
        assert_eq!(plain.indexer_target(), "idx");
        let istio = FilterConfig::from_json(
            br#"{"indexer_cluster": "outbound|9090||idx.ns.svc.cluster.local",
                 "indexer_authority": "idx.ns.svc.cluster.local:9090"}"#,
        )
        .unwrap();
        assert_eq!(
            istio.indexer_target(),
            grpc_target::encode(
                "outbound|9090||idx.ns.svc.cluster.local",
                Some("idx.ns.svc.cluster.local:9090")
            )
            .unwrap()
        );
        assert_ne!(istio.indexer_target(), istio.indexer_cluster);
    }

    #[test]
    fn defaults_cover_both_openai_paths() {
        let config = FilterConfig::default();
        assert_eq!(config.api_for("/v1/chat/completions"), Some(Api::Chat));
        assert_eq!(config.api_for("/v1/completions"), Some(Api::Completions));
        assert_eq!(config.api_for("/v1/messages"), Some(Api::Messages));
        assert_eq!(config.api_for("/v1/models"), None);
        config.validate().unwrap();
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        assert!(reason("{").contains("not valid JSON"));
        assert!(reason("[]").contains("must be a JSON object"));
        assert!(reason("\"x\"").contains("must be a JSON object"));
        assert!(reason("{} x").contains("not valid JSON"));
        assert!(reason(r#"{"timeout": 5}"#).contains("unknown field `timeout`"));
        assert!(reason(r#"{"timeout_ms": "5"}"#).contains("invalid type"));
        assert!(reason(r#"{"indexer_cluster": " "}"#).contains("indexer_cluster"));
        assert!(reason(r#"{"indexer_authority": "a|b"}"#).contains("indexer_authority"));
        let long = format!(r#"{{"indexer_authority": "{}.svc:9090"}}"#, "a".repeat(120));
        assert!(reason(&long).contains("at most"));
        assert!(reason(r#"{"timeout_ms": 0}"#).contains("timeout_ms"));
        assert!(reason(r#"{"timeout_ms": 60000}"#).contains("timeout_ms"));
        assert!(reason(r#"{"paths": []}"#).contains("at least one"));
        assert!(reason(r#"{"paths": ["v1/completions"]}"#).contains("start with `/`"));
        assert!(reason(r#"{"paths": ["/v1/completions?x=1"]}"#).contains("query"));
        assert!(reason(r#"{"paths": ["/v1/embeddings"]}"#).contains("must end with"));
        assert!(reason(r#"{"paths": ["/v1/completions", "/v1/completions"]}"#).contains("twice"));
        assert!(reason(r#"{"tenant_header": "X-Tenant"}"#).contains("lower-case"));
        assert!(reason(r#"{"tenant_header": ""}"#).contains("tenant_header"));
        assert!(reason(r#"{"destination_header": ":path"}"#).contains("destination_header"));
        assert!(
            reason(r#"{"tenant_header": "x-a", "destination_header": "x-a"}"#).contains("differ")
        );
        assert!(reason(r#"{"max_body_bytes": 0}"#).contains("max_body_bytes"));
        assert!(reason(r#"{"max_body_bytes": 1000000000}"#).contains("max_body_bytes"));
        assert!(reason(r#"{"pick_stream_max_age_ms": 999}"#).contains("pick_stream_max_age_ms"));
        assert!(reason(r#"{"pick_stream_max_age_ms": 3600001}"#).contains("0 (no stream)"));
        assert!(reason(r#"{"pick_streams": 0}"#).contains("pick_streams"));
        assert!(reason(r#"{"pick_streams": 17}"#).contains("1..=16"));
    }
}
