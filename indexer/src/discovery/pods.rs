//! One pod of a pool → its workers (pure: no I/O).
//!
//! A pod is a worker while it has `status.podIP`, condition `Ready=True`
//! and no `deletionTimestamp`. Worker name = pod name; endpoint
//! `<podIP>:<http>`; events `tcp://<podIP>:<kv_events>`; replay
//! `tcp://<podIP>:<replay>`; metrics `http://<podIP>:<http>/metrics`.
//!
//! Data parallelism: a pod annotated `kvsteer.io/data-parallel-size: "N"`
//! runs N engine ranks in one server (`--data-parallel-size N`); vLLM
//! publishes rank r's events on the events and replay ports plus r. It is
//! N workers `<pod>-dp<r>` sharing the endpoint, each scraped for its own
//! rank's load.

use super::{PoolConfig, PortRef};
use crate::{config::WorkerConfig, index::WorkerId, workers::pod_worker_id};
use k8s_openapi::api::core::v1::Pod;

/// The annotation giving a pod's data-parallel size.
pub const DP_SIZE_ANNOTATION: &str = "kvsteer.io/data-parallel-size";

/// Ranks a pod may declare at most.
const MAX_DP_SIZE: u32 = 64;

/// One worker of a pod, ready to join.
#[derive(Debug, Clone, PartialEq)]
pub struct PodWorker {
    pub id: WorkerId,
    pub cfg: WorkerConfig,
}

