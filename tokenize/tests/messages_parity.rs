//! Every Anthropic `/v1/messages` request in `tests/messages/` → exactly the
//! prompt ids vLLM 0.32 computes for it (see `tests/messages/README.md` for
//! how the expected ids were obtained).

mod common;

use std::path::PathBuf;

use common::{ids_of, qwen3};
use kvsteer_tokenize::ChatRequest;
use serde_json::Value;

struct Case {
    file: String,
    body: Value,
    token_ids: Vec<u32>,
    /// The chat request vLLM's converter made of the body.
    chat: Value,
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/messages")
}

fn cases() -> Vec<Case> {
    let expected = std::fs::read_to_string(dir().join("expected.jsonl")).expect("expected.jsonl");
    expected
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("a JSON line");
            let file = v["file"].as_str().expect("file").to_owned();
            let body = std::fs::read_to_string(dir().join(&file)).expect("request file");
            Case {
                body: serde_json::from_str(&body).expect("request JSON"),
                token_ids: ids_of(&v["token_ids"]),
                chat: v["chat"].clone(),
                file,
            }
        })
        .collect()
}

#[test]
fn every_messages_request_matches_vllm() {
    let tok = qwen3();
    let cases = cases();
    assert_eq!(cases.len(), 8, "expected.jsonl lists 8 requests");
    let mut failures = Vec::new();
    for case in &cases {
        let req = match ChatRequest::from_anthropic(&case.body) {
            Ok(req) => req,
            Err(e) => {
                failures.push(format!("{}: {e}", case.file));
                continue;
            }
        };
        // The conversion itself: the same request as vLLM's converted chat
        // (tool-call arguments compared as JSON: vLLM writes them with
        // `json.dumps`, and the template re-serialises them anyway).
        let converted = ChatRequest::from_openai(&case.chat).expect("converted chat parses");
        if arguments_as_json(req.clone()) != arguments_as_json(converted.clone()) {
            failures.push(format!(
                "{}: conversion differs\n ours: {req:?}\n vllm: {converted:?}",
                case.file
            ));
        }
        match tok.chat_token_ids(&req) {
            Ok(ids) if ids == case.token_ids => {}
            Ok(ids) => failures.push(format!(
                "{}: ids differ (ours {} ids, vLLM {})",
                case.file,
                ids.len(),
                case.token_ids.len()
            )),
            Err(e) => failures.push(format!("{}: {e}", case.file)),
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

fn arguments_as_json(mut req: ChatRequest) -> ChatRequest {
    for call in req
        .messages
        .iter_mut()
        .flat_map(|m| m.tool_calls.iter_mut())
    {
        call.arguments = call.arguments.as_deref().map(|a| {
            serde_json::from_str::<Value>(a)
                .expect("arguments are JSON")
                .to_string()
        });
    }
    req
}

/// The trap: a tool_result holding only tool_reference parts renders an
/// empty tool response *and* one naming the referenced tools.
#[test]
fn tool_references_reach_the_prompt() {
    let tok = qwen3();
    let case = cases()
        .into_iter()
        .find(|c| c.file.starts_with("m004"))
        .expect("m004");
    let text = tok
        .render_chat(&ChatRequest::from_anthropic(&case.body).unwrap())
        .unwrap();
    assert!(
        text.contains(
            "<tool_response>\n\n</tool_response>\n<tool_response>\nmcp__github__create_issue\nmcp__github__list_issues\n</tool_response>"
        ),
        "{text}"
    );
}

/// Turn 1 of a Claude Code session is a prefix of turn 2 (the per-request
/// billing header is dropped), so the engine's cache serves it.
#[test]
fn a_later_turn_extends_an_earlier_one() {
    let cases = cases();
    let ids = |prefix: &str| {
        cases
            .iter()
            .find(|c| c.file.starts_with(prefix))
            .map(|c| c.token_ids.clone())
            .expect("case")
    };
    let (t1, t2) = (ids("m002"), ids("m003"));
    assert!(t2.len() > t1.len());
    assert_eq!(&t2[..t1.len()], &t1[..]);
}
