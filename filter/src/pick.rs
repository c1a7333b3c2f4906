//! The indexer's `PickResponse` (wire format) → what the filter does with the
//! paused request: steer it, answer it locally, or let it go untouched.

use std::net::SocketAddr;

use kvsteer_proto::v1::{PickResponse, Rejection};
use prost::Message;
use proxy_wasm::types::GrpcStatusCode;
use serde_json::json;

use crate::metrics::FailOpenReason;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PickOutcome {
    /// Forward the request upstream.
    Forward {
        /// Value for the destination header (`ip:port[,ip:port…]`); `None`
        /// leaves the choice to Envoy's fallback load balancing.
        destination: Option<String>,
        /// New request body, when the indexer rewrote it.
        replacement_body: Option<Vec<u8>>,
        /// The indexer replica that answered (`ip:port`), where the
        /// request's reports go; `None` when it advertised none.
        replica: Option<String>,
        /// The tenant's `cache_salt`, to add to the body (see [`with_cache_salt`]).
        cache_salt: Option<String>,
    },
    /// Answer the client with this local reply; nothing goes upstream.
    /// `retry_after_s` > 0 adds a `Retry-After` header.
    Reject {
        status: u32,
        body: Vec<u8>,
        retry_after_s: u32,
    },
    /// The answer was unusable; forward the request untouched.
    FailOpen(FailOpenReason),
}

/// The JSON shape of a local reply's error body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorShape {
    /// `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}`, for `/v1/messages`.
    Anthropic,
}

/// Decodes and interprets the indexer's answer; a rejection's body takes
/// `shape`.
pub fn decide(answer: &[u8], shape: ErrorShape) -> PickOutcome {
    match PickResponse::decode(answer) {
        Ok(response) => decide_response(response, shape),
        Err(_) => PickOutcome::FailOpen(FailOpenReason::BadAnswer),
    }
}

/// [`decide`] for an answer already decoded (a streamed one, decoded once
/// to find its request id).
pub fn decide_response(response: PickResponse, shape: ErrorShape) -> PickOutcome {
    if let Some(rejection) = response.rejection {
        let reply = match shape {
            ErrorShape::OpenAi => rejection_reply(&rejection),
            ErrorShape::Anthropic => anthropic_rejection_reply(&rejection),
        };
        return match reply {
            Some((status, body)) => PickOutcome::Reject {
                status,
                body,
                retry_after_s: rejection.retry_after_s,
            },
            None => PickOutcome::FailOpen(FailOpenReason::BadAnswer),
        };
    }
    // Invalid entries are dropped: Envoy's override_host would skip them anyway.
    let endpoints: Vec<&str> = response
        .endpoints
        .iter()
        .map(|e| e.trim())
        .filter(|e| e.parse::<SocketAddr>().is_ok())
        .collect();
    let replica = response.replica.trim();
    PickOutcome::Forward {
        destination: (!endpoints.is_empty()).then(|| endpoints.join(",")),
        replacement_body: response.replacement_body,
        replica: replica
            .parse::<SocketAddr>()
            .is_ok()
            .then(|| replica.to_owned()),
        cache_salt: (!response.cache_salt.is_empty()).then_some(response.cache_salt),
    }
}

/// `body` (a JSON object, as the filter parsed it) with `"cache_salt"` added
/// as its last key: a JSON parser keeping the last of duplicate keys (as
/// vLLM's does) then uses this salt whatever the client sent earlier.
/// `None` when the body does not end like an object.
pub fn with_cache_salt(body: &[u8], salt: &str) -> Option<Vec<u8>> {
    let end = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
    if body[end] != b'}' {
        return None;
    }
    let start = body.iter().position(|b| !b.is_ascii_whitespace())?;
    if body[start] != b'{' || start >= end {
        return None;
    }
    let empty = body[start + 1..end].iter().all(u8::is_ascii_whitespace);
    let value = serde_json::to_string(salt).ok()?;
    let mut out = Vec::with_capacity(body.len() + value.len() + 16);
    out.extend_from_slice(&body[..end]);
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(b"\"cache_salt\":");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(&body[end..]);
    Some(out)
}

