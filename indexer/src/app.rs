//! Wiring: load tokenizers, build the index, workers, picker; start the
//! event streams, the scraper, the gRPC and admin servers; stop them all on
//! shutdown.

use crate::{
    admin::{self, AdminState, Readiness},
    config::{Config, GrpcTlsConfig, IndexBackend},
    discovery::{
        self,
        watch::{DiscoveryMetrics, DiscoveryStatus},
    },
    fleet::Fleet,
    grpc::RouterService,
    index::{
        Index,
        redis::{
            RedisBackend, RedisMetrics, RedisSetupError, WriterMode,
            cache::{CachedLookups, HotCache},
            lease::{self, LeaseBoard},
        },
    },
    metrics::Metrics,
    picker::Picker,
    scrape, streams,
    tenancy::{Tenancy, TenancyMetrics},
    workers::Workers,
};
use kvsteer_tokenize::PromptTokenizer;
use prometheus_client::registry::Registry;
use std::{
    collections::HashMap,
    future::Future,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("model {model:?}: cannot load tokenizer from {path}: {source}")]
    Tokenizer {
        model: String,
        path: String,
        source: kvsteer_tokenize::Error,
    },
    #[error("index.redis: {0}")]
    Redis(#[from] RedisSetupError),
    #[error("discovery.kubernetes: {0}")]
    Discovery(#[from] discovery::watch::ClientError),
    #[error(transparent)]
    Tenancy(#[from] crate::tenancy::TenancyError),
    #[error(transparent)]
    DebugToken(#[from] admin::DebugTokenError),
    #[error("grpc.tls: cannot read {path}: {source}")]
    TlsFile {
        path: String,
        source: std::io::Error,
    },
    #[error("grpc.tls: {0}")]
    Tls(#[from] tonic::transport::Error),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Listen {
        what: &'static str,
        addr: String,
        source: std::io::Error,
    },
}

/// How often budget reservations without a report are looked for.
pub const RESERVATION_SWEEP_EVERY: Duration = Duration::from_secs(5);

/// How often the Redis backend is pinged, its stats refreshed and workers
/// whose writes failed are resynced.
pub const REDIS_UPKEEP_EVERY: Duration = Duration::from_secs(1);

/// A running service.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub picker: Arc<Picker>,
    pub index: Index,
    /// This replica's write leases (Redis, `writer: auto`).
    pub leases: Option<Arc<LeaseBoard>>,
    /// Joins and leaves of workers (discovery).
    pub fleet: Arc<Fleet>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// Loads every model's tokenizer.
pub fn load_tokenizers(cfg: &Config) -> Result<HashMap<String, Arc<PromptTokenizer>>, AppError> {
    cfg.models
        .iter()
        .map(|m| {
            let tok =
                PromptTokenizer::from_dir(&m.tokenizer).map_err(|source| AppError::Tokenizer {
                    model: m.name.clone(),
                    path: m.tokenizer.display().to_string(),
                    source,
                })?;
            Ok((m.name.clone(), Arc::new(tok)))
        })
        .collect()
}

/// The index the configuration asks for: the memory one, or the Redis one
/// (its metrics registered in `registry`; it does not wait for Redis),
/// behind the hot cache unless `cache_entries` is 0.
pub async fn build_index(
    cfg: &Config,
    registry: &mut Registry,
) -> Result<(Index, Option<Arc<RedisBackend>>), AppError> {
    match cfg.index.backend {
        IndexBackend::Memory => Ok((Index::memory(cfg.index.capacity), None)),
        IndexBackend::Redis => {
            let rcfg = cfg.index.redis.clone();
            let metrics = RedisMetrics::register(registry);
            let backend = Arc::new(RedisBackend::new(rcfg.clone(), metrics.clone()).await?);
            let index = if rcfg.cache_entries == 0 {
                Index::with_backend(backend.clone())
            } else {
                let cache = HotCache::new(rcfg.cache_entries, rcfg.cache_ttl());
                Index::with_backend(Arc::new(CachedLookups::new(
                    backend.clone(),
                    cache,
                    metrics,
                )))
            };
            Ok((index, Some(backend)))
        }
    }
}

/// The picker on a memory index, without any task or listener (benchmarks
/// and tests drive it directly; its workers, index and metrics are
/// [`Picker::workers`], [`Picker::index`], [`Picker::metrics`]).
pub fn build_picker(
    cfg: &Config,
    tokenizers: HashMap<String, Arc<PromptTokenizer>>,
    registry: &mut Registry,
) -> Arc<Picker> {
    let index = Index::memory(cfg.index.capacity);
    build_picker_on(cfg, tokenizers, registry, index)
}

/// [`build_picker`] on a given index.
pub fn build_picker_on(
    cfg: &Config,
    tokenizers: HashMap<String, Arc<PromptTokenizer>>,
    registry: &mut Registry,
    index: Index,
) -> Arc<Picker> {
    let metrics = Arc::new(Metrics::new(registry, &cfg.tenants.metrics_allowlist));
    let capacity = cfg.workers.len() + cfg.discovery.max_workers();
    let workers = Arc::new(Workers::with_capacity(&cfg.workers, capacity));
    for w in workers.iter() {
        let block_size = cfg.model(&w.cfg.model).map_or(16, |m| m.block_size);
        index.register_worker(w.id, &w.cfg.model, block_size);
    }
    Arc::new(Picker::new(cfg, tokenizers, index, workers, metrics))
}

/// Starts everything; listeners are bound before this returns.
pub async fn start(cfg: Config) -> Result<Running, AppError> {
    let tokenizers = load_tokenizers(&cfg)?;
    let mut registry = Registry::default();
    let (index, redis) = build_index(&cfg, &mut registry).await?;
    let picker = build_picker_on(&cfg, tokenizers, &mut registry, index);
    let (workers, index, metrics) = (
        picker.workers().clone(),
        picker.index().clone(),
        picker.metrics().clone(),
    );
    let tenancy = Arc::new(Tenancy::new(
        cfg.tenants.clone(),
        Some(cfg.index.redis.url.as_str()).filter(|u| !u.is_empty()),
        &cfg.index.redis.key_prefix,
        Duration::from_secs(cfg.scoring.in_flight_ttl_s),
        TenancyMetrics::new(&mut registry, &cfg.tenants.metrics_allowlist),
    )?);
    // Redis: `always` writes every worker, `never` none, `auto` those whose
    // write lease this replica holds (fenced in Redis by its replica id).
    let writer = redis
        .as_ref()
        .map_or(WriterMode::Always, |r| r.config().writer);
    let leases = match &redis {
        Some(r) if writer == WriterMode::Auto => {
            let id = lease::replica_id();
            r.enable_fencing(&id);
            let managed = workers
                .iter()
                .filter(|w| w.cfg.kv_events.is_some())
                .map(|w| (w.id, w.cfg.name.clone()));
            Some(Arc::new(LeaseBoard::new(
                id,
                r.config().lease_ttl(),
                managed,
            )))
        }
        _ => None,
    };
    let debug = admin::DebugGate::from_config(
        &cfg.admin,
        std::env::var(crate::config::ADMIN_TOKEN_ENV).ok(),
    )?;
    let (shutdown, shutdown_rx) = watch::channel(false);

    let grpc = listen("grpc", &cfg.grpc_listen).await?;
    let admin = listen("admin", &cfg.admin_listen).await?;
    let grpc_addr = grpc.local_addr().expect("bound");
    let admin_addr = admin.local_addr().expect("bound");

    let mut tasks = Vec::new();
    if let Some(redis) = &redis {
        if writer == WriterMode::Always {
            purge_at_startup(redis, &index, &workers).await;
        }
        tasks.push(tokio::spawn(redis_upkeep(
            redis.clone(),
            index.clone(),
            workers.clone(),
            shutdown_rx.clone(),
        )));
        if let Some(board) = &leases {
            tasks.push(tokio::spawn(lease::run(
                redis.clone(),
                board.clone(),
                shutdown_rx.clone(),
            )));
        }
    }
    let gates = match &leases {
        Some(board) => streams::Gates::Leases(board.clone()),
        None => streams::Gates::Open,
    };
    let cleared_picker = picker.clone();
    let stream_ctx = (writer != WriterMode::Never).then(|| streams::StreamContext {
        index: index.clone(),
        on_cleared: Arc::new(move |slot| cleared_picker.worker_cleared(slot)),
        cfg: cfg.streams.clone(),
        down_after: cfg.scrape.down_after,
        metrics: metrics.clone(),
        shutdown: shutdown_rx.clone(),
        gates: gates.clone(),
    });
    match &stream_ctx {
        Some(ctx) => tasks.extend(streams::spawn_all(&workers, ctx)),
        None => streams::mark_disabled(&workers, &metrics),
    }
    let fleet = Arc::new(Fleet::new(
        picker.clone(),
        index.clone(),
        stream_ctx,
        leases.clone().zip(redis.clone()),
        cfg.models
            .iter()
            .map(|m| (m.name.clone(), m.block_size))
            .collect(),
    ));
    let discovery = match &cfg.discovery.kubernetes {
        Some(k8s) => {
            let (client, namespace) = discovery::watch::client(k8s).await?;
            let status = Arc::new(DiscoveryStatus::new(namespace, k8s.pools.len()));
            let dmetrics = DiscoveryMetrics::register(&mut registry);
            tracing::info!(namespace = %status.namespace, pools = k8s.pools.len(), "watching worker pods");
            tasks.push(tokio::spawn(discovery::watch::run(
                client,
                k8s.clone(),
                fleet.clone(),
                status.clone(),
                dmetrics,
                shutdown_rx.clone(),
            )));
            Some(status)
        }
        None => None,
    };
    tasks.push(tokio::spawn(housekeeping(
        picker.clone(),
        cfg.clone(),
        shutdown_rx.clone(),
    )));

    // A Pick carries the whole prompt: tonic's default 4 MB decode limit
    // would refuse the 4-8 MiB bodies the filter buffers.
    let replica = cfg.grpc.advertise.clone().unwrap_or_else(|| {
        std::env::var("POD_IP")
            .ok()
            .filter(|ip| !ip.is_empty())
            .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
            .map(|ip| SocketAddr::new(ip, grpc_addr.port()).to_string())
            .unwrap_or_default()
    });
    if tenancy.budgets_enabled() {
        let (tenancy, mut rx) = (tenancy.clone(), shutdown_rx.clone());
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(RESERVATION_SWEEP_EVERY);
            loop {
                tokio::select! {
                    _ = tick.tick() => tenancy.expire(Instant::now()).await,
                    _ = stopped(&mut rx) => break,
                }
            }
        }));
    }
    let service = RouterService::new(picker.clone(), replica.clone())
        .with_tenancy(tenancy)
        .with_shutdown(shutdown_rx.clone())
        .into_server()
        .max_decoding_message_size(cfg.grpc.max_message_bytes);
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = &cfg.grpc.tls {
        server = server.tls_config(server_tls(tls)?)?;
    }
    let mut rx = shutdown_rx.clone();
    tasks.push(tokio::spawn(async move {
        let result = server
            .add_service(service)
            .serve_with_incoming_shutdown(
                // Picks and reports are small frames on one long-lived HTTP/2
                // connection: without TCP_NODELAY a reply can sit behind
                // Nagle until the filter's delayed ACK (~40 ms).
                tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true)),
                stopped(&mut rx),
            )
            .await;
        if let Err(error) = result {
            tracing::error!(%error, "gRPC server failed");
        }
    }));

    let state = AdminState {
        picker: picker.clone(),
        workers: workers.clone(),
        index: index.clone(),
        registry: Arc::new(registry),
        tenant_header: cfg.tenants.header.clone(),
        readiness: match (&leases, writer) {
            (Some(board), _) => Readiness::Leases(board.clone()),
            (None, WriterMode::Never) => Readiness::Always,
            (None, _) => Readiness::Streams,
        },
        leases: leases.clone(),
        discovery,
        debug,
    };
    let mut rx = shutdown_rx.clone();
    tasks.push(tokio::spawn(async move {
        let result = axum::serve(admin, admin::router(state))
            .with_graceful_shutdown(async move { stopped(&mut rx).await })
            .await;
        if let Err(error) = result {
            tracing::error!(%error, "admin server failed");
        }
    }));
    tracing::info!(
        %grpc_addr,
        %admin_addr,
        workers = workers.len(),
        index = ?cfg.index.backend,
        writer = writer.as_str(),
        replica = leases.as_ref().map(|b| b.id()),
        advertise = %replica,
        "kvsteer-indexer started"
    );
    Ok(Running {
        grpc_addr,
        admin_addr,
        picker,
        index,
        leases,
        fleet,
        shutdown,
        tasks,
    })
}

