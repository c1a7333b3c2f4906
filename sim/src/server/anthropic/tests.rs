use super::*;
use crate::server::openai::Api;

fn meta() -> ResponseMeta {
    ResponseMeta {
        api: Api::Messages,
        id: "chatcmpl-1".into(),
        created: 0,
        model: "tiny".into(),
    }
}

fn parse_events(bytes: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(bytes).unwrap();
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let mut lines = e.lines();
            let kind = lines.next().unwrap().strip_prefix("event: ").unwrap();
            let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
            let data: Value = serde_json::from_str(data).unwrap();
            assert_eq!(data["type"], kind, "event name = data type");
            (kind.to_owned(), data)
        })
        .collect()
}

#[test]
fn stream_events_follow_vllm_order() {
    let mut s = StreamState::new(40);
    let mut out = BytesMut::new();
    let tok = |finish| Delta {
        token_id: 1,
        finish,
    };
    out.extend_from_slice(&s.events(&meta(), &tok(None), "Hel"));
    out.extend_from_slice(&s.events(&meta(), &tok(None), ""));
    let usage = Usage {
        prompt_tokens: 40,
        completion_tokens: 3,
        cached_tokens: 32,
    };
    out.extend_from_slice(&s.events(
        &meta(),
        &tok(Some(Finish {
            reason: FinishReason::Length,
            usage,
        })),
        "lo",
    ));
    let events = parse_events(&out);
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(
        events[0].1["message"]["usage"],
        json!({"input_tokens": 40, "output_tokens": 0})
    );
    assert_eq!(events[0].1["message"]["role"], "assistant");
    assert_eq!(
        events[2].1["delta"],
        json!({"type": "text_delta", "text": "Hel"})
    );
    assert_eq!(events[5].1["delta"]["stop_reason"], "max_tokens");
    assert_eq!(
        events[5].1["usage"],
        json!({"input_tokens": 8, "output_tokens": 3, "cache_read_input_tokens": 32})
    );
}

#[test]
fn whole_message_and_errors() {
    let usage = Usage {
        prompt_tokens: 5,
        completion_tokens: 2,
        cached_tokens: 0,
    };
    let body = full(&meta(), "hi", FinishReason::Stop, &usage);
    assert_eq!(body["type"], "message");
    assert_eq!(body["content"], json!([{"type": "text", "text": "hi"}]));
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(body["usage"]["input_tokens"], 5);
    assert_eq!(
        full(&meta(), "", FinishReason::Stop, &usage)["content"],
        json!([])
    );
}
