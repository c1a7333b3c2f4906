//! Kubernetes discovery end to end: the indexer watches pods on a fake API
//! server (the real list/watch protocol: `common::fake_kube`) while real
//! `kvsteer-sim` engines serve as the pods, each on its own loopback
//! address (127.0.0.2, 127.0.0.3) and the same ports, so pod IPs are real
//! addresses. Pods are added, turn unready and ready, are deleted and
//! re-created with a new uid; the API server compacts its history (410 on
//! resume) and restarts; a pod declares a port the pool does not know.

mod common;

use common::{
    Admin, MODEL, Sim, eventually,
    fake_kube::{FakeKube, pod},
    shared,
};
use kvsteer_indexer::{app, config::Config, workers::pod_worker_id};
use serde_json::{Value, json};
use std::{net::SocketAddr, time::Instant};

const NS: &str = "kvsteer";

/// A port free on every one of `ips`.
fn port_free_on(ips: &[&str]) -> u16 {
    loop {
        let first = std::net::TcpListener::bind((ips[0], 0)).unwrap();
        let port = first.local_addr().unwrap().port();
        let others: Result<Vec<_>, _> = ips[1..]
            .iter()
            .map(|ip| std::net::TcpListener::bind((*ip, port)))
            .collect();
        if others.is_ok() {
            return port;
        }
    }
}

fn chat(text: &str) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 1,
    })
}

async fn workers(admin: &Admin) -> Value {
    admin.call_json("GET", "/debug/workers", None).await.1
}

fn named<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == name)
}

fn names(list: &Value) -> Vec<String> {
    let mut v: Vec<String> = list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap().to_owned())
        .collect();
    v.sort();
    v
}

