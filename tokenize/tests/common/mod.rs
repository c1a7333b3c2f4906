//! Shared helpers for the integration tests: where the shared data lives.
#![allow(dead_code)]

use std::path::PathBuf;

use kvsteer_tokenize::PromptTokenizer;

pub use kvsteer_e2e::shared_dir;

pub fn parity_dir() -> PathBuf {
    shared_dir().join("chat-parity")
}

pub fn qwen3() -> PromptTokenizer {
    let dir = shared_dir().join("tokenizers/qwen3");
    PromptTokenizer::from_dir(&dir).unwrap_or_else(|e| panic!("load {}: {e}", dir.display()))
}

/// One line of `expected.jsonl`.
pub struct Case {
    pub file: String,
    pub endpoint: String,
    pub body: serde_json::Value,
    pub text: Option<String>,
    pub token_ids: serde_json::Value,
}

pub fn cases() -> Vec<Case> {
    let dir = parity_dir();
    let expected = std::fs::read_to_string(dir.join("expected.jsonl")).expect("expected.jsonl");
    expected
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).expect("expected line");
            let file = v["file"].as_str().expect("file").to_owned();
            let body = std::fs::read_to_string(dir.join(&file)).expect("request file");
            Case {
                body: serde_json::from_str(&body).expect("request json"),
                endpoint: v["endpoint"].as_str().expect("endpoint").to_owned(),
                text: v["text"].as_str().map(str::to_owned),
                token_ids: v["token_ids"].clone(),
                file,
            }
        })
        .collect()
}

pub fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}
