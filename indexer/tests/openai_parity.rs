//! One body parser, two paths, vLLM's ids.
//!
//! Every `shared/chat-parity` body goes (a) through the filter's parser into
//! a `PickRequest`, over the wire encoding, through the indexer's
//! `prompt::from_proto` into the tokenizer, as `Pick` does, and (b) straight
//! into the tokenizer, as `/debug/score`, the `tokenize` CLI and the
//! simulator do. Both must give the oracle's ids, from equal requests.

use kvsteer_filter::{admission::Api, openai::parse_pick_request};
use kvsteer_indexer::prompt::{Prompt, from_proto};
use kvsteer_proto::v1::PickRequest;
use kvsteer_tokenize::{ChatRequest, CompletionPrompt, PromptTokenizer};
use prost::Message;
use serde_json::{Value, json};

use kvsteer_e2e::shared_dir as shared;

fn qwen3() -> PromptTokenizer {
    PromptTokenizer::from_dir(&shared().join("tokenizers/qwen3")).expect("qwen3 tokenizer")
}

/// The prompt `Pick` tokenizes: filter parse → proto bytes → `from_proto`.
fn via_pick(api: Api, body: &[u8]) -> Prompt {
    let pick = parse_pick_request(api, body).expect("the filter parses the body");
    let wire = pick.encode_to_vec();
    let pick = PickRequest::decode(wire.as_slice()).expect("proto decodes");
    from_proto(&pick).expect("the indexer reads the pick")
}

/// The prompt the direct callers tokenize (the `tokenize` CLI's way).
fn direct(api: Api, body: &[u8]) -> Prompt {
    let body: Value = serde_json::from_slice(body).expect("JSON body");
    match api {
        Api::Chat => Prompt::Chat(ChatRequest::from_openai(&body).expect("chat body")),
        Api::Messages => Prompt::Chat(ChatRequest::from_anthropic(&body).expect("messages body")),
        Api::Completions => Prompt::Completion {
            prompt: CompletionPrompt::from_openai(&body).expect("completions body"),
            add_special_tokens: body.get("add_special_tokens").and_then(Value::as_bool),
        },
    }
}

fn ids(tok: &PromptTokenizer, prompt: &Prompt) -> Vec<Vec<u32>> {
    match prompt {
        Prompt::Chat(chat) => vec![tok.chat_token_ids(chat).expect("chat ids")],
        Prompt::Completion {
            prompt,
            add_special_tokens,
        } => tok
            .completion_token_ids(prompt, *add_special_tokens)
            .expect("completion ids"),
    }
}

#[test]
fn every_parity_file_gives_vllms_ids_through_both_paths() {
    let tok = qwen3();
    let dir = shared().join("chat-parity");
    let expected = std::fs::read_to_string(dir.join("expected.jsonl")).expect("expected.jsonl");
    let mut checked = 0;
    for line in expected.lines().filter(|l| !l.trim().is_empty()) {
        let want: Value = serde_json::from_str(line).expect("expected line");
        let file = want["file"].as_str().expect("file");
        let api = match want["endpoint"].as_str() {
            Some("chat") => Api::Chat,
            Some("completions") => Api::Completions,
            other => panic!("{file}: endpoint {other:?}"),
        };
        let want_ids: Vec<Vec<u32>> = if want["batch"] == json!(true) {
            serde_json::from_value(want["token_ids"].clone()).expect("id lists")
        } else {
            vec![serde_json::from_value(want["token_ids"].clone()).expect("ids")]
        };
        let body = std::fs::read(dir.join(file)).expect("request file");
        let picked = via_pick(api, &body);
        let direct = direct(api, &body);
        assert_eq!(
            picked, direct,
            "{file}: the two paths read different requests"
        );
        assert_eq!(ids(&tok, &picked), want_ids, "{file}: via Pick");
        assert_eq!(ids(&tok, &direct), want_ids, "{file}: direct");
        checked += 1;
    }
    assert_eq!(checked, 20);
}