async fn metric(admin: &Admin, line_start: &str) -> Option<f64> {
    let (_, text) = admin.call("GET", "/metrics", None).await;
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_come_and_go_and_the_api_server_may_vanish() {
    let ips = ["127.0.0.2", "127.0.0.3"];
    let ports = (port_free_on(&ips), port_free_on(&ips), port_free_on(&ips));
    let mut sims = Vec::new();
    for ip in ips {
        let listen: SocketAddr = format!("{ip}:{}", ports.0).parse().unwrap();
        let handle = Sim::try_start(
            listen,
            &format!("tcp://{ip}:{}", ports.1),
            &format!("tcp://{ip}:{}", ports.2),
        )
        .await
        .expect("sim");
        sims.push(handle);
    }

    let kube = FakeKube::start(NS).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    // A pod of another app in the namespace: never a worker.
    let mut other = pod("sglang-0", "uid-other", "127.0.0.9", true, ports);
    other["metadata"]["labels"] = json!({"app": "sglang"});
    kube.put(other);

    let cfg = Config::from_yaml(&format!(
        "grpc_listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
models:
  - name: {MODEL}
    tokenizer: {tok}
discovery:
  kubernetes:
    kubeconfig: {kc}
    namespace: {NS}
    watch_timeout_s: 1
    pools:
      - model: {MODEL}
        selector: app=vllm
        ports: {{http: http, kv_events: kv-events, replay: kv-replay}}
streams:
  backoff_initial_ms: 20
  backoff_max_ms: 200
scrape:
  interval_ms: 100
",
        tok = shared().join("tokenizers/qwen3").display(),
        kc = kubeconfig.display(),
    ))
    .expect("config");
    let running = app::start(cfg).await.expect("start");
    let admin = Admin::new(format!("http://{}", running.admin_addr));

    // Listed and synced: no worker yet (the other app's pod is not one).
    eventually("first list", || async {
        let w = workers(&admin).await;
        (w["discovery"]["synced"] == true).then_some(())
    })
    .await;
    assert!(names(&workers(&admin).await).is_empty());

    // Pod a (ready) joins at its IP; pod b joins only once Ready.
    kube.put(pod("vllm-a", "uid-a1", ips[0], true, ports));
    kube.put(pod("vllm-b", "uid-b1", ips[1], false, ports));
    let a = eventually("vllm-a live", || async {
        let w = workers(&admin).await;
        named(&w, "vllm-a")
            .filter(|a| a["stream"]["state"] == "live")
            .cloned()
    })
    .await;
    assert_eq!(a["endpoint"], format!("{}:{}", ips[0], ports.0));
    assert_eq!(a["source"]["kind"], "kubernetes");
    assert_eq!(a["source"]["uid"], "uid-a1");
    assert!(
        named(&workers(&admin).await, "vllm-b").is_none(),
        "b is not Ready"
    );
    kube.put(pod("vllm-b", "uid-b1", ips[1], true, ports));
    eventually("vllm-b live", || async {
        let w = workers(&admin).await;
        named(&w, "vllm-b")
            .filter(|b| b["stream"]["state"] == "live")
            .map(|_| ())
    })
    .await;

    // A conversation on a: its blocks are indexed, and a pick of the same
    // prompt goes there.
    let client = Admin::new(format!("http://{}:{}", ips[0], ports.0));
    let body = chat(&"Discovery keeps the index in step with the pods. ".repeat(40));
    let (status, reply) = client
        .call_json("POST", "/v1/chat/completions", Some(&body))
        .await;
    assert_eq!(status, 200, "{reply}");
    let id_a1 = pod_worker_id("uid-a1");
    eventually("a's blocks indexed", || async {
        (running.index.worker_blocks(id_a1) > 0).then_some(())
    })
    .await;
    let (_, score) = admin.call_json("POST", "/debug/score", Some(&body)).await;
    assert_eq!(score["chosen"], "vllm-a", "{score}");

    // a turns unready: it leaves and its blocks are purged.
    let t = Instant::now();
    kube.put(pod("vllm-a", "uid-a1", ips[0], false, ports));
    eventually("a gone and purged", || async {
        let w = workers(&admin).await;
        (named(&w, "vllm-a").is_none() && running.index.worker_blocks(id_a1) == 0).then_some(())
    })
    .await;
    eprintln!("unready pod left and was purged within {:?}", t.elapsed());
    let (_, score) = admin.call_json("POST", "/debug/score", Some(&body)).await;
    assert_eq!(score["chosen"], "vllm-b", "{score}");

    // Ready again: it comes back empty and replays the engine's events.
    kube.put(pod("vllm-a", "uid-a1", ips[0], true, ports));
    eventually("a back with its blocks replayed", || async {
        let w = workers(&admin).await;
        let a = named(&w, "vllm-a")?;
        (a["indexed_blocks"].as_u64() > Some(0)).then_some(())
    })
    .await;

    // b is deleted and re-created under the same name with a new uid: a
    // new worker (new id); nothing is left of the old one.
    let id_b1 = pod_worker_id("uid-b1");
    kube.delete("vllm-b");
    kube.put(pod("vllm-b", "uid-b2", ips[1], true, ports));
    eventually("b re-created", || async {
        let w = workers(&admin).await;
        named(&w, "vllm-b")
            .filter(|b| b["source"]["uid"] == "uid-b2" && b["stream"]["state"] == "live")
            .map(|_| ())
    })
    .await;
    assert_eq!(running.index.worker_blocks(id_b1), 0);

    // A pod declaring no `kv-events` port: a clear metric, not a worker.
    let mut bad = pod("vllm-c", "uid-c1", "127.0.0.4", true, ports);
    bad["spec"]["containers"][0]["ports"][1]["name"] = json!("events");
    kube.put(bad);
    eventually("invalid pod counted", || async {
        metric(
            &admin,
            &format!(
                "kvsteer_discovery_pods_invalid_total{{pool=\"{MODEL}\",reason=\"missing_port\"}}"
            ),
        )
        .await
        .filter(|n| *n >= 1.0)
    })
    .await;
    assert_eq!(names(&workers(&admin).await), ["vllm-a", "vllm-b"]);

    // The API server compacts its history: watches resumed from an older
    // resourceVersion get 410 Gone, and the watcher lists again.
    let lists = |k: &FakeKube| {
        k.requests()
            .iter()
            .filter(|r| !r.contains("watch=true"))
            .count()
    };
    let before = lists(&kube);
    kube.compact();
    eventually("a new list after 410", || async {
        (lists(&kube) > before).then_some(())
    })
    .await;
    assert_eq!(names(&workers(&admin).await), ["vllm-a", "vllm-b"]);

    // The API server goes away: the workers stay, marked stale.
    kube.stop().await;
    eventually("stale", || async {
        let w = workers(&admin).await;
        (w["discovery"]["stale"] == true).then_some(())
    })
    .await;
    assert_eq!(names(&workers(&admin).await), ["vllm-a", "vllm-b"]);
    assert_eq!(metric(&admin, "kvsteer_discovery_stale ").await, Some(1.0));
    // While it is away, b is deleted; once it is back the list says so.
    kube.delete("vllm-b");
    kube.restart().await;
    eventually("fresh again, b gone", || async {
        let w = workers(&admin).await;
        (w["discovery"]["stale"] == false && names(&w) == ["vllm-a"]).then_some(())
    })
    .await;
    assert_eq!(metric(&admin, "kvsteer_discovery_stale ").await, Some(0.0));
    assert_eq!(running.index.worker_blocks(pod_worker_id("uid-b2")), 0);

    // Only namespaced calls, by label selector; no cluster-wide list.
    let requests = kube.requests();
    assert!(requests.len() > 4);
    for r in &requests {
        assert!(
            r.starts_with(&format!("/api/v1/namespaces/{NS}/pods?"))
                && r.contains("labelSelector=app%3Dvllm"),
            "{r}"
        );
    }
    assert!(
        requests
            .iter()
            .any(|r| r.contains("allowWatchBookmarks=true"))
    );

    running.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
    kube.stop().await;
}
