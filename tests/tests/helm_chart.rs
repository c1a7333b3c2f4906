//! The Helm chart `deploy/helm/kvsteer` renders, with each example values
//! file, into objects that what will load them accepts.
//!
//! For every values file: `helm lint --strict` and `helm template`; every
//! rendered document parses and carries the standard labels; core kinds pass
//! `kubernetes-validate --strict`; Istio and Envoy Gateway resources pass
//! their CRD schemas (tests/fixtures/crd-schemas, unknown fields fail); the
//! indexer ConfigMap passes the indexer's loader (after the init container's
//! Redis-URL substitution, run here with `sh`); every filter configuration
//! passes the filter's parser; every Envoy configuration the chart produces
//! (the standalone bootstrap, a sidecar with the Istio patches, a gateway
//! with the Envoy Gateway policies applied) passes `envoy --mode validate`
//! with the real wasm; the gateway routes answer vLLM's admin paths 404.
//!
//! Tools: `$KVSTEER_HELM`, `$KVSTEER_KUBERNETES_VALIDATE`, `$KVSTEER_ENVOY`
//! must exist when set (scripts/test.sh sets them); unset, they are looked
//! for in .cache/bin, .venv/bin and on PATH, and a missing one fails the
//! test (`KVSTEER_SKIP_MISSING_TOOLS=1` skips its checks instead, saying so).

#[path = "helm_chart/schema.rs"]
mod schema;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use kvsteer_e2e::manifests::{documents, merge, root, str_at, tool, walk, wasm};
use kvsteer_filter::config::FilterConfig;
use kvsteer_indexer::config::{Config as IndexerConfig, DebugAccess};
use kvsteer_indexer::tenancy::policy::Isolation;
use serde_json::{Value, json};

const RELEASE: &str = "kvsteer";
const NAMESPACE: &str = "kvsteer";
const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const OVERRIDE_HOST: &str = "envoy.load_balancing_policies.override_host";
const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
const REDIS_PLACEHOLDER: &str = "redis://redis-url-from-secret.invalid:6379";
const WASM_IN_SIDECAR: &str = "/var/lib/kvsteer/wasm/kvsteer_filter.wasm";

/// vLLM server endpoints that must not be reachable through the gateway
/// unless `upstream.adminPaths` lists them (vllm/entrypoints/serve/*).
const VLLM_ADMIN_PATHS: &[&str] = &[
    "/reset_prefix_cache",
    "/reset_mm_cache",
    "/tokenize",
    "/detokenize",
    "/metrics",
    "/health",
    "/load_lora_adapter",
    "/unload_lora_adapter",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/sleep",
    "/wake_up",
    "/is_sleeping",
    "/collective_rpc",
    "/start_profile",
    "/stop_profile",
    "/server_info",
    "/pause",
    "/resume",
    "/reconfigure",
    "/scale_elastic_ep",
];

// === tools ===

fn helm() -> Option<PathBuf> {
    tool(
        "KVSTEER_HELM",
        "helm",
        &[root().join(".cache/bin/helm")],
        "scripts/test.sh installs it (ensure_helm)",
    )
}

fn kubernetes_validate() -> Option<PathBuf> {
    tool(
        "KVSTEER_KUBERNETES_VALIDATE",
        "kubernetes-validate",
        &[root().join(".venv/bin/kubernetes-validate")],
        "scripts/test.sh installs it (ensure_kubernetes_validate)",
    )
}

fn envoy() -> Option<PathBuf> {
    tool(
        "KVSTEER_ENVOY",
        "envoy",
        &[root().join(".venv/bin/envoy")],
        "scripts/test.sh installs it (ensure_envoy)",
    )
}

fn run(cmd: &mut Command, what: &str) -> String {
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let log = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{what} failed:\n{log}");
    String::from_utf8_lossy(&output.stdout).to_string()
}

// === rendering ===

fn chart() -> PathBuf {
    root().join("deploy/helm/kvsteer")
}

/// One rendering of the chart: a values file plus `--set` overrides.
struct Case {
    name: &'static str,
    values: &'static str,
    set: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        name: "defaults",
        values: "values.yaml",
        set: &[],
    },
    Case {
        name: "standalone",
        values: "values-standalone.yaml",
        set: &[],
    },
    Case {
        name: "standalone, admin paths opened, image volume",
        values: "values-standalone.yaml",
        set: &[
            "upstream.adminPaths={/tokenize,/metrics}",
            "wasm.source=image",
            "wasm.image.reference=registry.example/kvsteer-filter:0.1.0",
        ],
    },
    Case {
        name: "standalone, debug behind a token",
        values: "values-standalone.yaml",
        set: &[
            "indexer.debug=token",
            "indexer.debugTokenSecret.name=kvsteer-admin-token",
        ],
    },
    Case {
        name: "standalone, a salted tenant and a budgeted one",
        values: "values-standalone.yaml",
        set: &[
            "tenants.overrides.team-a.isolation=salted",
            "tenants.overrides.team-b.budget.tokens_per_minute=4000",
            "indexer.saltSecret.name=kvsteer-salt",
        ],
    },
    Case {
        name: "istio",
        values: "values-istio.yaml",
        set: &[],
    },
    Case {
        name: "istio, three replicas",
        values: "values-istio-replicas.yaml",
        set: &[],
    },
    Case {
        name: "envoy gateway",
        values: "values-envoy-gateway.yaml",
        set: &[],
    },
    Case {
        name: "redis replicas",
        values: "values-redis-replicas.yaml",
        set: &[],
    },
    Case {
        name: "static workers",
        values: "values-static.yaml",
        set: &[],
    },
];

struct Rendered {
    case: &'static str,
    docs: Vec<Value>,
}

impl Rendered {
    fn all(&self, kind: &str) -> Vec<&Value> {
        self.docs.iter().filter(|d| d["kind"] == kind).collect()
    }

    fn one(&self, kind: &str, name_suffix: &str) -> &Value {
        let found: Vec<&Value> = self
            .all(kind)
            .into_iter()
            .filter(|d| str_at(d, "/metadata/name").ends_with(name_suffix))
            .collect();
        assert_eq!(found.len(), 1, "{}: one {kind} *{name_suffix}", self.case);
        found[0]
    }
}

