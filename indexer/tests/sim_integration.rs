//! The service end to end over loopback: KV events from ZeroMQ publishers
//! (hand-made `BlockStored` events carrying the engine's blocks of a
//! tokenized conversation), picks over gRPC and `/debug/score`, publisher
//! restarts and lost batches.

mod common;

use common::{Admin, BLOCK, MODEL, eventually, free_port, shared, stored};
use kvsteer_indexer::{app, config::Config};
use kvsteer_kv_events::{
    EventBatch, KvEvent,
    zmq::{Publisher, PublisherConfig},
};
use kvsteer_proto::v1 as pb;
use kvsteer_tokenize::{ChatRequest, PromptTokenizer};
use serde_json::{Value, json};

async fn publisher(pub_ep: &str, replay_ep: &str, topic: &str) -> Publisher {
    Publisher::bind(PublisherConfig {
        pub_endpoint: pub_ep.into(),
        replay_endpoint: Some(replay_ep.into()),
        topic: topic.into(),
        ..Default::default()
    })
    .await
    .expect("bind publisher")
}

/// The filter's reports for a request that streamed and finished.
async fn first_token_and_done(
    client: &mut pb::router_client::RouterClient<tonic::transport::Channel>,
    request_id: &str,
) {
    for kind in [pb::ReportKind::FirstToken, pb::ReportKind::Done] {
        client
            .report(pb::ReportRequest {
                request_id: request_id.into(),
                kind: kind as i32,
                elapsed_ms: 120.0,
                ..Default::default()
            })
            .await
            .expect("report");
    }
}

