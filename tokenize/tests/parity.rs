//! Every request in `shared/chat-parity/` → exactly vLLM's prompt ids.

mod common;

use common::{cases, ids_of, qwen3};
use kvsteer_tokenize::{ChatRequest, CompletionPrompt, PromptTokenizer};

#[test]
fn every_parity_request_matches_vllm() {
    let tok = qwen3();
    let cases = cases();
    assert_eq!(cases.len(), 20, "expected.jsonl lists 20 requests");
    let mut failures = Vec::new();
    for case in &cases {
        let result = match case.endpoint.as_str() {
            "chat" => check_chat(&tok, case),
            "completions" => check_completions(&tok, case),
            other => Err(format!("unknown endpoint {other}")),
        };
        if let Err(msg) = result {
            failures.push(format!("{}: {msg}", case.file));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

fn check_chat(tok: &PromptTokenizer, case: &common::Case) -> Result<(), String> {
    let req = ChatRequest::from_openai(&case.body).map_err(|e| e.to_string())?;
    let text = tok.render_chat(&req).map_err(|e| e.to_string())?;
    if let Some(want) = &case.text {
        compare_text(want, &text)?;
    }
    let want = ids_of(&case.token_ids);
    let got = tok.chat_token_ids(&req).map_err(|e| e.to_string())?;
    compare_ids(tok, &want, &got, "cached")?;
    let uncached = tok.encode(&text, false).map_err(|e| e.to_string())?;
    compare_ids(tok, &want, &uncached, "uncached")
}

fn check_completions(tok: &PromptTokenizer, case: &common::Case) -> Result<(), String> {
    let prompt = CompletionPrompt::from_openai(&case.body).map_err(|e| e.to_string())?;
    let special = case
        .body
        .get("add_special_tokens")
        .and_then(|v| v.as_bool());
    let got = tok
        .completion_token_ids(&prompt, special)
        .map_err(|e| e.to_string())?;
    let want: Vec<Vec<u32>> = if case.token_ids[0].is_array() {
        case.token_ids
            .as_array()
            .unwrap()
            .iter()
            .map(ids_of)
            .collect()
    } else {
        vec![ids_of(&case.token_ids)]
    };
    if got.len() != want.len() {
        return Err(format!(
            "batch of {} prompts, want {}",
            got.len(),
            want.len()
        ));
    }
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        compare_ids(tok, w, g, &format!("prompt {i}"))?;
    }
    Ok(())
}

fn compare_text(want: &str, got: &str) -> Result<(), String> {
    if want == got {
        return Ok(());
    }
    let at = want
        .char_indices()
        .zip(got.chars())
        .find(|((_, w), g)| w != g)
        .map(|((i, _), _)| i)
        .unwrap_or(want.len().min(got.len()));
    let window = |s: &str| {
        let start = s.floor_char_boundary(at.saturating_sub(60));
        let end = s.ceil_char_boundary((at + 60).min(s.len()));
        format!("{:?}", &s[start..end])
    };
    Err(format!(
        "rendered text differs at byte {at} (want {} bytes, got {}):\n  want …{}…\n  got  …{}…",
        want.len(),
        got.len(),
        window(want),
        window(got)
    ))
}

fn compare_ids(tok: &PromptTokenizer, want: &[u32], got: &[u32], what: &str) -> Result<(), String> {
    if want == got {
        return Ok(());
    }
    let at = want
        .iter()
        .zip(got)
        .position(|(w, g)| w != g)
        .unwrap_or(want.len().min(got.len()));
    let around = |ids: &[u32]| {
        let lo = at.saturating_sub(5);
        let hi = (at + 6).min(ids.len());
        let ids = &ids[lo..hi];
        format!("{ids:?} = {:?}", tok.decode(ids).unwrap_or_default())
    };
    Err(format!(
        "{what} ids differ at index {at} (want {} ids, got {}):\n  want {}\n  got  {}",
        want.len(),
        got.len(),
        around(want),
        around(got)
    ))
}