fn args(case: &Case, b64: &Path) -> Vec<String> {
    let mut args = vec![
        "-f".to_owned(),
        chart().join(case.values).display().to_string(),
        "--set-file".to_owned(),
        format!("wasm.configMap.base64={}", b64.display()),
    ];
    for s in case.set {
        args.push("--set".to_owned());
        args.push((*s).to_owned());
    }
    args
}

/// Lints and renders every case (or `None` without helm).
fn render_all() -> Option<(Vec<Rendered>, tempfile::TempDir)> {
    let helm = helm()?;
    let dir = tempfile::tempdir().expect("temp dir");
    let b64 = dir.path().join("kvsteer_filter.wasm.b64");
    let bytes = std::fs::read(wasm()).expect("read the wasm");
    std::fs::write(&b64, base64(&bytes)).expect("write base64");
    let mut out = Vec::new();
    for case in CASES {
        run(
            Command::new(&helm)
                .args(["lint", "--strict"])
                .arg(chart())
                .args(args(case, &b64)),
            &format!("helm lint --strict ({})", case.name),
        );
        let text = run(
            Command::new(&helm)
                .args(["template", RELEASE])
                .arg(chart())
                .args(["--namespace", NAMESPACE])
                .args(args(case, &b64)),
            &format!("helm template ({})", case.name),
        );
        let docs = documents(case.name, &text);
        out.push(Rendered {
            case: case.name,
            docs,
        });
    }
    Some((out, dir))
}

fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                s.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

// === the whole check, one rendering at a time ===

#[test]
fn chart_renders_and_every_rendered_object_loads() {
    let Some((rendered, dir)) = render_all() else {
        return;
    };
    let validator = kubernetes_validate();
    let envoy = envoy();
    for r in &rendered {
        objects_are_labelled(r);
        match &validator {
            Some(v) => core_kinds_validate(v, r, dir.path()),
            None => eprintln!("{}: core kinds not validated", r.case),
        }
        custom_resources_match_their_schemas(r);
        indexer_config_loads(r);
        indexer_access_is_namespaced(r);
        let filters = filter_configs(r);
        match (&envoy, filters) {
            (_, Proxy::None) => {}
            (Some(envoy), Proxy::Standalone(bootstrap)) => {
                standalone_routes_close_admin_paths(r, &bootstrap);
                validate(envoy, &format!("{}: standalone Envoy", r.case), &bootstrap);
            }
            (Some(envoy), Proxy::Istio) => istio_sidecar_validates(envoy, r),
            (Some(envoy), Proxy::EnvoyGateway) => envoy_gateway_validates(envoy, r),
            (None, _) => eprintln!("{}: Envoy configurations not validated", r.case),
        }
    }
}

fn objects_are_labelled(r: &Rendered) {
    assert!(!r.docs.is_empty(), "{}: nothing rendered", r.case);
    for d in &r.docs {
        let what = format!("{}: {} {}", r.case, d["kind"], d["metadata"]["name"]);
        assert!(
            d["apiVersion"].is_string() && d["kind"].is_string(),
            "{what}"
        );
        assert!(
            d["metadata"]["namespace"].is_string(),
            "{what}: no namespace"
        );
        for label in [
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/part-of",
        ] {
            assert!(
                d["metadata"]["labels"][label].is_string(),
                "{what}: no label {label}"
            );
        }
    }
}

// === Kubernetes schemas ===

const CORE_GROUPS: &[&str] = &[
    "v1",
    "apps/v1",
    "policy/v1",
    "rbac.authorization.k8s.io/v1",
    "networking.k8s.io/v1",
];

fn core_kinds_validate(validator: &Path, r: &Rendered, dir: &Path) {
    let core: Vec<&Value> = r
        .docs
        .iter()
        .filter(|d| CORE_GROUPS.contains(&d["apiVersion"].as_str().unwrap_or_default()))
        .collect();
    assert!(core.len() >= 4, "{}: {} core objects", r.case, core.len());
    let file = dir.join("core.yaml");
    let text: Vec<String> = core
        .iter()
        .map(|d| serde_norway::to_string(d).expect("yaml"))
        .collect();
    std::fs::write(&file, text.join("---\n")).expect("write");
    run(
        Command::new(validator)
            .args(["--strict", "--quiet"])
            .arg(&file),
        &format!("kubernetes-validate ({})", r.case),
    );
}

fn crd_schema(api_version: &str, kind: &str) -> Option<Value> {
    let (group, version) = api_version.split_once('/')?;
    let path = root().join(format!(
        "tests/fixtures/crd-schemas/{kind}.{group}.{version}.json"
    ));
    let text = std::fs::read_to_string(path).ok()?;
    Some(serde_json::from_str(&text).expect("schema JSON"))
}

fn custom_resources_match_their_schemas(r: &Rendered) {
    for d in &r.docs {
        let api = d["apiVersion"].as_str().unwrap_or_default();
        let kind = d["kind"].as_str().unwrap_or_default();
        if CORE_GROUPS.contains(&api) {
            continue;
        }
        let Some(schema) = crd_schema(api, kind) else {
            // Only the Prometheus Operator's ServiceMonitor goes unchecked.
            assert_eq!(
                kind, "ServiceMonitor",
                "{}: no schema for {api} {kind}",
                r.case
            );
            assert!(d["spec"]["endpoints"][0]["port"].is_string(), "{}", r.case);
            continue;
        };
        let problems = schema::violations(&schema, d);
        assert!(
            problems.is_empty(),
            "{}: {kind} {} violates its CRD schema:\n{}",
            r.case,
            d["metadata"]["name"],
            problems.join("\n")
        );
    }
}

