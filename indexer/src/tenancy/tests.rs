use std::io::Write;

use prometheus_client::registry::Registry;

use super::policy::{Budget, PolicyLevel};
use super::*;

fn metrics(allow: &[&str]) -> TenancyMetrics {
    let allow: Vec<String> = allow.iter().map(|s| (*s).to_owned()).collect();
    TenancyMetrics::new(&mut Registry::default(), &allow)
}

fn secret_file() -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "0123456789abcdef0123456789abcdef").unwrap();
    f
}

fn config(yaml: &str) -> TenantsConfig {
    serde_norway::from_str(yaml).unwrap()
}

#[test]
fn salts_are_per_tenant_secret_dependent_and_yield_to_the_client() {
    let file = secret_file();
    let mut cfg = config("overrides: {a: {isolation: salted}, b: {isolation: salted}}");
    cfg.salt_secret_file = Some(file.path().to_owned());
    let t = Tenancy::new(
        cfg.clone(),
        None,
        "kvsteer",
        Duration::from_secs(60),
        metrics(&[]),
    )
    .unwrap();
    let a = t.salt("a", "m", None).expect("a is salted");
    let b = t.salt("b", "m", None).expect("b is salted");
    assert_ne!(a, b);
    assert_eq!(t.salt("a", "m", None).as_deref(), Some(a.as_str()));
    assert_eq!(t.salt("a", "m", Some("client's")), None);
    assert_eq!(t.salt("shared-tenant", "m", None), None);
    // Another secret, other salts: they cannot be guessed from the tenant.
    let mut other = tempfile::NamedTempFile::new().unwrap();
    writeln!(other, "another secret of some length").unwrap();
    cfg.salt_secret_file = Some(other.path().to_owned());
    let t2 = Tenancy::new(cfg, None, "kvsteer", Duration::from_secs(60), metrics(&[])).unwrap();
    assert_ne!(t2.salt("a", "m", None).unwrap(), a);
}

#[test]
fn a_salted_tenant_needs_a_long_enough_secret() {
    let mut cfg = config("default: {isolation: salted}");
    let missing = std::env::temp_dir().join("kvsteer-no-such-secret");
    cfg.salt_secret_file = Some(missing);
    assert!(matches!(
        Tenancy::new(cfg.clone(), None, "p", Duration::from_secs(1), metrics(&[])),
        Err(TenancyError::SecretFile { .. })
    ));
    let mut short = tempfile::NamedTempFile::new().unwrap();
    writeln!(short, "short").unwrap();
    cfg.salt_secret_file = Some(short.path().to_owned());
    assert!(matches!(
        Tenancy::new(cfg, None, "p", Duration::from_secs(1), metrics(&[])),
        Err(TenancyError::ShortSecret(5))
    ));
}

#[tokio::test]
async fn budgets_refuse_with_retry_after_and_settle_to_usage() {
    let cfg = config("overrides: {b: {budget: {tokens_per_minute: 1000, max_concurrent: 2}}}");
    let t = Tenancy::new(cfg, None, "p", Duration::from_secs(60), metrics(&["b"])).unwrap();
    // No budget for others.
    for i in 0..100 {
        t.admit(&format!("x{i}"), "a", "m", 10_000, Some(10_000))
            .await
            .unwrap();
    }
    assert_eq!(t.reservations(), 0);
    t.admit("r1", "b", "m", 300, Some(300)).await.unwrap();
    // 400 left; 600 asked.
    let refusal = t.admit("r2", "b", "m", 300, Some(300)).await.unwrap_err();
    assert_eq!(
        (refusal.status, refusal.error_type),
        (429, "rate_limit_error")
    );
    assert_eq!(refusal.retry_after_s, 12, "200 tokens at 1000/min");
    // r1 used 100 of its 600: 500 come back, 900 left.
    t.settle(
        "r1",
        Ending::Done {
            used_tokens: Some(100),
        },
    )
    .await;
    t.admit("r2", "b", "m", 300, Some(300)).await.unwrap();
    t.admit("r3", "b", "m", 10, Some(10)).await.unwrap();
    // Two in flight: the third waits for one.
    let refusal = t.admit("r4", "b", "m", 1, Some(1)).await.unwrap_err();
    assert!(
        refusal.message.contains("concurrent"),
        "{}",
        refusal.message
    );
    t.settle("r3", Ending::NotSent).await;
    t.admit("r4", "b", "m", 1, Some(1)).await.unwrap();
    // Larger than a minute: refused for good.
    let refusal = t.admit("r5", "b", "m", 1_000, Some(1)).await.unwrap_err();
    assert_eq!(refusal.retry_after_s, 0);
    assert!(refusal.message.contains("too large"), "{}", refusal.message);
}

