//! Two indexer replicas behind Envoy's indexer cluster: a request's reports
//! reach the replica that answered its pick (`PickResponse.replica` →
//! `x-kvsteer-replica` → the cluster's `override_host` policy), so neither
//! replica keeps load it cannot release; one replica killed mid-run costs
//! no request, and the other carries on with nothing left behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kvsteer_e2e::{
    Cluster, ClusterOptions, MODEL, chat_body, metric_sum, send_chat, serial, wait_until,
    workers_of,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn options() -> ClusterOptions {
    ClusterOptions {
        extra_indexers: 1,
        ..ClusterOptions::tiny(4.0)
    }
}

/// Istio's name for the indexer Service's gRPC port, as a sidecar knows it.
const ISTIO_INDEXER_CLUSTER: &str = "outbound|9090||kvsteer-indexer.kvsteer.svc.cluster.local";
const ISTIO_INDEXER_AUTHORITY: &str = "kvsteer-indexer.kvsteer.svc.cluster.local:9090";

/// `envoy/local/envoy.yaml` with the indexer cluster under Istio's name and
/// the filter configured as the chart's Istio EnvoyFilter configures it.
fn istio_named_envoy_config(dir: &Path) -> anyhow::Result<PathBuf> {
    let root = kvsteer_e2e::Paths::discover()?.root;
    let text = std::fs::read_to_string(root.join("envoy/local/envoy.yaml"))?;
    let plugin = r#""indexer_cluster": "kvsteer_indexer","#;
    let named = ["- name: kvsteer_indexer", "cluster_name: kvsteer_indexer"];
    anyhow::ensure!(
        text.contains(plugin) && named.iter().all(|n| text.contains(n)),
        "envoy/local/envoy.yaml: indexer cluster not where expected"
    );
    let text = text
        .replace(
            plugin,
            &format!(
                r#""indexer_cluster": "{ISTIO_INDEXER_CLUSTER}", "indexer_authority": "{ISTIO_INDEXER_AUTHORITY}","#
            ),
        )
        .replace(named[0], &format!("- name: \"{ISTIO_INDEXER_CLUSTER}\""))
        .replace(named[1], &format!("cluster_name: \"{ISTIO_INDEXER_CLUSTER}\""));
    let path = dir.join("envoy-istio-named.yaml");
    std::fs::write(&path, text)?;
    Ok(path)
}

async fn get(c: &Cluster, r: usize, path: &str) -> anyhow::Result<String> {
    Ok(c.client
        .get(c.replica_admin_url(r, path))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?)
}

/// Picks a replica answered (routed or not), reports it could not match. A
/// first token overtaken by its request's end is not among them (the
/// replica counts it as after its end): unmatched reports went elsewhere.
async fn counts(c: &Cluster, r: usize) -> anyhow::Result<(f64, f64)> {
    let m = get(c, r, "/metrics").await?;
    let unmatched = |kind: &str| {
        metric_sum(
            &m,
            "kvsteer_reports_unmatched_total",
            &[&format!("kind=\"{kind}\"")],
        )
    };
    Ok((
        metric_sum(&m, "kvsteer_picks_total", &["outcome=\"routed\""]),
        unmatched("first_token") + unmatched("done") + unmatched("cancelled"),
    ))
}

async fn in_flight(c: &Cluster, r: usize) -> anyhow::Result<u64> {
    let v: Value = serde_json::from_str(&get(c, r, "/debug/workers").await?)?;
    Ok(workers_of(&v)
        .iter()
        .filter_map(|w| w.get("in_flight").and_then(Value::as_u64))
        .sum())
}

/// `n` chat requests through Envoy, `concurrency` at a time: their statuses.
async fn traffic(c: &Cluster, tag: &str, n: usize, concurrency: usize) -> Vec<u16> {
    use futures::StreamExt;
    futures::stream::iter(0..n)
        .map(|i| async move {
            let body = chat_body(
                MODEL,
                &json!([{"role": "user", "content": format!("{tag} question {i}: {}", "context ".repeat(60))}]),
                8,
            );
            match send_chat(&c.client, &c.envoy_url("/v1/chat/completions"), &body, &[]).await {
                Ok(reply) => reply.status,
                Err(_) => 0,
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_reach_the_picking_replica_and_a_killed_one_costs_no_request() {
    let _g = serial().await;
    let mut c = Cluster::start(options()).await.expect("cluster");
    for r in [0, 1] {
        let v: Value = serde_json::from_str(&get(&c, r, "/debug/workers").await.unwrap()).unwrap();
        assert_eq!(workers_of(&v).len(), 3);
    }

    let statuses = traffic(&c, "steady", 40, 4).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    // Both replicas answered picks (round robin), and every report reached
    // the one that picked: none unmatched, no load left on either.
    for r in [0, 1] {
        let (routed, unmatched) = counts(&c, r).await.unwrap();
        assert!(routed >= 5.0, "replica {r} routed {routed}");
        assert_eq!(unmatched, 0.0, "replica {r}: reports went elsewhere");
    }
    wait_until("no load left on either replica", WAIT, || async {
        (in_flight(&c, 0).await.ok()? == 0 && in_flight(&c, 1).await.ok()? == 0).then_some(())
    })
    .await
    .unwrap();

    // Replica 2 dies while requests run: none fails (a pick that cannot
    // reach it fails open or goes to replica 1), and replica 1 ends idle.
    let killer = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        c.signal_replica(1, "KILL").expect("kill replica 2");
    };
    let (statuses, ()) = tokio::join!(traffic(&c, "kill", 60, 4), killer);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    c.kill_replica(1);
    wait_until("no load left on the survivor", WAIT, || async {
        (in_flight(&c, 0).await.ok()? == 0).then_some(())
    })
    .await
    .unwrap();
    let statuses = traffic(&c, "after", 10, 2).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let (_, unmatched) = counts(&c, 0).await.unwrap();
    eprintln!(
        "after the kill, replica 1 saw {unmatched} unmatched reports (the dead replica's requests)"
    );
}

/// The indexer cluster under Istio's name (`outbound|9090||…`, whose `|` is no
/// valid `:authority`) with the filter's `indexer_authority` set, as the
/// chart's Istio variant renders it: every pick is answered (no fail-open),
/// and reports still reach the picking replica through the cluster's
/// `override_host` policy (the chart's `-indexer-lb` EnvoyFilter patch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_istios_cluster_name_picks_are_answered_and_reports_find_their_replica() {
    let _g = serial().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = istio_named_envoy_config(dir.path()).expect("envoy config");
    let c = Cluster::start(ClusterOptions {
        envoy_config: Some(config),
        ..options()
    })
    .await
    .expect("cluster");

    let statuses = traffic(&c, "istio", 30, 3).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let mut routed_total = 0.0;
    for r in [0, 1] {
        let (routed, unmatched) = counts(&c, r).await.unwrap();
        assert!(routed >= 3.0, "replica {r} routed {routed}");
        assert_eq!(unmatched, 0.0, "replica {r}: reports went elsewhere");
        routed_total += routed;
    }
    // Every request was picked by a replica: none failed open.
    assert_eq!(routed_total, statuses.len() as f64);
    let steered = c
        .envoy_stat("wasmcustom.kvsteer_filter_steered")
        .await
        .expect("envoy stats");
    assert_eq!(steered, statuses.len() as u64, "the filter failed open");
    wait_until("no load left on either replica", WAIT, || async {
        (in_flight(&c, 0).await.ok()? == 0 && in_flight(&c, 1).await.ok()? == 0).then_some(())
    })
    .await
    .unwrap();
}
