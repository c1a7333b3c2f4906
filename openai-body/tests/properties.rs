//! Properties of the body parser: no input makes it panic, and every valid
//! request survives a trip through JSON unchanged.

use kvsteer_openai_body::{
    Api, Chat, Content, Input, Message, Part, Prompt, Request, ToolCall, from_value, parse,
    text_key,
};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Keys the parser looks at, so random objects reach its deeper branches.
const KEYS: [&str; 28] = [
    "messages",
    "role",
    "content",
    "type",
    "text",
    "input_text",
    "refusal",
    "thinking",
    "tool_calls",
    "function",
    "name",
    "arguments",
    "id",
    "prompt",
    "tools",
    "chat_template_kwargs",
    "reasoning",
    "reasoning_content",
    "tool_call_id",
    "uuid",
    "image_url",
    "input_audio",
    "tool_reference",
    "model",
    "stream",
    "max_tokens",
    "cache_salt",
    "add_generation_prompt",
];

const KINDS: [&str; 12] = [
    "text",
    "input_text",
    "output_text",
    "refusal",
    "thinking",
    "tool_reference",
    "image_url",
    "input_audio",
    "audio_url",
    "video_url",
    "file",
    "x-new",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "(?s).{0,12}",
        Just("<|im_end|>\n{\"a\": 1}".to_owned()),
        Just(String::new()),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(KEYS.to_vec()).prop_map(str::to_owned),
        1 => "[a-z_]{0,6}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e9f64..1e9).prop_map(Value::from),
        text().prop_map(Value::String),
        prop::sample::select(KINDS.to_vec()).prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 96, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

// === valid requests ===

fn part() -> impl Strategy<Value = Part> {
    (
        prop::sample::select(KINDS.to_vec()),
        prop::option::of(text()),
    )
        .prop_map(|(kind, text)| Part {
            kind: kind.to_owned(),
            text: text_key(kind).and(text),
        })
}

fn content() -> impl Strategy<Value = Content> {
    prop_oneof![
        Just(Content::Null),
        text().prop_map(Content::Text),
        prop::collection::vec(part(), 0..4).prop_map(Content::Parts),
    ]
}

fn tool_call() -> impl Strategy<Value = ToolCall> {
    (
        prop::option::of(text()),
        prop::option::of(text()),
        text(),
        prop::option::of(text()),
    )
        .prop_map(|(id, kind, name, arguments)| ToolCall {
            id,
            kind,
            name,
            arguments,
        })
}

fn message() -> impl Strategy<Value = Message> {
    (
        prop::sample::select(vec!["system", "developer", "user", "assistant", "tool", ""]),
        content(),
        prop::collection::vec(tool_call(), 0..3),
        prop::option::of(text()),
        prop::option::of(text()),
        prop::option::of(text()),
    )
        .prop_map(
            |(role, content, tool_calls, tool_call_id, name, reasoning)| Message {
                role: role.to_owned(),
                content,
                tool_calls,
                tool_call_id,
                name,
                reasoning,
            },
        )
}

fn chat() -> impl Strategy<Value = Chat> {
    (
        prop::collection::vec(message(), 0..5),
        prop::option::of(prop::collection::vec(json_value(), 0..3)),
        prop::option::of(prop::collection::vec((key(), json_value()), 0..3)),
        prop::option::of(any::<bool>()),
        prop::option::of(any::<bool>()),
        prop::option::of(text()),
    )
        .prop_map(
            |(messages, tools, kwargs, add_generation_prompt, continue_final_message, effort)| {
                Chat {
                    messages,
                    tools,
                    chat_template_kwargs: kwargs.map(|kv| kv.into_iter().collect()),
                    add_generation_prompt,
                    continue_final_message,
                    reasoning_effort: effort,
                }
            },
        )
}

fn completion() -> impl Strategy<Value = Prompt> {
    let ids = || prop::collection::vec(any::<u32>(), 1..6);
    prop_oneof![
        text().prop_map(Prompt::Text),
        prop::collection::vec(text(), 1..4).prop_map(Prompt::Texts),
        ids().prop_map(Prompt::Ids),
        prop::collection::vec(ids(), 1..4).prop_map(Prompt::IdBatch),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    (
        "[A-Za-z0-9/._-]{0,12}",
        any::<bool>(),
        prop::option::of(any::<u32>()),
        prop::option::of(any::<bool>()),
        prop::option::of(text()),
        prop_oneof![
            chat().prop_map(Input::Chat),
            completion().prop_map(Input::Completion)
        ],
    )
        .prop_map(
            |(model, stream, max_tokens, add_special_tokens, cache_salt, input)| Request {
                model,
                stream,
                max_tokens,
                add_special_tokens,
                cache_salt,
                input,
            },
        )
}

// === writing a request as a client would ===

/// The body a client could send for `req`. Where the wire has two spellings
/// of one thing (a bare-string text part, `reasoning_content`,
/// `max_completion_tokens`, an absent `model`), the choice is made from the
/// data so both spellings are exercised.
fn to_body(req: &Request) -> Value {
    let mut body = Map::new();
    if !req.model.is_empty() || req.stream {
        body.insert("model".into(), req.model.clone().into());
    }
    body.insert("stream".into(), req.stream.into());
    if let Some(n) = req.max_tokens {
        let chat = matches!(req.input, Input::Chat(_));
        let key = if n.is_multiple_of(2) || !chat {
            "max_tokens"
        } else {
            "max_completion_tokens"
        };
        body.insert(key.into(), n.into());
    }
    if let Some(b) = req.add_special_tokens {
        body.insert("add_special_tokens".into(), b.into());
    }
    if let Some(s) = &req.cache_salt {
        body.insert("cache_salt".into(), s.clone().into());
    }
    body.insert("temperature".into(), json!(0.5));
    match &req.input {
        Input::Chat(chat) => {
            let messages = chat.messages.iter().map(message_json).collect();
            body.insert("messages".into(), Value::Array(messages));
            if let Some(tools) = &chat.tools {
                body.insert("tools".into(), Value::Array(tools.clone()));
            }
            if let Some(kwargs) = &chat.chat_template_kwargs {
                body.insert("chat_template_kwargs".into(), Value::Object(kwargs.clone()));
            }
            for (key, flag) in [
                ("add_generation_prompt", chat.add_generation_prompt),
                ("continue_final_message", chat.continue_final_message),
            ] {
                if let Some(b) = flag {
                    body.insert(key.into(), b.into());
                }
            }
            if let Some(e) = &chat.reasoning_effort {
                body.insert("reasoning_effort".into(), e.clone().into());
            }
        }
        Input::Completion(prompt) => {
            let prompt = match prompt {
                Prompt::Text(t) => json!(t),
                Prompt::Texts(t) => json!(t),
                Prompt::Ids(ids) => json!(ids),
                Prompt::IdBatch(batch) => json!(batch),
            };
            body.insert("prompt".into(), prompt);
        }
    }
    Value::Object(body)
}

fn message_json(m: &Message) -> Value {
    let mut obj = Map::new();
    obj.insert("role".into(), m.role.clone().into());
    match &m.content {
        Content::Null if m.role.len().is_multiple_of(2) => {}
        Content::Null => {
            obj.insert("content".into(), Value::Null);
        }
        Content::Text(t) => {
            obj.insert("content".into(), t.clone().into());
        }
        Content::Parts(parts) => {
            obj.insert(
                "content".into(),
                parts.iter().map(part_json).collect::<Vec<_>>().into(),
            );
        }
    }
    if !m.tool_calls.is_empty() {
        let calls: Vec<Value> = m.tool_calls.iter().map(call_json).collect();
        obj.insert("tool_calls".into(), calls.into());
    }
    for (key, value) in [("tool_call_id", &m.tool_call_id), ("name", &m.name)] {
        if let Some(v) = value {
            obj.insert(key.into(), v.clone().into());
        }
    }
    if let Some(r) = &m.reasoning {
        let key = if r.len().is_multiple_of(2) {
            "reasoning"
        } else {
            "reasoning_content"
        };
        obj.insert(key.into(), r.clone().into());
    }
    Value::Object(obj)
}

fn part_json(p: &Part) -> Value {
    match (p.kind.as_str(), &p.text) {
        ("text", Some(t)) if !t.len().is_multiple_of(2) => Value::String(t.clone()),
        (kind, text) => {
            let mut obj = Map::new();
            obj.insert("type".into(), kind.into());
            if let (Some(key), Some(t)) = (text_key(kind), text) {
                obj.insert(key.into(), t.clone().into());
            }
            Value::Object(obj)
        }
    }
}

fn call_json(c: &ToolCall) -> Value {
    let mut function = Map::new();
    function.insert("name".into(), c.name.clone().into());
    if let Some(a) = &c.arguments {
        function.insert("arguments".into(), a.clone().into());
    }
    let mut obj = Map::new();
    if let Some(id) = &c.id {
        obj.insert("id".into(), id.clone().into());
    }
    if let Some(kind) = &c.kind {
        obj.insert("type".into(), kind.clone().into());
    }
    obj.insert("function".into(), Value::Object(function));
    Value::Object(obj)
}

fn api_of(req: &Request) -> Api {
    match req.input {
        Input::Chat(_) => Api::Chat,
        Input::Completion(_) => Api::Completions,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_json_value_is_ok_or_err(value in json_value()) {
        let _ = from_value(Api::Chat, value.clone());
        let _ = from_value(Api::Completions, value);
    }

    #[test]
    fn any_bytes_are_ok_or_err(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse(Api::Chat, &bytes);
        let _ = parse(Api::Completions, &bytes);
    }

    /// A valid body with one field anywhere in it replaced by junk.
    #[test]
    fn damaged_requests_are_ok_or_err(
        req in request(),
        target in 0usize..8,
        key in key(),
        junk in json_value(),
    ) {
        let mut body = to_body(&req);
        let n = body.get("messages").and_then(Value::as_array).map_or(0, Vec::len);
        let obj = if target > 0 && n > 0 {
            &mut body["messages"][target % n]
        } else {
            &mut body
        };
        if let Some(obj) = obj.as_object_mut() {
            obj.insert(key, junk);
        }
        let _ = from_value(Api::Chat, body.clone());
        let _ = from_value(Api::Completions, body);
    }

    #[test]
    fn valid_requests_round_trip(req in request()) {
        let body = to_body(&req);
        let bytes = serde_json::to_vec(&body).expect("serialisable");
        prop_assert_eq!(parse(api_of(&req), &bytes), Ok(req.clone()));
        prop_assert_eq!(from_value(api_of(&req), body), Ok(req));
    }
}
