use serde_json::json;

use super::*;

fn invalid(body: Value) -> String {
    match ChatRequest::from_openai(&body) {
        Err(Error::InvalidRequest(msg)) => msg,
        other => panic!("expected InvalidRequest for {body}, got {other:?}"),
    }
}

fn invalid_prompt(body: Value) -> String {
    match CompletionPrompt::from_openai(&body) {
        Err(Error::InvalidRequest(msg)) => msg,
        other => panic!("expected InvalidRequest for {body}, got {other:?}"),
    }
}

#[test]
fn reads_every_prompt_field() {
    let req = ChatRequest::from_openai(&json!({
        "model": "m",
        "temperature": 0.2,
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "a"}, "b", {"type": "image_url", "image_url": {}}]},
            {"role": "assistant", "content": null, "reasoning_content": "r",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
            {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "ok"}
        ],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "chat_template_kwargs": {"enable_thinking": false},
        "add_generation_prompt": false,
        "continue_final_message": true,
        "add_special_tokens": true,
        "reasoning_effort": "low"
    }))
    .unwrap();
    assert_eq!(req.messages.len(), 3);
    assert_eq!(
        req.messages[0].content,
        Content::Parts(vec![
            ContentPart {
                kind: "text".into(),
                text: Some("a".into())
            },
            ContentPart {
                kind: "text".into(),
                text: Some("b".into())
            },
            ContentPart {
                kind: "image_url".into(),
                text: None
            },
        ])
    );
    let call = &req.messages[1].tool_calls[0];
    assert_eq!(call.arguments.as_deref(), Some(r#"{"x":1}"#));
    assert_eq!(req.messages[1].reasoning.as_deref(), Some("r"));
    assert_eq!(req.messages[2].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(req.tools.as_ref().map(Vec::len), Some(1));
    assert_eq!(req.chat_template_kwargs["enable_thinking"], json!(false));
    assert_eq!(
        (
            req.add_generation_prompt,
            req.continue_final_message,
            req.add_special_tokens
        ),
        (Some(false), Some(true), Some(true))
    );
    assert_eq!(req.reasoning_effort.as_deref(), Some("low"));
}

#[test]
fn reasoning_wins_over_reasoning_content() {
    let req = ChatRequest::from_openai(&json!({"messages": [
        {"role": "assistant", "content": "x", "reasoning": "new", "reasoning_content": "old"}
    ]}))
    .unwrap();
    assert_eq!(req.messages[0].reasoning.as_deref(), Some("new"));
}

#[test]
fn bad_chat_bodies_name_the_field() {
    assert!(invalid(json!([])).contains("JSON object"));
    assert!(invalid(json!({})).contains("`messages` is required"));
    assert!(invalid(json!({"messages": {"role": "user"}})).contains("`messages` must be an array"));
    assert!(invalid(json!({"messages": [1]})).contains("`messages[0]`"));
    assert!(
        invalid(json!({"messages": [{"content": "x"}]})).contains("`messages[0].role` is required")
    );
    assert!(
        invalid(json!({"messages": [{"role": 3}]})).contains("`messages[0].role` must be a string")
    );
    assert!(
        invalid(json!({"messages": [{"role": "user", "content": 5}]}))
            .contains("`messages[0].content`")
    );
    assert!(
        invalid(json!({"messages": [{"role": "user", "content": [{"text": "x"}]}]}))
            .contains("`messages[0].content[0].type` is required")
    );
    assert!(
        invalid(json!({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}))
            .contains("`messages[0].content[0].text` must be a string")
    );
    assert!(
        invalid(json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}))
            .contains("`messages[0].tool_calls[0].function.name` is required")
    );
    assert!(invalid(json!({"messages": [], "tools": {}})).contains("`tools`"));
    assert!(
        invalid(json!({"messages": [], "chat_template_kwargs": []}))
            .contains("`chat_template_kwargs`")
    );
    assert!(
        invalid(json!({"messages": [], "add_generation_prompt": "yes"}))
            .contains("`add_generation_prompt`")
    );
    assert!(invalid(json!({"messages": [], "reasoning_effort": 1})).contains("`reasoning_effort`"));
}

/// vLLM reads `input_text` and `output_text` parts as text (its
/// `chat_utils.MM_PARSER_MAP`), so the rendered prompt includes them.
#[test]
fn input_and_output_text_parts_are_text() {
    let req = ChatRequest::from_openai(&json!({"messages": [
        {"role": "user", "content": [{"type": "input_text", "text": "question"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "answer"}]}
    ]}))
    .unwrap();
    let texts: Vec<String> = req
        .messages
        .iter()
        .map(|m| crate::normalize::content_text(&m.content, false))
        .collect();
    assert_eq!(texts, ["question", "answer"]);
}

