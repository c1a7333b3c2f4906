//! One kube-runtime watcher per pool (list, then watch; namespaced, by
//! label selector; re-list on `410 Gone`; bookmarks), its events turned
//! into joins and leaves of the [`Fleet`].
//!
//! An error (API server unreachable, watch refused) keeps the workers as
//! they are and marks discovery stale (`/debug/workers`,
//! `kvsteer_discovery_stale`); the pool's watcher is then started again
//! after a backoff, with a fresh list, whose end clears the mark. An API
//! server that is away for a while thus never empties the worker set.

use super::{
    KubernetesConfig, PoolConfig,
    pods::{self, PodView, PodWorker},
};
use crate::{fleet::Fleet, workers::Origin};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    config::{KubeConfigOptions, Kubeconfig},
    runtime::watcher::{self, Event},
};
use parking_lot::Mutex;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    time::Duration,
};
use tokio::sync::watch as signal;

/// Backoff between restarts of a failed watcher.
const BACKOFF_INITIAL: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        source: kube::config::KubeconfigError,
    },
    #[error(
        "no Kubernetes client configuration (in-cluster service account, KUBECONFIG, ~/.kube/config): {0}"
    )]
    Infer(#[from] kube::config::InferConfigError),
    #[error("Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// The API client and the namespace watched.
pub async fn client(cfg: &KubernetesConfig) -> Result<(Client, String), ClientError> {
    let config = match &cfg.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Kubeconfig {
                    path: path.display().to_string(),
                    source,
                })?
        }
        None => kube::Config::infer().await?,
    };
    let namespace = cfg
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    Ok((Client::try_from(config)?, namespace))
}

/// What `/debug/workers` shows of discovery.
#[derive(Default)]
pub struct DiscoveryStatus {
    pub namespace: String,
    last_error: Mutex<Option<String>>,
    /// Per pool: its first list completed.
    synced: Vec<AtomicBool>,
    /// Per pool: its last watch failed and no list succeeded since.
    stale: Vec<AtomicBool>,
}

impl DiscoveryStatus {
    pub fn new(namespace: String, pools: usize) -> Self {
        Self {
            namespace,
            synced: (0..pools).map(|_| AtomicBool::new(false)).collect(),
            stale: (0..pools).map(|_| AtomicBool::new(false)).collect(),
            ..Default::default()
        }
    }

