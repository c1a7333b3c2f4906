//! Helpers the deployment checks share (`deploy_manifests`, `helm_chart`):
//! where the repository and the tools are, YAML documents, JSON walking and
//! merging as Envoy applies patches.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

/// The filter for `envoy --mode validate` (`$KVSTEER_WASM`, else the
/// release wasm32-wasip1 build); it must exist.
pub fn wasm() -> PathBuf {
    let path = std::env::var_os("KVSTEER_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/wasm32-wasip1/release/kvsteer_filter.wasm"));
    assert!(
        path.is_file(),
        "{} missing: cargo build -p kvsteer-filter --target wasm32-wasip1 --release",
        path.display()
    );
    path
}

/// `$VAR` (must exist), else the first candidate that exists, else `name`
/// on PATH. A missing tool fails the test (`scripts/test.sh` installs every
/// one): only with `KVSTEER_SKIP_MISSING_TOOLS=1` is it `None`, the checks
/// that need it skipped, and that said on stderr.
pub fn tool(var: &str, name: &str, candidates: &[PathBuf], installer: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(var).map(PathBuf::from) {
        assert!(path.is_file(), "{var}={} does not exist", path.display());
        return Some(path);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    let found = candidates.iter().find(|p| p.is_file()).cloned().or(on_path);
    if found.is_none() {
        let why = format!("no {name} ({var} unset, none in .cache/.venv or on PATH); {installer}");
        assert!(
            std::env::var_os("KVSTEER_SKIP_MISSING_TOOLS").is_some_and(|v| v == "1"),
            "{why} (KVSTEER_SKIP_MISSING_TOOLS=1 skips the checks that need it)"
        );
        eprintln!("SKIPPED (KVSTEER_SKIP_MISSING_TOOLS=1): {why}");
    }
    found
}

/// Every non-empty YAML document of a (multi-document) text.
pub fn documents(name: &str, text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .enumerate()
        .map(|(i, doc)| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("{name}: document {i}: {e}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}

pub fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {v}"))
}

/// Every JSON object in `v` (depth first) for which `pick` holds.
pub fn walk<'a>(v: &'a Value, pick: &dyn Fn(&Value) -> bool, out: &mut Vec<&'a Value>) {
    if pick(v) {
        out.push(v);
    }
    match v {
        Value::Object(map) => map.values().for_each(|c| walk(c, pick, out)),
        Value::Array(list) => list.iter().for_each(|c| walk(c, pick, out)),
        _ => {}
    }
}

/// Proto MERGE as Istio applies it: objects merge key by key, lists append,
/// anything else is replaced.
pub fn merge(into: &mut Value, patch: &Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (Value::Array(a), Value::Array(b)) => a.extend(b.iter().cloned()),
        (slot, v) => *slot = v.clone(),
    }
}