/// Status and OpenAI error JSON of a local reply; `None` when the status is not
/// a client or server error.
pub fn rejection_reply(rejection: &Rejection) -> Option<(u32, Vec<u8>)> {
    let status = rejection.status;
    if !(400..=599).contains(&status) {
        return None;
    }
    let error_type = if rejection.error_type.is_empty() {
        default_error_type(status)
    } else {
        rejection.error_type.as_str()
    };
    let message = if rejection.message.is_empty() {
        "request rejected by the router"
    } else {
        rejection.message.as_str()
    };
    let body = json!({
        "error": {
            "message": message,
            "type": error_type,
            "param": null,
            "code": status,
        }
    });
    Some((status, body.to_string().into_bytes()))
}

/// Status and Anthropic error JSON of a local reply
/// (`{"type":"error","error":{"type","message"}}`); `None` when the status is
/// not a client or server error. The error type is the rejection's when it
/// is one of Anthropic's, else the one Anthropic uses for the status.
pub fn anthropic_rejection_reply(rejection: &Rejection) -> Option<(u32, Vec<u8>)> {
    const TYPES: [&str; 9] = [
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "overloaded_error",
        "timeout_error",
    ];
    let status = rejection.status;
    if !(400..=599).contains(&status) {
        return None;
    }
    let error_type = match TYPES.iter().find(|t| **t == rejection.error_type) {
        Some(t) => *t,
        None => match status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            504 => "timeout_error",
            503 | 529 => "overloaded_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        },
    };
    let message = if rejection.message.is_empty() {
        "request rejected by the router"
    } else {
        rejection.message.as_str()
    };
    let body = json!({
        "type": "error",
        "error": { "type": error_type, "message": message },
    });
    Some((status, body.to_string().into_bytes()))
}

fn default_error_type(status: u32) -> &'static str {
    match status {
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    }
}

/// Why a `Pick` call that ended with a non-OK gRPC status failed. Envoy
/// reports its own deadline as UNAVAILABLE (from the HTTP 504 of its async
/// client), so a failure that arrives near the deadline counts as a timeout
/// too. (Envoy 1.40 was seen reporting a 200 ms deadline after 197.9 ms of
/// wasm clock: the two clocks differ slightly.)
pub fn call_failure(grpc_status: u32, elapsed_ms: f64, timeout_ms: u64) -> FailOpenReason {
    if grpc_status == GrpcStatusCode::DeadlineExceeded as u32
        || elapsed_ms >= 0.9 * timeout_ms as f64
    {
        FailOpenReason::Timeout
    } else {
        FailOpenReason::GrpcError
    }
}

