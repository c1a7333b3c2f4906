//! Request headers: which headers to strip, and whether the request's body is
//! worth buffering for a pick or passes straight through.

use kvsteer_proto::v1::ApiKind;

use crate::config::{FilterConfig, MAX_TENANT_BYTES};
use crate::metrics::FailOpenReason;
use crate::pick::ErrorShape;

/// The API a path serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
    /// Anthropic's Messages API (`/v1/messages`), which vLLM serves too.
    Messages,
}

/// What the headers say about the request, before any body is seen. The
/// content type is not among them: clients send JSON as `text/plain`, with
/// charsets or with no type at all, so the body decides (see [`body_start`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead<'a> {
    pub method: Option<&'a str>,
    pub path: Option<&'a str>,
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
    /// The body does not start like a JSON object: let go without buffering the rest.
    NotJson,
}

/// What the first bytes of a body say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyStart {
    /// Starts with `{` (after whitespace): buffer it and let the parser decide.
    Object,
    /// Starts with something else: no OpenAI request.
    NotJson,
    /// Only whitespace so far.
    Blank,
}

/// Bytes of a body's start the host reads to tell JSON from not; a body
/// with this much leading whitespace is left to the parser.
pub const SNIFF_BYTES: usize = 512;

// === impl Api ===

impl Api {
    /// The API a configured path serves, by its last segments.
    pub fn for_path(path: &str) -> Option<Self> {
        if path.ends_with("/chat/completions") {
            Some(Self::Chat)
        } else if path.ends_with("/completions") {
            Some(Self::Completions)
        } else if path.ends_with("/messages") {
            Some(Self::Messages)
        } else {
            None
        }
    }

    pub fn kind(self) -> ApiKind {
        match self {
            Self::Chat => ApiKind::Chat,
            Self::Completions => ApiKind::Completions,
            Self::Messages => ApiKind::Messages,
        }
    }