/// The `PickRequest` cannot carry an empty id, type, name or effort apart
/// from an absent one, so the direct path reads them the same way.
#[test]
fn empty_strings_read_as_absent() {
    let req = ChatRequest::from_openai(&json!({"reasoning_effort": "", "messages": [
        {"role": "assistant", "name": "", "tool_call_id": "", "reasoning": "",
         "tool_calls": [{"id": "", "type": "", "function": {"name": "f"}}]}
    ]}))
    .unwrap();
    let m = &req.messages[0];
    assert_eq!((&m.name, &m.tool_call_id), (&None, &None));
    assert_eq!((&m.tool_calls[0].id, &m.tool_calls[0].kind), (&None, &None));
    assert_eq!(req.reasoning_effort, None);
    // `reasoning` is an optional string in the proto too: "" stays "".
    assert_eq!(m.reasoning.as_deref(), Some(""));
}

#[test]
fn completion_prompt_shapes() {
    let p = |v: Value| CompletionPrompt::from_openai(&json!({"prompt": v})).unwrap();
    assert_eq!(p(json!("hi")), CompletionPrompt::Text("hi".into()));
    assert_eq!(
        p(json!(["a", "b"])),
        CompletionPrompt::Texts(vec!["a".into(), "b".into()])
    );
    assert_eq!(p(json!([1, 2])), CompletionPrompt::Ids(vec![1, 2]));
    assert_eq!(
        p(json!([[1], [2, 3]])),
        CompletionPrompt::IdBatch(vec![vec![1], vec![2, 3]])
    );
}

#[test]
fn bad_prompts_name_the_field() {
    assert!(invalid_prompt(json!({})).contains("`prompt` is required"));
    assert!(invalid_prompt(json!({"prompt": 3})).contains("`prompt` must be"));
    assert!(invalid_prompt(json!({"prompt": []})).contains("empty"));
    assert!(invalid_prompt(json!({"prompt": ["a", 1]})).contains("`prompt[1]`"));
    assert!(invalid_prompt(json!({"prompt": [1, -2]})).contains("`prompt[1]`"));
    assert!(invalid_prompt(json!({"prompt": [1, 2.5]})).contains("`prompt[1]`"));
    assert!(invalid_prompt(json!({"prompt": [1, 4294967296u64]})).contains("`prompt[1]`"));
    assert!(invalid_prompt(json!({"prompt": [[1], [2, "x"]]})).contains("`prompt[1][1]`"));
    assert!(
        invalid_prompt(json!({"prompt": [[1], []]}))
            .contains("`prompt[1]` must be a non-empty list")
    );
    assert!(invalid_prompt(json!({"prompt": [true]})).contains("`prompt`"));
    assert!(invalid_prompt(json!("x")).contains("JSON object"));
}

/// Random JSON values must give `Ok` or `Err`, never a panic.
#[test]
fn random_bodies_never_panic() {
    use rand::{Rng, SeedableRng, rngs::SmallRng};

    fn random_value(rng: &mut SmallRng, depth: u32) -> Value {
        const KEYS: [&str; 16] = [
            "messages",
            "role",
            "content",
            "type",
            "text",
            "tool_calls",
            "function",
            "name",
            "arguments",
            "prompt",
            "tools",
            "chat_template_kwargs",
            "reasoning",
            "refusal",
            "add_generation_prompt",
            "x",
        ];
        const ROLES: [&str; 5] = ["user", "assistant", "system", "developer", "tool"];
        match rng.random_range(0..if depth > 3 { 6 } else { 9 }) {
            0 => Value::Null,
            1 => Value::Bool(rng.random()),
            2 => json!(rng.random_range(-3i64..200_000)),
            3 => json!(rng.random::<f64>() * 10.0),
            4 => json!(ROLES[rng.random_range(0..ROLES.len())]),
            5 => json!("<|im_end|>{\"a\": 1}"),
            6 | 7 => Value::Array(
                (0..rng.random_range(0..4))
                    .map(|_| random_value(rng, depth + 1))
                    .collect(),
            ),
            _ => Value::Object(
                (0..rng.random_range(0..5))
                    .map(|_| {
                        let k = KEYS[rng.random_range(0..KEYS.len())];
                        (k.to_owned(), random_value(rng, depth + 1))
                    })
                    .collect(),
            ),
        }
    }

    let mut rng = SmallRng::seed_from_u64(42);
    let mut parsed = 0;
    for _ in 0..20_000 {
        let body = random_value(&mut rng, 0);
        if ChatRequest::from_openai(&body).is_ok() {
            parsed += 1;
        }
        let _ = CompletionPrompt::from_openai(&body);
        let _ = crate::normalize::normalize(&ChatRequest::from_openai(&body).unwrap_or_default());
    }
    // The generator must reach the success path too, or the test proves little.
    assert!(parsed > 0);
}
