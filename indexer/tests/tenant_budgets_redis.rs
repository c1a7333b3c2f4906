//! Tenant budgets in a real `redis-server` (free loopback port, killed on
//! drop): two indexer replicas share one budget through the admission
//! script; settlement refunds across replicas; Redis gone → the configured
//! rule (`fail_open` or `local`).

use std::time::Duration;

use kvsteer_indexer::config::TenantsConfig;
use kvsteer_indexer::index::redis::testing::RedisServer;
use kvsteer_indexer::tenancy::{Ending, Tenancy, TenancyMetrics};
use prometheus_client::registry::Registry;

async fn server() -> RedisServer {
    RedisServer::start()
        .await
        .unwrap_or_else(|e| panic!("these tests need a local redis-server: {e}"))
}

/// A replica's tenancy on `url`; generous call timeout for busy machines.
fn replica(url: &str, extra: &str) -> (Tenancy, Registry) {
    let yaml = format!(
        "default: {{budget: {{tokens_per_minute: 1000, max_concurrent: 2}}}}\nbudget_store: {{backend: redis, url: \"{url}\", timeout_ms: 2000{extra}}}\n"
    );
    let cfg: TenantsConfig = serde_norway::from_str(&yaml).expect("config");
    let mut registry = Registry::default();
    let metrics = TenancyMetrics::new(&mut registry, &[]);
    let t = Tenancy::new(cfg, None, "kvt", Duration::from_secs(60), metrics).expect("tenancy");
    (t, registry)
}

fn metric(registry: &Registry, line_start: &str) -> f64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
    text.lines()
        .filter(|l| l.starts_with(line_start))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn replicas_share_one_budget() {
    let redis = server().await;
    let (r1, _) = replica(&redis.url(), "");
    let (r2, _) = replica(&redis.url(), "");
    r1.admit("a1", "t", "m", 500, Some(100))
        .await
        .expect("first fits");
    // 400 left in Redis: the other replica sees it.
    let refusal = r2.admit("a2", "t", "m", 400, Some(100)).await.unwrap_err();
    assert_eq!(refusal.status, 429);
    assert_eq!(
        refusal.retry_after_s, 6,
        "100 tokens at 1000/min: {refusal:?}"
    );
    // Another tenant has its own budget.
    r2.admit("b1", "u", "m", 900, Some(100))
        .await
        .expect("other tenant");
    // a1 used 200 of 600: 400 come back, whichever replica settles.
    r1.settle(
        "a1",
        Ending::Done {
            used_tokens: Some(200),
        },
    )
    .await;
    r2.admit("a2", "t", "m", 400, Some(100))
        .await
        .expect("after the refund");
    // Concurrency counts across replicas: a2 and a3 in flight.
    r1.admit("a3", "t", "m", 1, Some(1))
        .await
        .expect("second slot");
    let refusal = r2.admit("a4", "t", "m", 1, Some(1)).await.unwrap_err();
    assert!(refusal.message.contains("concurrent"), "{refusal:?}");
    r2.settle("a2", Ending::Cancelled { used_tokens: None })
        .await;
    r2.admit("a4", "t", "m", 1, Some(1))
        .await
        .expect("a slot came free");
}

#[tokio::test]
async fn the_memory_and_redis_stores_admit_alike() {
    let redis = server().await;
    let (shared, _) = replica(&redis.url(), "");
    let cfg: TenantsConfig =
        serde_norway::from_str("default: {budget: {tokens_per_minute: 1000, max_concurrent: 2}}")
            .expect("config");
    let mut registry = Registry::default();
    let local = Tenancy::new(
        cfg,
        None,
        "kvt",
        Duration::from_secs(60),
        TenancyMetrics::new(&mut registry, &[]),
    )
    .expect("tenancy");
    // A fixed sequence of admissions and settlements; both stores must
    // agree on every verdict (sub-second clocks refill < 20 tokens).
    let steps: [(&str, u32, u32, Option<u64>); 8] = [
        ("s1", 300, 100, None),
        ("s2", 300, 100, Some(150)),
        ("s3", 300, 100, None),
        ("s4", 50, 10, Some(60)),
        ("s5", 100, 50, None),
        ("s6", 700, 200, None),
        ("s7", 10, 10, Some(5)),
        ("s8", 200, 20, None),
    ];
    for (id, prompt, max, settle) in steps {
        let a = shared.admit(id, "t", "m", prompt, Some(max)).await;
        let b = local.admit(id, "t", "m", prompt, Some(max)).await;
        assert_eq!(a.is_ok(), b.is_ok(), "{id}: redis {a:?} memory {b:?}");
        if let (Err(a), Err(b)) = (&a, &b) {
            assert_eq!(a.message, b.message, "{id}");
        }
        if let Some(used) = settle
            && a.is_ok()
        {
            shared
                .settle(
                    id,
                    Ending::Done {
                        used_tokens: Some(used),
                    },
                )
                .await;
            local
                .settle(
                    id,
                    Ending::Done {
                        used_tokens: Some(used),
                    },
                )
                .await;
        }
    }
}

#[tokio::test]
async fn redis_gone_follows_the_configured_rule() {
    let mut redis = server().await;
    let (open, open_metrics) = replica(&redis.url(), ", on_error: fail_open");
    let (local, local_metrics) = replica(&redis.url(), ", on_error: local");
    redis.stop();
    // fail_open: everything admitted, errors counted.
    for i in 0..5 {
        open.admit(&format!("o{i}"), "t", "m", 900, Some(100))
            .await
            .expect("fail open");
    }
    assert_eq!(
        metric(
            &open_metrics,
            "kvsteer_tenant_budget_store_errors_total{action=\"fail_open\"}"
        ),
        5.0
    );
    // local: this replica's own budget holds.
    local
        .admit("l1", "t", "m", 900, Some(100))
        .await
        .expect("fits locally");
    assert!(local.admit("l2", "t", "m", 900, Some(100)).await.is_err());
    assert_eq!(
        metric(
            &local_metrics,
            "kvsteer_tenant_budget_store_errors_total{action=\"local\"}"
        ),
        2.0
    );
    // Settling a local reservation stays local (no Redis call to fail).
    local
        .settle(
            "l1",
            Ending::Done {
                used_tokens: Some(10),
            },
        )
        .await;
    local
        .admit("l3", "t", "m", 900, Some(10))
        .await
        .expect("refunded locally");
    // Redis back: the shared budget again.
    redis.restart().await.expect("restart");
    let errors = || metric(&open_metrics, "kvsteer_tenant_budget_store_errors_total");
    let mut admitted = false;
    for i in 0..50 {
        let before = errors();
        let ok = open
            .admit(&format!("back{i}"), "t", "m", 1, Some(1))
            .await
            .is_ok();
        if ok && errors() == before {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(admitted, "admitted through Redis once it is back");
}
