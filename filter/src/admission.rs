//! Request headers: which headers to strip, and whether the request's body is
//! worth buffering for a pick or passes straight through.

use kvsteer_proto::v1::ApiKind;

use crate::config::FilterConfig;
use crate::metrics::FailOpenReason;

/// The OpenAI API a path serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
}

/// What the headers say about the request, before any body is seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead<'a> {
    pub method: Option<&'a str>,
    pub path: Option<&'a str>,
    pub content_type: Option<&'a str>,
    pub content_length: Option<&'a str>,
    /// The headers ended the stream: no body follows.
    pub end_of_stream: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadersVerdict {
    /// Not a request the filter steers; no metric.
    PassThrough,
    /// A steerable path, but the request goes on untouched for this reason.
    FailOpen(FailOpenReason),
    /// Pause and buffer the body, then ask the indexer.
    Buffer(Api),
}

/// What to do with a request body chunk while buffering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyVerdict {
    /// Keep buffering.
    Wait,
    /// The whole body is here: ask the indexer.
    Complete,
    /// Over the limit: let go now, before Envoy's own buffer limit answers 413.
    TooLarge,
}

// === impl Api ===

impl Api {
    /// The API a configured path serves, by its last segments.
    pub fn for_path(path: &str) -> Option<Self> {
        if path.ends_with("/chat/completions") {
            Some(Self::Chat)
        } else if path.ends_with("/completions") {
            Some(Self::Completions)
        } else {
            None
        }
    }

    pub fn kind(self) -> ApiKind {
        match self {
            Self::Chat => ApiKind::Chat,
            Self::Completions => ApiKind::Completions,
        }
    }
}

// === decisions ===

/// Headers removed from every request before anything else: clients must not
/// steer requests themselves, nor claim a tenant unless that is trusted.
pub fn headers_to_strip(config: &FilterConfig) -> Vec<&str> {
    let mut names = vec![config.destination_header.as_str()];
    if !config.trust_tenant_header {
        names.push(config.tenant_header.as_str());
    }
    names
}

/// The path without its query string or fragment.
pub fn path_without_query(path: &str) -> &str {
    let end = path.find(['?', '#']).unwrap_or(path.len());
    &path[..end]
}

/// Decides from the headers alone whether to buffer the body.
pub fn classify(config: &FilterConfig, head: &RequestHead<'_>) -> HeadersVerdict {
    let Some(api) = head
        .path
        .and_then(|path| config.api_for(path_without_query(path)))
    else {
        return HeadersVerdict::PassThrough;
    };
    if head.method != Some("POST") || head.end_of_stream {
        return HeadersVerdict::PassThrough;
    }
    if let Some(content_type) = head.content_type
        && !is_json(content_type)
    {
        return HeadersVerdict::FailOpen(FailOpenReason::NotJson);
    }
    if let Some(length) = head.content_length {
        match length.trim().parse::<u64>() {
            Ok(0) => return HeadersVerdict::PassThrough,
            Ok(n) if n > config.max_body_bytes as u64 => {
                return HeadersVerdict::FailOpen(FailOpenReason::BodyTooLarge);
            }
            Ok(_) => {}
            // Envoy rejects malformed lengths itself; never buffer on a guess.
            Err(_) => return HeadersVerdict::FailOpen(FailOpenReason::BadRequest),
        }
    }
    HeadersVerdict::Buffer(api)
}

/// Decides on a body chunk; `buffered` is the running size Envoy reports.
pub fn on_body(config: &FilterConfig, buffered: usize, end_of_stream: bool) -> BodyVerdict {
    if buffered > config.max_body_bytes {
        BodyVerdict::TooLarge
    } else if end_of_stream {
        BodyVerdict::Complete
    } else {
        BodyVerdict::Wait
    }
}