#[test]
fn the_schema_check_catches_what_the_api_server_would_drop_or_reject() {
    let schema = crd_schema("gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy")
        .expect("vendored schema");
    let good = json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "BackendTrafficPolicy",
        "metadata": {"name": "x"},
        "spec": {
            "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "r"}],
            "loadBalancer": {"type": "RoundRobin", "endpointOverride": {"extractFrom": [{"header": "h"}]}},
            "connection": {"bufferLimit": 16777216}
        }
    });
    assert_eq!(schema::violations(&schema, &good), Vec::<String>::new());
    type Spoil = fn(&mut Value);
    let cases: [(&str, Spoil, &str); 5] = [
        (
            "unknown field",
            |d| d["spec"]["loadBalancer"]["typo"] = json!(1),
            "unknown field",
        ),
        (
            "enum",
            |d| d["spec"]["loadBalancer"]["type"] = json!("Fastest"),
            "is not one of",
        ),
        (
            "type",
            |d| d["spec"]["retry"] = json!({"numRetries": "two"}),
            "expected integer",
        ),
        (
            "int-or-string",
            |d| d["spec"]["connection"]["bufferLimit"] = json!(true),
            "neither an integer nor a string",
        ),
        (
            "pattern",
            |d| d["spec"]["targetRefs"][0]["kind"] = json!("http route"),
            "does not match",
        ),
    ];
    for (what, spoil, expect) in cases {
        let mut doc = good.clone();
        spoil(&mut doc);
        let problems = schema::violations(&schema, &doc).join("\n");
        assert!(problems.contains(expect), "{what}: {problems:?}");
    }
}

// === the indexer ===

fn indexer_config_loads(r: &Rendered) {
    let cm = r.one("ConfigMap", "-indexer-config");
    let mut text = str_at(cm, "/data/indexer.yaml").to_owned();
    let dep = r.one("Deployment", "-indexer");
    let spec = &dep["spec"]["template"]["spec"];
    if text.contains(REDIS_PLACEHOLDER) {
        text = run_redis_url_init(r, spec, &text);
    }
    let cfg = IndexerConfig::from_yaml(&text)
        .unwrap_or_else(|e| panic!("{}: the indexer rejects its config: {e}\n{text}", r.case));
    assert_eq!(cfg.grpc_listen, "0.0.0.0:9090", "{}", r.case);
    assert_eq!(cfg.admin_listen, "0.0.0.0:9091", "{}", r.case);

    // The Deployment reads the config where it is mounted, the tokenizers
    // where the config points, and probes the admin port.
    let c = &spec["containers"][0];
    // /debug/* is off unless asked for; a token comes from a Secret.
    let want = if r.case.contains("debug behind a token") {
        DebugAccess::Token
    } else {
        DebugAccess::Disabled
    };
    assert_eq!(cfg.admin.debug, want, "{}", r.case);
    let token_env = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "KVSTEER_ADMIN_TOKEN");
    match token_env {
        Some(e) => assert_eq!(
            e["valueFrom"]["secretKeyRef"]["name"], "kvsteer-admin-token",
            "{}",
            r.case
        ),
        None => assert_ne!(want, DebugAccess::Token, "{}: no token env", r.case),
    }
    // A salted tenant's secret comes from its Secret, and the policy
    // reaches the indexer's config.
    let salt_env = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "KVSTEER_SALT_SECRET");
    if r.case.contains("salted tenant") {
        let env = salt_env.expect("KVSTEER_SALT_SECRET");
        assert_eq!(env["valueFrom"]["secretKeyRef"]["name"], "kvsteer-salt");
        let a = &cfg.tenants.overrides["team-a"];
        assert_eq!(a.isolation, Some(Isolation::Salted));
        let b = cfg.tenants.overrides["team-b"]
            .budget
            .expect("team-b budget");
        assert_eq!(b.tokens_per_minute, Some(4000));
    } else {
        assert!(salt_env.is_none(), "{}", r.case);
    }
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        args,
        ["serve", "--config", "/etc/kvsteer/indexer.yaml"],
        "{}",
        r.case
    );
    let mounts: Vec<&str> = c["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(|m| str_at(m, "/mountPath"))
        .collect();
    assert!(mounts.contains(&"/etc/kvsteer"), "{}: {mounts:?}", r.case);
    for m in &cfg.models {
        assert!(
            mounts.iter().any(|p| m.tokenizer.starts_with(p)),
            "{}: tokenizer {} is on no mount",
            r.case,
            m.tokenizer.display()
        );
    }
    if let Some(init) = spec["initContainers"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == "fetch-tokenizers"))
    {
        let script = str_at(init, "/args/0");
        for (i, _) in cfg.models.iter().enumerate() {
            assert!(
                script.contains(&format!("fetch /var/lib/kvsteer/tokenizers/{i} ")),
                "{}: the init container fetches no tokenizer for model {i}",
                r.case
            );
        }
    }
    assert_eq!(str_at(c, "/readinessProbe/httpGet/path"), "/readyz");
    assert_eq!(str_at(c, "/livenessProbe/httpGet/path"), "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "admin");

    // Several replicas only with the shared index, and with a PDB.
    let replicas = dep["spec"]["replicas"].as_u64().expect("replicas");
    if replicas > 1 {
        assert_eq!(format!("{:?}", cfg.index.backend), "Redis", "{}", r.case);
        let pdb = r.one("PodDisruptionBudget", "-indexer");
        assert_eq!(
            pdb["spec"]["selector"]["matchLabels"],
            dep["spec"]["selector"]["matchLabels"]
        );
    }

    // The discovery pools select what the chart's worker Service selects.
    let raw: Value = serde_norway::from_str(&text).expect("yaml");
    if let Some(pools) = raw
        .pointer("/discovery/kubernetes/pools")
        .and_then(Value::as_array)
    {
        assert_eq!(
            pools.len(),
            cfg.models.len(),
            "{}: one pool per model",
            r.case
        );
        for (pool, model) in pools.iter().zip(&cfg.models) {
            assert_eq!(pool["model"], model.name.as_str(), "{}", r.case);
            if let Some(svc) = r
                .all("Service")
                .into_iter()
                .find(|s| str_at(s, "/metadata/name").ends_with("-workers"))
            {
                let selector = str_at(pool, "/selector");
                for (k, v) in svc["spec"]["selector"].as_object().expect("selector") {
                    let pair = format!("{k}={}", v.as_str().unwrap());
                    assert!(
                        selector.split(',').any(|p| p == pair),
                        "{}: {pair} not in {selector}",
                        r.case
                    );
                }
            }
        }
    } else {
        assert!(
            !cfg.workers.is_empty(),
            "{}: neither discovery nor workers",
            r.case
        );
    }
}