/// Runs until `signal` completes, then shuts down.
pub async fn serve(cfg: Config, signal: impl Future<Output = ()>) -> Result<(), AppError> {
    let running = start(cfg).await?;
    signal.await;
    tracing::info!("shutting down");
    running.shutdown().await;
    Ok(())
}

// === impl Running ===

impl Running {
    /// Stops every task and waits for them (bounded).
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let mut tasks = self.tasks;
        // Discovery ends first (shutdown), so no worker joins after this.
        tasks.extend(self.fleet.take_tasks());
        for task in tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }

    /// Stops every task at once, as a crash would: nothing is released
    /// (write leases lapse after their TTL). Listeners close.
    pub async fn abort(self) {
        let mut tasks = self.tasks;
        tasks.extend(self.fleet.take_tasks());
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
    }
}

/// The rustls server config of `grpc.tls`: this server's identity and the
/// CA every client certificate must chain to (required).
fn server_tls(tls: &GrpcTlsConfig) -> Result<ServerTlsConfig, AppError> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|source| AppError::TlsFile {
            path: path.display().to_string(),
            source,
        })
    };
    Ok(ServerTlsConfig::new()
        .identity(Identity::from_pem(
            read(&tls.cert_file)?,
            read(&tls.key_file)?,
        ))
        .client_ca_root(Certificate::from_pem(read(&tls.client_ca_file)?))
        .client_auth_optional(false))
}

