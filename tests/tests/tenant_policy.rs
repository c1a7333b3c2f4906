//! Tenant cache isolation and budgets through a real Envoy 1.40, the filter,
//! the indexer and three simulated workers (local layout). The tenant comes
//! from a trusted hop (`envoy/trusted-hop/envoy.yaml`: the header counts
//! only on connections from 127.0.0.2, where these requests come from).

use std::time::Duration;

use kvsteer_e2e::{
    ChatReply, Cluster, ClusterOptions, MODEL, Paths, chat_body, send_chat, serial, wait_until,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
const TENANT_HEADER: &str = "x-tenant-id";

/// ~1.5k tokens shared by every tenant's first turn.
fn shared_system_prompt() -> String {
    let mut s = "You are the support assistant of one product.\n".to_owned();
    for i in 0..120 {
        s.push_str(&format!(
            "Policy {i}: answer in one sentence, cite rule {i}.\n"
        ));
    }
    s
}

fn messages(turns: &[&str]) -> Value {
    let mut m = vec![json!({"role": "system", "content": shared_system_prompt()})];
    for (i, t) in turns.iter().enumerate() {
        if i > 0 {
            m.push(json!({"role": "assistant", "content": "Noted."}));
        }
        m.push(json!({"role": "user", "content": t}));
    }
    Value::Array(m)
}

/// A client of the trusted hop: its tenant header counts.
fn gateway() -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

async fn ask(c: &Cluster, tenant: &str, body: &Value) -> ChatReply {
    send_chat(
        &gateway(),
        &c.envoy_url("/v1/chat/completions"),
        body,
        &[(TENANT_HEADER, tenant)],
    )
    .await
    .expect("request through Envoy")
}

fn options(secret: &std::path::Path) -> ClusterOptions {
    let mut opts = ClusterOptions::tiny(4.0);
    opts.tenants_extra = format!(
        "  salt_secret_file: {}\n  overrides:\n    team-a: {{isolation: salted}}\n    team-b: {{isolation: salted}}\n    team-c:\n      budget: {{tokens_per_minute: 3000}}\n",
        secret.display()
    );
    let paths = Paths::discover().expect("paths");
    opts.envoy_config = Some(paths.root.join("envoy/trusted-hop/envoy.yaml"));
    opts
}

/// Salted tenants never hit each other's blocks (nor an unsalted tenant's),
/// each still hits its own, and each is steered to its own warm worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn salted_tenants_share_no_blocks_and_keep_their_own() {
    let _g = serial().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("salt-secret");
    std::fs::write(&secret, "a test secret of thirty-two bytes").expect("secret");
    let c = Cluster::start(options(&secret)).await.expect("cluster");

    let turn1 = chat_body(MODEL, &messages(&["How do I reset my password?"]), 8);
    let a1 = ask(&c, "team-a", &turn1).await;
    assert_eq!(a1.status, 200, "{}", a1.text());
    // The same prompt, other tenants: nothing cached for them.
    let b1 = ask(&c, "team-b", &turn1).await;
    let d1 = ask(&c, "team-d", &turn1).await;
    for (who, r) in [("team-b", &b1), ("team-d (unsalted)", &d1)] {
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.cached_tokens(),
            0,
            "{who} hit team-a's blocks: {:?}",
            r.usage
        );
    }
    // Each tenant's next turn goes where its own prefix is, and hits it.
    let turn2 = chat_body(
        MODEL,
        &messages(&["How do I reset my password?", "And my e-mail?"]),
        8,
    );
    for (tenant, first) in [("team-a", &a1), ("team-b", &b1), ("team-d", &d1)] {
        let r = ask(&c, tenant, &turn2).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.worker, first.worker,
            "{tenant} moved away from its prefix"
        );
        assert!(r.cached_tokens() > 1000, "{tenant}: {:?}", r.usage);
    }
}

/// Over its budget a tenant gets an OpenAI-style 429 with `Retry-After`
/// and the request never reaches a worker; reported usage settles the
/// reservation; a request larger than the whole budget is refused for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_budget_requests_get_429_and_never_reach_a_worker() {
    let _g = serial().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("salt-secret");
    std::fs::write(&secret, "a test secret of thirty-two bytes").expect("secret");
    let c = Cluster::start(options(&secret)).await.expect("cluster");

    // ~1.5k prompt tokens + 16: the first fits in 3000 tokens a minute, the
    // second does not.
    let body = chat_body(MODEL, &messages(&["Where is my invoice?"]), 16);
    let first = ask(&c, "team-c", &body).await;
    assert_eq!(first.status, 200, "{}", first.text());
    // The DONE report's usage reaches the budget.
    wait_until("usage settled", WAIT, || async {
        let used = c
            .indexer_metric("kvsteer_tenant_used_tokens_total", &[])
            .await
            .ok()?;
        (used > 0.0).then_some(())
    })
    .await
    .expect("usage settled");
    let upstream = c
        .envoy_stat("cluster.vllm_workers.upstream_rq_total")
        .await
        .expect("stat");

    let second = ask(&c, "team-c", &body).await;
    assert_eq!(second.status, 429, "{}", second.text());
    let retry: u64 = second
        .retry_after
        .as_deref()
        .expect("retry-after")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry), "retry-after {retry}");
    let err: Value = serde_json::from_slice(&second.body).expect("JSON error");
    assert_eq!(err["error"]["type"], "rate_limit_error", "{err}");
    assert_eq!(err["error"]["code"], 429);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("tokens per minute"),
        "{err}"
    );

    // Larger than a minute's budget: refused with no retry.
    let huge = chat_body(MODEL, &messages(&["Summarise everything."]), 5000);
    let refused = ask(&c, "team-c", &huge).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.retry_after, None);

    // Anthropic's /v1/messages gets Anthropic's error shape.
    let messages = json!({
        "model": MODEL,
        "max_tokens": 16,
        "system": shared_system_prompt(),
        "messages": [{"role": "user", "content": "Where is my invoice?"}],
    });
    let anthropic = send_chat(
        &gateway(),
        &c.envoy_url("/v1/messages"),
        &messages,
        &[(TENANT_HEADER, "team-c")],
    )
    .await
    .expect("request through Envoy");
    assert_eq!(anthropic.status, 429, "{}", anthropic.text());
    assert!(anthropic.retry_after.is_some());
    let err: Value = serde_json::from_slice(&anthropic.body).expect("JSON error");
    assert_eq!(err["type"], "error", "{err}");
    assert_eq!(err["error"]["type"], "rate_limit_error", "{err}");

    // Other tenants are not limited, and the refusals reached no worker.
    let other = ask(&c, "team-a", &body).await;
    assert_eq!(other.status, 200, "{}", other.text());
    let after = c
        .envoy_stat("cluster.vllm_workers.upstream_rq_total")
        .await
        .expect("stat");
    assert_eq!(after, upstream + 1, "only team-a's request went upstream");
    let rejected = c
        .indexer_metric("kvsteer_tenant_rejected_requests_total", &[])
        .await
        .expect("metric");
    assert_eq!(rejected, 3.0);
}
