//! `kvsteer-indexer tokenize` prints exactly the ids of `shared/chat-parity/`.

use serde_json::Value;
use std::{path::PathBuf, process::Command};

use kvsteer_e2e::shared_dir as shared;

/// What `kvsteer-indexer tokenize --endpoint ENDPOINT` prints for `request`.
fn tokenize(endpoint: &str, request: &std::path::Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kvsteer-indexer"))
        .args(["tokenize", "--endpoint", endpoint, "--tokenizer"])
        .arg(shared().join("tokenizers/qwen3"))
        .arg("--request")
        .arg(request)
        .output()
        .expect("run kvsteer-indexer");
    assert!(
        out.status.success(),
        "{}: {}",
        request.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

#[test]
fn tokenize_matches_every_parity_file() {
    let dir = shared().join("chat-parity");
    let expected = std::fs::read_to_string(dir.join("expected.jsonl")).expect("expected.jsonl");
    let mut checked = 0;
    for line in expected.lines().filter(|l| !l.trim().is_empty()) {
        let want: Value = serde_json::from_str(line).expect("expected line");
        let file = want["file"].as_str().expect("file");
        let endpoint = want["endpoint"].as_str().expect("endpoint");
        let got = tokenize(endpoint, &dir.join(file));
        assert_eq!(got["token_ids"], want["token_ids"], "{file}");
        checked += 1;
    }
    assert_eq!(checked, 20);
}

/// `--endpoint messages` prints the ids of `tokenize/tests/messages/`
/// (vLLM 0.32's conversion of each Anthropic body).
#[test]
fn tokenize_messages_matches_every_fixture() {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tokenize/tests/messages"
    ));
    let expected = std::fs::read_to_string(dir.join("expected.jsonl")).expect("expected.jsonl");
    let mut checked = 0;
    for line in expected.lines().filter(|l| !l.trim().is_empty()) {
        let want: Value = serde_json::from_str(line).expect("expected line");
        let file = want["file"].as_str().expect("file");
        let got = tokenize("messages", &dir.join(file));
        assert_eq!(
            got,
            serde_json::json!({"token_ids": want["token_ids"]}),
            "{file}"
        );
        checked += 1;
    }
    assert_eq!(checked, 8);
}

#[test]
fn tokenize_reports_bad_requests() {
    let tmp = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(tmp.path(), r#"{"model":"m","messages":"nope"}"#).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvsteer-indexer"))
        .args(["tokenize", "--endpoint", "chat", "--tokenizer"])
        .arg(shared().join("tokenizers/qwen3"))
        .arg("--request")
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("messages"));
}

#[test]
fn check_config_names_the_bad_field() {
    let tmp = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        tmp.path(),
        "models: [{name: m, tokenizer: t}]\nworkers: [{name: w, endpoint: nowhere, model: m}]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvsteer-indexer"))
        .args(["check-config", "--config"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("workers[0].endpoint"));
    let ok = Command::new(env!("CARGO_BIN_EXE_kvsteer-indexer"))
        .args(["check-config", "--config"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/config.example.yaml"))
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("policy: kvsteer"));
}
