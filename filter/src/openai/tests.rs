use super::*;
use kvsteer_proto::v1::ApiKind;

fn chat(json: &str) -> PickRequest {
    parse_pick_request(Api::Chat, json.as_bytes()).expect("chat body parses")
}

fn completion(json: &str) -> PickRequest {
    parse_pick_request(Api::Completions, json.as_bytes()).expect("completion body parses")
}

fn prompt_kind(json: &str) -> completion_prompt::Kind {
    completion(json)
        .prompt
        .and_then(|p| p.kind)
        .expect("prompt kind")
}

fn error(api: Api, json: &str) -> BodyError {
    parse_pick_request(api, json.as_bytes()).expect_err("body must be rejected")
}

#[test]
fn chat_top_level_fields() {
    let body = r#"{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}],
        "chat_template_kwargs": {"enable_thinking": false},
        "add_generation_prompt": true, "continue_final_message": false,
        "reasoning_effort": "low", "add_special_tokens": false, "cache_salt": "s1",
        "max_completion_tokens": 64, "stream": true, "temperature": 0.2}"#;
    let pick = chat(body);
    assert_eq!(pick.api, ApiKind::Chat as i32);
    assert_eq!(pick.model, "qwen3");
    assert_eq!(
        pick.tools_json,
        r#"[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}]"#
    );
    assert_eq!(
        pick.chat_template_kwargs_json,
        r#"{"enable_thinking":false}"#
    );
    assert_eq!(pick.add_generation_prompt, Some(true));
    assert_eq!(pick.continue_final_message, Some(false));
    assert_eq!(pick.reasoning_effort, "low");
    assert_eq!(pick.add_special_tokens, Some(false));
    assert_eq!(pick.cache_salt, "s1");
    assert_eq!(pick.max_tokens, Some(64));
    assert!(pick.stream);
    assert_eq!(pick.body_bytes as usize, body.len());
    assert!(pick.request_id.is_empty() && pick.tenant.is_empty());
    assert_eq!(pick.prompt, None);
}

#[test]
fn absent_optional_fields_stay_unset() {
    let pick = chat(r#"{"messages": [], "tools": null, "max_tokens": null}"#);
    assert_eq!(pick.model, "");
    assert_eq!(pick.tools_json, "");
    assert_eq!(pick.chat_template_kwargs_json, "");
    assert_eq!(pick.add_generation_prompt, None);
    assert_eq!(pick.add_special_tokens, None);
    assert_eq!(pick.max_tokens, None);
    assert!(!pick.stream);
    assert!(pick.messages.is_empty());
}

/// vLLM reads `max_completion_tokens or max_tokens` for chat.
#[test]
fn max_completion_tokens_wins_for_chat() {
    let pick = chat(r#"{"messages": [], "max_tokens": 5, "max_completion_tokens": 9}"#);
    assert_eq!(pick.max_tokens, Some(9));
}

#[test]
fn message_content_forms() {
    let pick = chat(
        r#"{"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
            "bare string"]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm"},
            {"type": "refusal", "refusal": "no"}]},
        {"role": "assistant", "content": null}
    ]}"#,
    );
    let contents: Vec<_> = pick.messages.iter().map(|m| m.content.clone()).collect();
    assert_eq!(
        contents[0],
        Some(chat_message::Content::Text("be brief".into()))
    );
    let part = |t: &str, text: Option<&str>| ContentPart {
        r#type: t.into(),
        text: text.map(Into::into),
    };
    assert_eq!(
        contents[1],
        Some(chat_message::Content::Parts(ContentParts {
            parts: vec![
                part("text", Some("look")),
                part("image_url", None),
                part("text", Some("bare string")),
            ]
        }))
    );
    assert_eq!(
        contents[2],
        Some(chat_message::Content::Parts(ContentParts {
            parts: vec![part("thinking", Some("hmm")), part("refusal", Some("no"))]
        }))
    );
    assert_eq!(contents[3], None);
    assert_eq!(pick.messages[0].role, "system");
}

