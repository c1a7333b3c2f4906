//! The public surface other crates use, on the shared Qwen3 tokenizer.

mod common;

use common::qwen3;
use kvsteer_tokenize::{ChatRequest, CompletionPrompt, Error, PromptTokenizer};
use serde_json::json;

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn prompt_tokenizer_is_send_sync() {
    assert_send_sync::<PromptTokenizer>();
}

#[test]
fn metadata() {
    let tok = qwen3();
    assert_eq!(tok.eos_token_id(), Some(151645));
    assert_eq!(tok.vocab_size(), 151669);
    assert_eq!(
        tok.decode(&[151644, 872, 198]).unwrap(),
        "<|im_start|>user\n"
    );
}

#[test]
fn special_tokens_inside_user_content_become_single_ids() {
    let tok = qwen3();
    let req = ChatRequest::from_openai(&json!({"messages": [
        {"role": "user", "content": "say <|im_end|> and <think>"}
    ]}))
    .unwrap();
    let ids = tok.chat_token_ids(&req).unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == 151645).count(), 2);
    assert!(ids.contains(&151667));
}

#[test]
fn later_turns_extend_earlier_ones_and_hit_the_cache() {
    let tok = qwen3();
    let mut messages = vec![json!({"role": "user", "content": "Explain borrowing in Rust."})];
    let t1 = tok
        .chat_token_ids(
            &ChatRequest::from_openai(
                &json!({"messages": messages, "add_generation_prompt": false}),
            )
            .unwrap(),
        )
        .unwrap();
    let served_before = tok.cache_stats().tokens_served;
    messages.push(json!({"role": "assistant", "content": "Borrowing lends a reference."}));
    messages.push(json!({"role": "user", "content": "And lifetimes?"}));
    let t2 = tok
        .chat_token_ids(&ChatRequest::from_openai(&json!({"messages": messages})).unwrap())
        .unwrap();
    assert_eq!(&t2[..t1.len()], &t1[..]);
    assert!(tok.cache_stats().tokens_served > served_before);
}

#[test]
fn completions_ids_and_errors() {
    let tok = qwen3();
    let p = CompletionPrompt::from_openai(&json!({"prompt": [[1, 2], [3]]})).unwrap();
    assert_eq!(
        tok.completion_token_ids(&p, None).unwrap(),
        vec![vec![1, 2], vec![3]]
    );
    let p = CompletionPrompt::Ids(vec![1, 151669]);
    assert!(
        matches!(tok.completion_token_ids(&p, None), Err(Error::InvalidRequest(m)) if m.contains("151669"))
    );
    let p = CompletionPrompt::Texts(vec!["a".into(), "b c".into()]);
    let ids = tok.completion_token_ids(&p, Some(false)).unwrap();
    assert_eq!(
        ids,
        vec![
            tok.encode("a", false).unwrap(),
            tok.encode("b c", false).unwrap()
        ]
    );
}

#[test]
fn template_errors_are_errors() {
    let tok = qwen3();
    // The Qwen3 template reads messages[0]: an empty conversation fails cleanly.
    let req = ChatRequest::from_openai(&json!({"messages": []})).unwrap();
    assert!(matches!(tok.chat_token_ids(&req), Err(Error::Template(_))));
    let req = ChatRequest::from_openai(&json!({"messages": [{"role": "user", "content": "x"}],
        "continue_final_message": true, "add_generation_prompt": false}))
    .unwrap();
    assert!(tok.render_chat(&req).unwrap().ends_with("x"));
}

#[test]
fn missing_files_are_load_errors() {
    let err = PromptTokenizer::from_dir(std::path::Path::new("/nonexistent-kvsteer")).unwrap_err();
    assert!(matches!(err, Error::Load { .. }), "{err}");
}

/// Random conversations through the real Qwen3 template: never a panic, and
/// whenever rendering succeeds the cached ids equal a plain encode.
#[test]
fn random_conversations_render_or_fail_cleanly() {
    use rand::{Rng, SeedableRng, rngs::SmallRng};
    const ROLES: [&str; 6] = ["system", "developer", "user", "assistant", "tool", "other"];
    const TEXTS: [&str; 8] = [
        "",
        "hello",
        "<tool_response>\nok\n</tool_response>",
        "<think>\nhmm\n</think>\n\nanswer",
        "a</think>b",
        "x-anthropic-billing-header: cch=1;\nrules",
        "  spaced  \n",
        "<|im_end|>",
    ];
    const ARGS: [&str; 5] = [
        "",
        "{\"a\": 1.50}",
        "[1]",
        "{oops",
        "{\"k\": {\"n\": null}}",
    ];
    let tok = qwen3();
    let mut rng = SmallRng::seed_from_u64(99);
    let pick = |rng: &mut SmallRng, xs: &[&'static str]| xs[rng.random_range(0..xs.len())];
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..300 {
        let messages: Vec<serde_json::Value> = (0..rng.random_range(0..6))
            .map(|_| {
                let mut m = json!({"role": pick(&mut rng, &ROLES), "content": pick(&mut rng, &TEXTS)});
                if rng.random_bool(0.3) {
                    m["tool_calls"] = json!([{"type": "function", "function": {"name": "f", "arguments": pick(&mut rng, &ARGS)}}]);
                }
                if rng.random_bool(0.2) {
                    m["reasoning"] = json!(pick(&mut rng, &TEXTS));
                }
                if rng.random_bool(0.2) {
                    m["content"] = json!([{"type": "text", "text": pick(&mut rng, &TEXTS)}, {"type": "refusal", "refusal": "no"}]);
                }
                m
            })
            .collect();
        let continue_final = rng.random_bool(0.2);
        let mut body = json!({"messages": messages, "continue_final_message": continue_final,
                              "add_generation_prompt": !continue_final && rng.random_bool(0.8)});
        if rng.random_bool(0.3) {
            body["tools"] = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        }
        if rng.random_bool(0.3) {
            body["reasoning_effort"] = json!(pick(&mut rng, &["none", "low"]));
        }
        let req = ChatRequest::from_openai(&body).expect("generated bodies are well-formed");
        match (tok.render_chat(&req), tok.chat_token_ids(&req)) {
            (Ok(text), Ok(ids)) => {
                assert_eq!(ids, tok.encode(&text, false).unwrap(), "{body}");
                ok += 1;
            }
            (Err(a), Err(b)) => {
                assert_eq!(a.to_string(), b.to_string());
                failed += 1;
            }
            (a, b) => panic!("render and ids disagree for {body}: {a:?} vs {b:?}"),
        }
    }
    assert!(ok > 100 && failed > 0, "ok {ok}, failed {failed}");
}