async fn listen(what: &'static str, addr: &str) -> Result<TcpListener, AppError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AppError::Listen {
            what,
            addr: addr.to_owned(),
            source,
        })
}

async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// A restarted writer has empty ingest maps, so it cannot derive removals
/// for what an earlier run stored: purge every worker before subscribing.
/// When Redis is down, the worker is marked for a resync instead (done by
/// [`redis_upkeep`] once Redis answers).
async fn purge_at_startup(redis: &RedisBackend, index: &Index, workers: &Workers) {
    if let Err(error) = redis.refresh_stats().await {
        // Don't wait a write budget per worker: resync them all later.
        tracing::warn!(%error, "redis unavailable at startup; picks score on load only until it answers");
        for w in workers.iter() {
            w.stream.mark_resync();
        }
        return;
    }
    for w in workers.iter() {
        if let Err(error) = index.reset_worker(w.id).await {
            tracing::warn!(worker = %w.cfg.name, %error, "cannot purge worker at startup; resync later");
            w.stream.mark_resync();
        }
    }
}

/// Every [`REDIS_UPKEEP_EVERY`]: ping Redis; when it answers, refresh the
/// index stats and resync the workers whose writes failed (a lease holder's
/// short outage; a longer one costs the lease, and the next holder purges
/// and replays anyway).
async fn redis_upkeep(
    redis: Arc<RedisBackend>,
    index: Index,
    workers: Arc<Workers>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(REDIS_UPKEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stopped(&mut shutdown) => return,
            _ = tick.tick() => {}
        }
        if let Err(error) = redis.ping().await {
            tracing::debug!(%error, "redis ping failed");
            continue;
        }
        for w in workers.iter() {
            if w.cfg.kv_events.is_some() {
                w.stream.request_resync();
            } else if w.stream.take_resync()
                && let Err(error) = index.reset_worker(w.id).await
            {
                // No subscriber to stop: only the startup purge to redo.
                tracing::debug!(worker = %w.cfg.name, %error, "purge failed");
                w.stream.mark_resync();
            }
        }
        if let Err(error) = redis.refresh_stats().await {
            tracing::debug!(%error, "redis stats refresh failed");
        }
    }
}