    /// The error body shape clients of this API expect in a local reply.
    pub fn error_shape(self) -> ErrorShape {
        match self {
            Self::Chat | Self::Completions => ErrorShape::OpenAi,
            Self::Messages => ErrorShape::Anthropic,
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

/// The tenant a pick carries, from the (trusted) tenant header's value: none
/// when the header is absent or untrusted, or when the value is longer than
/// [`MAX_TENANT_BYTES`] or holds anything but visible ASCII (a safe fallback:
/// the request is still steered, as nobody's).
pub fn tenant_of(config: &FilterConfig, value: Option<&str>) -> Result<String, TenantError> {
    let Some(value) = value.filter(|_| config.trust_tenant_header) else {
        return Ok(String::new());
    };
    if value.len() > MAX_TENANT_BYTES {
        return Err(TenantError::TooLong(value.len()));
    }
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(TenantError::NotVisibleAscii);
    }
    Ok(value.to_owned())
}

/// Why a tenant header's value was dropped.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    #[error("tenant header of {0} bytes exceeds {MAX_TENANT_BYTES}; sent without tenant")]
    TooLong(usize),
    #[error("tenant header holds other than visible ASCII; sent without tenant")]
    NotVisibleAscii,
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

/// Decides on a body chunk; `buffered` is the running size Envoy reports and
/// `start` what its first bytes say (`None` once that is settled as JSON).
pub fn on_body(
    config: &FilterConfig,
    buffered: usize,
    end_of_stream: bool,
    start: Option<BodyStart>,
) -> BodyVerdict {
    match start {
        Some(BodyStart::NotJson) => return BodyVerdict::NotJson,
        // Empty or all whitespace to the end: nothing to parse.
        Some(BodyStart::Blank) if end_of_stream => return BodyVerdict::NotJson,
        _ => {}
    }
    if buffered > config.max_body_bytes {
        BodyVerdict::TooLarge
    } else if end_of_stream {
        BodyVerdict::Complete
    } else {
        BodyVerdict::Wait
    }
}

/// Classifies the first bytes of a body (up to [`SNIFF_BYTES`] of them).
pub fn body_start(prefix: &[u8]) -> BodyStart {
    match prefix.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => BodyStart::Object,
        Some(_) => BodyStart::NotJson,
        None => BodyStart::Blank,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head<'a>(path: &'a str) -> RequestHead<'a> {
        RequestHead {
            method: Some("POST"),
            path: Some(path),
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
        // Claude Code posts to `/v1/messages?beta=true`.
        assert_eq!(
            classify(&config, &head("/v1/messages?beta=true")),
            HeadersVerdict::Buffer(Api::Messages)
        );
        let chunked = RequestHead {
            content_length: None,
            ..head("/v1/chat/completions")
        };
        assert_eq!(
            classify(&config, &chunked),
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
    fn fails_open_on_size_and_framing() {
        let config = FilterConfig {
            max_body_bytes: 100,
            ..FilterConfig::default()
        };
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
        assert_eq!(on_body(&config, 40, false, None), BodyVerdict::Wait);
        assert_eq!(on_body(&config, 100, false, None), BodyVerdict::Wait);
        assert_eq!(on_body(&config, 100, true, None), BodyVerdict::Complete);
        assert_eq!(on_body(&config, 101, false, None), BodyVerdict::TooLarge);
        assert_eq!(on_body(&config, 101, true, None), BodyVerdict::TooLarge);
        let object = Some(BodyStart::Object);
        assert_eq!(on_body(&config, 40, true, object), BodyVerdict::Complete);
        assert_eq!(on_body(&config, 101, false, object), BodyVerdict::TooLarge);
    }

    #[test]
    fn the_body_not_the_content_type_decides_json() {
        assert_eq!(body_start(b"{\"model\":1}"), BodyStart::Object);
        assert_eq!(body_start(b" \r\n\t{"), BodyStart::Object);
        assert_eq!(body_start(b"hello worker"), BodyStart::NotJson);
        assert_eq!(body_start(b"[1,2]"), BodyStart::NotJson);
        assert_eq!(body_start(b"--boundary\r\n"), BodyStart::NotJson);
        assert_eq!(body_start(b""), BodyStart::Blank);
        assert_eq!(body_start(b"  \n "), BodyStart::Blank);

        let config = FilterConfig::default();
        let not_json = Some(BodyStart::NotJson);
        assert_eq!(on_body(&config, 10, false, not_json), BodyVerdict::NotJson);
        let blank = Some(BodyStart::Blank);
        assert_eq!(on_body(&config, 3, false, blank), BodyVerdict::Wait);
        assert_eq!(on_body(&config, 3, true, blank), BodyVerdict::NotJson);
        assert_eq!(on_body(&config, 0, true, blank), BodyVerdict::NotJson);
    }

    #[test]
    fn strips_destination_always_and_tenant_unless_trusted() {
        let mut config = FilterConfig::default();
        assert_eq!(
            headers_to_strip(&config),
            vec!["x-gateway-destination-endpoint", "x-tenant-id"]
        );
        config.trust_tenant_header = true;
        assert_eq!(
            headers_to_strip(&config),
            vec!["x-gateway-destination-endpoint"]
        );
    }

    #[test]
    fn tenant_is_read_only_when_trusted_and_capped() {
        let mut config = FilterConfig::default();
        assert_eq!(tenant_of(&config, Some("team-a")), Ok(String::new()));
        config.trust_tenant_header = true;
        assert_eq!(tenant_of(&config, Some("team-a")), Ok("team-a".into()));
        assert_eq!(tenant_of(&config, None), Ok(String::new()));
        let longest = "t".repeat(MAX_TENANT_BYTES);
        assert_eq!(tenant_of(&config, Some(&longest)), Ok(longest.clone()));
        let over = format!("{longest}x");
        assert_eq!(
            tenant_of(&config, Some(&over)),
            Err(TenantError::TooLong(MAX_TENANT_BYTES + 1))
        );
        for bad in ["team a", "team\u{7f}", "t\u{e9}am", "\t"] {
            assert_eq!(
                tenant_of(&config, Some(bad)),
                Err(TenantError::NotVisibleAscii),
                "{bad:?}"
            );
        }
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
        assert_eq!(Api::for_path("/v1/messages"), Some(Api::Messages));
        assert_eq!(Api::for_path("/v1/messages/count_tokens"), None);
        assert_eq!(Api::for_path("/v1/models"), None);
        assert_eq!(Api::Chat.kind(), ApiKind::Chat);
        assert_eq!(Api::Completions.kind(), ApiKind::Completions);
        assert_eq!(Api::Messages.kind(), ApiKind::Messages);
        assert_eq!(Api::Chat.error_shape(), ErrorShape::OpenAi);
        assert_eq!(Api::Messages.error_shape(), ErrorShape::Anthropic);
    }
}
