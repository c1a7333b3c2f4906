//! LoRA adapters: two `kvsteer-sim` engines serving one adapter each
//! (`--lora-modules`, listed in `/v1/models` with their `parent`, events
//! carrying `lora_name`/`lora_id` as vLLM 0.32's do). The indexer learns
//! each worker's adapters from `/v1/models`; a request for an adapter goes
//! to the workers serving it and matches that adapter's blocks; a base
//! request may go anywhere and does not match an adapter's blocks.

mod common;

use common::{Admin, BLOCK, MODEL, Sim, eventually, shared};
use kvsteer_indexer::{app, config::Config};
use kvsteer_sim::server::LoraModule;
use serde_json::{Value, json};

async fn sim(adapter: &str) -> Sim {
    Sim::start_with(vec![LoraModule {
        name: adapter.into(),
        path: format!("/adapters/{adapter}"),
    }])
    .await
}

fn turn(model: &str, topic: &str, answer: Option<&str>) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": format!("You answer questions about {topic}. ").repeat(30)}),
        json!({"role": "user", "content": format!("First question about {topic}?")}),
    ];
    if let Some(a) = answer {
        messages.push(json!({"role": "assistant", "content": a}));
        messages.push(json!({"role": "user", "content": "And the second one?"}));
    }
    json!({"model": model, "messages": messages, "max_tokens": 4})
}

fn matched(score: &Value, worker: &str) -> u64 {
    score["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == worker)
        .map_or(0, |w| w["matched_tokens"].as_u64().unwrap())
}

fn candidates(score: &Value) -> Vec<String> {
    score["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_per_adapter_sticks_to_its_worker_and_hits() {
    let sims = [sim("sql").await, sim("chat").await];
    let workers: String = sims
        .iter()
        .zip(["w1", "w2"])
        .map(|(s, name)| {
            format!(
                "  - {{name: {name}, endpoint: '{a}', model: {MODEL}, kv_events: '{k}', replay: '{r}', metrics: 'http://{a}/metrics'}}\n",
                a = s.addr,
                k = s.kv,
                r = s.replay,
            )
        })
        .collect();
    let cfg = Config::from_yaml(&format!(
        "grpc_listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
models:
  - name: {MODEL}
    tokenizer: {tok}
workers:
{workers}scrape:
  interval_ms: 100
",
        tok = shared().join("tokenizers/qwen3").display(),
    ))
    .expect("config");
    let running = app::start(cfg).await.expect("start");
    let admin = Admin::new(format!("http://{}", running.admin_addr));
    eventually("adapters learned", || async {
        let (_, v) = admin.call_json("GET", "/debug/workers", None).await;
        let ws = v["workers"].as_array()?.clone();
        let of = |n: &str| {
            ws.iter()
                .find(|w| w["name"] == n)
                .map(|w| w["adapters"].clone())
        };
        (of("w1")? == json!(["sql"]) && of("w2")? == json!(["chat"])).then_some(())
    })
    .await;
    let client = Admin::new(String::new());

    for (i, (adapter, worker)) in [("sql", "w1"), ("chat", "w2")].into_iter().enumerate() {
        // Only the worker serving the adapter is a candidate.
        let first = turn(adapter, adapter, None);
        let (status, score) = admin.call_json("POST", "/debug/score", Some(&first)).await;
        assert_eq!(status, 200, "{score}");
        assert_eq!(candidates(&score), [worker], "{score}");

        // The turn runs there; its blocks are indexed under the adapter.
        let reply = sims[i].chat(&client, &first).await;
        let answer = reply["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        let second = turn(adapter, adapter, Some(&answer));
        let full = {
            let (_, s) = admin.call_json("POST", "/debug/score", Some(&first)).await;
            s["prompt_tokens"].as_u64().unwrap() / BLOCK as u64 * BLOCK as u64
        };
        let score = eventually("the adapter's blocks indexed", || async {
            let (_, s) = admin.call_json("POST", "/debug/score", Some(&second)).await;
            (matched(&s, worker) >= full).then_some(s)
        })
        .await;
        assert_eq!(score["chosen"], worker, "{score}");
        assert_eq!(score["degraded"], false, "{score}");

        // The same prompt on the base model: any worker, and the adapter's
        // blocks are not its blocks (in the index, and in the engine).
        let base = turn(MODEL, adapter, Some(&answer));
        let (_, s) = admin.call_json("POST", "/debug/score", Some(&base)).await;
        assert_eq!(candidates(&s), ["w1", "w2"], "{s}");
        assert_eq!(matched(&s, worker), 0, "{s}");
        assert_eq!(sims[i].cached_tokens(&client, &base).await, 0);
        // The engine, for its part, had the adapter's prefix cached.
        assert!(sims[i].cached_tokens(&client, &second).await >= full);
    }

    // An adapter nobody serves is an unknown model: no opinion.
    let (_, s) = admin
        .call_json("POST", "/debug/score", Some(&turn("nope", "x", None)))
        .await;
    assert!(s["endpoints"].as_array().unwrap().is_empty(), "{s}");
    assert!(
        s["reason"].as_str().unwrap().contains("unknown_model"),
        "{s}"
    );

    running.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}