    /// Some pool's watch failed and no list succeeded since.
    pub fn is_stale(&self) -> bool {
        self.stale.iter().any(|s| s.load(Relaxed))
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    /// Every pool's first list completed.
    pub fn synced(&self) -> bool {
        self.synced.iter().all(|s| s.load(Relaxed))
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolReasonLabels {
    pub pool: String,
    pub reason: &'static str,
}

#[derive(Clone)]
pub struct DiscoveryMetrics {
    /// 1 while the last watch of some pool failed and no list since.
    pub stale: Gauge,
    pub errors: Family<PoolLabels, Counter>,
    pub workers: Family<PoolLabels, Gauge>,
    /// Pods selected but not workers because of how they are declared.
    pub pods_invalid: Family<PoolReasonLabels, Counter>,
    pub joins: Family<PoolLabels, Counter>,
    pub leaves: Family<PoolReasonLabels, Counter>,
}

impl DiscoveryMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            stale: Gauge::default(),
            errors: Family::default(),
            workers: Family::default(),
            pods_invalid: Family::default(),
            joins: Family::default(),
            leaves: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("kvsteer_discovery");
        r.register(
            "stale",
            "1 while a pool's watch failed and no list succeeded since (workers kept as last seen)",
            m.stale.clone(),
        );
        r.register(
            "errors",
            "Failed lists and watches of the API server",
            m.errors.clone(),
        );
        r.register("workers", "Workers discovered, per pool", m.workers.clone());
        r.register(
            "pods_invalid",
            "Selected pods that are no workers because of how they are declared",
            m.pods_invalid.clone(),
        );
        r.register("joins", "Discovered workers that joined", m.joins.clone());
        r.register(
            "leaves",
            "Discovered workers that left, by reason",
            m.leaves.clone(),
        );
        m
    }
}

/// Watches every pool until `shutdown`.
pub async fn run(
    client: Client,
    cfg: KubernetesConfig,
    fleet: Arc<Fleet>,
    status: Arc<DiscoveryStatus>,
    metrics: DiscoveryMetrics,
    shutdown: signal::Receiver<bool>,
) {
    let api: Api<Pod> = Api::namespaced(client, &status.namespace);
    let watches = cfg.pools.iter().enumerate().map(|(i, pool)| {
        let mut w = PoolWatch {
            index: i,
            pool: pool.clone(),
            label: pool.model.clone(),
            fleet: fleet.clone(),
            status: status.clone(),
            metrics: metrics.clone(),
            members: HashMap::new(),
        };
        let api = api.clone();
        let wc = watcher::Config::default()
            .labels(&pool.selector)
            .timeout(cfg.watch_timeout_s);
        let shutdown = shutdown.clone();
        async move { w.run(api, wc, shutdown).await }
    });
    futures::future::join_all(watches).await;
}

/// One pool's watch and the workers it put in the fleet.
struct PoolWatch {
    index: usize,
    pool: PoolConfig,
    /// The pool's metric label (its model).
    label: String,
    fleet: Arc<Fleet>,
    status: Arc<DiscoveryStatus>,
    metrics: DiscoveryMetrics,
    /// Pod uid → its workers in the fleet.
    members: HashMap<String, Vec<Arc<crate::workers::Worker>>>,
}

impl PoolWatch {
    async fn run(
        &mut self,
        api: Api<Pod>,
        wc: watcher::Config,
        mut shutdown: signal::Receiver<bool>,
    ) {
        let mut backoff = BACKOFF_INITIAL;
        loop {
            let stream = watcher::watcher(api.clone(), wc.clone());
            futures::pin_mut!(stream);
            let mut listing: Option<HashMap<String, Pod>> = None;
            let error = loop {
                let item = tokio::select! {
                    biased;
                    _ = shutdown.wait_for(|s| *s) => return,
                    item = stream.next() => item,
                };
                match item {
                    None => break None,
                    Some(Ok(Event::Init)) => listing = Some(HashMap::new()),
                    Some(Ok(Event::InitApply(pod))) => {
                        let uid = pods::identity(&pod).2.to_owned();
                        listing.get_or_insert_with(HashMap::new).insert(uid, pod);
                    }
                    Some(Ok(Event::InitDone)) => {
                        let listed = listing.take().unwrap_or_default();
                        self.resync(listed).await;
                        self.set_stale(None);
                        backoff = BACKOFF_INITIAL;
                    }
                    Some(Ok(Event::Apply(pod))) => self.apply(&pod).await,
                    Some(Ok(Event::Delete(pod))) => {
                        let uid = pods::identity(&pod).2.to_owned();
                        self.remove(&uid, "deleted").await;
                    }
                    // 410 Gone: the watcher lists again by itself.
                    Some(Err(watcher::Error::WatchError(status))) if status.code == 410 => {
                        tracing::debug!(pool = %self.label, "watch expired (410); listing again");
                    }
                    Some(Err(e)) => break Some(e.to_string()),
                }
            };
            let why = error.unwrap_or_else(|| "watch stream ended".into());
            self.metrics
                .errors
                .get_or_create(&PoolLabels {
                    pool: self.label.clone(),
                })
                .inc();
            tracing::warn!(pool = %self.label, namespace = %self.status.namespace, error = %why, retry_in = ?backoff, "pod watch failed; keeping the workers as last seen");
            self.set_stale(Some(why));
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    fn set_stale(&self, error: Option<String>) {
        self.status.stale[self.index].store(error.is_some(), Relaxed);
        if error.is_none() {
            self.status.synced[self.index].store(true, Relaxed);
        }
        self.metrics.stale.set(i64::from(self.status.is_stale()));
        if let Some(e) = error {
            *self.status.last_error.lock() = Some(e);
        }
    }

    /// A full list: pods absent from it left; the others are applied.
    async fn resync(&mut self, listed: HashMap<String, Pod>) {
        let gone: Vec<String> = self
            .members
            .keys()
            .filter(|uid| !listed.contains_key(*uid))
            .cloned()
            .collect();
        for uid in gone {
            self.remove(&uid, "deleted").await;
        }
        for pod in listed.values() {
            self.apply(pod).await;
        }
        tracing::info!(pool = %self.label, namespace = %self.status.namespace, pods = listed.len(), workers = self.count(), "pods listed");
    }

    /// A pod added or changed: its workers now.
    async fn apply(&mut self, pod: &Pod) {
        let (namespace, name, uid) = pods::identity(pod);
        let (namespace, name, uid) = (namespace.to_owned(), name.to_owned(), uid.to_owned());
        let wanted: Vec<PodWorker> = match pods::view(&self.pool, pod) {
            PodView::Workers(ws) => ws,
            PodView::Waiting(reason) => {
                self.remove(&uid, reason).await;
                return;
            }
            PodView::Invalid(reason, why) => {
                self.metrics
                    .pods_invalid
                    .get_or_create(&PoolReasonLabels {
                        pool: self.label.clone(),
                        reason,
                    })
                    .inc();
                tracing::warn!(pool = %self.label, pod = %name, reason, "pod selected but not a worker: {why}");
                self.remove(&uid, reason).await;
                return;
            }
        };
        let same = self.members.get(&uid).is_some_and(|cur| {
            cur.len() == wanted.len()
                && cur
                    .iter()
                    .zip(&wanted)
                    .all(|(w, p)| w.id == p.id && w.cfg == p.cfg)
        });
        if same {
            return;
        }
        // A new IP (or ports, or size): the old workers leave first.
        self.remove(&uid, "changed").await;
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default();
        let mut joined = Vec::new();
        for p in wanted {
            let origin = Origin::Pod {
                namespace: namespace.clone(),
                name: name.clone(),
                uid: uid.clone(),
                ip: ip.clone(),
            };
            match self.fleet.join(p.id, p.cfg, origin) {
                Ok(w) => {
                    self.metrics
                        .joins
                        .get_or_create(&PoolLabels {
                            pool: self.label.clone(),
                        })
                        .inc();
                    joined.push(w);
                }
                Err(e) => {
                    self.metrics
                        .pods_invalid
                        .get_or_create(&PoolReasonLabels {
                            pool: self.label.clone(),
                            reason: "no_slot",
                        })
                        .inc();
                    tracing::error!(pool = %self.label, pod = %name, error = %e, "pod cannot join");
                }
            }
        }
        if !joined.is_empty() {
            self.members.insert(uid, joined);
        }
        self.publish_count();
    }

    async fn remove(&mut self, uid: &str, reason: &'static str) {
        let Some(ws) = self.members.remove(uid) else {
            return;
        };
        for w in &ws {
            self.fleet.leave(w, reason).await;
            self.metrics
                .leaves
                .get_or_create(&PoolReasonLabels {
                    pool: self.label.clone(),
                    reason,
                })
                .inc();
        }
        self.publish_count();
    }

    fn count(&self) -> usize {
        self.members.values().map(Vec::len).sum()
    }

    fn publish_count(&self) {
        self.metrics
            .workers
            .get_or_create(&PoolLabels {
                pool: self.label.clone(),
            })
            .set(self.count() as i64);
    }
}