#[tokio::test]
async fn a_cancelled_request_without_usage_pays_its_prompt() {
    let cfg = config("default: {budget: {tokens_per_minute: 1000}}");
    let t = Tenancy::new(cfg, None, "p", Duration::from_secs(60), metrics(&[])).unwrap();
    t.admit("r1", "a", "m", 400, Some(500)).await.unwrap();
    t.settle("r1", Ending::Cancelled { used_tokens: None })
        .await;
    // 600 left: 600 fits, 601 does not.
    t.admit("r2", "a", "m", 300, Some(300)).await.unwrap();
    t.settle("r2", Ending::NotSent).await;
    assert!(t.admit("r3", "a", "m", 301, Some(300)).await.is_err());
    // Unknown ids settle nothing.
    t.settle(
        "nobody",
        Ending::Done {
            used_tokens: Some(1),
        },
    )
    .await;
}

#[tokio::test]
async fn per_model_budgets_are_counted_apart() {
    let mut cfg = config("default: {budget: {tokens_per_minute: 100}}");
    cfg.default.models.insert(
        "big".into(),
        PolicyLevel {
            isolation: None,
            budget: Some(Budget {
                tokens_per_minute: Some(50),
                ..Budget::default()
            }),
        },
    );
    let t = Tenancy::new(cfg, None, "p", Duration::from_secs(60), metrics(&[])).unwrap();
    t.admit("r1", "a", "big", 40, Some(10)).await.unwrap();
    assert!(t.admit("r2", "a", "big", 1, Some(0)).await.is_err());
    t.admit("r3", "a", "small", 90, Some(10)).await.unwrap();
    // Tenants are apart too.
    t.admit("r4", "b", "big", 40, Some(10)).await.unwrap();
}

#[tokio::test]
async fn reservations_without_a_report_expire() {
    let cfg = config("default: {budget: {max_concurrent: 1}}");
    let t = Tenancy::new(cfg, None, "p", Duration::from_millis(0), metrics(&[])).unwrap();
    t.admit("r1", "a", "m", 1, Some(1)).await.unwrap();
    assert!(t.admit("r2", "a", "m", 1, Some(1)).await.is_err());
    t.expire(Instant::now()).await;
    assert_eq!(t.reservations(), 0);
    t.admit("r2", "a", "m", 1, Some(1)).await.unwrap();
}

#[tokio::test]
async fn a_thousand_tenants_make_a_bounded_set_of_series() {
    let mut registry = Registry::default();
    let m = TenancyMetrics::new(&mut registry, &["gold".to_owned()]);
    let cfg = config("default: {budget: {requests_per_minute: 1}}");
    let t = Tenancy::new(cfg, None, "p", Duration::from_secs(60), m).unwrap();
    for i in 0..1000 {
        let tenant = format!("tenant-{i}");
        t.admit(&format!("a{i}"), &tenant, "m", 1, Some(1))
            .await
            .unwrap();
        t.settle(
            &format!("a{i}"),
            Ending::Done {
                used_tokens: Some(2),
            },
        )
        .await;
        assert!(
            t.admit(&format!("b{i}"), &tenant, "m", 1, Some(1))
                .await
                .is_err()
        );
    }
    t.admit("g", "gold", "m", 1, Some(1)).await.unwrap();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("kvsteer_tenant_"))
        .collect();
    assert!(series.iter().all(|l| !l.contains("tenant-")), "{series:?}");
    assert!(series.len() <= 12, "{series:#?}");
    assert!(
        series.contains(
            &r#"kvsteer_tenant_rejected_requests_total{tenant="other",limit="requests"} 1000"#
        ),
        "{series:#?}"
    );
}

#[test]
fn oversized_tenants_are_refused() {
    let t = Tenancy::disabled(metrics(&[]));
    assert!(t.check_tenant(&"x".repeat(256)).is_ok());
    let refusal = t.check_tenant(&"x".repeat(257)).unwrap_err();
    assert_eq!(refusal.status, 400);
}