/// Every scrape interval: scrape worker metrics, expire stale ledger
/// entries and tombstones (the only place they expire), refresh gauges.
async fn housekeeping(picker: Arc<Picker>, cfg: Config, mut shutdown: watch::Receiver<bool>) {
    let client = scrape::http_client();
    let timeout = Duration::from_millis(cfg.scrape.timeout_ms);
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.scrape.interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stopped(&mut shutdown) => return,
            _ = tick.tick() => {}
        }
        let workers: Vec<_> = picker.workers().iter().collect();
        let scrapes = workers.iter().filter_map(|w| {
            let url = w.cfg.metrics.as_deref()?;
            let client = &client;
            Some(async move {
                let r = scrape::scrape(client, url, w.cfg.data_parallel_rank, timeout).await;
                if let Err(error) = &r {
                    tracing::debug!(worker = %w.cfg.name, %error, "scrape failed");
                }
                w.health.record(r, Instant::now());
                // The adapters it serves (kept as they were when this fails).
                if let Some(models) = scrape::models_url(url) {
                    match scrape::adapters(client, &models, timeout).await {
                        Ok(adapters) => w.set_adapters(adapters),
                        Err(error) => {
                            tracing::debug!(worker = %w.cfg.name, %error, "model list scrape failed");
                        }
                    }
                }
            })
        });
        futures::future::join_all(scrapes).await;
        picker.housekeep(Instant::now());
        for w in workers.iter().filter(|w| !w.is_retired()) {
            let labels = Metrics::worker(&w.cfg.name);
            let up = w.is_up(cfg.scrape.down_after);
            picker
                .metrics()
                .worker_up
                .get_or_create(&labels)
                .set(i64::from(up));
        }
    }
}