/// Part types vLLM reads as text (`input_text`, `output_text`, ...) count in
/// both paths, and mean what the same texts as `text` parts mean.
#[test]
fn text_like_parts_tokenize_alike_through_both_paths() {
    let tok = qwen3();
    let body = |kinds: [&str; 2]| {
        json!({"model": "", "messages": [
            {"role": "system", "content": [{"type": kinds[0], "text": "You answer in French."}]},
            {"role": "user", "content": [
                {"type": kinds[0], "text": "Translate:"},
                "good morning",
                {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]},
            {"role": "assistant", "name": "", "content": [
                {"type": kinds[1], "text": "bonjour"},
                {"type": "refusal", "refusal": "not more"}],
             "tool_calls": [{"id": "", "type": "function",
                             "function": {"name": "f", "arguments": {"b": 1, "a": [2.5]}}}]},
            {"role": "user", "content": [{"type": kinds[0], "text": "and good night?"}]}
        ]})
        .to_string()
    };
    let texts = body(["text", "text"]);
    let responses = body(["input_text", "output_text"]);
    let plain = ids(&tok, &direct(Api::Chat, texts.as_bytes()));
    let picked = via_pick(Api::Chat, responses.as_bytes());
    let direct = direct(Api::Chat, responses.as_bytes());
    assert_eq!(picked, direct);
    assert_eq!(ids(&tok, &picked), plain, "via Pick");
    assert_eq!(ids(&tok, &direct), plain, "direct");
    let rendered = match &direct {
        Prompt::Chat(chat) => tok.render_chat(chat).expect("renders"),
        Prompt::Completion { .. } => unreachable!("a chat body"),
    };
    for text in [
        "Translate:\ngood morning",
        "bonjour\nnot more",
        "and good night?",
    ] {
        assert!(rendered.contains(text), "{text:?} missing from {rendered}");
    }
}

/// Random chat bodies over every part type, argument form and empty-string
/// field: the request `Pick` reads equals the one the direct callers read.
#[test]
fn random_bodies_read_alike_through_both_paths() {
    use rand::{Rng, SeedableRng, rngs::SmallRng};

    fn pick<'a>(rng: &mut SmallRng, from: &[&'a str]) -> &'a str {
        from[rng.random_range(0..from.len())]
    }
    fn text(rng: &mut SmallRng) -> Value {
        json!(pick(
            rng,
            &["", "hi", "a\nb", "<|im_end|>", "ünï 中文 🙂", "{\"x\": 1}"]
        ))
    }
    fn part(rng: &mut SmallRng) -> Value {
        const KINDS: [&str; 10] = [
            "text",
            "input_text",
            "output_text",
            "refusal",
            "thinking",
            "tool_reference",
            "image_url",
            "input_audio",
            "file",
            "new",
        ];
        match rng.random_range(0..4) {
            0 => text(rng),
            1 => json!({"image_url": {"url": "u"}}),
            _ => {
                let key = pick(rng, &["text", "refusal", "thinking", "name"]);
                json!({"type": pick(rng, &KINDS), key: text(rng)})
            }
        }
    }
    fn call(rng: &mut SmallRng) -> Value {
        let arguments = match rng.random_range(0..5) {
            0 => json!("{\"b\": 1, \"a\": [2.5, \"x\"]}"),
            1 => json!({"b": 1, "a": [2.5, "x"]}),
            2 => json!(7),
            3 => json!("not json"),
            _ => Value::Null,
        };
        json!({"id": pick(rng, &["", "c1"]), "type": pick(rng, &["", "function"]),
               "function": {"name": "f", "arguments": arguments}})
    }
    fn message(rng: &mut SmallRng) -> Value {
        let mut m =
            json!({"role": pick(rng, &["system", "developer", "user", "assistant", "tool"])});
        m["content"] = match rng.random_range(0..4) {
            0 => Value::Null,
            1 => text(rng),
            _ => Value::Array((0..rng.random_range(0..4)).map(|_| part(rng)).collect()),
        };
        if rng.random_bool(0.3) {
            m["tool_calls"] =
                Value::Array((0..rng.random_range(0..3)).map(|_| call(rng)).collect());
        }
        for key in ["name", "tool_call_id", "reasoning", "reasoning_content"] {
            if rng.random_bool(0.2) {
                m[key] = text(rng);
            }
        }
        m
    }

    let mut rng = SmallRng::seed_from_u64(18);
    for _ in 0..2_000 {
        let mut body = json!({
            "messages": (0..rng.random_range(0..5)).map(|_| message(&mut rng)).collect::<Vec<_>>(),
        });
        if rng.random_bool(0.3) {
            body["tools"] = json!([{"type": "function", "function": {"name": "t", "strict": true,
                "parameters": {"b": 1.50, "a": [1, "x", null]}}}]);
        }
        if rng.random_bool(0.3) {
            body["chat_template_kwargs"] = json!({"enable_thinking": rng.random_bool(0.5)});
        }
        for key in [
            "add_generation_prompt",
            "continue_final_message",
            "add_special_tokens",
        ] {
            if rng.random_bool(0.2) {
                body[key] = json!(rng.random_bool(0.5));
            }
        }
        if rng.random_bool(0.3) {
            body["reasoning_effort"] = json!(pick(&mut rng, &["", "none", "low"]));
        }
        let bytes = body.to_string();
        assert_eq!(
            via_pick(Api::Chat, bytes.as_bytes()),
            direct(Api::Chat, bytes.as_bytes()),
            "{bytes}"
        );
    }
}

/// Every `/v1/messages` fixture (ids from vLLM 0.32's own conversion, see
/// `tokenize/tests/messages/README.md`) gives those ids through the filter's
/// pick (`API_KIND_MESSAGES`) and directly.
#[test]
fn every_messages_fixture_gives_vllms_ids_through_both_paths() {
    let tok = qwen3();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenize/tests/messages");
    let expected = std::fs::read_to_string(dir.join("expected.jsonl")).expect("expected.jsonl");
    let mut checked = 0;
    for line in expected.lines().filter(|l| !l.trim().is_empty()) {
        let want: Value = serde_json::from_str(line).expect("expected line");
        let file = want["file"].as_str().expect("file");
        let want_ids: Vec<u32> = serde_json::from_value(want["token_ids"].clone()).expect("ids");
        let body = std::fs::read(dir.join(file)).expect("request file");
        let picked = via_pick(Api::Messages, &body);
        assert_eq!(
            ids(&tok, &picked),
            vec![want_ids.clone()],
            "{file} via pick"
        );
        assert_eq!(
            ids(&tok, &direct(Api::Messages, &body)),
            vec![want_ids],
            "{file} direct"
        );
        checked += 1;
    }
    assert_eq!(checked, 8);
}