/// Runs the `redis-url` init container's script (sh + awk, as in the pod)
/// on the rendered config, with a URL that needs quoting.
fn run_redis_url_init(r: &Rendered, spec: &Value, text: &str) -> String {
    let init = spec["initContainers"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == "redis-url"))
        .unwrap_or_else(|| {
            panic!(
                "{}: a placeholder URL but no redis-url init container",
                r.case
            )
        });
    let env = &init["env"];
    let secret = env
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == "REDIS_URL"))
        .expect("REDIS_URL");
    assert!(
        secret["valueFrom"]["secretKeyRef"]["name"].is_string(),
        "{}",
        r.case
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let (src, dst) = (dir.path().join("in.yaml"), dir.path().join("out.yaml"));
    std::fs::write(&src, text).expect("write");
    let url = "redis://:pa's&s\\word@redis-0.redis:6379/2";
    let cmd = init["command"].as_array().expect("command");
    assert_eq!(cmd[0], "/bin/sh");
    run(
        Command::new("sh")
            .arg("-c")
            .arg(str_at(init, "/args/0"))
            .env("REDIS_URL", url)
            .env("SRC", &src)
            .env("DST", &dst),
        &format!("{}: the redis-url init script", r.case),
    );
    let out = std::fs::read_to_string(&dst).expect("init output");
    let cfg = IndexerConfig::from_yaml(&out).unwrap_or_else(|e| panic!("{}: {e}\n{out}", r.case));
    assert_eq!(
        cfg.index.redis.url, url,
        "{}: the URL survives quoting",
        r.case
    );
    out
}

fn indexer_access_is_namespaced(r: &Rendered) {
    let dep = r.one("Deployment", "-indexer");
    let spec = &dep["spec"]["template"]["spec"];
    let sa = str_at(spec, "/serviceAccountName");
    assert!(r.all("ClusterRole").is_empty() && r.all("ClusterRoleBinding").is_empty());
    let roles = r.all("Role");
    let discovery =
        str_at(r.one("ConfigMap", "-indexer-config"), "/data/indexer.yaml").contains("discovery:");
    assert_eq!(
        spec["automountServiceAccountToken"], discovery,
        "{}",
        r.case
    );
    if !discovery {
        assert!(roles.is_empty(), "{}: a Role without discovery", r.case);
        return;
    }
    assert_eq!(roles.len(), 1, "{}", r.case);
    assert_eq!(
        roles[0]["rules"],
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]),
        "{}",
        r.case
    );
    let binding = r.one("RoleBinding", "-pods");
    assert_eq!(binding["roleRef"]["name"], roles[0]["metadata"]["name"]);
    assert_eq!(
        binding["metadata"]["namespace"],
        roles[0]["metadata"]["namespace"]
    );
    assert_eq!(binding["subjects"][0]["name"], sa, "{}", r.case);

    // NetworkPolicy: gRPC from named peers, admin from monitoring only.
    let np = r.one("NetworkPolicy", "-indexer");
    let ingress = np["spec"]["ingress"].as_array().expect("ingress");
    assert_eq!(ingress.len(), 2, "{}", r.case);
    assert_eq!(ingress[0]["ports"][0]["port"], "grpc");
    assert!(
        !ingress[0]["from"]
            .as_array()
            .expect("grpc peers")
            .is_empty()
    );
    assert_eq!(ingress[1]["ports"][0]["port"], "admin");
    assert!(
        !ingress[1]["from"]
            .as_array()
            .expect("admin peers")
            .is_empty()
    );
}

// === the filter ===

enum Proxy {
    None,
    /// The standalone bootstrap (YAML text).
    Standalone(String),
    Istio,
    EnvoyGateway,
}

fn check_plugin(where_: &str, config: &Value, json_text: &str) -> FilterConfig {
    assert_eq!(config["allow_on_headers_stop_iteration"], true, "{where_}");
    assert_eq!(config["failure_policy"], "FAIL_OPEN", "{where_}");
    assert_eq!(config["root_id"], "kvsteer", "{where_}");
    let parsed = FilterConfig::from_json(json_text.as_bytes())
        .unwrap_or_else(|e| panic!("{where_}: plugin configuration rejected: {e}"));
    assert_eq!(parsed.destination_header, DESTINATION_HEADER, "{where_}");
    // The chart's default: a client's tenant header is never trusted.
    assert!(
        !parsed.trust_tenant_header,
        "{where_}: tenant header trusted"
    );
    parsed
}

fn wasm_filters(v: &Value) -> Vec<&Value> {
    let mut found = Vec::new();
    walk(v, &|o| o["@type"] == WASM_TYPE, &mut found);
    found
}

fn filter_configs(r: &Rendered) -> Proxy {
    if let Some(cm) = r
        .all("ConfigMap")
        .into_iter()
        .find(|d| d.pointer("/data/envoy.yaml").is_some())
    {
        let text = str_at(cm, "/data/envoy.yaml").to_owned();
        let envoy = documents(r.case, &text).remove(0);
        let filters = wasm_filters(&envoy);
        assert_eq!(filters.len(), 1, "{}", r.case);
        let config = &filters[0]["config"];
        let parsed = check_plugin(r.case, config, str_at(config, "/configuration/value"));
        let clusters = envoy["static_resources"]["clusters"]
            .as_array()
            .expect("clusters");
        assert!(
            clusters
                .iter()
                .any(|c| c["name"] == parsed.indexer_cluster.as_str())
        );
        return Proxy::Standalone(text);
    }
    if !r.all("EnvoyFilter").is_empty() {
        let ef = r.one("EnvoyFilter", "-filter");
        let filters = wasm_filters(ef);
        assert_eq!(filters.len(), 1, "{}", r.case);
        let config = &filters[0]["config"];
        let parsed = check_plugin(r.case, config, str_at(config, "/configuration/value"));
        let indexer = r.one("Service", "-indexer");
        let indexer_host = format!(
            "{}.{NAMESPACE}.svc.cluster.local",
            str_at(indexer, "/metadata/name")
        );
        assert_eq!(
            parsed.indexer_cluster,
            format!("outbound|9090||{indexer_host}")
        );
        // Istio's cluster name is no valid :authority: the filter names the
        // Service instead (or the indexer refuses every call).
        assert_eq!(
            parsed.indexer_authority.as_deref(),
            Some(format!("{indexer_host}:9090").as_str()),
            "{}",
            r.case
        );
        return Proxy::Istio;
    }
    if !r.all("EnvoyExtensionPolicy").is_empty() {
        let eep = r.one("EnvoyExtensionPolicy", "-filter");
        let wasm = &eep["spec"]["wasm"][0];
        // Envoy Gateway passes `config` to the plugin as its JSON text.
        let text = serde_json::to_string(&wasm["config"]).unwrap();
        let config = json!({"allow_on_headers_stop_iteration": true, "failure_policy": "FAIL_OPEN", "root_id": wasm["rootID"]});
        assert_eq!(wasm["failOpen"], true);
        check_plugin(r.case, &config, &text);
        return Proxy::EnvoyGateway;
    }
    Proxy::None
}

