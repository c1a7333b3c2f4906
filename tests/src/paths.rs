use std::path::{Path, PathBuf};

use anyhow::bail;

/// The repository root.
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The shared test data (tokenizers, parity files, vLLM's event vectors):
/// `$KVSTEER_SHARED`, else `shared/` beside the repository. Every test of
/// every crate finds it here.
pub fn shared_dir() -> PathBuf {
    std::env::var_os("KVSTEER_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared"))
}

/// Where the binaries, configs and shared test data are.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The repository root (Envoy and the indexer are started from here).
    pub root: PathBuf,
    /// `../shared` beside the repository, or `$KVSTEER_SHARED`.
    pub shared: PathBuf,
    /// Where `kvsteer-sim` and `kvsteer-indexer` are (`$KVSTEER_BIN_DIR`, default `target/debug`).
    pub bin_dir: PathBuf,
    /// The Envoy binary (`$KVSTEER_ENVOY`, default `.venv/bin/envoy`).
    pub envoy: PathBuf,
    /// The filter (`$KVSTEER_WASM`, default the release wasm32-wasip1 build).
    pub wasm: PathBuf,
}

impl Paths {
    /// Resolves every path and checks that the pieces exist, naming the command
    /// that builds or installs whatever is missing.
    pub fn discover() -> anyhow::Result<Paths> {
        let root = repo_root();
        let env_or = |var: &str, default: PathBuf| {
            std::env::var_os(var).map(PathBuf::from).unwrap_or(default)
        };
        let paths = Paths {
            shared: shared_dir(),
            bin_dir: env_or("KVSTEER_BIN_DIR", root.join("target/debug")),
            envoy: env_or("KVSTEER_ENVOY", root.join(".venv/bin/envoy")),
            wasm: env_or(
                "KVSTEER_WASM",
                root.join("target/wasm32-wasip1/release/kvsteer_filter.wasm"),
            ),
            root,
        };
        for (what, path, how) in [
            ("kvsteer-sim", paths.sim(), "cargo build -p kvsteer-sim"),
            (
                "kvsteer-indexer",
                paths.indexer(),
                "cargo build -p kvsteer-indexer",
            ),
            (
                "envoy",
                paths.envoy.clone(),
                "scripts/test.sh (installs Envoy into .venv)",
            ),
            (
                "the filter",
                paths.wasm.clone(),
                "cargo build -p kvsteer-filter --target wasm32-wasip1 --release",
            ),
            (
                "the Qwen3 tokenizer",
                paths.tokenizer().join("tokenizer.json"),
                "a copy of shared/",
            ),
        ] {
            if !path.exists() {
                bail!("{what} not found at {}: run `{how}` first", path.display());
            }
        }
        Ok(paths)
    }

    pub fn sim(&self) -> PathBuf {
        self.bin_dir.join("kvsteer-sim")
    }

    pub fn indexer(&self) -> PathBuf {
        self.bin_dir.join("kvsteer-indexer")
    }

    pub fn tokenizer(&self) -> PathBuf {
        self.shared.join("tokenizers/qwen3")
    }
}
