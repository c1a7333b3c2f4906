//! Requests through a real Envoy 1.40 with the kvsteer filter, a real
//! `kvsteer-indexer` and three `kvsteer-sim engine` workers, all on loopback
//! in the local layout of `envoy/local/`.

use std::time::Duration;

use futures::StreamExt;
use kvsteer_e2e::{
    ChatReply, Cluster, ClusterOptions, MODEL, Recorder, SimOptions, chat_body, send_chat,
    send_raw, serial, wait_until,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// A long, conversation-specific system prompt (~1.5k tokens).
fn system_prompt(tag: &str) -> String {
    let mut s = format!("You are assistant {tag}. Follow the project rules below.\n");
    for i in 0..120 {
        s.push_str(&format!(
            "Rule {i} for {tag}: keep functions small, name things plainly, test edge case {i}.\n"
        ));
    }
    s
}

/// Runs `turns` turns of one conversation through Envoy and returns the replies.
async fn conversation(c: &Cluster, tag: &str, turns: usize) -> anyhow::Result<Vec<ChatReply>> {
    let mut messages = vec![json!({"role": "system", "content": system_prompt(tag)})];
    let mut replies = Vec::new();
    for t in 0..turns {
        messages.push(
            json!({"role": "user", "content": format!("Question {t} about {tag}: what next?")}),
        );
        let body = chat_body(MODEL, &Value::Array(messages.clone()), 16);
        let reply = send_chat(&c.client, &c.envoy_url("/v1/chat/completions"), &body, &[]).await?;
        anyhow::ensure!(
            reply.status == 200,
            "turn {t}: status {} {}",
            reply.status,
            reply.text()
        );
        messages.push(json!({"role": "assistant", "content": reply.content()}));
        replies.push(reply);
    }
    Ok(replies)
}

fn fast_sims() -> ClusterOptions {
    ClusterOptions::tiny(4.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_conversation_sticks_to_the_warm_worker() {
    let _g = serial().await;
    let c = Cluster::start(fast_sims()).await.expect("cluster");
    for tag in ["alpha", "beta", "gamma"] {
        let replies = conversation(&c, tag, 4).await.expect("conversation");
        let first = replies[0].worker.clone().expect("x-kvsteer-worker");
        for (t, r) in replies.iter().enumerate().skip(1) {
            assert_eq!(
                r.worker.as_deref(),
                Some(first.as_str()),
                "{tag} turn {t} moved"
            );
            assert!(
                r.cached_tokens() > 0,
                "{tag} turn {t}: no cached tokens ({:?})",
                r.usage
            );
        }
    }
}

/// Each steered request records the filter's three timings, and the
/// dispatch (inside Envoy's gRPC client) is part of the pick call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steered_requests_record_the_filter_timings() {
    let _g = serial().await;
    let c = Cluster::start(fast_sims()).await.expect("cluster");
    conversation(&c, "timed", 3).await.expect("conversation");
    let steered = c
        .envoy_stat("wasmcustom.kvsteer_filter_steered")
        .await
        .expect("stat");
    assert_eq!(steered, 3, "every turn steered");
    // Envoy merges the workers' histograms at its stats flush (5 s).
    let names = [
        "kvsteer_filter_prepare_us",
        "kvsteer_filter_dispatch_us",
        "kvsteer_filter_pick_us",
    ];
    let recorded = wait_until("the filter's histograms", WAIT, || async {
        let mut all = Vec::new();
        for name in names {
            let h = c.envoy_histogram(name).await.ok()?;
            (h.0 == steered).then_some(())?;
            all.push(h);
        }
        Some(all)
    })
    .await
    .expect("each histogram has one sample per steered request");
    let (dispatch, pick) = (recorded[1].1, recorded[2].1);
    assert!(dispatch > 0.0, "dispatch took no time: {recorded:?}");
    assert!(
        dispatch <= pick,
        "dispatch is part of the pick call: {recorded:?}"
    );
}

/// Once the first pick has asked for it, the filter's `PickStream` opens
/// and carries the picks that follow; every turn is still steered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn picks_ride_the_stream_once_it_is_open() {
    let _g = serial().await;
    let c = Cluster::start(fast_sims()).await.expect("cluster");
    conversation(&c, "streamed-a", 1).await.expect("first turn");
    wait_until("the pick stream open", WAIT, || async {
        let open = c.indexer_metric("kvsteer_pick_streams", &[]).await.ok()?;
        (open >= 1.0).then_some(())
    })
    .await
    .expect("the first pick opens a stream");
    let replies = conversation(&c, "streamed-b", 4)
        .await
        .expect("conversation");
    let first = replies[0].worker.clone().expect("x-kvsteer-worker");
    assert!(
        replies
            .iter()
            .all(|r| r.worker.as_deref() == Some(first.as_str()))
    );
    assert!(replies[1..].iter().all(|r| r.cached_tokens() > 0));
    let stat = |name: &'static str| c.envoy_stat(name);
    let steered = stat("wasmcustom.kvsteer_filter_steered")
        .await
        .expect("stat");
    let streamed = stat("wasmcustom.kvsteer_filter_pick_streamed")
        .await
        .expect("stat");
    let opened = stat("wasmcustom.kvsteer_filter_pick_stream_opened")
        .await
        .expect("stat");
    assert_eq!(steered, 5, "every turn steered");
    // Each Envoy worker's first pick goes unary and opens its stream; a
    // worker that sees a later pick sends it on the stream.
    assert!(
        streamed >= 1 && streamed < steered,
        "{streamed} of {steered} streamed"
    );
    assert!(opened >= 1, "{opened} streams opened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_with_token_ids_are_steered_like_chat() {
    let _g = serial().await;
    let c = Cluster::start(fast_sims()).await.expect("cluster");
    let prefix: Vec<u32> = (0..1024).map(|i| 1000 + (i * 7919) % 50_000).collect();
    let mut workers = Vec::new();
    for turn in 0..3u32 {
        let mut prompt = prefix.clone();
        prompt.extend((0..40).map(|i| 200 + turn * 100 + i));
        let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 4, "stream": false});
        let r = send_chat(&c.client, &c.envoy_url("/v1/completions"), &body, &[])
            .await
            .expect("completion");
        assert_eq!(r.status, 200, "{}", r.text());
        if turn > 0 {
            assert!(r.cached_tokens() >= 1024, "turn {turn}: {:?}", r.usage);
        }
        workers.push(r.worker.expect("worker header"));
    }
    assert!(workers.iter().all(|w| *w == workers[0]), "{workers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_supplied_destination_header_is_ignored() {
    let _g = serial().await;
    let mut c = Cluster::start(fast_sims()).await.expect("cluster");
    let replies = conversation(&c, "delta", 1).await.expect("turn 1");
    let warm = replies[0].worker.clone().expect("worker");
    let other = ["w1", "w2", "w3"]
        .into_iter()
        .find(|w| *w != warm)
        .expect("other");
    let other_ep = format!("127.0.0.1:{}", 8000 + other[1..].parse::<u16>().expect("n"));

    // With the indexer up: the pick wins over the client's header.
    let messages = json!([
        {"role": "system", "content": system_prompt("delta")},
        {"role": "user", "content": "Question 0 about delta: what next?"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "and then?"}
    ]);
    let body = chat_body(MODEL, &messages, 4);
    let hdr = [("x-gateway-destination-endpoint", other_ep.as_str())];
    let r = send_chat(&c.client, &c.envoy_url("/v1/chat/completions"), &body, &hdr)
        .await
        .expect("request");
    assert_eq!(r.worker.as_deref(), Some(warm.as_str()));

    // With the indexer down: the header still does not steer (round robin spreads).
    c.stop_indexer();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let r = send_chat(&c.client, &c.envoy_url("/v1/chat/completions"), &body, &hdr)
            .await
            .expect("request");
        assert_eq!(r.status, 200);
        seen.insert(r.worker.expect("worker"));
    }
    assert!(
        seen.len() > 1,
        "every request went to {seen:?}: the header steered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexer_down_fails_open_and_steering_resumes_after_restart() {
    let _g = serial().await;
    let mut c = Cluster::start(fast_sims()).await.expect("cluster");
    let replies = conversation(&c, "epsilon", 2).await.expect("warm up");
    let warm = replies[0].worker.clone().expect("worker");

    c.stop_indexer();
    for i in 0..9 {
        let body = chat_body(
            MODEL,
            &json!([{"role": "user", "content": format!("hi {i}")}]),
            4,
        );
        let r = send_chat(&c.client, &c.envoy_url("/v1/chat/completions"), &body, &[])
            .await
            .expect("request while the indexer is down");
        assert_eq!(r.status, 200, "request {i} failed: {}", r.text());
    }

    // The restarted indexer replays the workers' buffered events and steers again.
    c.start_indexer().await.expect("indexer restart");
    let messages = json!([
        {"role": "system", "content": system_prompt("epsilon")},
        {"role": "user", "content": "Question 0 about epsilon: what next?"}
    ]);
    let body = chat_body(MODEL, &messages, 4);
    let r = send_chat(&c.client, &c.envoy_url("/v1/chat/completions"), &body, &[])
        .await
        .expect("after restart");
    assert_eq!(r.worker.as_deref(), Some(warm.as_str()));
    assert!(r.cached_tokens() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_non_json_and_oversized_bodies_reach_the_worker() {
    let _g = serial().await;
    let c = Cluster::start(fast_sims()).await.expect("cluster");
    let url = c.envoy_url("/v1/chat/completions");
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "malformed json",
            "application/json",
            b"{\"model\": \"x\", \"messages\": [".to_vec(),
        ),
        ("non-json", "text/plain", b"hello worker".to_vec()),
        ("oversized", "application/json", {
            let big = "y".repeat(12 * 1024 * 1024);
            serde_json::to_vec(
                &json!({"model": MODEL, "messages": [{"role": "user", "content": big}]}),
            )
            .expect("json")
        }),
    ];
    for (what, ct, body) in cases {
        let r = send_raw(&c.client, &url, ct, body, &[]).await.expect(what);
        assert!(
            r.worker.is_some(),
            "{what}: not answered by a worker: {} {}",
            r.status,
            r.text()
        );
        assert!(
            r.status < 500 && r.status != 413,
            "{what}: status {}",
            r.status
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_arrive_byte_identical_and_disconnects_leave_no_load() {
    let _g = serial().await;
    // Worker 1 moves behind a recording relay that takes its contract port.
    let mut c = Cluster::start(fast_sims()).await.expect("cluster");
    c.stop_sim(0);
    let relay_port = 18_001;
    c.start_sim_at(0, relay_port)
        .await
        .expect("sim behind relay");
    let recorder = Recorder::start("127.0.0.1:8001", format!("127.0.0.1:{relay_port}"))
        .await
        .expect("relay");

    // Where steering sends a cold request depends on the calibrated rates
    // (the relay makes w1 look slower), so w1 first caches a long prefix,
    // sent to it directly; requests sharing it are then steered to w1.
    c.wait_streams_live(3).await.expect("streams live again");
    let system = json!({"role": "system", "content": system_prompt("relay")});
    let warm = chat_body(
        MODEL,
        &json!([system, {"role": "user", "content": "warm"}]),
        4,
    );
    let r = send_chat(
        &c.client,
        &c.worker_url(0, "/v1/chat/completions"),
        &warm,
        &[],
    )
    .await
    .expect("warm w1");
    assert_eq!(r.status, 200);
    let mut received = Vec::new();
    for i in 0..60 {
        let body = chat_body(
            MODEL,
            &json!([system, {"role": "user", "content": format!("stream {i}")}]),
            24,
        );
        let r = send_chat(&c.client, &c.envoy_url("/v1/chat/completions"), &body, &[])
            .await
            .expect("stream");
        assert_eq!(r.status, 200);
        if r.worker.as_deref() == Some("w1") {
            received.push(r.body.clone());
            if received.len() == 2 {
                break;
            }
        }
    }
    assert!(!received.is_empty(), "no request of 60 reached w1");
    let sent = recorder.response_bodies().expect("recorded");
    for body in &received {
        assert!(
            sent.contains(body),
            "a client body differs from every body w1 sent"
        );
    }

    // A client that disconnects mid-stream leaves no in-flight load behind.
    let body = chat_body(
        MODEL,
        &json!([{"role": "user", "content": "long story"}]),
        2000,
    );
    let resp = c
        .client
        .post(c.envoy_url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("long stream");
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.expect("a first chunk").expect("chunk");
    assert!(!first.is_empty());
    drop(stream);
    wait_until("in-flight load to drain", WAIT, || async {
        (c.total_in_flight().await.ok()? == 0).then_some(())
    })
    .await
    .expect("in-flight returns to zero");
}

/// The worker whose `/debug/score` choice satisfies `pred`, polled until it does.
async fn wait_for_choice(
    c: &Cluster,
    body: &Value,
    what: &str,
    pred: impl Fn(&str) -> bool,
) -> Value {
    wait_until(what, Duration::from_secs(60), || async {
        let score = c.debug_score(body).await.ok()?;
        let chosen = score.get("chosen")?.as_str()?.to_string();
        pred(&chosen).then_some(score)
    })
    .await
    .expect(what)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturated_warm_worker_loses_to_an_idle_one_and_wins_back() {
    let _g = serial().await;
    let mut opts = ClusterOptions::three(SimOptions {
        profile: "tiny-cpu".into(),
        time_scale: 1.0,
        max_num_seqs: 2,
        ..SimOptions::default()
    });
    // The indexer knows the workers' slot count.
    opts.scoring_extra = "  max_num_seqs: 2".into();
    let c = Cluster::start(opts).await.expect("cluster");
    let url = c.envoy_url("/v1/chat/completions");
    let system = json!({"role": "system", "content": system_prompt("zeta")});
    let long_question = format!(
        "Please review this: {}",
        "the parser and the cache ".repeat(120)
    );
    // Turn 1 (system prompt + a long question) makes one worker warm.
    let turn1 = chat_body(
        MODEL,
        &json!([system, {"role": "user", "content": long_question}]),
        4,
    );
    let r = send_chat(&c.client, &url, &turn1, &[])
        .await
        .expect("turn 1");
    let warm = r.worker.clone().expect("worker");
    let warm_idx: usize = warm[1..].parse::<usize>().expect("n") - 1;

    let other = chat_body(
        MODEL,
        &json!([system, {"role": "user", "content": "A short question."}]),
        4,
    );
    wait_for_choice(&c, &other, "the warm worker to be chosen while idle", |w| {
        w == warm
    })
    .await;

    // Saturate it directly (not through Envoy): two slots, long decodes queue up.
    let load: Vec<_> = (0..8)
        .map(|i| {
            let client = c.client.clone();
            let url = c.worker_url(warm_idx, "/v1/chat/completions");
            let b = chat_body(
                MODEL,
                &json!([{"role": "user", "content": format!("busy {i}")}]),
                400,
            );
            tokio::spawn(async move { send_chat(&client, &url, &b, &[]).await })
        })
        .collect();

    // A new request sharing the system prompt goes to an idle worker once the
    // indexer predicts the queue costs more than the prefill it would save.
    let other = chat_body(
        MODEL,
        &json!([system, {"role": "user", "content": "A short question."}]),
        4,
    );
    let score = wait_for_choice(&c, &other, "a pick away from the saturated worker", |w| {
        w != warm
    })
    .await;
    let r = send_chat(&c.client, &url, &other, &[])
        .await
        .expect("request");
    assert_eq!(r.status, 200);
    assert_ne!(
        r.worker.as_deref(),
        Some(warm.as_str()),
        "went to the saturated worker: {score}"
    );

    for h in load {
        let reply = h.await.expect("join").expect("load request");
        assert_eq!(reply.status, 200);
    }
    // Drained: turn 1's prompt, which only the first worker holds whole, goes back there.
    wait_for_choice(&c, &turn1, "the warm worker to win again", |w| w == warm).await;
    let r = send_chat(&c.client, &url, &turn1, &[])
        .await
        .expect("request after drain");
    assert_eq!(r.worker.as_deref(), Some(warm.as_str()));
    assert!(r.cached_tokens() > 0);
}
