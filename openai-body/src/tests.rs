use serde_json::json;

use super::*;

fn chat(body: Value) -> (Request, Chat) {
    let req = from_value(Api::Chat, body).expect("chat body parses");
    match &req.input {
        Input::Chat(chat) => {
            let chat = chat.clone();
            (req, chat)
        }
        Input::Completion(_) => panic!("not chat"),
    }
}

fn prompt(value: Value) -> Prompt {
    match from_value(Api::Completions, json!({ "prompt": value })) {
        Ok(Request {
            input: Input::Completion(p),
            ..
        }) => p,
        other => panic!("prompt must parse: {other:?}"),
    }
}

fn error(api: Api, body: Value) -> BodyError {
    from_value(api, body).expect_err("body must be rejected")
}

fn part(kind: &str, text: Option<&str>) -> Part {
    Part {
        kind: kind.into(),
        text: text.map(Into::into),
    }
}

#[test]
fn top_level_fields() {
    let (req, chat) = chat(json!({
        "model": "qwen3", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}],
        "chat_template_kwargs": {"enable_thinking": false},
        "add_generation_prompt": true, "continue_final_message": false,
        "reasoning_effort": "low", "add_special_tokens": false, "cache_salt": "s1",
        "max_completion_tokens": 64, "stream": true, "temperature": 0.2
    }));
    assert_eq!(req.model, "qwen3");
    assert!(req.stream);
    assert_eq!(req.max_tokens, Some(64));
    assert_eq!(req.add_special_tokens, Some(false));
    assert_eq!(req.cache_salt.as_deref(), Some("s1"));
    let tools = chat.tools.expect("tools");
    assert_eq!(
        Value::Array(tools).to_string(),
        r#"[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}]"#
    );
    assert_eq!(
        chat.chat_template_kwargs,
        json!({"enable_thinking": false}).as_object().cloned()
    );
    assert_eq!(chat.add_generation_prompt, Some(true));
    assert_eq!(chat.continue_final_message, Some(false));
    assert_eq!(chat.reasoning_effort.as_deref(), Some("low"));
}

#[test]
fn absent_and_null_fields_stay_unset() {
    let (req, chat) = chat(json!({"messages": [], "tools": null, "max_tokens": null,
        "chat_template_kwargs": null, "model": null}));
    assert_eq!(req.model, "", "a missing model parses as empty");
    assert_eq!(
        (req.stream, req.max_tokens, req.cache_salt),
        (false, None, None)
    );
    assert_eq!(chat, Chat::default());
}

/// vLLM: `max_completion_tokens or max_tokens` for chat; completions have
/// only `max_tokens`.
#[test]
fn max_completion_tokens_wins_for_chat_as_in_vllm() {
    let max = |api, body: Value| from_value(api, body).unwrap().max_tokens;
    let both = json!({"messages": [], "prompt": "p", "max_tokens": 5, "max_completion_tokens": 9});
    assert_eq!(max(Api::Chat, both.clone()), Some(9));
    assert_eq!(max(Api::Completions, both), Some(5));
    let zero = json!({"messages": [], "max_tokens": 5, "max_completion_tokens": 0});
    assert_eq!(max(Api::Chat, zero), Some(5));
    let only = json!({"messages": [], "prompt": "p", "max_completion_tokens": 9});
    assert_eq!(max(Api::Chat, only.clone()), Some(9));
    assert_eq!(max(Api::Completions, only), None);
}

#[test]
fn content_forms() {
    let (_, chat) = chat(json!({"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
            "bare string"]},
        {"role": "assistant", "content": null},
        {"role": "assistant"},
        {"role": "user", "content": []}
    ]}));
    let contents: Vec<_> = chat.messages.iter().map(|m| m.content.clone()).collect();
    assert_eq!(
        contents,
        [
            Content::Text("be brief".into()),
            Content::Parts(vec![
                part("text", Some("look")),
                part("image_url", None),
                part("text", Some("bare string")),
            ]),
            Content::Null,
            Content::Null,
            Content::Parts(vec![]),
        ]
    );
}

/// vLLM's `_parse_chat_message_content_part`: these part types are text,
/// each read from its own key; a wrong key gives no text.
#[test]
fn text_parts_follow_vllm() {
    let (_, chat) = chat(json!({"messages": [{"role": "user", "content": [
        {"type": "input_text", "text": "in"},
        {"type": "output_text", "text": "out"},
        {"type": "refusal", "refusal": "no"},
        {"type": "thinking", "thinking": "hmm"},
        {"type": "tool_reference", "name": "lookup"},
        {"type": "refusal", "text": "not the refusal key"},
        {"type": "text"},
        {"type": "text", "text": null},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "video_url", "video_url": {"url": "v"}},
        {"type": "something_new", "text": "unknown types carry no text"}
    ]}]}));
    assert_eq!(
        chat.messages[0].content,
        Content::Parts(vec![
            part("input_text", Some("in")),
            part("output_text", Some("out")),
            part("refusal", Some("no")),
            part("thinking", Some("hmm")),
            part("tool_reference", Some("lookup")),
            part("refusal", None),
            part("text", None),
            part("text", None),
            part("input_audio", None),
            part("video_url", None),
            part("something_new", None),
        ])
    );
}

