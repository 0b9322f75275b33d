//! Builds the bot (identity, database, homeserver account, index, guests, providers,
//! bus) and runs its part of the pipeline until a signal; then it stops, and the
//! database closes. Which part (`pipeline::Role`):
//! - with the in-process bus, everything: the index follower, the poller and every
//!   stage;
//! - with the Redis bus and no `WORKER_TYPE`, the leader's part (index follower,
//!   poller, router, publisher) while it holds the lease (`lease`), standing by while
//!   another process does;
//! - with `WORKER_TYPE`, the workers of that type.
//!
//! Every process serves health and metrics.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use homeserver_runtime::{PolicyRuntime, RuntimeConfig};
use pk_client::PkClient;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::bus::{Bus, InProcessBus, RedisBus};
use crate::config::{BotConfig, BusKind, IndexKind};
use crate::context::{BotContext, StatusBoard};
use crate::identity;
use crate::index::Index;
use crate::index::embedded::EmbeddedIndex;
use crate::index::nexus::NexusIndex;
use crate::lease::Lease;
use crate::metrics::Metrics;
use crate::pipeline::Role;
use crate::post::MentionMatcher;
use crate::providers::chain::{AiChain, CallLog, Retry, SearchChain};
use crate::providers::openai::OpenAiCompatible;
use crate::providers::search::WebSearch;
use crate::providers::{AiModel, ProviderError, SearchApi};
use crate::shared::{RedisShared, SharedState};
use crate::store::{ActionType, Store};
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
    #[error("the Redis bus at {url}: {source}")]
    Bus {
        url: String,
        source: crate::bus::BusError,
    },
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
        let (keypair, created) = identity::load_or_create(
            config.identity.mnemonic.expose(),
            &config.identity.mnemonic_file,
        )?;
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
            config.storage.database_url.expose(),
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
        let role = match config.workers.worker_type.as_str() {
            "summary" => Role::Worker(ActionType::Summary),
            "factcheck" => Role::Worker(ActionType::Factcheck),
            _ if config.bus.kind == BusKind::Redis => Role::Leader,
            _ => Role::All,
        };
        let (bus, shared, redis): (Arc<dyn Bus>, SharedState, Option<Arc<RedisBus>>) = match config
            .bus
            .kind
        {
            BusKind::InProcess => (
                Arc::new(InProcessBus::new()),
                SharedState::Database(store.clone(), Default::default()),
                None,
            ),
            BusKind::Redis => {
                let bus = Arc::new(
                    RedisBus::connect(config.bus.redis(), metrics.redis_operations.clone())
                        .await
                        .map_err(|source| StartError::Bus {
                            url: config.bus.redis_url.redacted(),
                            source,
                        })?,
                );
                let shared =
                    SharedState::Redis(RedisShared::new(&bus, metrics.redis_operations.clone()));
                (bus.clone(), shared, Some(bus))
            }
        };

        // The embedded index is followed by the process that polls (the leader).
        let mut follower = None;
        let index: Arc<dyn Index> = match config.index.kind {
            IndexKind::Embedded => {
                let embedded = EmbeddedIndex::new(reader, store.clone(), matcher.clone());
                follower = Some(embedded.clone());
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
        metrics.register_guests(guests.clone())?;
        // Operators swap a wordlist or a module without a restart, as on the homeserver.
        let watch = match guests.watch() {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::warn!(error = %e, "not watching the policies directory");
                None
            }
        };
        let status = Arc::new(StatusBoard::default());
        let (ai, search, provider_names) = providers(&config, &metrics, &status);
        let names: Vec<&str> = provider_names.iter().map(String::as_str).collect();
        metrics.prepare(&names);
        tracing::info!(
            botPubky = %key,
            homeserver = %config.homeserver.url,
            index = index.kind(),
            role = role.name(),
            bus = bus.kind(),
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
            shared,
            bus,
            index,
            guests,
            ai,
            search,
            matcher,
            metrics,
            status,
            unpublished: std::sync::Mutex::new(Vec::new()),
            routing_locks: Default::default(),
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
        context.status.set_role(role.name());
        match (role, redis) {
            (Role::Worker(_), _) => pipeline::start(&context, role, &mut tasks, &stop).await?,
            (Role::Leader, Some(redis)) => {
                let lease = Lease::new(
                    redis.connection(),
                    redis.key("pkbot:leader"),
                    format!("{}-{}", crate::bus::redis::process_name(), context.key),
                    Duration::from_millis(context.config.bus.lease_ttl_ms),
                );
                tasks.spawn(lead(context.clone(), follower, lease, redis, stop.clone()));
            }
            _ => run_leader_stages(&context, follower, role, &mut tasks, &stop).await?,
        }
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

/// The configured providers: AI, search, and the names of every member.
type Providers = (
    Option<Arc<dyn AiModel>>,
    Option<Arc<dyn SearchApi>>,
    Vec<String>,
);

/// The AI and search providers, each a chain of the configured one and its fallbacks
/// with retries, reporting every call to the metrics and the health board; and the
/// names of all of them.
fn providers(config: &BotConfig, metrics: &Arc<Metrics>, status: &Arc<StatusBoard>) -> Providers {
    let log: CallLog = {
        let (metrics, status) = (metrics.clone(), status.clone());
        Arc::new(
            move |provider: &str, error: Option<&ProviderError>, tokens: u64| {
                status.provider_called(
                    provider,
                    crate::store::now_secs(),
                    error.map(ToString::to_string),
                );
                metrics
                    .ai_api_calls
                    .with_label_values(&[provider, if error.is_none() { "ok" } else { "error" }])
                    .inc();
                if tokens > 0 {
                    metrics
                        .ai_tokens_used
                        .with_label_values(&[provider])
                        .inc_by(tokens);
                }
            },
        )
    };
    let mut names = Vec::new();
    let ai = config.ai.enabled().then(|| {
        let timeout = Duration::from_secs(config.ai.timeout_secs);
        let schemas = config.ai.json_mode == "json_schema";
        let mut members: Vec<Arc<dyn AiModel>> = vec![Arc::new(
            OpenAiCompatible::new(
                config.ai.base(),
                config.ai.api_key.expose(),
                &config.ai.model,
                timeout,
            )
            .sending_schemas(schemas),
        )];
        for f in &config.ai.fallbacks {
            members.push(Arc::new(
                OpenAiCompatible::new(&f.base_url, f.api_key.expose(), &f.model, timeout)
                    .sending_schemas(schemas),
            ));
        }
        names.extend(members.iter().map(|m| m.name().to_owned()));
        let retry = Retry {
            retries: config.ai.max_retries,
            max_wait: Duration::from_secs(config.ai.max_retry_wait_secs),
            base: Duration::from_millis(500),
        };
        Arc::new(AiChain::new(members, retry, log.clone())) as Arc<dyn AiModel>
    });
    let timeout = Duration::from_secs(config.search.timeout_secs);
    let members: Vec<Arc<dyn SearchApi>> = std::iter::once((
        config.search.provider.as_str(),
        config.search.base_url.as_str(),
        config.search.api_key.expose(),
    ))
    .chain(
        config
            .search
            .fallbacks
            .iter()
            .map(|f| (f.provider.as_str(), f.base_url.as_str(), f.api_key.expose())),
    )
    .filter_map(|(kind, base, key)| WebSearch::new(kind, base, key, timeout))
    .map(|s| Arc::new(s) as Arc<dyn SearchApi>)
    .collect();
    names.extend(members.iter().map(|m| m.name().to_owned()));
    let search = (!members.is_empty()).then(|| {
        let retry = Retry {
            retries: config.search.max_retries,
            max_wait: Duration::from_secs(config.search.max_retry_wait_secs),
            base: Duration::from_millis(500),
        };
        Arc::new(SearchChain::new(members, retry, log)) as Arc<dyn SearchApi>
    });
    names.sort();
    names.dedup();
    (ai, search, names)
}

/// Starts what the leader runs: sign-up, the index follower, the router and
/// publisher (and in process the workers), what the last stop left unfinished, the
/// poller, the key purge.
async fn run_leader_stages(
    ctx: &Arc<BotContext>,
    follower: Option<Arc<EmbeddedIndex>>,
    role: Role,
    tasks: &mut JoinSet<()>,
    stop: &CancellationToken,
) -> Result<(), StartError> {
    tasks.spawn(sign_up(ctx.clone(), stop.clone()));
    if let Some(embedded) = follower {
        tasks.spawn(embedded.follow(
            Duration::from_millis(ctx.config.index.follow_interval_ms),
            stop.clone(),
        ));
    }
    pipeline::start(ctx, role, tasks, stop).await?;
    pipeline::recover(ctx).await?;
    tasks.spawn(poller::run(ctx.clone(), stop.clone()));
    tasks.spawn(purge_keys(ctx.clone(), stop.clone()));
    Ok(())
}

/// With the Redis bus: waits for the leader lease, leads while it holds it, and stands
/// by again if it loses it; gives it up at a clean stop.
///
/// A standby sleeps until the holder's lease would expire (its `PTTL`) and tries then,
/// so it takes over within one lease lifetime of the holder's last renewal. Having
/// taken it, it raises the database's fence to its token before anything else (see
/// `store::Fence`): from then on nothing the previous holder does lands, even if it
/// was only frozen.
///
/// The lease is renewed from the moment it is taken, beside the leader's start (which
/// may take a while: sign-up, recovery), each renewal bounded by a third of its
/// lifetime. When a renewal says the lease is someone else's, or none has succeeded for
/// longer than the lifetime minus one period (counted from when the last successful
/// one was sent), the leader's tasks are aborted at once: by the time another process
/// can take the lease, this one has stopped. Every write and publish of its stages
/// checks the lease too (the fence), for a process that resumes after a freeze.
async fn lead(
    ctx: Arc<BotContext>,
    follower: Option<Arc<EmbeddedIndex>>,
    lease: Lease,
    redis: Arc<RedisBus>,
    stop: CancellationToken,
) {
    let lease = Arc::new(lease);
    let period = lease.period();
    loop {
        ctx.status.set_role("standby");
        let mut waiting_said = false;
        let taken = loop {
            let sent = std::time::Instant::now();
            let wait = match lease.acquire().await {
                Ok(Some(token)) => match ctx.store.raise_fence(token, lease.holder()).await {
                    Ok(None) => break (token, sent),
                    Ok(Some(higher)) => {
                        // Redis lost the counter: move it past the database's fence
                        // and take a new token.
                        tracing::warn!(
                            token,
                            fence = higher,
                            "the lease's token is behind the database's fence: drawing a new one"
                        );
                        let _ = lease.advance_token(higher).await;
                        let _ = lease.release().await;
                        Duration::ZERO
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot raise the database's fence: not leading yet");
                        let _ = lease.release().await;
                        period
                    }
                },
                Ok(None) => {
                    if !waiting_said {
                        waiting_said = true;
                        let holder = lease.current_holder().await.ok().flatten();
                        tracing::info!(
                            holder = holder.as_deref().unwrap_or(""),
                            "another process leads (poller, router, publisher): standing by"
                        );
                    }
                    // Try again when the holder's lease would expire.
                    match lease.expires_in().await {
                        Ok(Some(left)) => (left + Duration::from_millis(5)).min(lease.ttl()),
                        Ok(None) => Duration::ZERO,
                        Err(_) => period,
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot reach Redis for the leader lease");
                    period
                }
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        };
        let (token, sent) = taken;
        ctx.store.fence().lead(token, sent + lease.ttl());
        redis.set_fence(lease.value());
        tracing::info!(
            holder = lease.holder(),
            fencingToken = token,
            "took the leader lease: running the poller, router and publisher"
        );
        ctx.status.set_role("leader");
        let term = stop.child_token();
        let renewing = tokio::spawn(keep_lease(lease.clone(), ctx.clone(), sent, term.clone()));
        let mut tasks = JoinSet::new();
        let started =
            run_leader_stages(&ctx, follower.clone(), Role::Leader, &mut tasks, &term).await;
        if let Err(e) = &started {
            tracing::error!(error = %e, "cannot start leading; trying again");
            term.cancel();
        }
        term.cancelled().await;
        // Lost, or never started: either way not a stop.
        let lost = renewing.await.unwrap_or(true) || started.is_err();
        if lost {
            ctx.store.fence().lose();
            // No draining: another process may lead already.
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
            if started.is_ok() {
                tracing::error!("lost the leader lease: stopped leading");
            }
        } else {
            let drain = async { while tasks.join_next().await.is_some() {} };
            if tokio::time::timeout(Duration::from_secs(10), drain)
                .await
                .is_err()
            {
                tasks.abort_all();
            }
            ctx.store.fence().lose();
        }
        let _ = lease.release().await;
        if !lost || stop.is_cancelled() {
            return;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

/// Renews the lease every period until `term` (a stop: returns false) or until it is
/// lost (cancels `term`, returns true). Each renewal extends how long this process's
/// writes are fenced in (from when it was sent).
async fn keep_lease(
    lease: Arc<Lease>,
    ctx: Arc<BotContext>,
    taken: std::time::Instant,
    term: CancellationToken,
) -> bool {
    let period = lease.period();
    let ttl = lease.ttl();
    let mut renewed = taken;
    loop {
        tokio::select! {
            _ = term.cancelled() => return false,
            _ = tokio::time::sleep(period) => {}
        }
        // A process that was frozen wakes here late: past its lease, its writes stop
        // at once (the fence), before the renewal below finds the lease gone.
        if renewed.elapsed() >= ttl {
            ctx.store.fence().lose();
        }
        let sent = std::time::Instant::now();
        match tokio::time::timeout(period, lease.renew()).await {
            Ok(Ok(true)) => {
                renewed = sent;
                ctx.store.fence().extend(sent + ttl);
            }
            Ok(Ok(false)) => {
                tracing::error!("the leader lease is held by another process");
                return lost(&ctx, &term).await;
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot renew the leader lease"),
            Err(_) => tracing::warn!("renewing the leader lease timed out"),
        }
        // The next try would come too late to be sure nobody else took it.
        if renewed.elapsed() + period >= ttl {
            tracing::error!("could not renew the leader lease in time");
            return lost(&ctx, &term).await;
        }
    }
}

/// The lease is lost: the fence refuses this process's writes, and its stages stop
/// (`term`). Returns true (lost).
async fn lost(ctx: &BotContext, term: &CancellationToken) -> bool {
    ctx.store.fence().lose();
    if crate::failpoint::skip("stop-on-lease-loss") {
        // A process whose stages go on past its lease (the tests): only the fence
        // stands between them and the new leader's work.
        tracing::warn!("failpoint skip:stop-on-lease-loss: the stages go on");
        term.cancelled().await;
        return false;
    }
    term.cancel();
    true
}

/// Signs the bot up on its homeserver (idempotent), retrying until it works: replies
/// need the account, but health and the index do not.
async fn sign_up(ctx: Arc<BotContext>, stop: CancellationToken) {
    let token = Some(ctx.config.homeserver.signup_token.expose()).filter(|t| !t.is_empty());
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
