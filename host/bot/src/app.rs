//! Builds the bot (identity, database, homeserver account, index, guests, providers,
//! bus) and runs it: the health server, the index follower, the poller and every stage,
//! until a signal; then they stop, and the database closes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use homeserver_runtime::{PolicyRuntime, RuntimeConfig};
use pk_client::PkClient;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::bus::InProcessBus;
use crate::config::{BotConfig, IndexKind};
use crate::context::{BotContext, StatusBoard};
use crate::identity;
use crate::index::Index;
use crate::index::embedded::EmbeddedIndex;
use crate::index::nexus::NexusIndex;
use crate::metrics::Metrics;
use crate::post::MentionMatcher;
use crate::providers::openai::OpenAiCompatible;
use crate::providers::search::WebSearch;
use crate::providers::{AiModel, SearchApi};
use crate::store::Store;
use crate::{health, pipeline, poller};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Identity(#[from] identity::IdentityError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("homeserver {url}: {message}")]
    Homeserver { url: String, message: String },
    #[error("guests: {0}")]
    Guests(#[from] homeserver_runtime::RuntimeError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Stage(#[from] crate::workers::StageError),
}

/// A running bot.
pub struct Bot {
    context: Arc<BotContext>,
    /// Reloads the guests when `policies/` changes (dropped: stops watching).
    _watch: Option<homeserver_runtime::WatchHandle>,
    tasks: JoinSet<()>,
    stop: CancellationToken,
    http_addr: SocketAddr,
}

impl Bot {
    /// Builds everything and starts every task.
    pub async fn start(config: BotConfig) -> Result<Self, StartError> {
        let (keypair, created) =
            identity::load_or_create(&config.identity.mnemonic, &config.identity.mnemonic_file)?;
        let key = keypair.public_key();
        if created {
            tracing::info!(
                botPubky = %key,
                file = %config.identity.mnemonic_file.display(),
                "made a new identity (its 12 words are in the file: keep them safe)"
            );
        }
        let metrics = Arc::new(Metrics::new()?);
        let store = Store::open(
            &config.storage.database_url,
            metrics.db_query_duration.clone(),
        )
        .await?;
        let homeserver_error = |message: String| StartError::Homeserver {
            url: config.homeserver.url.clone(),
            message,
        };
        let homeserver = PkClient::new(&config.homeserver.url, Some(keypair.clone()))
            .map_err(|e| homeserver_error(e.to_string()))?;
        let reader = PkClient::new(&config.homeserver.url, None)
            .map_err(|e| homeserver_error(e.to_string()))?;
        let matcher = MentionMatcher::new(&key, &config.identity.handles);
        let stop = CancellationToken::new();
        let mut tasks = JoinSet::new();

        let index: Arc<dyn Index> = match config.index.kind {
            IndexKind::Embedded => {
                let embedded = EmbeddedIndex::new(reader, store.clone(), matcher.clone());
                tasks.spawn(embedded.clone().follow(
                    Duration::from_millis(config.index.follow_interval_ms),
                    stop.clone(),
                ));
                embedded
            }
            IndexKind::Nexus => Arc::new(NexusIndex::new(
                &config.index.nexus_url,
                &key,
                Duration::from_secs(config.search.timeout_secs.max(10)),
                Duration::from_secs(config.poller.max_age_secs),
            )),
        };
        let guests = Arc::new(PolicyRuntime::load(RuntimeConfig {
            policies_dir: config.policies.dir.clone(),
            ..RuntimeConfig::default()
        })?);
        // Operators swap a wordlist or a module without a restart, as on the homeserver.
        let watch = match guests.watch() {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::warn!(error = %e, "not watching the policies directory");
                None
            }
        };
        let ai: Option<Arc<dyn AiModel>> = config.ai.enabled().then(|| {
            Arc::new(OpenAiCompatible::new(
                config.ai.base(),
                &config.ai.api_key,
                &config.ai.model,
                Duration::from_secs(config.ai.timeout_secs),
            )) as Arc<dyn AiModel>
        });
        let search: Option<Arc<dyn SearchApi>> = WebSearch::new(
            &config.search.provider,
            &config.search.base_url,
            &config.search.api_key,
            Duration::from_secs(config.search.timeout_secs),
        )
        .map(|s| Arc::new(s) as Arc<dyn SearchApi>);
        let providers: Vec<&str> = ai
            .iter()
            .map(|a| a.name())
            .chain(search.iter().map(|s| s.name()))
            .collect();
        metrics.prepare(&providers);
        tracing::info!(
            botPubky = %key,
            homeserver = %config.homeserver.url,
            index = index.kind(),
            aiProvider = ai.as_ref().map_or("local", |a| a.name()),
            search = search.as_ref().map_or("none", |s| s.name()),
            "starting"
        );

        let listener = TcpListener::bind(config.http.listen)
            .await
            .map_err(|source| StartError::Bind {
                address: config.http.listen,
                source,
            })?;
        let http_addr = listener.local_addr().map_err(|source| StartError::Bind {
            address: config.http.listen,
            source,
        })?;
        let context = Arc::new(BotContext {
            config,
            key,
            homeserver,
            store,
            bus: Arc::new(InProcessBus::new()),
            index,
            guests,
            ai,
            search,
            matcher,
            metrics,
            status: StatusBoard::default(),
        });
        tracing::info!(listen = %http_addr, "health and metrics");
        {
            let stop = stop.clone();
            let app = health::router(context.clone());
            tasks.spawn(async move {
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(stop.cancelled_owned())
                    .await;
            });
        }
        tasks.spawn(sign_up(context.clone(), stop.clone()));
        pipeline::start(&context, &mut tasks, &stop);
        pipeline::recover(&context).await?;
        tasks.spawn(poller::run(context.clone(), stop.clone()));
        tasks.spawn(purge_keys(context.clone(), stop.clone()));
        Ok(Self {
            context,
            _watch: watch,
            tasks,
            stop,
            http_addr,
        })
    }

    pub fn context(&self) -> &Arc<BotContext> {
        &self.context
    }

    /// Where health and metrics listen.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Stops every task and closes the database.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        let drain = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(10), drain)
            .await
            .is_err()
        {
            tracing::warn!("some tasks did not stop within 10 s");
            self.tasks.abort_all();
        }
        self.context.store.close().await;
    }

    /// Runs until SIGINT or SIGTERM, then shuts down.
    pub async fn run_until_signal(self) {
        wait_for_signal().await;
        tracing::info!("stopping");
        self.shutdown().await;
    }
}

/// Signs the bot up on its homeserver (idempotent), retrying until it works: replies
/// need the account, but health and the index do not.
async fn sign_up(ctx: Arc<BotContext>, stop: CancellationToken) {
    let token = Some(ctx.config.homeserver.signup_token.as_str()).filter(|t| !t.is_empty());
    let mut wait = Duration::from_secs(1);
    loop {
        match ctx.homeserver.signup_status(token).await {
            Ok(status) => {
                ctx.status
                    .signed_up
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(botPubky = %ctx.key, created = status.created, "signed up on the homeserver");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, retryInSecs = wait.as_secs(), "cannot sign up on the homeserver yet");
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(Duration::from_secs(60));
    }
}

/// Forgets expired idempotency keys every hour.
async fn purge_keys(ctx: Arc<BotContext>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(3600));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = ctx.store.purge_expired_keys().await {
            tracing::warn!(error = %e, "could not purge expired idempotency keys");
        }
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut term) = signal(SignalKind::terminate()) else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
