use serde_json::{Value, json};

use crate::{Api, BodyError, Content, Input, Message, Part, from_value};

fn convert(body: Value) -> crate::Chat {
    let req = from_value(Api::Messages, body).expect("messages body parses");
    match req.input {
        Input::Chat(chat) => chat,
        Input::Completion(_) => panic!("a messages body converts to chat"),
    }
}

fn text(role: &str, t: &str) -> Message {
    Message {
        role: role.into(),
        content: Content::Text(t.into()),
        ..Message::default()
    }
}

#[test]
fn system_blocks_join_and_system_messages_stay_in_place() {
    let chat = convert(json!({
        "model": "m", "max_tokens": 5,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc=1;"},
            {"type": "text", "text": "You are "},
            {"type": "text", "text": ""},
            {"type": "text", "text": "terse."}
        ],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "kind."}]},
            {"role": "system", "content": "x-anthropic-billing-header: cc=2;"},
            {"role": "system", "content": []},
            {"role": "user", "content": "ok"}
        ]
    }));
    assert_eq!(
        chat.messages,
        vec![
            text("system", "You are terse."),
            text("user", "hi"),
            text("system", "Be kind."),
            text("user", "ok")
        ]
    );
}

#[test]
fn disabled_thinking_means_no_reasoning_effort() {
    let chat = convert(json!({
        "model": "m", "max_tokens": 5,
        "output_config": {"effort": "high"},
        "thinking": {"type": "disabled"},
        "messages": [{"role": "user", "content": "q"}]
    }));
    assert_eq!(chat.reasoning_effort.as_deref(), Some("none"));
    let chat = convert(json!({
        "model": "m", "max_tokens": 5,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "messages": [{"role": "user", "content": "q"}]
    }));
    assert_eq!(chat.reasoning_effort, None);
}

#[test]
fn blocks_become_content_reasoning_and_tool_calls() {
    let chat = convert(json!({
        "model": "m", "max_tokens": 5,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "one"}]},
            {"role": "user", "content": [
                {"type": "text", "text": "a"},
                {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}},
                {"type": "text", "text": "b"}
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "redacted_thinking", "data": "zz"},
                {"type": "thinking", "thinking": "m"},
                {"type": "tool_use", "id": "t1", "name": "get", "input": {"b": 1, "a": "é"}}
            ]}
        ]
    }));
    assert_eq!(chat.messages[0], text("user", "one"));
    assert_eq!(
        chat.messages[1].content,
        Content::Parts(vec![
            Part {
                kind: "text".into(),
                text: Some("a".into())
            },
            Part {
                kind: "image_url".into(),
                text: None
            },
            Part {
                kind: "text".into(),
                text: Some("b".into())
            },
        ])
    );
    let assistant = &chat.messages[2];
    assert_eq!(assistant.content, Content::Null);
    assert_eq!(assistant.reasoning.as_deref(), Some("hmm"));
    assert_eq!(assistant.tool_calls.len(), 1);
    assert_eq!(assistant.tool_calls[0].name, "get");
    assert_eq!(assistant.tool_calls[0].id.as_deref(), Some("t1"));
    assert_eq!(
        assistant.tool_calls[0].arguments.as_deref(),
        Some(r#"{"b":1,"a":"é"}"#)
    );
}

