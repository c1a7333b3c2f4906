use serde_json::json;

use super::*;
use crate::request::{ContentPart, ToolCall};

fn msg(role: &str, content: Content) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        content,
        ..Default::default()
    }
}

fn text(s: &str) -> Content {
    Content::Text(s.into())
}

fn part(kind: &str, text: Option<&str>) -> ContentPart {
    ContentPart {
        kind: kind.into(),
        text: text.map(str::to_owned),
    }
}

#[test]
fn content_null_and_parts() {
    assert_eq!(content_text(&Content::Null, false), "");
    let parts = Content::Parts(vec![
        part("text", Some("a")),
        part("text", Some("")),
        part("image_url", None),
        part("refusal", Some("b")),
        part("thinking", Some("c")),
    ]);
    assert_eq!(content_text(&parts, false), "a\nb\nc");
}

#[test]
fn billing_header_line_is_stripped_from_system_only() {
    let header = "x-anthropic-billing-header: cc_version=1; cch=abc;\nYou are Claude.";
    assert_eq!(content_text(&text(header), true), "You are Claude.");
    assert_eq!(content_text(&text(header), false), header);
    let parts = Content::Parts(vec![
        part("text", Some("x-anthropic-billing-header: cch=1;")),
        part("text", Some("Rules.")),
    ]);
    assert_eq!(content_text(&parts, true), "Rules.");
}

#[test]
fn tool_call_arguments_parse_to_objects() {
    assert_eq!(
        parse_arguments(Some(r#"{"b": 1.2e2, "a": "x"}"#)).to_string(),
        r#"{"b":120.0,"a":"x"}"#
    );
    for bad in [
        None,
        Some(""),
        Some("null"),
        Some("[1]"),
        Some("3"),
        Some("{oops"),
    ] {
        assert_eq!(parse_arguments(bad), json!({}), "{bad:?}");
    }
}

#[test]
fn empty_tool_calls_are_removed_and_calls_reshaped() {
    let mut m = msg("assistant", Content::Null);
    let out = normalize_messages(std::slice::from_ref(&m));
    assert_eq!(out[0], json!({"role": "assistant", "content": ""}));
    m.tool_calls.push(ToolCall {
        id: Some("c".into()),
        kind: None,
        name: "f".into(),
        arguments: Some("{\"x\": [1]}".into()),
    });
    m.reasoning = Some("think".into());
    let out = normalize_messages(&[m]);
    assert_eq!(
        out[0],
        json!({"role": "assistant", "content": "",
               "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": [1]}}}],
               "reasoning_content": "think"})
    );
}

#[test]
fn developer_becomes_system_and_systems_merge_at_front() {
    let out = normalize_messages(&[msg("developer", text("d")), msg("user", text("u"))]);
    assert_eq!(
        out,
        vec![
            json!({"role": "system", "content": "d"}),
            json!({"role": "user", "content": "u"})
        ]
    );

    let out = normalize_messages(&[
        msg("system", text("s")),
        msg("user", text("u")),
        msg("developer", text("")),
        msg("developer", text("d")),
    ]);
    assert_eq!(
        out,
        vec![
            json!({"role": "system", "content": "s\n\nd"}),
            json!({"role": "user", "content": "u"})
        ]
    );

    // Without a developer message, a late system message stays where it is.
    let out = normalize_messages(&[msg("user", text("u")), msg("system", text("s"))]);
    assert_eq!(out[1]["role"], "system");
}

#[test]
fn tools_are_reshaped_to_exact_keys() {
    let req = ChatRequest {
        tools: Some(vec![
            json!({"function": {"parameters": {"type": "object"}, "extra": 1, "name": "a", "strict": true}, "type": "function", "x": 2}),
            json!({"type": "function", "function": {"name": "b", "description": "d", "defer_loading": false, "strict": null}}),
        ]),
        ..Default::default()
    };
    let tools = normalize(&req).unwrap().tools.unwrap();
    assert_eq!(
        serde_json::to_string(&tools).unwrap(),
        r#"[{"type":"function","function":{"name":"a","description":null,"parameters":{"type":"object"},"strict":true}},{"type":"function","function":{"name":"b","description":"d","parameters":null,"defer_loading":false}}]"#
    );
    for bad in [
        json!(1),
        json!({"type": "function"}),
        json!({"function": {"description": "x"}}),
        json!({"type": "web", "function": {"name": "a"}}),
    ] {
        let req = ChatRequest {
            tools: Some(vec![bad.clone()]),
            ..Default::default()
        };
        assert!(
            matches!(normalize(&req), Err(Error::InvalidRequest(m)) if m.contains("tools[0]")),
            "{bad}"
        );
    }
}

#[test]
fn kwargs_flags_and_reasoning_effort() {
    let mut req = ChatRequest {
        chat_template_kwargs: json!({"add_generation_prompt": false, "messages": [], "custom": 1})
            .as_object()
            .cloned()
            .unwrap(),
        reasoning_effort: Some("none".into()),
        ..Default::default()
    };
    let input = normalize(&req).unwrap();
    assert!(
        input.add_generation_prompt,
        "top-level default wins over kwargs"
    );
    assert!(!input.continue_final_message);
    assert_eq!(
        serde_json::Value::Object(input.kwargs),
        json!({"custom": 1, "enable_thinking": false})
    );

    req.reasoning_effort = Some("high".into());
    assert_eq!(
        normalize(&req).unwrap().kwargs["enable_thinking"],
        json!(true)
    );
    req.chat_template_kwargs
        .insert("enable_thinking".into(), json!(false));
    assert_eq!(
        normalize(&req).unwrap().kwargs["enable_thinking"],
        json!(false)
    );

    req.continue_final_message = Some(true);
    assert!(matches!(normalize(&req), Err(Error::InvalidRequest(_))));
    req.add_generation_prompt = Some(false);
    assert!(normalize(&req).unwrap().continue_final_message);
}