#[test]
fn tool_calls_with_string_object_and_null_arguments() {
    let pick = chat(
        r#"{"messages": [
        {"role": "assistant", "reasoning_content": "think", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {"y": [1, 2], "a": "b"}}},
            {"id": "c3", "type": "function", "function": {"name": "h", "arguments": null}},
            {"id": "c4", "type": "function", "function": {"name": "k"}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "42"}
    ]}"#,
    );
    let calls = &pick.messages[0].tool_calls;
    assert_eq!(calls.len(), 4);
    assert_eq!(
        calls[0],
        ToolCall {
            id: "c1".into(),
            r#type: "function".into(),
            name: "f".into(),
            arguments: Some(r#"{"x": 1}"#.into()),
        }
    );
    assert_eq!(
        calls[1].arguments.as_deref(),
        Some(r#"{"y":[1,2],"a":"b"}"#)
    );
    assert_eq!(calls[2].arguments, None);
    assert_eq!(calls[3].arguments, None);
    assert_eq!(pick.messages[0].reasoning.as_deref(), Some("think"));
    assert_eq!(pick.messages[1].tool_call_id, "c1");
    assert_eq!(pick.messages[1].name, "f");
    assert_eq!(pick.messages[1].reasoning, None);
}

#[test]
fn reasoning_prefers_the_new_field() {
    let pick = chat(
        r#"{"messages": [{"role": "assistant", "reasoning": "new", "reasoning_content": "old"}]}"#,
    );
    assert_eq!(pick.messages[0].reasoning.as_deref(), Some("new"));
}

#[test]
fn completion_prompt_forms() {
    assert_eq!(
        prompt_kind(r#"{"prompt": "once upon"}"#),
        completion_prompt::Kind::Text("once upon".into())
    );
    assert_eq!(
        prompt_kind(r#"{"prompt": ["a", "b"]}"#),
        completion_prompt::Kind::Texts(Texts {
            texts: vec!["a".into(), "b".into()]
        })
    );
    assert_eq!(
        prompt_kind(r#"{"prompt": [1, 2, 4294967295]}"#),
        completion_prompt::Kind::TokenIds(TokenIds {
            ids: vec![1, 2, u32::MAX]
        })
    );
    assert_eq!(
        prompt_kind(r#"{"prompt": [[1, 2], [3]]}"#),
        completion_prompt::Kind::TokenIdBatch(TokenIdBatch {
            prompts: vec![TokenIds { ids: vec![1, 2] }, TokenIds { ids: vec![3] }]
        })
    );
    let pick = completion(r#"{"model": "m", "prompt": "x", "max_tokens": 3, "cache_salt": "c"}"#);
    assert_eq!(pick.api, ApiKind::Completions as i32);
    assert_eq!((pick.model.as_str(), pick.max_tokens), ("m", Some(3)));
    assert_eq!(pick.cache_salt, "c");
    assert!(pick.messages.is_empty());
}

/// The part types vLLM reads as text carry their text into the proto, each
/// from its own key (a `refusal` part's `text` is not its refusal).
#[test]
fn every_text_part_type_carries_its_text() {
    let pick = chat(
        r#"{"messages": [{"role": "user", "content": [
        {"type": "input_text", "text": "in"},
        {"type": "output_text", "text": "out"},
        {"type": "refusal", "text": "wrong key"},
        {"image_url": {"url": "u"}}]}]}"#,
    );
    let part = |t: &str, text: Option<&str>| ContentPart {
        r#type: t.into(),
        text: text.map(Into::into),
    };
    assert_eq!(
        pick.messages[0].content,
        Some(chat_message::Content::Parts(ContentParts {
            parts: vec![
                part("input_text", Some("in")),
                part("output_text", Some("out")),
                part("refusal", None),
                part("image_url", None),
            ]
        }))
    );
}

#[test]
fn malformed_bodies_are_errors() {
    assert!(matches!(error(Api::Chat, "{"), BodyError::Json(_)));
    assert!(matches!(error(Api::Chat, ""), BodyError::Json(_)));
    assert_eq!(error(Api::Chat, "[1]"), BodyError::NotAnObject);
    assert_eq!(
        error(Api::Chat, "{}"),
        BodyError::Missing("messages".into())
    );
    assert_eq!(
        error(Api::Completions, "{}"),
        BodyError::Missing("prompt".into())
    );
    for (api, body, field) in [
        (Api::Chat, r#"{"messages": {}}"#, "messages"),
        (Api::Chat, r#"{"messages": [1]}"#, "messages[0]"),
        (
            Api::Chat,
            r#"{"messages": [{"content": "x"}]}"#,
            "messages[0].role",
        ),
        (
            Api::Chat,
            r#"{"messages": [{"role": "user", "content": 3}]}"#,
            "messages[0].content",
        ),
        (
            Api::Chat,
            r#"{"messages": [{"role": "user", "content": [{"text": "no type"}]}]}"#,
            "messages[0].content[0].type",
        ),
        (
            Api::Chat,
            r#"{"messages": [{"role": "a", "tool_calls": {}}]}"#,
            "messages[0].tool_calls",
        ),
        (
            Api::Chat,
            r#"{"messages": [{"role": "a", "tool_calls": [{"function": 1}]}]}"#,
            "messages[0].tool_calls[0].function",
        ),
        (Api::Chat, r#"{"messages": [], "model": 7}"#, "model"),
        (Api::Chat, r#"{"messages": [], "stream": "yes"}"#, "stream"),
        (Api::Chat, r#"{"messages": [], "tools": {}}"#, "tools"),
        (
            Api::Chat,
            r#"{"messages": [], "max_tokens": -1}"#,
            "max_tokens",
        ),
        (Api::Completions, r#"{"prompt": []}"#, "prompt"),
        (Api::Completions, r#"{"prompt": ["a", 1]}"#, "prompt[1]"),
        (Api::Completions, r#"{"prompt": [[1], "a"]}"#, "prompt[1]"),
    ] {
        assert_eq!(error(api, body).field(), Some(field), "{body}");
    }
}

/// A `/v1/messages` body reaches the indexer as the chat request vLLM
/// converts it to, marked `API_KIND_MESSAGES`.
#[test]
fn anthropic_messages_become_chat_fields() {
    let body = r#"{"model":"claude","max_tokens":64,"stream":true,"cache_salt":"s",
        "system":"Be brief.",
        "tools":[{"name":"get","input_schema":{"properties":{}}}],
        "messages":[
            {"role":"user","content":"hi"},
            {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"get","input":{"q":1}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"tool_reference","tool_name":"get"}]}]}
        ]}"#;
    let pick = parse_pick_request(Api::Messages, body.as_bytes()).expect("messages body parses");
    assert_eq!(pick.api, ApiKind::Messages as i32);
    assert_eq!(pick.model, "claude");
    assert_eq!(pick.max_tokens, Some(64));
    assert!(pick.stream);
    assert_eq!(pick.cache_salt, "s");
    let roles: Vec<&str> = pick.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "tool"]);
    assert_eq!(
        pick.messages[2].tool_calls[0].arguments.as_deref(),
        Some(r#"{"q":1}"#)
    );
    assert_eq!(
        pick.messages[4].content,
        Some(chat_message::Content::Parts(ContentParts {
            parts: vec![ContentPart {
                r#type: "tool_reference".into(),
                text: Some("get".into()),
            }],
        }))
    );
    assert_eq!(
        pick.tools_json,
        r#"[{"type":"function","function":{"name":"get","description":null,"parameters":{"properties":{},"type":"object"},"strict":null,"defer_loading":null}}]"#
    );
}