#[test]
fn user_tool_results_come_before_the_user_message_and_keep_tool_references() {
    let chat = convert(json!({
        "model": "m", "max_tokens": 5,
        "messages": [
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "l1"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}},
                    {"type": "text", "text": "l2"},
                    {"type": "tool_reference", "tool_name": "search"},
                    {"type": "tool_reference", "name": "fetch"},
                    {"type": "tool_reference"}
                ]},
                {"type": "text", "text": "go on"}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t2", "content": [
                    {"type": "tool_reference", "tool_name": "only"}
                ]}
            ]}
        ]
    }));
    let tool = |id: &str, content: Content| Message {
        role: "tool".into(),
        content,
        tool_call_id: Some(id.into()),
        ..Message::default()
    };
    let reference = |name: &str| Part {
        kind: "tool_reference".into(),
        text: Some(name.into()),
    };
    assert_eq!(
        chat.messages,
        vec![
            tool("t1", Content::Text("l1\nl2".into())),
            Message {
                role: "user".into(),
                content: Content::Parts(vec![Part {
                    kind: "image_url".into(),
                    text: None
                }]),
                ..Message::default()
            },
            tool(
                "t1",
                Content::Parts(vec![reference("search"), reference("fetch")])
            ),
            text("user", "go on"),
            // Only references: an empty tool response, then the names.
            tool("t2", Content::Text(String::new())),
            tool("t2", Content::Parts(vec![reference("only")])),
        ]
    );
}

#[test]
fn assistant_tool_result_is_python_str_of_its_content() {
    let chat = convert(json!({
        "model": "m", "max_tokens": 5,
        "messages": [
            {"role": "assistant", "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": [
                    {"type": "text", "text": "it's", "ok": true, "n": null}
                ]}
            ]},
            {"role": "assistant", "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": "plain"}
            ]}
        ]
    }));
    assert_eq!(
        chat.messages,
        vec![
            text(
                "assistant",
                r#"Tool result: [{'type': 'text', 'text': "it's", 'ok': True, 'n': None}]"#
            ),
            text("assistant", "Tool result: plain"),
        ]
    );
}

#[test]
fn tools_effort_and_top_level_fields() {
    let req = from_value(
        Api::Messages,
        json!({
            "model": "claude", "max_tokens": 7, "stream": true, "cache_salt": "s",
            "add_special_tokens": "ignored",
            "output_config": {"effort": "high"},
            "chat_template_kwargs": {"enable_thinking": false},
            "tools": [
                {"name": "a", "input_schema": {"properties": {}}},
                {"name": "b", "description": "d", "input_schema": {"type": "object"}, "strict": false, "defer_loading": true}
            ],
            "messages": [{"role": "user", "content": "q"}]
        }),
    )
    .expect("parses");
    assert_eq!(req.model, "claude");
    assert_eq!(req.max_tokens, Some(7));
    assert!(req.stream);
    assert_eq!(req.cache_salt.as_deref(), Some("s"));
    assert_eq!(req.add_special_tokens, None);
    let Input::Chat(chat) = req.input else {
        panic!("chat")
    };
    assert_eq!(chat.reasoning_effort.as_deref(), Some("high"));
    assert_eq!(
        Value::Array(chat.tools.expect("tools")),
        json!([
            {"type": "function", "function": {"name": "a", "description": null,
                "parameters": {"properties": {}, "type": "object"}, "strict": null, "defer_loading": null}},
            {"type": "function", "function": {"name": "b", "description": "d",
                "parameters": {"type": "object"}, "strict": false, "defer_loading": true}}
        ])
    );
}

#[test]
fn bad_fields_are_named() {
    let cases = [
        (json!({"messages": {}}), "messages"),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "nope"}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "input": []}]}]}),
            "messages[0].content[0].input",
        ),
        (json!({"messages": [], "system": 3}), "system"),
        (
            json!({"messages": [{"role": "ctx", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "system", "content": [{"type": "tool_addition"}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": [], "thinking": {"type": "on"}}),
            "thinking.type",
        ),
        (
            json!({"messages": [], "system": [{"type": "text", "text": 1}]}),
            "system[0].text",
        ),
        (
            json!({"messages": [], "tools": [{"name": "a"}]}),
            "tools[0].input_schema",
        ),
        (
            json!({"messages": [], "output_config": {"effort": 1}}),
            "output_config.effort",
        ),
    ];
    for (body, field) in cases {
        let err: BodyError = from_value(Api::Messages, body.clone()).expect_err("rejected");
        assert_eq!(err.field(), Some(field), "{body}");
    }
}