// === Envoy ===

fn validate(envoy: &Path, name: &str, config: &str) {
    let wasm = wasm().display().to_string();
    let mut text = config.to_owned();
    for p in [
        "/etc/kvsteer/wasm/kvsteer_filter.wasm",
        "/etc/kvsteer/wasm/plugin.wasm",
        WASM_IN_SIDECAR,
    ] {
        text = text.replace(p, &wasm);
    }
    assert!(text.contains(&wasm), "{name}: no wasm file to load");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("envoy.yaml");
    std::fs::write(&file, text).expect("write");
    let output = Command::new(envoy)
        .args(["--mode", "validate", "--log-level", "warn", "-c"])
        .arg(&file)
        .output()
        .expect("envoy runs");
    let log = String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{name} does not validate:\n{log}");
    // Envoy Gateway's translator sets the wasm PluginConfig's deprecated
    // `fail_open` (internal/xds/translator/wasm.go); nothing else may be.
    let eg_fail_open = "'envoy.extensions.wasm.v3.PluginConfig.fail_open'";
    let deprecated: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Deprecated field"))
        .filter(|l| !(name.contains("Envoy Gateway") && l.contains(eg_fail_open)))
        .collect();
    assert!(
        deprecated.is_empty(),
        "{name} uses deprecated fields:\n{log}"
    );
}

/// The worker cluster: override_host on the filter's header, an active
/// /health check, outlier detection.
fn check_worker_cluster(where_: &str, cluster: &Value) {
    let mut lb = Vec::new();
    walk(cluster, &|o| o["name"] == OVERRIDE_HOST, &mut lb);
    assert_eq!(lb.len(), 1, "{where_}: override_host");
    assert_eq!(
        lb[0]["typed_config"]["override_host_sources"][0]["header"],
        DESTINATION_HEADER
    );
    assert_eq!(
        cluster["health_checks"][0]["http_health_check"]["path"], "/health",
        "{where_}"
    );
    assert!(
        cluster["outlier_detection"]["consecutive_5xx"].is_u64(),
        "{where_}"
    );
    assert!(
        cluster["per_connection_buffer_limit_bytes"].as_u64() >= Some(16 << 20),
        "{where_}"
    );
}

/// Which route of `routes` (Envoy RouteConfiguration order) a path takes:
/// `Some(cluster)` or `None` for a direct response.
fn route_for<'a>(routes: &'a [Value], path: &str) -> Option<&'a str> {
    let route = routes
        .iter()
        .find(|r| {
            let m = &r["match"];
            m["path"].as_str() == Some(path)
                || m["prefix"].as_str().is_some_and(|p| path.starts_with(p))
        })
        .unwrap_or_else(|| panic!("no route for {path}"));
    if route["direct_response"]["status"] == 404 {
        return None;
    }
    route["route"]["cluster"].as_str()
}

fn standalone_routes_close_admin_paths(r: &Rendered, text: &str) {
    let envoy = documents(r.case, text).remove(0);
    let listener = &envoy["static_resources"]["listeners"][0];
    let hcm = &listener["filter_chains"][0]["filters"][0]["typed_config"];
    let routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
        .as_array()
        .expect("routes");
    let opened: Vec<&str> = if r.case.contains("admin paths opened") {
        vec!["/tokenize", "/metrics"]
    } else {
        vec![]
    };
    for path in [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/models",
    ] {
        assert_eq!(
            route_for(routes, path),
            Some("vllm_workers"),
            "{}: {path}",
            r.case
        );
    }
    for path in VLLM_ADMIN_PATHS {
        let expect = opened.contains(path).then_some("vllm_workers");
        assert_eq!(route_for(routes, path), expect, "{}: {path}", r.case);
    }
    let clusters = envoy["static_resources"]["clusters"]
        .as_array()
        .expect("clusters");
    let workers = clusters
        .iter()
        .find(|c| c["name"] == "vllm_workers")
        .expect("vllm_workers");
    check_worker_cluster(r.case, workers);
    // STRICT_DNS on the headless workers' Service: hosts are pod IPs.
    assert_eq!(workers["type"], "STRICT_DNS");
    let svc = r.one("Service", "-workers");
    assert_eq!(svc["spec"]["clusterIP"], "None", "{}: headless", r.case);
    let host = str_at(
        workers,
        "/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address/address",
    );
    assert_eq!(
        host,
        format!(
            "{}.{NAMESPACE}.svc.cluster.local",
            str_at(svc, "/metadata/name")
        )
    );
    assert!(listener["per_connection_buffer_limit_bytes"].as_u64() >= Some(16 << 20));

    // The Deployment mounts the wasm where the bootstrap loads it, drains on
    // SIGTERM and gives generations time.
    let dep = r.one("Deployment", "-envoy");
    let pod = &dep["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let filename = str_at(
        &wasm_filters(&envoy)[0]["config"],
        "/vm_config/code/local/filename",
    );
    let mounted = c["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| Path::new(filename).parent() == Some(Path::new(str_at(m, "/mountPath"))));
    let volume =
        mounted.unwrap_or_else(|| panic!("{}: {filename} not mounted", r.case))["name"].clone();
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == volume)
        .expect("volume");
    if filename.ends_with("plugin.wasm") {
        assert!(
            volume["image"]["reference"].is_string(),
            "{}: image volume",
            r.case
        );
    } else {
        let cm = str_at(volume, "/configMap/name");
        let wasm_cm = r
            .all("ConfigMap")
            .into_iter()
            .find(|d| d["metadata"]["name"] == cm)
            .expect("wasm ConfigMap");
        let b64 = str_at(wasm_cm, "/binaryData/kvsteer_filter.wasm");
        assert_eq!(
            b64,
            base64(&std::fs::read(wasm()).unwrap()),
            "{}: the wasm round-trips",
            r.case
        );
    }
    let pre_stop = str_at(c, "/lifecycle/preStop/exec/command/2");
    assert!(pre_stop.contains("/drain_listeners?graceful"), "{}", r.case);
    assert!(pre_stop.contains("downstream_rq_active"), "{}", r.case);
    assert!(
        pod["terminationGracePeriodSeconds"].as_u64() >= Some(300),
        "{}",
        r.case
    );
}