/// Headers to set on the request after its body was replaced.
pub fn replaced_body_headers(new_len: usize) -> [(&'static str, String); 1] {
    [("content-length", new_len.to_string())]
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvsteer_proto::v1::Decision;

    fn encode(response: PickResponse) -> Vec<u8> {
        response.encode_to_vec()
    }

    fn endpoints(list: &[&str]) -> PickResponse {
        PickResponse {
            endpoints: list.iter().map(|e| (*e).to_owned()).collect(),
            decision: Some(Decision {
                policy: "ttft".into(),
                ..Decision::default()
            }),
            ..PickResponse::default()
        }
    }

    #[test]
    fn endpoints_become_the_ordered_header_value() {
        let outcome = decide(
            &encode(endpoints(&["10.0.0.2:8000", "10.0.0.1:8000", "[::1]:9"])),
            ErrorShape::OpenAi,
        );
        assert_eq!(
            outcome,
            PickOutcome::Forward {
                destination: Some("10.0.0.2:8000,10.0.0.1:8000,[::1]:9".into()),
                replacement_body: None,
                replica: None,
                cache_salt: None,
            }
        );
    }

    #[test]
    fn invalid_endpoints_are_dropped_and_none_left_means_no_opinion() {
        let outcome = decide(
            &encode(endpoints(&[
                "worker-1",
                " 10.0.0.1:80 ",
                "1.2.3.4:80,5.6.7.8:80",
            ])),
            ErrorShape::OpenAi,
        );
        assert_eq!(
            outcome,
            PickOutcome::Forward {
                destination: Some("10.0.0.1:80".into()),
                replacement_body: None,
                replica: None,
                cache_salt: None,
            }
        );
        for answer in [endpoints(&[]), endpoints(&["", "host:port"])] {
            assert_eq!(
                decide(&encode(answer), ErrorShape::OpenAi),
                PickOutcome::Forward {
                    destination: None,
                    replacement_body: None,
                    replica: None,
                    cache_salt: None,
                }
            );
        }
    }

    #[test]
    fn the_answering_replica_is_kept_when_it_is_an_address() {
        let mut answer = endpoints(&["10.0.0.1:8000"]);
        answer.replica = " 10.1.0.7:9090 ".into();
        let PickOutcome::Forward { replica, .. } =
            decide(&encode(answer.clone()), ErrorShape::OpenAi)
        else {
            panic!("expected a forward");
        };
        assert_eq!(replica.as_deref(), Some("10.1.0.7:9090"));
        for bad in ["", "indexer-0", "10.1.0.7"] {
            answer.replica = bad.into();
            let PickOutcome::Forward { replica, .. } =
                decide(&encode(answer.clone()), ErrorShape::OpenAi)
            else {
                panic!("expected a forward");
            };
            assert_eq!(replica, None, "{bad:?}");
        }
    }

    #[test]
    fn replacement_body_is_passed_on_with_its_length() {
        let mut answer = endpoints(&["127.0.0.1:8001"]);
        answer.replacement_body = Some(b"{\"prompt\":[1,2]}".to_vec());
        let PickOutcome::Forward {
            replacement_body: Some(body),
            ..
        } = decide(&encode(answer), ErrorShape::OpenAi)
        else {
            panic!("expected a replacement body");
        };
        assert_eq!(body, b"{\"prompt\":[1,2]}");
        assert_eq!(
            replaced_body_headers(body.len()),
            [("content-length", "16".to_owned())]
        );
    }

    #[test]
    fn rejection_becomes_an_openai_error_reply() {
        let mut answer = endpoints(&["127.0.0.1:8001"]);
        answer.rejection = Some(Rejection {
            status: 429,
            message: "tenant over quota".into(),
            error_type: String::new(),
            retry_after_s: 7,
        });
        let PickOutcome::Reject {
            status,
            body,
            retry_after_s,
        } = decide(&encode(answer), ErrorShape::OpenAi)
        else {
            panic!("expected a rejection");
        };
        assert_eq!((status, retry_after_s), (429, 7));
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json,
            json!({"error": {"message": "tenant over quota", "type": "rate_limit_error",
                "param": null, "code": 429}})
        );
        assert_eq!(
            serde_json::to_string(
                &json["error"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .collect::<Vec<_>>()
            )
            .unwrap(),
            r#"["message","type","param","code"]"#
        );
    }

    #[test]
    fn rejection_fields_and_defaults() {
        let reply = |status, message: &str, error_type: &str| {
            rejection_reply(&Rejection {
                status,
                message: message.into(),
                error_type: error_type.into(),
                retry_after_s: 0,
            })
            .map(|(s, b)| (s, serde_json::from_slice::<serde_json::Value>(&b).unwrap()))
        };
        let (_, json) = reply(400, "", "").unwrap();
        assert_eq!(json["error"]["type"], "invalid_request_error");
        assert_eq!(json["error"]["message"], "request rejected by the router");
        let (_, json) = reply(503, "busy", "overloaded").unwrap();
        assert_eq!(json["error"]["type"], "overloaded");
        assert_eq!(
            reply(503, "", "").unwrap().1["error"]["type"],
            "server_error"
        );
        assert_eq!(reply(200, "x", ""), None);
        assert_eq!(reply(0, "x", ""), None);
        assert_eq!(reply(600, "x", ""), None);
    }

    #[test]
    fn the_salt_is_added_as_the_last_key() {
        let mut answer = endpoints(&["127.0.0.1:8001"]);
        answer.cache_salt = "kvsteer-00ff".into();
        let PickOutcome::Forward { cache_salt, .. } = decide(&encode(answer), ErrorShape::OpenAi)
        else {
            panic!("expected a forward");
        };
        assert_eq!(cache_salt.as_deref(), Some("kvsteer-00ff"));
        let salted = |body: &str| {
            with_cache_salt(body.as_bytes(), "s\"1").map(|b| String::from_utf8(b).unwrap())
        };
        assert_eq!(
            salted(" {\"model\":\"m\",\"cache_salt\":null}\n").as_deref(),
            Some(" {\"model\":\"m\",\"cache_salt\":null,\"cache_salt\":\"s\\\"1\"}\n")
        );
        assert_eq!(
            salted("{ }").as_deref(),
            Some("{ \"cache_salt\":\"s\\\"1\"}")
        );
        // The last of duplicate keys wins, as in Python's json.
        let v: serde_json::Value =
            serde_json::from_str(&salted("{\"cache_salt\":\"mine\",\"a\":[1,{}]}").unwrap())
                .unwrap();
        assert_eq!(v["cache_salt"], "s\"1");
        assert_eq!(v["a"], json!([1, {}]));
        for bad in ["", "[1]", "{\"a\":1", "}", " "] {
            assert_eq!(salted(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn failures_at_the_deadline_are_timeouts() {
        assert_eq!(call_failure(4, 3.0, 200), FailOpenReason::Timeout);
        assert_eq!(call_failure(14, 200.4, 200), FailOpenReason::Timeout);
        assert_eq!(call_failure(14, 197.9, 200), FailOpenReason::Timeout);
        assert_eq!(call_failure(14, 170.0, 200), FailOpenReason::GrpcError);
        assert_eq!(call_failure(14, 2.0, 200), FailOpenReason::GrpcError);
        assert_eq!(call_failure(2, 0.0, 200), FailOpenReason::GrpcError);
    }

    #[test]
    fn a_bad_rejection_or_undecodable_answer_fails_open() {
        let mut answer = endpoints(&["127.0.0.1:8001"]);
        answer.rejection = Some(Rejection {
            status: 0,
            ..Rejection::default()
        });
        assert_eq!(
            decide(&encode(answer), ErrorShape::OpenAi),
            PickOutcome::FailOpen(FailOpenReason::BadAnswer)
        );
        assert_eq!(
            decide(&[0xff, 0xff, 0xff], ErrorShape::OpenAi),
            PickOutcome::FailOpen(FailOpenReason::BadAnswer)
        );
        // An empty message is a valid, empty answer: no opinion.
        assert_eq!(
            decide(&[], ErrorShape::OpenAi),
            PickOutcome::Forward {
                destination: None,
                replacement_body: None,
                replica: None,
                cache_salt: None,
            }
        );
    }

    /// A `/v1/messages` rejection answers in Anthropic's error shape, with
    /// the status, message and (Anthropic) type of the rejection.
    #[test]
    fn anthropic_rejections_take_anthropic_shape() {
        let mut answer = endpoints(&["127.0.0.1:8001"]);
        answer.rejection = Some(Rejection {
            status: 429,
            message: "tenant over budget".into(),
            error_type: "rate_limit_exceeded".into(),
            retry_after_s: 3,
        });
        let PickOutcome::Reject {
            status,
            body,
            retry_after_s,
        } = decide(&encode(answer.clone()), ErrorShape::Anthropic)
        else {
            panic!("a rejection")
        };
        assert_eq!((status, retry_after_s), (429, 3));
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"tenant over budget"}}"#
        );
        let typed = |status, error_type: &str| {
            let (_, body) = anthropic_rejection_reply(&Rejection {
                status,
                message: String::new(),
                error_type: error_type.into(),
                retry_after_s: 0,
            })
            .unwrap();
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(json["error"]["message"], "request rejected by the router");
            json["error"]["type"].as_str().unwrap().to_owned()
        };
        assert_eq!(typed(400, ""), "invalid_request_error");
        assert_eq!(typed(503, ""), "overloaded_error");
        assert_eq!(typed(500, "server_error"), "api_error");
        assert_eq!(typed(400, "request_too_large"), "request_too_large");
        assert_eq!(typed(413, ""), "request_too_large");
        assert!(anthropic_rejection_reply(&Rejection::default()).is_none());
        // The same answer on a chat path keeps OpenAI's shape.
        let PickOutcome::Reject { body, .. } = decide(&encode(answer), ErrorShape::OpenAi) else {
            panic!("a rejection")
        };
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"]["code"], 429);
    }
}