/// vLLM infers a part's type from its payload field when `type` is missing
/// or a `uuid` is given.
#[test]
fn untyped_parts_take_the_type_of_their_payload() {
    let (_, chat) = chat(json!({"messages": [{"role": "user", "content": [
        {"image_url": {"url": "u"}},
        {"type": null, "audio_url": "a"},
        {"input_audio": null, "video_url": "v"},
        {"type": "text", "uuid": "u1", "image_embeds": "e"},
        {"tool_reference": {}, "name": "t"}
    ]}]}));
    assert_eq!(
        chat.messages[0].content,
        Content::Parts(vec![
            part("image_url", None),
            part("audio_url", None),
            part("video_url", None),
            part("image_embeds", None),
            part("tool_reference", Some("t")),
        ])
    );
    for body in [
        json!({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}),
        json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "uuid": "u"}]}]}),
    ] {
        assert_eq!(
            error(Api::Chat, body),
            BodyError::Missing("messages[0].content[0].type".into())
        );
    }
}

#[test]
fn tool_calls_with_string_object_and_null_arguments() {
    let (_, chat) = chat(json!({"messages": [
        {"role": "assistant", "reasoning_content": "think", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {"y": [1, 2], "a": "b"}}},
            {"id": "c3", "function": {"name": "h", "arguments": null}},
            {"function": {"name": "k"}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "42"}
    ]}));
    let calls = &chat.messages[0].tool_calls;
    assert_eq!(
        calls[0],
        ToolCall {
            id: Some("c1".into()),
            kind: Some("function".into()),
            name: "f".into(),
            arguments: Some(r#"{"x": 1}"#.into()),
        }
    );
    assert_eq!(
        calls[1].arguments.as_deref(),
        Some(r#"{"y":[1,2],"a":"b"}"#)
    );
    assert_eq!(
        (calls[2].kind.as_deref(), calls[2].arguments.as_deref()),
        (None, None)
    );
    assert_eq!(
        (calls[3].id.as_deref(), calls[3].arguments.as_deref()),
        (None, None)
    );
    assert_eq!(chat.messages[0].reasoning.as_deref(), Some("think"));
    let tool = &chat.messages[1];
    assert_eq!(tool.tool_call_id.as_deref(), Some("c1"));
    assert_eq!(tool.name.as_deref(), Some("f"));
    assert_eq!(tool.reasoning, None);
}

#[test]
fn reasoning_wins_over_reasoning_content() {
    let (_, chat) = chat(json!({"messages": [
        {"role": "assistant", "reasoning": "new", "reasoning_content": "old"}
    ]}));
    assert_eq!(chat.messages[0].reasoning.as_deref(), Some("new"));
}

#[test]
fn completion_prompt_forms() {
    assert_eq!(prompt(json!("once upon")), Prompt::Text("once upon".into()));
    assert_eq!(
        prompt(json!(["a", "b"])),
        Prompt::Texts(vec!["a".into(), "b".into()])
    );
    assert_eq!(
        prompt(json!([1, 2, 4294967295u64])),
        Prompt::Ids(vec![1, 2, u32::MAX])
    );
    assert_eq!(
        prompt(json!([[1, 2], [3]])),
        Prompt::IdBatch(vec![vec![1, 2], vec![3]])
    );
    let req = from_value(
        Api::Completions,
        json!({"model": "m", "prompt": "x", "max_tokens": 3, "cache_salt": "c",
               "add_special_tokens": false, "messages": "ignored"}),
    )
    .unwrap();
    assert_eq!((req.model.as_str(), req.max_tokens), ("m", Some(3)));
    assert_eq!(req.cache_salt.as_deref(), Some("c"));
    assert_eq!(req.add_special_tokens, Some(false));
}

#[test]
fn bytes_that_are_not_an_object() {
    assert!(matches!(parse(Api::Chat, b"{"), Err(BodyError::Json(_))));
    assert!(matches!(parse(Api::Chat, b""), Err(BodyError::Json(_))));
    assert_eq!(parse(Api::Chat, b"[1]"), Err(BodyError::NotAnObject));
    assert_eq!(
        parse(Api::Completions, b"\"x\""),
        Err(BodyError::NotAnObject)
    );
}

#[test]
fn every_malformed_field_is_named() {
    use Api::{Chat as C, Completions as P};
    for (api, body, field) in [
        (C, json!({}), "messages"),
        (C, json!({"messages": null}), "messages"),
        (C, json!({"messages": {}}), "messages"),
        (C, json!({"messages": [1]}), "messages[0]"),
        (
            C,
            json!({"messages": [{"content": "x"}]}),
            "messages[0].role",
        ),
        (C, json!({"messages": [{"role": 3}]}), "messages[0].role"),
        (
            C,
            json!({"messages": [{"role": "u", "content": 3}]}),
            "messages[0].content",
        ),
        (
            C,
            json!({"messages": [{"role": "u", "content": [7]}]}),
            "messages[0].content[0]",
        ),
        (
            C,
            json!({"messages": [{"role": "u", "content": [{"type": 1}]}]}),
            "messages[0].content[0].type",
        ),
        (
            C,
            json!({"messages": [{"role": "u", "content": [{"type": "text", "text": 1}]}]}),
            "messages[0].content[0].text",
        ),
        (
            C,
            json!({"messages": [{"role": "u", "content": ["a", {"type": "thinking", "thinking": []}]}]}),
            "messages[0].content[1].thinking",
        ),
        (
            C,
            json!({"messages": [{"role": "a", "tool_calls": {}}]}),
            "messages[0].tool_calls",
        ),
        (
            C,
            json!({"messages": [{"role": "a", "tool_calls": [1]}]}),
            "messages[0].tool_calls[0]",
        ),
        (
            C,
            json!({"messages": [{"role": "a", "tool_calls": [{}]}]}),
            "messages[0].tool_calls[0].function",
        ),
        (
            C,
            json!({"messages": [{"role": "a", "tool_calls": [{"function": 1}]}]}),
            "messages[0].tool_calls[0].function",
        ),
        (
            C,
            json!({"messages": [{"role": "a", "tool_calls": [{"function": {}}]}]}),
            "messages[0].tool_calls[0].function.name",
        ),
        (
            C,
            json!({"messages": [{"role": "a", "tool_calls": [{"id": 1, "function": {"name": "f"}}]}]}),
            "messages[0].tool_calls[0].id",
        ),
        (
            C,
            json!({"messages": [{"role": "a", "name": 1}]}),
            "messages[0].name",
        ),
        (
            C,
            json!({"messages": [{"role": "a", "tool_call_id": 1}]}),
            "messages[0].tool_call_id",
        ),
        (
            C,
            json!({"messages": [{"role": "a", "reasoning": 1}]}),
            "messages[0].reasoning",
        ),
        (
            C,
            json!({"messages": [{"role": "a", "reasoning_content": 1}]}),
            "messages[0].reasoning_content",
        ),
        (C, json!({"messages": [], "tools": {}}), "tools"),
        (
            C,
            json!({"messages": [], "chat_template_kwargs": []}),
            "chat_template_kwargs",
        ),
        (
            C,
            json!({"messages": [], "add_generation_prompt": "yes"}),
            "add_generation_prompt",
        ),
        (
            C,
            json!({"messages": [], "continue_final_message": 1}),
            "continue_final_message",
        ),
        (
            C,
            json!({"messages": [], "reasoning_effort": 1}),
            "reasoning_effort",
        ),
        (C, json!({"messages": [], "model": 7}), "model"),
        (C, json!({"messages": [], "stream": "yes"}), "stream"),
        (C, json!({"messages": [], "cache_salt": {}}), "cache_salt"),
        (
            C,
            json!({"messages": [], "add_special_tokens": 0}),
            "add_special_tokens",
        ),
        (C, json!({"messages": [], "max_tokens": -1}), "max_tokens"),
        (C, json!({"messages": [], "max_tokens": 1.5}), "max_tokens"),
        (
            C,
            json!({"messages": [], "max_completion_tokens": 4294967296u64}),
            "max_completion_tokens",
        ),
        (P, json!({}), "prompt"),
        (P, json!({"prompt": null}), "prompt"),
        (P, json!({"prompt": []}), "prompt"),
        (P, json!({"prompt": 5}), "prompt"),
        (P, json!({"prompt": [true]}), "prompt"),
        (P, json!({"prompt": [null]}), "prompt"),
        (P, json!({"prompt": ["a", 1]}), "prompt[1]"),
        (P, json!({"prompt": [1, -2]}), "prompt[1]"),
        (P, json!({"prompt": [1, 2.5]}), "prompt[1]"),
        (P, json!({"prompt": [1, 4294967296u64]}), "prompt[1]"),
        (P, json!({"prompt": [[1], "a"]}), "prompt[1]"),
        (P, json!({"prompt": [[1], []]}), "prompt[1]"),
        (P, json!({"prompt": [[1], [2, "x"]]}), "prompt[1][1]"),
    ] {
        let err = error(api, body.clone());
        assert_eq!(err.field(), Some(field), "{body}: {err}");
        assert!(err.to_string().contains(&format!("`{field}`")), "{err}");
    }
}