fn istio_sidecar_validates(envoy: &Path, r: &Rendered) {
    let filter = r.one("EnvoyFilter", "-filter");
    let lb = r.one("EnvoyFilter", "-workers-lb");
    let svc = r.one("Service", "-workers");
    assert_ne!(
        svc["spec"]["clusterIP"], "None",
        "{}: Istio needs a ClusterIP Service",
        r.case
    );
    let workers_host = format!(
        "{}.{NAMESPACE}.svc.cluster.local",
        str_at(svc, "/metadata/name")
    );
    let workers_cluster = format!("outbound|8000||{workers_host}");
    let patches = |ef: &Value, kind: &str| -> Vec<Value> {
        ef["spec"]["configPatches"]
            .as_array()
            .expect("patches")
            .iter()
            .filter(|p| p["applyTo"] == kind)
            .cloned()
            .collect()
    };
    let mut http_filters: Vec<Value> = patches(filter, "HTTP_FILTER")
        .iter()
        .map(|p| {
            assert_eq!(p["patch"]["operation"], "INSERT_BEFORE");
            assert_eq!(p["match"]["listener"]["portNumber"], 8000);
            p["patch"]["value"].clone()
        })
        .collect();
    assert_eq!(http_filters.len(), 2, "{}: strip + kvsteer", r.case);
    http_filters.push(json!({"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}));
    let mut listener = json!({
        "name": "0.0.0.0_8000",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8000}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "outbound_0.0.0.0_8000",
                "route_config": {"name": "8000", "virtual_hosts": [{
                    "name": format!("{workers_host}:8000"), "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": workers_cluster, "timeout": "0s"}}]
                }]},
                "http_filters": http_filters
            }
        }]}]
    });
    for p in patches(filter, "LISTENER") {
        merge(&mut listener, &p["patch"]["value"]);
    }
    // Istio's EDS cluster for a Service, as far as these settings go.
    let mut workers = json!({
        "name": workers_cluster, "type": "STATIC", "connect_timeout": "10s",
        "lb_policy": "LEAST_REQUEST", "common_lb_config": {"healthy_panic_threshold": {}},
        "load_assignment": {"cluster_name": workers_cluster, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "10.0.0.10", "port_value": 8000}}}}
        ]}]}
    });
    let cluster_patches = patches(lb, "CLUSTER");
    assert_eq!(cluster_patches.len(), 1);
    assert_eq!(
        cluster_patches[0]["match"]["cluster"]["service"],
        workers_host.as_str()
    );
    merge(&mut workers, &cluster_patches[0]["patch"]["value"]);
    check_worker_cluster(r.case, &workers);

    // The VirtualService routes the allowed paths and answers the rest 404.
    let vs = r.one("VirtualService", "-workers");
    let http = vs["spec"]["http"].as_array().expect("http routes");
    let exact: Vec<&str> = http[0]["match"]
        .as_array()
        .expect("match")
        .iter()
        .map(|m| str_at(m, "/uri/exact"))
        .collect();
    for p in VLLM_ADMIN_PATHS {
        assert!(!exact.contains(p), "{}: {p} routed", r.case);
    }
    assert!(exact.contains(&"/v1/chat/completions"));
    assert_eq!(http.last().unwrap()["directResponse"]["status"], 404);

    // The indexer: a virtual-IP Service (Istio's EDS cluster lists every
    // replica; a headless one gets ORIGINAL_DST, useless for the filter's own
    // calls), its cluster patched so reports reach the picking replica.
    let indexer_svc = r.one("Service", "-indexer");
    assert!(
        indexer_svc["spec"].get("clusterIP").is_none(),
        "{}: the indexer Service must not be headless under Istio",
        r.case
    );
    let indexer_name = str_at(indexer_svc, "/metadata/name");
    let indexer_host = format!("{indexer_name}.{NAMESPACE}.svc.cluster.local");
    let indexer_cluster = format!("outbound|9090||{indexer_host}");
    let mut indexer = json!({
        "name": indexer_cluster, "type": "STATIC", "connect_timeout": "10s",
        "lb_policy": "LEAST_REQUEST", "common_lb_config": {"healthy_panic_threshold": {}},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}
        }},
        "load_assignment": {"cluster_name": indexer_cluster, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "10.0.0.20", "port_value": 9090}}}}
        ]}]}
    });
    let indexer_lb = r.one("EnvoyFilter", "-indexer-lb");
    let indexer_patches = patches(indexer_lb, "CLUSTER");
    assert_eq!(indexer_patches.len(), 1, "{}", r.case);
    let p = &indexer_patches[0];
    assert_eq!(p["match"]["context"], "SIDECAR_OUTBOUND");
    assert_eq!(p["match"]["cluster"]["service"], indexer_host.as_str());
    assert_eq!(p["match"]["cluster"]["portNumber"], 9090);
    assert_eq!(p["patch"]["operation"], "MERGE");
    assert_eq!(
        indexer_lb["spec"]["workloadSelector"], filter["spec"]["workloadSelector"],
        "{}: the same sidecars",
        r.case
    );
    merge(&mut indexer, &p["patch"]["value"]);
    let mut lb = Vec::new();
    walk(&indexer, &|o| o["name"] == OVERRIDE_HOST, &mut lb);
    assert_eq!(lb.len(), 1, "{}: indexer override_host", r.case);
    assert_eq!(
        lb[0]["typed_config"]["override_host_sources"][0]["header"],
        "x-kvsteer-replica"
    );
    let bootstrap =
        json!({"static_resources": {"listeners": [listener], "clusters": [workers, indexer]}});
    validate(
        envoy,
        &format!("{}: Istio sidecar with the EnvoyFilters", r.case),
        &bootstrap.to_string(),
    );
}

