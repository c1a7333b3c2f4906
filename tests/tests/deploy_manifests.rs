//! The manifests under `deploy/` stay loadable by what will load them.
//!
//! - every YAML document in `deploy/**` parses (multi-document files too);
//! - the indexer ConfigMap's `indexer.yaml` passes the indexer's own loader
//!   (`Config::from_yaml`: unknown keys and bad values fail) and agrees with
//!   the vLLM StatefulSet (model name, block size, topic, ports, max-num-seqs);
//! - every kvsteer plugin configuration (standalone Envoy and Istio) passes
//!   the filter's own parser (`FilterConfig::from_json`) and names a cluster
//!   that exists;
//! - the standalone Envoy bootstrap, and a bootstrap assembled from the Istio
//!   EnvoyFilter patches, pass `envoy --mode validate` with the real wasm
//!   (which runs the filter's `on_configure`).
//!
//! Envoy comes from `$KVSTEER_ENVOY` (must exist when set), else
//! `.venv/bin/envoy`, else `envoy` on `PATH`; when none exists the Envoy
//! tests print why and pass. The wasm comes from `$KVSTEER_WASM`, else the
//! release wasm32-wasip1 build.

use std::path::{Path, PathBuf};
use std::process::Command;

use kvsteer_e2e::manifests::{documents, merge, root, str_at, tool, walk, wasm};
use kvsteer_filter::config::FilterConfig;
use kvsteer_indexer::config::Config as IndexerConfig;
use serde_json::{Value, json};

const NAMESPACE: &str = "kvsteer";
const WASM_IN_ENVOY_POD: &str = "/etc/kvsteer/wasm/kvsteer_filter.wasm";
const WASM_IN_SIDECAR: &str = "/var/lib/kvsteer/wasm/kvsteer_filter.wasm";
const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const OVERRIDE_HOST: &str = "envoy.load_balancing_policies.override_host";

// === the manifests ===

fn yaml_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        // The Helm chart's templates are not YAML until rendered: the
        // helm_chart test renders and checks them.
        if path.ends_with("deploy/helm") {
            continue;
        }
        if path.is_dir() {
            yaml_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            found.push(path);
        }
    }
}

/// `(file relative to the repository root, document)` for all of `deploy/`.
fn manifests() -> Vec<(String, Value)> {
    let mut files = Vec::new();
    yaml_files(&root().join("deploy"), &mut files);
    files.sort();
    let mut docs = Vec::new();
    for file in files {
        let name = file
            .strip_prefix(root())
            .unwrap_or(&file)
            .display()
            .to_string();
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
        docs.extend(
            documents(&name, &text)
                .into_iter()
                .map(|d| (name.clone(), d)),
        );
    }
    docs
}

fn object(kind: &str, name: &str) -> Value {
    manifests()
        .into_iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} under deploy/"))
}

fn indexer_yaml() -> String {
    let cm = object("ConfigMap", "kvsteer-indexer-config");
    str_at(&cm, "/data/indexer.yaml").to_owned()
}

fn standalone_envoy_yaml() -> String {
    let cm = object("ConfigMap", "kvsteer-envoy");
    str_at(&cm, "/data/envoy.yaml").to_owned()
}

fn wasm_configs(v: &Value) -> Vec<&Value> {
    let mut found = Vec::new();
    walk(v, &|o| o["@type"] == WASM_TYPE, &mut found);
    found
}

/// The value of a `--flag=value` argument of the vLLM container.
fn vllm_flag(flag: &str) -> String {
    let sts = object("StatefulSet", "vllm-qwen3");
    let args = sts
        .pointer("/spec/template/spec/containers/0/args")
        .and_then(Value::as_array)
        .expect("vLLM args");
    let prefix = format!("{flag}=");
    args.iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("vLLM has no {flag}=..."))
        .to_owned()
}

// === YAML ===

#[test]
fn every_deploy_yaml_document_parses() {
    let docs = manifests();
    let files: std::collections::BTreeSet<&str> = docs.iter().map(|(f, _)| f.as_str()).collect();
    for required in [
        "deploy/kubernetes/indexer-configmap.yaml",
        "deploy/kubernetes/indexer.yaml",
        "deploy/kubernetes/vllm-workers.yaml",
        "deploy/envoy/configmap.yaml",
        "deploy/envoy/deployment.yaml",
        "deploy/istio/envoyfilter-kvsteer.yaml",
        "deploy/istio/envoyfilter-workers-lb.yaml",
    ] {
        assert!(files.contains(required), "{required} missing: {files:?}");
    }
    for (file, doc) in &docs {
        assert!(
            doc.is_object(),
            "{file}: a document is not a mapping: {doc}"
        );
        // Kubernetes objects (client-patch.yaml is a bare patch).
        if doc.get("apiVersion").is_some() {
            assert!(doc["kind"].is_string(), "{file}: object without kind");
            assert!(
                doc["metadata"]["name"].is_string(),
                "{file}: {} without metadata.name",
                doc["kind"]
            );
            if doc["kind"] != "Namespace" {
                assert_eq!(
                    doc["metadata"]["namespace"], NAMESPACE,
                    "{file}: {} {}",
                    doc["kind"], doc["metadata"]["name"]
                );
            }
        }
    }
}