/// `application/json`, with or without parameters (`; charset=utf-8`).
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head<'a>(path: &'a str) -> RequestHead<'a> {
        RequestHead {
            method: Some("POST"),
            path: Some(path),
            content_type: Some("application/json"),
            content_length: Some("120"),
            end_of_stream: false,
        }
    }

    #[test]
    fn buffers_openai_posts_with_a_body() {
        let config = FilterConfig::default();
        assert_eq!(
            classify(&config, &head("/v1/chat/completions")),
            HeadersVerdict::Buffer(Api::Chat)
        );
        assert_eq!(
            classify(&config, &head("/v1/completions?stream=1")),
            HeadersVerdict::Buffer(Api::Completions)
        );
        let chunked = RequestHead {
            content_length: None,
            content_type: Some("Application/JSON; charset=utf-8"),
            ..head("/v1/chat/completions")
        };
        assert_eq!(
            classify(&config, &chunked),
            HeadersVerdict::Buffer(Api::Chat)
        );
        let untyped = RequestHead {
            content_type: None,
            ..head("/v1/chat/completions")
        };
        assert_eq!(
            classify(&config, &untyped),
            HeadersVerdict::Buffer(Api::Chat)
        );
    }

    #[test]
    fn other_requests_pass_through() {
        let config = FilterConfig::default();
        for path in [
            "/v1/models",
            "/v1/chat/completions/x",
            "/",
            "/v1/completions2",
        ] {
            assert_eq!(
                classify(&config, &head(path)),
                HeadersVerdict::PassThrough,
                "{path}"
            );
        }
        let get = RequestHead {
            method: Some("GET"),
            ..head("/v1/completions")
        };
        assert_eq!(classify(&config, &get), HeadersVerdict::PassThrough);
        let bodiless = RequestHead {
            end_of_stream: true,
            ..head("/v1/completions")
        };
        assert_eq!(classify(&config, &bodiless), HeadersVerdict::PassThrough);
        let empty = RequestHead {
            content_length: Some("0"),
            ..head("/v1/completions")
        };
        assert_eq!(classify(&config, &empty), HeadersVerdict::PassThrough);
        let no_path = RequestHead {
            path: None,
            ..head("/v1/completions")
        };
        assert_eq!(classify(&config, &no_path), HeadersVerdict::PassThrough);
    }

    #[test]
    fn fails_open_on_content_type_and_size() {
        let config = FilterConfig {
            max_body_bytes: 100,
            ..FilterConfig::default()
        };
        let form = RequestHead {
            content_type: Some("application/x-www-form-urlencoded"),
            ..head("/v1/completions")
        };
        assert_eq!(
            classify(&config, &form),
            HeadersVerdict::FailOpen(FailOpenReason::NotJson)
        );
        assert_eq!(
            classify(&config, &head("/v1/completions")),
            HeadersVerdict::FailOpen(FailOpenReason::BodyTooLarge)
        );
        let at_limit = RequestHead {
            content_length: Some("100"),
            ..head("/v1/completions")
        };
        assert_eq!(
            classify(&config, &at_limit),
            HeadersVerdict::Buffer(Api::Completions)
        );
        let garbage = RequestHead {
            content_length: Some("12x"),
            ..head("/v1/completions")
        };
        assert_eq!(
            classify(&config, &garbage),
            HeadersVerdict::FailOpen(FailOpenReason::BadRequest)
        );
    }

    #[test]
    fn chunked_bodies_are_let_go_once_over_the_limit() {
        let config = FilterConfig {
            max_body_bytes: 100,
            ..FilterConfig::default()
        };
        assert_eq!(on_body(&config, 40, false), BodyVerdict::Wait);
        assert_eq!(on_body(&config, 100, false), BodyVerdict::Wait);
        assert_eq!(on_body(&config, 100, true), BodyVerdict::Complete);
        assert_eq!(on_body(&config, 0, true), BodyVerdict::Complete);
        assert_eq!(on_body(&config, 101, false), BodyVerdict::TooLarge);
        assert_eq!(on_body(&config, 101, true), BodyVerdict::TooLarge);
    }

    #[test]
    fn strips_destination_always_and_tenant_when_untrusted() {
        let mut config = FilterConfig::default();
        assert_eq!(
            headers_to_strip(&config),
            vec!["x-gateway-destination-endpoint"]
        );
        config.trust_tenant_header = false;
        assert_eq!(
            headers_to_strip(&config),
            vec!["x-gateway-destination-endpoint", "x-tenant-id"]
        );
    }

    #[test]
    fn query_and_fragment_are_ignored_in_paths() {
        assert_eq!(path_without_query("/v1/completions?a=b"), "/v1/completions");
        assert_eq!(path_without_query("/v1/completions#x"), "/v1/completions");
        assert_eq!(path_without_query("/v1/completions"), "/v1/completions");
        assert_eq!(path_without_query("?"), "");
    }

    #[test]
    fn api_follows_the_path_suffix() {
        assert_eq!(Api::for_path("/v1/chat/completions"), Some(Api::Chat));
        assert_eq!(Api::for_path("/x/v1/completions"), Some(Api::Completions));
        assert_eq!(Api::for_path("/v1/messages"), None);
        assert_eq!(Api::Chat.kind(), ApiKind::Chat);
        assert_eq!(Api::Completions.kind(), ApiKind::Completions);
    }
}