/// The pointers a JSONPath of the one form the chart uses selects:
/// `$..KEY[?(@.name=='NAME')].REST` (recursive descent to a list, filter
/// on `name`, then a dotted path).
fn json_path(doc: &Value, path: &str) -> Vec<String> {
    let rest = path.strip_prefix("$..").expect("$.. path");
    let (key, rest) = rest.split_once("[?(@.name=='").expect("filter");
    let (name, rest) = rest.split_once("')]").expect("filter end");
    let tail: Vec<&str> = rest
        .trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .collect();
    let mut out = Vec::new();
    fn descend(v: &Value, at: String, key: &str, name: &str, tail: &[&str], out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, c) in m {
                    if k == key
                        && let Some(list) = c.as_array()
                    {
                        for (i, item) in list.iter().enumerate() {
                            if item["name"] == name {
                                let mut p = format!("{at}/{k}/{i}");
                                for t in tail {
                                    p.push('/');
                                    p.push_str(t);
                                }
                                out.push(p);
                            }
                        }
                    }
                    descend(c, format!("{at}/{k}"), key, name, tail, out);
                }
            }
            Value::Array(list) => {
                for (i, c) in list.iter().enumerate() {
                    descend(c, format!("{at}/{i}"), key, name, tail, out);
                }
            }
            _ => {}
        }
    }
    descend(doc, String::new(), key, name, &tail, &mut out);
    out
}

/// JSON Patch `add` (RFC 6902) at a pointer whose parent exists.
fn json_patch_add(doc: &mut Value, pointer: &str, value: Value) {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer");
    let slot = doc
        .pointer_mut(parent)
        .unwrap_or_else(|| panic!("no {parent}"));
    slot.as_object_mut()
        .expect("object")
        .insert(key.to_owned(), value);
}

