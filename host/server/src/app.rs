//! The orchestrator: builds the [`AppContext`] once (stores, services, keys), binds every
//! listener before serving any request, runs background upkeep, and owns graceful
//! shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use homeserver_protocol::Keypair;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::client_server;
use crate::config::Config;
use crate::persistence::sqlite::SqliteStore;
use crate::persistence::{BlobStore, MetadataStore};
use crate::server_key;
use crate::service::events::EventHub;
use crate::service::now_secs;
use crate::service::signup::SignupService;
use crate::service::storage::{StorageLimits, StorageService};

/// How often expired replay marks are purged.
const REPLAY_PURGE_INTERVAL: Duration = Duration::from_secs(60);
/// How often unreferenced blobs are swept, and how old one must be to go.
const BLOB_SWEEP_INTERVAL: Duration = Duration::from_secs(3600);
const BLOB_SWEEP_MIN_AGE: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("metadata store: {0}")]
    Metadata(#[from] crate::persistence::StoreError),
    #[error("event hub: {0}")]
    Events(#[from] crate::service::ServiceError),
    #[error("blob store: {0}")]
    Blobs(#[from] crate::persistence::BlobError),
    #[error(transparent)]
    ServerKey(#[from] server_key::ServerKeyError),
    #[error("cannot listen on {address} ({listener}): {source}")]
    Bind {
        listener: &'static str,
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// Everything a request handler may need, built once.
pub struct AppContext {
    pub config: Config,
    pub metadata: Arc<dyn MetadataStore>,
    pub blobs: BlobStore,
    pub storage: StorageService,
    pub signup: SignupService,
    pub events: Arc<EventHub>,
    pub server_key: Keypair,
    sqlite: Option<Arc<SqliteStore>>,
}

impl AppContext {
    /// Builds every store and service; `shutdown` ends live streams and background work.
    pub async fn build(config: Config, shutdown: CancellationToken) -> Result<Self, StartError> {
        let sqlite = Arc::new(SqliteStore::open(&config.storage.database_url).await?);
        let metadata: Arc<dyn MetadataStore> = sqlite.clone();
        let blobs = BlobStore::open(&config.storage.blobs)?;
        let server_key = server_key::load_or_create(&config.keys.secret_key_file)?;
        let limits = StorageLimits {
            max_value_bytes: config.storage.max_value_bytes,
            quota_bytes: config.storage.quota_bytes,
        };
        let events = EventHub::new(metadata.clone(), shutdown).await?;
        Ok(Self {
            storage: StorageService::new(metadata.clone(), blobs.clone(), limits, events.clone()),
            events,
            signup: SignupService::new(metadata.clone(), config.signup.mode),
            metadata,
            blobs,
            server_key,
            sqlite: Some(sqlite),
            config,
        })
    }
}

/// A running homeserver.
pub struct Homeserver {
    context: Arc<AppContext>,
    http_addr: SocketAddr,
    shutdown: CancellationToken,
    tasks: JoinSet<()>,
}

impl Homeserver {
    /// Builds the context, binds every listener, then starts serving.
    pub async fn start(config: Config) -> Result<Self, StartError> {
        let shutdown = CancellationToken::new();
        let context = Arc::new(AppContext::build(config, shutdown.clone()).await?);
        let address = context.config.http.listen;
        let http = TcpListener::bind(address)
            .await
            .map_err(|source| StartError::Bind {
                listener: "http",
                address,
                source,
            })?;
        let http_addr = http.local_addr().map_err(|source| StartError::Bind {
            listener: "http",
            address,
            source,
        })?;

        let mut tasks = JoinSet::new();

        let router = client_server::router(context.clone())
            .into_make_service_with_connect_info::<SocketAddr>();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            // Without TCP_NODELAY a response written in two parts (headers, then a
            // streamed body) waits ~40 ms for the peer's delayed ACK.
            let http = http.tap_io(|tcp| {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(error = %e, "could not set TCP_NODELAY");
                }
            });
            let served = axum::serve(http, router)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "http listener failed");
            }
        });
        tracing::info!(listener = "http", address = %http_addr, "listening");
        tracing::info!(public_key = %context.server_key.public_key(), "server identity");

        tasks.spawn(context.events.clone().run_tailer());
        tasks.spawn(purge_replay_marks(context.clone(), shutdown.clone()));
        tasks.spawn(sweep_blobs(context.clone(), shutdown.clone()));

        Ok(Self {
            context,
            http_addr,
            shutdown,
            tasks,
        })
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn context(&self) -> &Arc<AppContext> {
        &self.context
    }

    /// Stops accepting, lets in-flight requests finish, then closes the stores.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        while self.tasks.join_next().await.is_some() {}
        if let Some(sqlite) = &self.context.sqlite {
            sqlite.close().await;
        }
    }

    /// Serves until SIGINT or SIGTERM, then shuts down gracefully.
    pub async fn run_until_signal(self) {
        wait_for_signal().await;
        tracing::info!("shutting down");
        self.shutdown().await;
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn purge_replay_marks(context: Arc<AppContext>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(REPLAY_PURGE_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = context.metadata.purge_replay_marks(now_secs()).await {
            tracing::warn!(error = %e, "purging replay marks failed");
        }
    }
}

async fn sweep_blobs(context: Arc<AppContext>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(BLOB_SWEEP_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match context
            .blobs
            .sweep(context.metadata.as_ref(), BLOB_SWEEP_MIN_AGE)
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "swept unreferenced blobs"),
            Err(e) => tracing::warn!(error = %e, "blob sweep failed"),
        }
    }
}
