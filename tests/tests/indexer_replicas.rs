//! Two indexer replicas behind Envoy's indexer cluster: a request's reports
//! reach the replica that answered its pick (`PickResponse.replica` →
//! `x-kvsteer-replica` → the cluster's `override_host` policy), so neither
//! replica keeps load it cannot release; one replica killed mid-run costs
//! no request, and the other carries on with nothing left behind.

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

async fn get(c: &Cluster, r: usize, path: &str) -> anyhow::Result<String> {
    Ok(c.client
        .get(c.replica_admin_url(r, path))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?)
}

/// Picks a replica answered (routed or not), reports it could not match.
async fn counts(c: &Cluster, r: usize) -> anyhow::Result<(f64, f64)> {
    let m = get(c, r, "/metrics").await?;
    Ok((
        metric_sum(&m, "kvsteer_picks_total", &["outcome=\"routed\""]),
        metric_sum(&m, "kvsteer_reports_unmatched_total", &[]),
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