/// A gateway listener and clusters shaped as Envoy Gateway (1.5+) emits
/// them for the chart's HTTPRoute, EnvoyExtensionPolicy and
/// BackendTrafficPolicy (internal/xds/translator: the Wasm filter disabled
/// on the HCM and enabled per route, override_host from endpointOverride),
/// then the EnvoyPatchPolicy applied with JSON Patch semantics.
fn envoy_gateway_validates(envoy: &Path, r: &Rendered) {
    let eep = r.one("EnvoyExtensionPolicy", "-filter");
    let btp = r.one("BackendTrafficPolicy", "-workers");
    let epp = r.one("EnvoyPatchPolicy", "");
    let route = r.all("HTTPRoute");
    assert_eq!(route.len(), 1, "{}", r.case);
    let route = route[0];
    let ns = str_at(eep, "/metadata/namespace");
    for policy in [eep, btp] {
        assert_eq!(policy["spec"]["targetRefs"][0]["kind"], "HTTPRoute");
        assert_eq!(
            policy["spec"]["targetRefs"][0]["name"],
            route["metadata"]["name"]
        );
        assert_eq!(
            policy["metadata"]["namespace"],
            route["metadata"]["namespace"]
        );
    }
    // The EnvoyPatchPolicy must sit beside the Gateway it targets.
    let parent = &route["spec"]["parentRefs"][0];
    assert_eq!(epp["spec"]["targetRef"]["name"], parent["name"]);
    assert_eq!(epp["metadata"]["namespace"], parent["namespace"]);
    let listener_name = format!(
        "{}/{}/{}",
        str_at(parent, "/namespace"),
        str_at(parent, "/name"),
        str_at(parent, "/sectionName")
    );

    let wasm = &eep["spec"]["wasm"][0];
    let filter_name = format!(
        "envoy.filters.http.wasm/envoyextensionpolicy/{ns}/{}/wasm/0",
        str_at(eep, "/metadata/name")
    );
    let route_cluster = format!("httproute/{ns}/{}/rule/0", str_at(route, "/metadata/name"));
    let routes: Vec<Value> = route["spec"]["rules"][0]["matches"]
        .as_array()
        .expect("matches")
        .iter()
        .map(|m| {
            assert_eq!(m["path"]["type"], "Exact");
            json!({
                "match": {"path": m["path"]["value"]},
                "route": {"cluster": route_cluster, "timeout": "0s"},
                "typed_per_filter_config": {filter_name.clone(): {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}}
            })
        })
        .collect();
    let paths: Vec<&str> = routes.iter().map(|r| str_at(r, "/match/path")).collect();
    for p in VLLM_ADMIN_PATHS {
        assert!(!paths.contains(p), "{}: {p} routed", r.case);
    }
    let mut listener = json!({
        "name": listener_name,
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 10080}},
        "per_connection_buffer_limit_bytes": 32768,
        "default_filter_chain": {"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "http-10080",
                "rds": null,
                "route_config": {"name": listener_name, "virtual_hosts": [{"name": "vllm", "domains": ["*"], "routes": routes}]},
                "http_filters": [
                    {"name": filter_name, "disabled": true, "typed_config": {
                        "@type": WASM_TYPE,
                        "config": {
                            "name": wasm["name"], "root_id": wasm["rootID"], "fail_open": true,
                            "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                "value": serde_json::to_string(&wasm["config"]).unwrap()},
                            "vm_config": {"vm_id": format!("envoyextensionpolicy/{ns}/{}/wasm/0", str_at(eep, "/metadata/name")),
                                "runtime": "envoy.wasm.runtime.v8",
                                "code": {"local": {"filename": "/etc/kvsteer/wasm/plugin.wasm"}}}
                        }
                    }},
                    {"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
                ]
            }
        }]}
    });
    listener["default_filter_chain"]["filters"][0]["typed_config"]
        .as_object_mut()
        .unwrap()
        .remove("rds");

    // The route's cluster from the BackendTrafficPolicy.
    let spec = &btp["spec"];
    let header = str_at(spec, "/loadBalancer/endpointOverride/extractFrom/0/header");
    assert_eq!(spec["loadBalancer"]["type"], "RoundRobin");
    let active = &spec["healthCheck"]["active"];
    let passive = &spec["healthCheck"]["passive"];
    let workers = json!({
        "name": route_cluster, "type": "STATIC", "connect_timeout": "10s",
        "per_connection_buffer_limit_bytes": spec["connection"]["bufferLimit"],
        "load_balancing_policy": {"policies": [{"typed_extension_config": {
            "name": OVERRIDE_HOST,
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                "override_host_sources": [{"header": header}],
                "fallback_policy": {"policies": [{"typed_extension_config": {
                    "name": "envoy.load_balancing_policies.round_robin",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"}
                }}]}
            }
        }}]},
        "health_checks": [{
            "timeout": active["timeout"], "interval": active["interval"],
            "unhealthy_threshold": active["unhealthyThreshold"], "healthy_threshold": active["healthyThreshold"],
            "http_health_check": {"path": active["http"]["path"]}
        }],
        "outlier_detection": {
            "consecutive_5xx": passive["consecutive5XxErrors"],
            "consecutive_gateway_failure": passive["consecutiveGatewayErrors"],
            "interval": passive["interval"], "base_ejection_time": passive["baseEjectionTime"],
            "max_ejection_percent": passive["maxEjectionPercent"]
        },
        "load_assignment": {"cluster_name": route_cluster, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "10.0.0.10", "port_value": 8000}}}}
        ]}]}
    });
    check_worker_cluster(r.case, &workers);

    // The EnvoyPatchPolicy.
    let mut clusters = vec![workers];
    let mut stop_iteration_set = false;
    for p in epp["spec"]["jsonPatches"].as_array().expect("jsonPatches") {
        let op = &p["operation"];
        assert_eq!(op["op"], "add", "{}", r.case);
        match p["type"].as_str() {
            Some("type.googleapis.com/envoy.config.listener.v3.Listener") => {
                assert_eq!(
                    p["name"],
                    listener_name.as_str(),
                    "{}: listener name",
                    r.case
                );
                let pointers = match op["jsonPath"].as_str() {
                    Some(jp) => json_path(&listener, jp)
                        .into_iter()
                        .map(|ptr| format!("{ptr}{}", str_at(op, "/path")))
                        .collect(),
                    None => vec![str_at(op, "/path").to_owned()],
                };
                assert_eq!(pointers.len(), 1, "{}: {p} selects {pointers:?}", r.case);
                json_patch_add(&mut listener, &pointers[0], op["value"].clone());
                stop_iteration_set |= pointers[0].ends_with("/allow_on_headers_stop_iteration");
            }
            Some("type.googleapis.com/envoy.config.cluster.v3.Cluster") => {
                assert_eq!(op["path"], "", "{}: a whole cluster", r.case);
                assert_eq!(op["value"]["name"], p["name"]);
                clusters.push(op["value"].clone());
            }
            other => panic!("{}: unexpected patch type {other:?}", r.case),
        }
    }
    assert!(
        stop_iteration_set,
        "{}: allow_on_headers_stop_iteration not patched",
        r.case
    );
    let patched = &wasm_filters(&listener)[0]["config"];
    let filter = check_plugin(
        r.case,
        &json!({"allow_on_headers_stop_iteration": patched["allow_on_headers_stop_iteration"], "failure_policy": "FAIL_OPEN", "root_id": patched["root_id"]}),
        str_at(patched, "/configuration/value"),
    );
    let indexer = clusters
        .iter()
        .find(|c| c["name"] == filter.indexer_cluster.as_str())
        .unwrap_or_else(|| panic!("{}: no cluster {}", r.case, filter.indexer_cluster));
    assert!(indexer.pointer("/typed_extension_protocol_options/envoy.extensions.upstreams.http.v3.HttpProtocolOptions/explicit_http_config/http2_protocol_options").is_some());
    assert!(
        listener["per_connection_buffer_limit_bytes"].as_u64() >= Some(16 << 20),
        "{}",
        r.case
    );

    let bootstrap = json!({"static_resources": {"listeners": [listener], "clusters": clusters}});
    validate(
        envoy,
        &format!("{}: Envoy Gateway listener with the policies", r.case),
        &bootstrap.to_string(),
    );
}

#[test]
fn bad_values_are_refused_with_a_reason() {
    let Some(helm) = helm() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let b64 = dir.path().join("w.b64");
    std::fs::write(&b64, "AGFzbQEAAAA=").unwrap();
    let refused: BTreeMap<&str, (&[&str], &str)> = BTreeMap::from([
        (
            "two replicas, memory index",
            (&["indexer.replicas=2"][..], "index.backend: redis"),
        ),
        (
            "redis without url",
            (&["index.backend=redis"][..], "index.redis.url"),
        ),
        ("an unknown key", (&["indexer.colour=red"][..], "colour")),
        (
            "envoy gateway with a ConfigMap wasm",
            (
                &[
                    "gateway=envoyGateway",
                    "networkPolicy.gatewayPeers[0].podSelector.matchLabels.a=b",
                ][..],
                "wasm.source: image",
            ),
        ),
        (
            "no discovery, no workers",
            (&["discovery.enabled=false"][..], "no worker"),
        ),
        (
            "a debug token without its Secret",
            (
                &["indexer.debug=token"][..],
                "indexer.debugTokenSecret.name",
            ),
        ),
        (
            "a salted tenant without its salt Secret",
            (
                &["tenants.overrides.team-a.isolation=salted"][..],
                "indexer.saltSecret.name",
            ),
        ),
        (
            "an unknown debug mode",
            (&["indexer.debug=open"][..], "debug"),
        ),
        (
            "buffer below the body limit",
            (&["upstream.bufferLimitBytes=1024"][..], "bufferLimitBytes"),
        ),
    ]);
    for (what, (set, reason)) in refused {
        let mut cmd = Command::new(&helm);
        cmd.args(["template", RELEASE])
            .arg(chart())
            .arg("--set-file")
            .arg(format!("wasm.configMap.base64={}", b64.display()));
        for s in set {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().expect("helm runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: accepted");
        assert!(err.contains(reason), "{what}: {err}");
    }
}