// === indexer ===

#[test]
fn indexer_configmap_passes_the_indexer_loader() {
    let text = indexer_yaml();
    let cfg = IndexerConfig::from_yaml(&text)
        .unwrap_or_else(|e| panic!("deploy indexer config rejected: {e}"));
    // The loader is the strict one: a stray key fails.
    let bad = text.replacen("scoring:\n", "scoring:\n  colour: red\n", 1);
    assert_ne!(bad, text);
    let err = IndexerConfig::from_yaml(&bad).expect_err("unknown key accepted");
    assert!(err.to_string().contains("colour"), "{err}");

    assert_eq!(cfg.grpc_listen, "0.0.0.0:9090");
    assert_eq!(cfg.admin_listen, "0.0.0.0:9091");
    assert!(cfg.streams.idle_reconnect_s.is_some());

    // The workers' flags agree with the config.
    let model = vllm_flag("--served-model-name");
    let m = cfg.model(&model).expect("the served model is configured");
    assert_eq!(vllm_flag("--block-size"), m.block_size.to_string());
    assert_eq!(
        vllm_flag("--max-num-seqs"),
        cfg.scoring.max_num_seqs.to_string()
    );
    let events: Value =
        serde_json::from_str(&vllm_flag("--kv-events-config")).expect("kv events JSON");
    assert_eq!(events["enable_kv_cache_events"], true);
    assert_eq!(events["publisher"], "zmq");
    assert_eq!(events["endpoint"], "tcp://*:5557");
    assert_eq!(events["replay_endpoint"], "tcp://*:5558");
    let sts = object("StatefulSet", "vllm-qwen3");
    let replicas = sts["spec"]["replicas"].as_u64().expect("replicas");
    assert_eq!(cfg.workers.len() as u64, replicas);
    for (i, w) in cfg.workers.iter().enumerate() {
        assert_eq!(w.name, format!("vllm-qwen3-{i}"));
        assert_eq!(w.model, model);
        let port = w.endpoint.rsplit_once(':').expect("ip:port").1;
        assert_eq!(port, "8000", "{}", w.name);
        // The default topic kv@<endpoint>@<model> is what vLLM publishes.
        assert!(w.topic.is_none());
        let published =
            str_at(&events, "/topic").replace("$(POD_IP)", w.endpoint.rsplit_once(':').unwrap().0);
        assert_eq!(w.topic(), published, "{}", w.name);
        let host = format!("{}.vllm-qwen3.{NAMESPACE}.svc.cluster.local", w.name);
        assert_eq!(w.kv_events.as_deref(), Some(&*format!("tcp://{host}:5557")));
        assert_eq!(w.replay.as_deref(), Some(&*format!("tcp://{host}:5558")));
    }

    // The Deployment mounts the config where it reads it, the tokenizer
    // where the config points, and probes the admin port.
    let dep = object("Deployment", "kvsteer-indexer");
    let c = &dep["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(args, ["serve", "--config", "/etc/kvsteer/indexer.yaml"]);
    let mounts: Vec<&str> = c["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(|m| str_at(m, "/mountPath"))
        .collect();
    assert!(mounts.contains(&"/etc/kvsteer"), "{mounts:?}");
    assert!(
        mounts.iter().any(|p| m.tokenizer.starts_with(p)),
        "tokenizer {} is not on a mount: {mounts:?}",
        m.tokenizer.display()
    );
    assert_eq!(str_at(c, "/readinessProbe/httpGet/path"), "/readyz");
    assert_eq!(str_at(c, "/livenessProbe/httpGet/path"), "/healthz");
    assert_eq!(
        dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"],
        true
    );

    // The Service: gRPC under the name and protocol a mesh needs.
    let svc = object("Service", "kvsteer-indexer");
    let grpc = svc["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == "grpc")
        .expect("a port named grpc");
    assert_eq!(grpc["port"], 9090);
    assert_eq!(grpc["appProtocol"], "grpc");
}

// === filter plugin configuration ===

/// Checks one wasm filter config the way Envoy and the filter will read it;
/// returns it.
fn check_wasm_filter(where_: &str, wasm: &Value) -> FilterConfig {
    let config = &wasm["config"];
    assert_eq!(
        config["allow_on_headers_stop_iteration"], true,
        "{where_}: without it Envoy picks the upstream before the body is read"
    );
    assert_eq!(config["failure_policy"], "FAIL_OPEN", "{where_}");
    assert_eq!(config["root_id"], "kvsteer", "{where_}");
    assert_eq!(
        config["vm_config"]["runtime"], "envoy.wasm.runtime.v8",
        "{where_}"
    );
    let json = str_at(config, "/configuration/value");
    let parsed = FilterConfig::from_json(json.as_bytes())
        .unwrap_or_else(|e| panic!("{where_}: plugin configuration rejected: {e}"));
    assert_eq!(
        parsed.destination_header, "x-gateway-destination-endpoint",
        "{where_}"
    );
    parsed
}

#[test]
fn plugin_configurations_pass_the_filter_parser() {
    // Standalone Envoy: the cluster the plugin names is in the bootstrap.
    let envoy = documents("deploy/envoy envoy.yaml", &standalone_envoy_yaml()).remove(0);
    let filters = wasm_configs(&envoy);
    assert_eq!(
        filters.len(),
        1,
        "one kvsteer filter in the standalone Envoy"
    );
    let cluster = check_wasm_filter("deploy/envoy", filters[0]).indexer_cluster;
    let clusters = envoy["static_resources"]["clusters"]
        .as_array()
        .expect("clusters");
    let indexer = clusters
        .iter()
        .find(|c| c["name"] == cluster.as_str())
        .unwrap_or_else(|| panic!("no cluster {cluster}"));
    assert!(
        indexer
            .pointer("/typed_extension_protocol_options/envoy.extensions.upstreams.http.v3.HttpProtocolOptions/explicit_http_config/http2_protocol_options")
            .is_some(),
        "the indexer cluster speaks HTTP/2 (gRPC)"
    );
    assert_eq!(
        indexer.pointer(
            "/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address/address"
        ),
        Some(&json!(format!(
            "kvsteer-indexer.{NAMESPACE}.svc.cluster.local"
        )))
    );
    let workers = clusters
        .iter()
        .find(|c| c["name"] == "vllm_workers")
        .expect("vllm_workers");
    let mut lb = Vec::new();
    walk(workers, &|o| o["name"] == OVERRIDE_HOST, &mut lb);
    assert_eq!(lb.len(), 1, "vllm_workers uses override_host");

    // Istio: the cluster is Istio's name for the indexer Service's grpc port.
    let istio = object("EnvoyFilter", "kvsteer-filter");
    let filters = wasm_configs(&istio);
    assert_eq!(
        filters.len(),
        1,
        "one kvsteer filter in the Istio EnvoyFilter"
    );
    let parsed = check_wasm_filter("deploy/istio", filters[0]);
    let host = format!("kvsteer-indexer.{NAMESPACE}.svc.cluster.local");
    assert_eq!(parsed.indexer_cluster, format!("outbound|9090||{host}"));
    // Istio's `|` is no valid :authority: the filter names the Service.
    assert_eq!(
        parsed.indexer_authority.as_deref(),
        Some(format!("{host}:9090").as_str())
    );
}

// === envoy --mode validate ===

/// Envoy, or `None` (with the reason printed) when it is truly absent.
/// `$KVSTEER_ENVOY` set to a missing file is an error, not a skip.
fn envoy() -> Option<PathBuf> {
    tool(
        "KVSTEER_ENVOY",
        "envoy",
        &[root().join(".venv/bin/envoy")],
        "scripts/test.sh installs it",
    )
}

fn validate(envoy: &Path, name: &str, file: &Path) {
    let output = Command::new(envoy)
        .args(["--mode", "validate", "--log-level", "warn", "-c"])
        .arg(file)
        .output()
        .expect("envoy runs");
    let log = String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{name} does not validate:\n{log}");
    assert!(
        !log.contains("Deprecated field"),
        "{name} uses deprecated fields:\n{log}"
    );
}

#[test]
fn standalone_envoy_bootstrap_validates() {
    let Some(envoy) = envoy() else { return };
    let wasm = wasm();
    let text = standalone_envoy_yaml();
    let local = text.replace(WASM_IN_ENVOY_POD, &wasm.display().to_string());
    assert_ne!(local, text, "the bootstrap loads {WASM_IN_ENVOY_POD}");

    // The Deployment mounts the wasm and the bootstrap where they are named.
    let dep = object("Deployment", "kvsteer-envoy");
    let mounts = &dep["spec"]["template"]["spec"]["containers"][0]["volumeMounts"];
    let wasm_dir = Path::new(WASM_IN_ENVOY_POD).parent().unwrap();
    for dir in [Path::new("/etc/envoy"), wasm_dir] {
        assert!(
            mounts
                .as_array()
                .expect("mounts")
                .iter()
                .any(|m| Path::new(str_at(m, "/mountPath")) == dir),
            "{} not mounted",
            dir.display()
        );
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("envoy.yaml");
    std::fs::write(&file, local).expect("write envoy.yaml");
    validate(&envoy, "deploy/envoy/configmap.yaml envoy.yaml", &file);
}

fn patches<'a>(filter: &'a Value, apply_to: &str) -> Vec<&'a Value> {
    filter["spec"]["configPatches"]
        .as_array()
        .expect("configPatches")
        .iter()
        .filter(|p| p["applyTo"] == apply_to)
        .collect()
}

/// A bootstrap shaped like an Istio sidecar's outbound side for port 8000,
/// with the EnvoyFilter patches applied: the HTTP filters inserted before the
/// router in order, the listener and the workers' cluster merged.
#[test]
fn istio_patches_validate_in_envoy() {
    let Some(envoy) = envoy() else { return };
    let wasm = wasm();
    let filter = object("EnvoyFilter", "kvsteer-filter");
    let lb = object("EnvoyFilter", "kvsteer-workers-lb");
    let workers_service = format!("vllm-qwen3-api.{NAMESPACE}.svc.cluster.local");
    let workers_cluster = format!("outbound|8000||{workers_service}");

    let mut http_filters = Vec::new();
    for p in patches(&filter, "HTTP_FILTER") {
        assert_eq!(p["match"]["context"], "SIDECAR_OUTBOUND");
        assert_eq!(p["match"]["listener"]["portNumber"], 8000);
        assert_eq!(p["patch"]["operation"], "INSERT_BEFORE");
        assert_eq!(
            p["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"],
            "envoy.filters.http.router"
        );
        http_filters.push(p["patch"]["value"].clone());
    }
    assert_eq!(http_filters.len(), 2, "strip + kvsteer");
    http_filters.push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    }));
    let filters_text = serde_json::to_string(&http_filters).unwrap();
    assert!(filters_text.contains(WASM_IN_SIDECAR));
    let http_filters: Value =
        serde_json::from_str(&filters_text.replace(WASM_IN_SIDECAR, &wasm.display().to_string()))
            .unwrap();

    let mut listener = json!({
        "name": "0.0.0.0_8000",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8000}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "outbound_0.0.0.0_8000",
                "route_config": {"name": "8000", "virtual_hosts": [{
                    "name": format!("{workers_service}:8000"),
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": workers_cluster, "timeout": "0s"}}]
                }]},
                "http_filters": http_filters
            }
        }]}]
    });
    for p in patches(&filter, "LISTENER") {
        assert_eq!(p["patch"]["operation"], "MERGE");
        merge(&mut listener, &p["patch"]["value"]);
    }
    assert_eq!(listener["per_connection_buffer_limit_bytes"], 16777216);

    // Istio's own settings for a Service cluster that matter here: an lb_policy
    // and a common_lb_config, which load_balancing_policy must coexist with.
    let mut workers = json!({
        "name": workers_cluster,
        "type": "STATIC",
        "connect_timeout": "10s",
        "lb_policy": "LEAST_REQUEST",
        "common_lb_config": {"healthy_panic_threshold": {}},
        "load_assignment": {"cluster_name": workers_cluster, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "10.0.0.10", "port_value": 8000}}}}
        ]}]}
    });
    let cluster_patches = patches(&lb, "CLUSTER");
    assert_eq!(cluster_patches.len(), 1);
    let p = cluster_patches[0];
    assert_eq!(p["match"]["context"], "SIDECAR_OUTBOUND");
    assert_eq!(p["match"]["cluster"]["service"], workers_service.as_str());
    assert_eq!(p["match"]["cluster"]["portNumber"], 8000);
    assert_eq!(p["patch"]["operation"], "MERGE");
    merge(&mut workers, &p["patch"]["value"]);
    let mut found = Vec::new();
    walk(&workers, &|o| o["name"] == OVERRIDE_HOST, &mut found);
    assert_eq!(found.len(), 1, "the workers' cluster uses override_host");

    let indexer_cluster = format!("outbound|9090||kvsteer-indexer.{NAMESPACE}.svc.cluster.local");
    let indexer = json!({
        "name": indexer_cluster,
        "type": "STATIC",
        "connect_timeout": "10s",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}
        }},
        "load_assignment": {"cluster_name": indexer_cluster, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "10.0.0.20", "port_value": 9090}}}}
        ]}]}
    });

    let bootstrap = json!({
        "static_resources": {"listeners": [listener], "clusters": [workers, indexer]}
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("istio-sidecar.json");
    std::fs::write(&file, serde_json::to_string_pretty(&bootstrap).unwrap()).expect("write");
    validate(&envoy, "deploy/istio EnvoyFilters (applied)", &file);
}
