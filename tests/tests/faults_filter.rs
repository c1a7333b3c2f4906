//! Issue 18, the filter's side, through a real Envoy 1.40 with the kvsteer
//! filter, a real indexer and three simulated workers (the local layout):
//! a client reset while the pick is outstanding leaves no load; the pick id
//! is the filter's own, so requests sharing an `x-request-id` are distinct
//! picks nobody else can cancel; a single-chunk response yields one DONE
//! carrying its first token; failed reports are counted; JSON is steered
//! whatever its content type says.

use std::time::Duration;

use futures::StreamExt;
use kvsteer_e2e::{Cluster, ClusterOptions, MODEL, chat_body, send_chat, serial, wait_until};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn sims(time_scale: f64) -> ClusterOptions {
    ClusterOptions::tiny(time_scale)
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// `wasmcustom.<name>` of the filter.
async fn filter_stat(c: &Cluster, name: &str) -> u64 {
    c.envoy_stat(&format!("wasmcustom.{name}"))
        .await
        .expect("envoy stats")
}

async fn reports(c: &Cluster, kind: &str) -> f64 {
    c.indexer_metric("kvsteer_reports_total", &[&format!("kind=\"{kind}\"")])
        .await
        .expect("indexer metrics")
}

async fn wait_in_flight(c: &Cluster, what: &str, want: u64) {
    let waited = wait_until(what, WAIT, || async {
        (c.total_in_flight().await.ok()? == want).then_some(())
    })
    .await;
    if let Err(e) = waited {
        panic!("{e}: in flight {:?}", c.total_in_flight().await);
    }
}

/// A client of its own, so dropping a request closes its connection.
fn lone_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_while_the_pick_is_outstanding_leaves_no_load() {
    let _g = serial().await;
    let c = Cluster::start(sims(4.0)).await.expect("cluster");
    // One request first, so Envoy holds an HTTP/2 connection to the indexer.
    let warm = chat_body(MODEL, &user("warm up"), 2);
    let r = send_chat(&c.client, &c.envoy_url("/v1/chat/completions"), &warm, &[])
        .await
        .expect("warm-up");
    assert_eq!(r.status, 200);
    wait_in_flight(&c, "the warm-up to finish", 0).await;
    let cancelled_before = reports(&c, "cancelled").await;

    // The indexer is frozen: the pick stays outstanding until the client goes.
    c.signal_indexer("STOP").expect("SIGSTOP");
    let client = lone_client();
    let url = c.envoy_url("/v1/chat/completions");
    let body = chat_body(MODEL, &user("a question whose client leaves"), 8);
    let request = tokio::spawn(async move { client.post(url).json(&body).send().await });
    let outstanding = wait_until("the pick to be outstanding", WAIT, || async {
        let active = c
            .envoy_stat("cluster.kvsteer_indexer.upstream_rq_active")
            .await
            .ok()?;
        (active >= 1).then_some(())
    })
    .await;
    request.abort();
    let gone = wait_until("Envoy to drop the client's stream", WAIT, || async {
        let active = c
            .envoy_stat("http.kvsteer.downstream_rq_active")
            .await
            .ok()?;
        (active == 0).then_some(())
    })
    .await;
    c.signal_indexer("CONT").expect("SIGCONT");
    outstanding.expect("pick outstanding");
    gone.expect("stream dropped");

    // The filter cancelled the pick it could not see answered ...
    wait_until("the filter's CANCELLED report", WAIT, || async {
        (reports(&c, "cancelled").await > cancelled_before).then_some(())
    })
    .await
    .expect("a cancelled report reaches the indexer");
    // ... so the indexer holds no load for it (needs the indexer's
    // tombstone when the cancel overtakes the pick).
    wait_in_flight(&c, "the reset request's load to go", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sharing_a_client_request_id_are_distinct_picks() {
    let _g = serial().await;
    let c = Cluster::start(sims(1.0)).await.expect("cluster");
    let url = c.envoy_url("/v1/chat/completions");
    // Eight long streams (~400 decode steps of 7 ms) with one x-request-id.
    let requests: Vec<_> = (0..8)
        .map(|i| {
            let client = c.client.clone();
            let url = url.clone();
            let body = chat_body(MODEL, &user(&format!("shared id {i}")), 400);
            tokio::spawn(async move {
                send_chat(&client, &url, &body, &[("x-request-id", "shared-id")]).await
            })
        })
        .collect();
    wait_in_flight(&c, "eight picks in flight", 8).await;
    for r in requests {
        let reply = r.await.expect("join").expect("request");
        assert_eq!(reply.status, 200);
    }
    wait_in_flight(&c, "the shared-id requests to end", 0).await;

    // Another client reusing a victim's id and resetting its own request
    // cancels its own pick, not the victim's.
    // The victim's answer (~2,000 steps, ~14 s) outlasts the attacker's
    // whole request and its cancel, so its pick is still counted below.
    let victim_body = chat_body(MODEL, &user("the victim's long answer"), 2000);
    let client = c.client.clone();
    let victim_url = url.clone();
    let victim = tokio::spawn(async move {
        send_chat(
            &client,
            &victim_url,
            &victim_body,
            &[("x-request-id", "victim")],
        )
        .await
    });
    wait_in_flight(&c, "the victim's pick", 1).await;
    let cancelled_before = reports(&c, "cancelled").await;
    let attacker = lone_client();
    let resp = attacker
        .post(&url)
        .header("x-request-id", "victim")
        .json(&chat_body(MODEL, &user("the attacker"), 400))
        .send()
        .await
        .expect("attacker request");
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.expect("a first chunk").expect("chunk");
    assert!(!first.is_empty());
    drop(stream);
    wait_until("the attacker's CANCELLED report", WAIT, || async {
        (reports(&c, "cancelled").await > cancelled_before).then_some(())
    })
    .await
    .expect("the attacker's reset is reported");
    wait_until("the attacker's load to go", WAIT, || async {
        (c.total_in_flight().await.ok()? <= 1).then_some(())
    })
    .await
    .expect("in flight back to the victim's");
    assert_eq!(
        c.total_in_flight().await.expect("in flight"),
        1,
        "the attacker's cancel removed the victim's load"
    );
    let reply = victim.await.expect("join").expect("victim");
    assert_eq!(reply.status, 200);
    wait_in_flight(&c, "the victim to end", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_chunk_response_yields_one_done_with_its_first_token() {
    let _g = serial().await;
    let c = Cluster::start(sims(4.0)).await.expect("cluster");
    let url = c.envoy_url("/v1/chat/completions");
    let (done_before, first_before) = (reports(&c, "done").await, reports(&c, "first_token").await);
    let n = 12;
    for i in 0..n {
        let mut body = chat_body(MODEL, &user(&format!("whole answer {i}")), 4);
        body["stream"] = json!(false);
        if let Some(fields) = body.as_object_mut() {
            fields.remove("stream_options");
        }
        let r = send_chat(&c.client, &url, &body, &[])
            .await
            .expect("request");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    wait_until("a DONE per request", WAIT, || async {
        (reports(&c, "done").await - done_before >= f64::from(n)).then_some(())
    })
    .await
    .expect("done reports");
    wait_in_flight(&c, "every request to end", 0).await;
    assert_eq!(reports(&c, "done").await - done_before, f64::from(n));
    // The first token rode on DONE: no separate report to race it.
    assert_eq!(reports(&c, "first_token").await - first_before, 0.0);
    assert_eq!(filter_stat(&c, "kvsteer_filter_report_failed").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_reports_are_counted() {
    let _g = serial().await;
    let mut c = Cluster::start(sims(1.0)).await.expect("cluster");
    let url = c.envoy_url("/v1/chat/completions");
    assert_eq!(filter_stat(&c, "kvsteer_filter_report_failed").await, 0);
    let first_before = reports(&c, "first_token").await;
    let requests: Vec<_> = (0..3)
        .map(|i| {
            let client = c.client.clone();
            let url = url.clone();
            let body = chat_body(MODEL, &user(&format!("outlives the indexer {i}")), 200);
            tokio::spawn(async move { send_chat(&client, &url, &body, &[]).await })
        })
        .collect();
    wait_in_flight(&c, "three picks", 3).await;
    // Once their first tokens are reported, the indexer goes: the DONE
    // reports, decided as the streams end, find nobody. (A report sent by an
    // HTTP context that is gone by the time its answer comes was never
    // counted.)
    wait_until("three first tokens", WAIT, || async {
        (reports(&c, "first_token").await - first_before >= 3.0).then_some(())
    })
    .await
    .expect("first tokens");
    c.stop_indexer();
    for r in requests {
        assert_eq!(r.await.expect("join").expect("request").status, 200);
    }
    wait_until("three failed reports", WAIT, || async {
        (filter_stat(&c, "kvsteer_filter_report_failed").await >= 3).then_some(())
    })
    .await
    .expect("report_failed counts the reports the indexer never answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_is_steered_whatever_its_content_type() {
    let _g = serial().await;
    let c = Cluster::start(sims(4.0)).await.expect("cluster");
    let url = c.envoy_url("/v1/chat/completions");
    let body = serde_json::to_vec(&chat_body(MODEL, &user("typed loosely"), 2)).expect("json");
    for content_type in [
        Some("text/plain"),
        Some("application/json; charset=utf-8"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let steered = filter_stat(&c, "kvsteer_filter_steered").await;
        let mut req = c.client.post(&url).body(body.clone());
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let resp = req.send().await.expect("request");
        assert_eq!(resp.status(), 200, "{content_type:?}");
        resp.bytes().await.expect("body");
        assert_eq!(
            filter_stat(&c, "kvsteer_filter_steered").await,
            steered + 1,
            "{content_type:?} was not steered"
        );
    }
    // A body without `model` is steered as the only model served (vLLM
    // serves it too).
    let mut no_model = chat_body(MODEL, &user("no model named"), 2);
    no_model.as_object_mut().expect("object").remove("model");
    let steered = filter_stat(&c, "kvsteer_filter_steered").await;
    let resp = c
        .client
        .post(&url)
        .json(&no_model)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    resp.bytes().await.expect("body");
    assert_eq!(
        filter_stat(&c, "kvsteer_filter_steered").await,
        steered + 1,
        "a body without model was not steered"
    );
    // A body that is not JSON goes through unsteered, typed as JSON or not.
    let not_json = filter_stat(&c, "kvsteer_filter_failopen.not_json").await;
    for content_type in ["application/json", "text/plain"] {
        let resp = c
            .client
            .post(&url)
            .header("content-type", content_type)
            .body("hello worker")
            .send()
            .await
            .expect("request");
        assert!(resp.headers().contains_key("x-kvsteer-worker"));
        resp.bytes().await.expect("body");
    }
    assert_eq!(
        filter_stat(&c, "kvsteer_filter_failopen.not_json").await,
        not_json + 2
    );
    wait_in_flight(&c, "every request to end", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_reports_lost_to_an_indexer_pause_are_sent_again() {
    let _g = serial().await;
    let c = Cluster::start(sims(1.0)).await.expect("cluster");
    let url = c.envoy_url("/v1/chat/completions");
    let failed_before = filter_stat(&c, "kvsteer_filter_report_failed").await;
    // A streamed answer long enough to still be running once it is counted.
    let mut body = chat_body(MODEL, &user("a long answer, please"), 400);
    body["stream"] = json!(true);
    let resp = c
        .client
        .post(&url)
        .json(&body)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.expect("a first chunk").expect("chunk");
    assert!(!first.is_empty());
    wait_in_flight(&c, "the request to be counted", 1).await;

    // The indexer pauses; the answer ends meanwhile, so its DONE fails.
    c.signal_indexer("STOP").expect("SIGSTOP");
    while let Some(chunk) = stream.next().await {
        chunk.expect("chunk");
    }
    let failed = wait_until("the DONE report to fail", WAIT, || async {
        let now = filter_stat(&c, "kvsteer_filter_report_failed").await;
        (now > failed_before).then_some(())
    })
    .await;
    c.signal_indexer("CONT").expect("SIGCONT");
    failed.expect("a report failed while the indexer was stopped");
    // Sent again once the indexer is back: no load is left behind.
    wait_in_flight(&c, "the retried DONE to release the pick", 0).await;
}