fn turns() -> (Value, Value) {
    let text = std::fs::read_to_string(shared().join("chat-parity/c002_coding_session_t1.json"))
        .expect("c002");
    let turn1: Value = serde_json::from_str(&text).unwrap();
    let mut turn2 = turn1.clone();
    let msgs = turn2["messages"].as_array_mut().unwrap();
    msgs.push(json!({"role": "assistant", "content": "Here is a first version of the function."}));
    msgs.push(json!({"role": "user", "content": "Now add unit tests for the edge cases."}));
    (turn1, turn2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversation_reset_and_replay() {
    let tok = PromptTokenizer::from_dir(&shared().join("tokenizers/qwen3")).unwrap();
    let (turn1, turn2) = turns();
    let ids1 = tok
        .chat_token_ids(&ChatRequest::from_openai(&turn1).unwrap())
        .unwrap();
    let ids2 = tok
        .chat_token_ids(&ChatRequest::from_openai(&turn2).unwrap())
        .unwrap();
    assert!(ids2.starts_with(&ids1), "turn 1 is a prefix of turn 2");
    let cached = ids1.len() / BLOCK * BLOCK;
    assert!(cached >= 2 * BLOCK);

    // Two engines: their PUB and replay endpoints on free ports.
    let endpoints = ["127.0.0.1:18001", "127.0.0.1:18002"];
    let mut pubs = Vec::new();
    for ep in endpoints {
        let topic = format!("kv@{ep}@{MODEL}");
        pubs.push(publisher("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", &topic).await);
    }
    let eps: Vec<(String, String)> = pubs
        .iter()
        .map(|p| {
            let (a, b) = p.local_endpoints();
            (a, b.unwrap())
        })
        .collect();
    let cfg = Config::from_yaml(&format!(
        "grpc_listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
models:
  - name: {MODEL}
    tokenizer: {tok}
workers:
  - name: w1
    endpoint: {e1}
    model: {MODEL}
    kv_events: {k1}
    replay: {r1}
  - name: w2
    endpoint: {e2}
    model: {MODEL}
    kv_events: {k2}
    replay: {r2}
streams:
  backoff_initial_ms: 20
  backoff_max_ms: 200
",
        tok = shared().join("tokenizers/qwen3").display(),
        e1 = endpoints[0],
        e2 = endpoints[1],
        k1 = eps[0].0,
        r1 = eps[0].1,
        k2 = eps[1].0,
        r2 = eps[1].1,
    ))
    .expect("config");
    let running = app::start(cfg).await.expect("start");
    let admin = Admin::new(format!("http://{}", running.admin_addr));
    eventually("readyz", || async {
        (admin.call("GET", "/readyz", None).await.0 == 200).then_some(())
    })
    .await;

    // Turn 1 ran on w2: its engine announces the prompt's blocks.
    pubs[1].publish(&stored(&ids1, 1000)).await.unwrap();
    eventually("w2 indexed turn 1", || async {
        let w = admin.worker("w2").await;
        (w["indexed_blocks"] == json!(cached / BLOCK)).then_some(())
    })
    .await;

    // Turn 2 scores best on w2, with turn 1's blocks matched.
    let (status, score) = admin.call_json("POST", "/debug/score", Some(&turn2)).await;
    assert_eq!(status, 200, "{score}");
    assert_eq!(score["chosen"], "w2", "{score}");
    assert_eq!(score["degraded"], false);
    assert_eq!(score["prompt_tokens"], json!(ids2.len()));
    let by_name = |s: &Value, n: &str| {
        s["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(by_name(&score, "w2")["matched_tokens"], json!(cached));
    assert_eq!(by_name(&score, "w1")["matched_tokens"], json!(0));
    // A dry run changes nothing.
    assert_eq!(admin.worker("w2").await["in_flight"], json!(0));

    // The same over gRPC, then the filter's reports.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", running.grpc_addr))
        .unwrap()
        .connect()
        .await
        .expect("grpc connect");
    let mut client = pb::router_client::RouterClient::new(channel);
    let picked = client
        .pick(common::pick_request("r-1", &turn2))
        .await
        .expect("pick")
        .into_inner();
    assert_eq!(picked.endpoints[0], endpoints[1]);
    assert_eq!(picked.endpoints.len(), 2);
    let d = picked.decision.unwrap();
    assert_eq!((d.worker.as_str(), d.matched_tokens), ("w2", cached as u32));
    assert!(!d.degraded && d.predicted_ttft_ms > 0.0);
    assert_eq!(admin.worker("w2").await["in_flight"], json!(1));
    first_token_and_done(&mut client, "r-1").await;
    assert_eq!(admin.worker("w2").await["in_flight"], json!(0));
    // The pick is remembered as routed there (whole blocks of the prompt).
    let routed_tokens = |s: &Value, n: &str| by_name(s, n)["routed_tokens"].as_u64().unwrap();
    let (_, score) = admin.call_json("POST", "/debug/score", Some(&turn2)).await;
    let turn2_blocks = (ids2.len() / BLOCK * BLOCK) as u64;
    assert_eq!(routed_tokens(&score, "w2"), turn2_blocks, "{score}");
    assert_eq!(routed_tokens(&score, "w1"), 0, "{score}");
    let unknown = client
        .pick(pb::PickRequest {
            model: "nope".into(),
            api: pb::ApiKind::Chat as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(unknown.endpoints.is_empty());
    assert!(
        unknown
            .decision
            .unwrap()
            .reason
            .starts_with("unknown_model")
    );

    // A lost batch on w1 is replayed.
    let lost = stored(&ids1, 5000);
    pubs[0].publish_unsent(&lost).await;
    pubs[0].publish(&stored(&[7; BLOCK], 9000)).await.unwrap();
    eventually("w1 replayed", || async {
        let w = admin.worker("w1").await;
        (w["indexed_blocks"] == json!(cached / BLOCK + 1)).then_some(w)
    })
    .await;
    let w1 = admin.worker("w1").await;
    assert!(w1["stream"]["gaps"].as_u64().unwrap() >= 1, "{w1}");
    assert!(w1["stream"]["replayed"].as_u64().unwrap() >= 1, "{w1}");

    // w2's engine restarts (seq back to 0): its blocks are dropped.
    // Restarts are detected by the seq going back, so the old incarnation
    // must be ahead of what the new one sends before the SUB reconnects.
    for i in 0..3 {
        pubs[1]
            .publish(&stored(&[i; BLOCK], 2000 + u64::from(i)))
            .await
            .unwrap();
    }
    for _ in 0..50 {
        pubs[1].publish(&EventBatch::default()).await.unwrap();
    }
    let old = pubs.pop().unwrap();
    old.shutdown().await;
    let restarted = publisher(
        &eps[1].0,
        &eps[1].1,
        &format!("kv@{}@{MODEL}", endpoints[1]),
    )
    .await;
    // The new incarnation's first messages may go out before the SUB socket
    // reconnects: keep sending empty batches until the reset is seen.
    let empty = EventBatch::default();
    eventually("w2 reset", || async {
        restarted.publish(&empty).await.unwrap();
        let w = admin.worker("w2").await;
        (w["stream"]["resets"].as_u64() >= Some(1)).then_some(())
    })
    .await;
    restarted.publish(&stored(&[42; BLOCK], 1)).await.unwrap();
    eventually("w2 holds only the new block", || async {
        let w = admin.worker("w2").await;
        (w["indexed_blocks"] == json!(1)).then_some(())
    })
    .await;
    let (_, score) = admin.call_json("POST", "/debug/score", Some(&turn2)).await;
    assert_eq!(by_name(&score, "w2")["matched_tokens"], json!(0), "{score}");
    assert_eq!(score["chosen"], "w1", "{score}");
    // The restarted engine holds nothing of what was routed to it before.
    eventually("w2's routes forgotten", || async {
        let (_, score) = admin.call_json("POST", "/debug/score", Some(&turn2)).await;
        (routed_tokens(&score, "w2") == 0).then_some(())
    })
    .await;

    // w1's engine clears its cache (AllBlocksCleared, e.g. after
    // `reset_prefix_cache`): its blocks and the routes to it go.
    let picked = client
        .pick(common::pick_request("r-2", &turn2))
        .await
        .expect("pick")
        .into_inner();
    assert_eq!(picked.endpoints[0], endpoints[0]);
    let (_, score) = admin.call_json("POST", "/debug/score", Some(&turn2)).await;
    assert_eq!(routed_tokens(&score, "w1"), turn2_blocks, "{score}");
    pubs[0]
        .publish(&EventBatch {
            ts: 2.0,
            events: vec![KvEvent::AllBlocksCleared],
            data_parallel_rank: None,
        })
        .await
        .unwrap();
    eventually("w1 cleared", || async {
        let (_, score) = admin.call_json("POST", "/debug/score", Some(&turn2)).await;
        let w = admin.worker("w1").await;
        (w["indexed_blocks"] == json!(0) && routed_tokens(&score, "w1") == 0).then_some(())
    })
    .await;
    first_token_and_done(&mut client, "r-2").await;
    assert_eq!(admin.worker("w1").await["in_flight"], json!(0));

    let (_, _) = admin.call("GET", "/metrics", None).await;
    running.shutdown().await;
    restarted.shutdown().await;
    for p in pubs {
        p.shutdown().await;
    }
}

// === against the kvsteer-sim engine ===

async fn chat(admin: &Admin, engine: std::net::SocketAddr, body: &Value) -> Value {
    let sim = Admin {
        base: format!("http://{engine}"),
        client: admin.client.clone(),
    };
    let (status, v) = sim
        .call_json("POST", "/v1/chat/completions", Some(body))
        .await;
    assert_eq!(status, 200, "{v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_engines_conversation_and_restart() {
    let tok = PromptTokenizer::from_dir(&shared().join("tokenizers/qwen3")).unwrap();
    let (mut turn1, _) = turns();
    turn1["max_tokens"] = json!(8);
    turn1["stream"] = json!(false);
    let ids1 = tok
        .chat_token_ids(&ChatRequest::from_openai(&turn1).unwrap())
        .unwrap();
    let cached = ids1.len() / BLOCK * BLOCK;

    // Free ports are picked before binding (the topic names the HTTP
    // address); on the rare collision, pick again.
    let mut sims = Vec::new();
    let (mut addrs, mut zmq) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        for attempt in 0.. {
            let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let kv = format!("tcp://127.0.0.1:{}", free_port());
            let replay = format!("tcp://127.0.0.1:{}", free_port());
            match common::Sim::try_start(addr, &kv, &replay).await {
                Ok(sim) => {
                    sims.push(sim);
                    addrs.push(addr);
                    zmq.push((kv, replay));
                    break;
                }
                Err(e) if attempt < 5 => eprintln!("retrying sim start: {e}"),
                Err(e) => panic!("start sim: {e}"),
            }
        }
    }
    let workers: String = (0..2)
        .map(|i| {
            format!(
                "  - {{name: w{n}, endpoint: '{a}', model: {MODEL}, kv_events: '{k}', replay: '{r}', metrics: 'http://{a}/metrics'}}\n",
                n = i + 1,
                a = addrs[i],
                k = zmq[i].0,
                r = zmq[i].1
            )
        })
        .collect();
    let cfg = Config::from_yaml(&format!(
        "grpc_listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nmodels: [{{name: {MODEL}, tokenizer: '{tok}'}}]\nworkers:\n{workers}scrape: {{interval_ms: 100}}\nstreams: {{backoff_initial_ms: 20, backoff_max_ms: 200, down_grace_ms: 600000}}\n",
        tok = shared().join("tokenizers/qwen3").display(),
    ))
    .unwrap();
    let running = app::start(cfg).await.expect("start indexer");
    let admin = Admin::new(format!("http://{}", running.admin_addr));
    eventually("both streams live", || async {
        let (a, b) = (admin.worker("w1").await, admin.worker("w2").await);
        (a["stream"]["state"] == "live" && b["stream"]["state"] == "live").then_some(())
    })
    .await;

    // Turn 1 runs on w2's engine, which announces the blocks it cached.
    let reply = chat(&admin, addrs[1], &turn1).await;
    let answer = reply["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    eventually("w2 indexed turn 1", || async {
        let w = admin.worker("w2").await;
        (w["indexed_blocks"].as_u64() >= Some((cached / BLOCK) as u64)).then_some(())
    })
    .await;

    // Turn 2 scores best on w2: at least turn 1's full blocks are matched there.
    let mut turn2 = turn1.clone();
    let msgs = turn2["messages"].as_array_mut().unwrap();
    msgs.push(json!({"role": "assistant", "content": answer}));
    msgs.push(json!({"role": "user", "content": "Thanks. Now add unit tests."}));
    let (status, score) = admin.call_json("POST", "/debug/score", Some(&turn2)).await;
    assert_eq!(status, 200, "{score}");
    assert_eq!(score["chosen"], "w2", "{score}");
    let workers = score["workers"].as_array().unwrap();
    let w2 = workers.iter().find(|w| w["name"] == "w2").unwrap();
    let w1 = workers.iter().find(|w| w["name"] == "w1").unwrap();
    assert!(
        w2["matched_tokens"].as_u64().unwrap() >= cached as u64,
        "{score}"
    );
    assert_eq!(w1["matched_tokens"], json!(0), "{score}");
    // Nothing waits for a first token anywhere: no queue, of age 0.
    for w in [w1, w2] {
        assert_eq!(w["queue_age_s"], json!(0.0), "{score}");
    }

    // w2's engine restarts on the same ports: its seq starts over and the
    // indexer drops everything it had announced. (The grace is long: the
    // restart must be found by its seq, not given up; see liveness.rs.)
    // Restarts are detected by the seq going back, so the old incarnation
    // must be well ahead of what the new one sends before the SUB
    // reconnects: each distinct prompt makes the engine publish a batch.
    for n in 0..40 {
        let warmup = json!({"model": MODEL, "max_tokens": 1,
            "messages": [{"role": "user", "content": format!("old engine {n} {}", "lo ".repeat(40))}]});
        chat(&admin, addrs[1], &warmup).await;
    }
    eventually("w2 saw the old engine's batches", || async {
        let w = admin.worker("w2").await;
        (w["stream"]["last_seq"].as_u64() >= Some(30)).then_some(())
    })
    .await;
    let old = sims.pop().unwrap();
    old.shutdown().await;
    let restarted = eventually("w2 engine restarted on its ports", || async {
        common::Sim::try_start(addrs[1], &zmq[1].0, &zmq[1].1)
            .await
            .ok()
    })
    .await;
    // Each ping is a new prompt, so each produces new blocks (and a batch).
    let pings = std::sync::atomic::AtomicU32::new(0);
    eventually("w2 reset", || async {
        let n = pings.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ping = json!({"model": MODEL, "max_tokens": 1,
            "messages": [{"role": "user", "content": format!("ping number {n} {}", "la ".repeat(40))}]});
        chat(&admin, addrs[1], &ping).await;
        let w = admin.worker("w2").await;
        (w["stream"]["resets"].as_u64() >= Some(1)).then_some(())
    })
    .await;
    let (_, score) = admin.call_json("POST", "/debug/score", Some(&turn2)).await;
    let w2 = score["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "w2")
        .cloned()
        .unwrap();
    assert_eq!(w2["matched_tokens"], json!(0), "{score}");

    running.shutdown().await;
    restarted.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}
