//! Regenerates the checked-in protobuf code and fails if it differs from what is
//! committed (the linkerd `spiffe-proto` pattern): the `.proto` and `src/gen/`
//! can never drift apart, and nobody needs `protoc` to build.
use std::path::{Path, PathBuf};

fn generate(out: &Path, grpc: bool) {
    let protoc = protoc_bin_vendored::protoc_bin_path().expect("vendored protoc");
    // SAFETY-free: PROTOC is read by prost-build in this process only.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto = root.join("kvsteer/v1/router.proto");
    std::fs::create_dir_all(out).expect("out dir");
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);
    if grpc {
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(true)
            .build_transport(false)
            .out_dir(out)
            .compile_with_config(config, &[proto], &[root.to_path_buf()])
            .expect("tonic codegen");
    } else {
        config.out_dir(out);
        config
            .compile_protos(&[proto], &[root])
            .expect("prost codegen");
    }
}

fn check(kind: &str, grpc: bool) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let committed = root.join("src/gen").join(kind).join("kvsteer.v1.rs");
    let tmp = std::env::temp_dir().join(format!("kvsteer-proto-{kind}-{}", std::process::id()));
    generate(&tmp, grpc);
    let fresh = std::fs::read_to_string(tmp.join("kvsteer.v1.rs")).expect("generated file");
    let _ = std::fs::remove_dir_all(&tmp);
    if std::env::var_os("KVSTEER_BLESS").is_some() {
        std::fs::write(&committed, &fresh).expect("write generated code");
        return;
    }
    let old = std::fs::read_to_string(&committed).unwrap_or_default();
    assert!(
        old == fresh,
        "{} is out of date: run `KVSTEER_BLESS=1 cargo test -p kvsteer-proto`",
        committed.display()
    );
}

#[test]
fn messages_are_up_to_date() {
    check("messages", false);
}

#[test]
fn grpc_is_up_to_date() {
    check("grpc", true);
}