/// What a pod is for the pool.
#[derive(Debug, Clone, PartialEq)]
pub enum PodView {
    /// Ready: its workers.
    Workers(Vec<PodWorker>),
    /// Not a worker now, for a normal reason (`no_ip`, `not_ready`,
    /// `terminating`).
    Waiting(&'static str),
    /// Not a worker because of how it is declared: the metric's reason and
    /// the log line.
    Invalid(&'static str, String),
}

/// The pod's identity: namespace, name, uid (empty when absent).
pub fn identity(pod: &Pod) -> (&str, &str, &str) {
    let m = &pod.metadata;
    (
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default(),
    )
}

/// What `pod` is for `pool`.
pub fn view(pool: &PoolConfig, pod: &Pod) -> PodView {
    let (_, name, uid) = identity(pod);
    if name.is_empty() || uid.is_empty() {
        return PodView::Invalid("no_identity", "pod without a name or uid".into());
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return PodView::Waiting("terminating");
    }
    let status = pod.status.as_ref();
    let Some(ip) = status
        .and_then(|s| s.pod_ip.as_deref())
        .filter(|ip| !ip.is_empty())
    else {
        return PodView::Waiting("no_ip");
    };
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if !ready {
        return PodView::Waiting("not_ready");
    }
    let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
        return PodView::Invalid("bad_ip", format!("status.podIP {ip:?} is not an address"));
    };
    let resolve = |what: &str, port: &PortRef| {
        port_of(pod, port).ok_or_else(|| {
            format!("{what} port {port} is not a container port of the pod (ports.{what})")
        })
    };
    let http = match resolve("http", &pool.ports.http) {
        Ok(p) => p,
        Err(e) => return PodView::Invalid("missing_port", e),
    };
    let events = match pool
        .ports
        .kv_events
        .as_ref()
        .map(|p| resolve("kv_events", p))
    {
        Some(Err(e)) => return PodView::Invalid("missing_port", e),
        Some(Ok(p)) => Some(p),
        None => None,
    };
    let replay = match pool.ports.replay.as_ref().map(|p| resolve("replay", p)) {
        Some(Err(e)) => return PodView::Invalid("missing_port", e),
        Some(Ok(p)) => Some(p),
        None => None,
    };
    let dp = match dp_size(pod) {
        Ok(n) => n,
        Err(e) => return PodView::Invalid("bad_annotation", e),
    };
    let addr = |port: u16| std::net::SocketAddr::new(ip, port);
    let endpoint = addr(http).to_string();
    let workers = (0..dp)
        .map(|rank| {
            let offset = |p: u16| -> Option<u16> { p.checked_add(u16::try_from(rank).ok()?) };
            let (name, id, dp_rank) = if dp == 1 {
                (name.to_owned(), pod_worker_id(uid), None)
            } else {
                (
                    format!("{name}-dp{rank}"),
                    pod_worker_id(&format!("{uid}/{rank}")),
                    Some(rank),
                )
            };
            PodWorker {
                id,
                cfg: WorkerConfig {
                    name,
                    endpoint: endpoint.clone(),
                    model: pool.model.clone(),
                    kv_events: events
                        .and_then(offset)
                        .map(|p| format!("tcp://{}", addr(p))),
                    replay: replay
                        .and_then(offset)
                        .map(|p| format!("tcp://{}", addr(p))),
                    metrics: Some(format!("http://{endpoint}/metrics")),
                    data_parallel_rank: dp_rank,
                    bind: false,
                    topic: pool.topic.clone(),
                },
            }
        })
        .collect();
    PodView::Workers(workers)
}

/// The container port `port` names (or is).
fn port_of(pod: &Pod, port: &PortRef) -> Option<u16> {
    match port {
        PortRef::Number(n) => Some(*n),
        PortRef::Name(name) => pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

fn dp_size(pod: &Pod) -> Result<u32, String> {
    let Some(v) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DP_SIZE_ANNOTATION))
    else {
        return Ok(1);
    };
    match v.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_DP_SIZE).contains(&n) => Ok(n),
        _ => Err(format!(
            "annotation {DP_SIZE_ANNOTATION}: {v:?} is not a size in 1..={MAX_DP_SIZE}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::PoolPorts;
    use serde_json::json;

    fn pool() -> PoolConfig {
        PoolConfig {
            model: "m".into(),
            selector: "app=vllm".into(),
            ports: PoolPorts::default(),
            topic: None,
        }
    }

    fn pod(ip: Option<&str>, ready: &str) -> serde_json::Value {
        json!({
            "metadata": {"name": "vllm-0", "namespace": "ns", "uid": "uid-0", "labels": {"app": "vllm"}},
            "spec": {"containers": [{"name": "vllm", "ports": [
                {"name": "http", "containerPort": 8000},
                {"name": "kv-events", "containerPort": 5557},
                {"name": "kv-replay", "containerPort": 5558}
            ]}]},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": ready}]}
        })
    }

    fn parse(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_ready_pod_is_one_worker_at_its_ip() {
        let PodView::Workers(ws) = view(&pool(), &parse(pod(Some("10.1.2.3"), "True"))) else {
            panic!("not a worker");
        };
        assert_eq!(ws.len(), 1);
        let w = &ws[0];
        assert_eq!(w.id, pod_worker_id("uid-0"));
        assert_eq!(w.cfg.name, "vllm-0");
        assert_eq!(w.cfg.endpoint, "10.1.2.3:8000");
        assert_eq!(w.cfg.kv_events.as_deref(), Some("tcp://10.1.2.3:5557"));
        assert_eq!(w.cfg.replay.as_deref(), Some("tcp://10.1.2.3:5558"));
        assert_eq!(
            w.cfg.metrics.as_deref(),
            Some("http://10.1.2.3:8000/metrics")
        );
        assert_eq!(w.cfg.topic(), "kv@10.1.2.3:8000@m");
    }

    #[test]
    fn unready_ipless_and_terminating_pods_wait() {
        assert_eq!(
            view(&pool(), &parse(pod(Some("10.1.2.3"), "False"))),
            PodView::Waiting("not_ready")
        );
        assert_eq!(
            view(&pool(), &parse(pod(None, "True"))),
            PodView::Waiting("no_ip")
        );
        let mut p = pod(Some("10.1.2.3"), "True");
        p["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
        assert_eq!(view(&pool(), &parse(p)), PodView::Waiting("terminating"));
    }

    #[test]
    fn a_missing_port_name_or_a_bad_annotation_is_invalid_with_the_reason() {
        let mut p = pool();
        p.ports.kv_events = Some(PortRef::Name("events".into()));
        match view(&p, &parse(pod(Some("10.1.2.3"), "True"))) {
            PodView::Invalid("missing_port", why) => assert!(why.contains("\"events\""), "{why}"),
            other => panic!("{other:?}"),
        }
        let mut v = pod(Some("10.1.2.3"), "True");
        v["metadata"]["annotations"] = json!({DP_SIZE_ANNOTATION: "zero"});
        assert!(matches!(
            view(&pool(), &parse(v)),
            PodView::Invalid("bad_annotation", _)
        ));
        // Numbers need no declared port; no events port: load only.
        let mut p = pool();
        p.ports = PoolPorts {
            http: PortRef::Number(9000),
            kv_events: None,
            replay: None,
        };
        let PodView::Workers(ws) = view(&p, &parse(pod(Some("10.1.2.3"), "True"))) else {
            panic!()
        };
        assert_eq!(ws[0].cfg.endpoint, "10.1.2.3:9000");
        assert_eq!(ws[0].cfg.kv_events, None);
    }

    #[test]
    fn a_data_parallel_pod_is_one_worker_per_rank_on_consecutive_event_ports() {
        let mut v = pod(Some("10.1.2.3"), "True");
        v["metadata"]["annotations"] = json!({DP_SIZE_ANNOTATION: "2"});
        v["spec"]["containers"][0]["ports"][2]["containerPort"] = json!(5600);
        let PodView::Workers(ws) = view(&pool(), &parse(v)) else {
            panic!()
        };
        let got: Vec<_> = ws
            .iter()
            .map(|w| {
                (
                    w.cfg.name.as_str(),
                    w.cfg.kv_events.as_deref().unwrap(),
                    w.cfg.replay.as_deref().unwrap(),
                    w.cfg.data_parallel_rank,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "vllm-0-dp0",
                    "tcp://10.1.2.3:5557",
                    "tcp://10.1.2.3:5600",
                    Some(0)
                ),
                (
                    "vllm-0-dp1",
                    "tcp://10.1.2.3:5558",
                    "tcp://10.1.2.3:5601",
                    Some(1)
                ),
            ]
        );
        assert_ne!(ws[0].id, ws[1].id);
        assert!(ws.iter().all(|w| w.cfg.endpoint == "10.1.2.3:8000"));
    }
}
