//! The orchestrator: builds the [`AppContext`] once (stores, services, keys), binds every
//! listener before serving any request, runs background upkeep, and owns graceful
//! shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use homeserver_protocol::Keypair;
use homeserver_runtime::{PolicyRuntime, RuntimeConfig};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::access_log::AccessLog;
use crate::config::{Config, PolicyStartMode};
use crate::metrics::Metrics;
use crate::persistence::{self, BlobStore};
use crate::rate_limit::RateLimits;
use crate::server_key;
use crate::service::access::AccessControl;
use crate::service::admin::AdminService;
use crate::service::entry_cache::EntryCache;
use crate::service::events::EventHub;
use crate::service::maintenance::Stores;
use crate::service::now_secs;
use crate::service::readiness::{self, ReadinessBoard};
use crate::service::sessions::{EXPIRED_RETENTION_SECS, SessionService};
use crate::service::signup::SignupService;
use crate::service::storage::{StorageLimits, StorageService};
use crate::{admin_server, client_server, metrics_server, serve, tls};

/// How often expired replay marks are purged.
const REPLAY_PURGE_INTERVAL: Duration = Duration::from_secs(60);
/// How often the whole blob store is walked for unreferenced blobs (how old one must be
/// to go: `Config::orphan_min_age`).
const BLOB_SWEEP_INTERVAL: Duration = Duration::from_secs(3600);
/// How often retired blobs whose grace has passed are deleted (an indexed query: cheap),
/// at most; sooner when `storage.blob_grace_secs` is shorter.
const RETIRED_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// The lease that makes one instance at a time sweep a shared store, and how long it
/// lasts unless renewed: an instance that dies holding it is replaced after this. (Two
/// sweeps at once would only repeat work: deleting a blob twice is harmless.)
const SWEEP_LEASE: &str = "blob-sweep";
const SWEEP_LEASE_SECS: i64 = 300;

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
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("guest runtime: {0}")]
    Runtime(#[from] homeserver_runtime::RuntimeError),
    #[error("guest runtime: {0}")]
    RuntimeStart(String),
    #[error("TLS certificate: {0}")]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    StorageInUse(#[from] crate::persistence::LockError),
    #[error(transparent)]
    RelativePaths(#[from] crate::local_paths::RelativeInRoot),
    #[error(
        "{0}\nFix or remove the module (a slot with no module in policies.toml is served by \
         the built-in guest), check it with `homeserver policy check FILE --slot SLOT`, or \
         set policies.on_start_error = \"safe-default\" to start anyway with the slot on its \
         safe default (the capability policy then answers 503 to every request it decides)"
    )]
    PolicyLoad(String),
    #[error("cannot listen on {address} ({listener}): {source}")]
    Bind {
        listener: &'static str,
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// Everything a request handler may need, built once. Routes reach data only through
/// the services (`storage`, `signup`, `events`, `admin`, `access`, `identity`): the
/// stores under them are private to this module, for the orchestrator's upkeep (and,
/// with the `test-support` feature, for tests that inspect or damage them).
pub struct AppContext {
    pub config: Config,
    stores: Stores,
    pub storage: StorageService,
    pub signup: SignupService,
    pub events: Arc<EventHub>,
    pub admin: AdminService,
    pub access: AccessControl,
    pub policy: Arc<PolicyRuntime>,
    pub metrics: Arc<Metrics>,
    pub rate_limits: RateLimits,
    pub stream_slots: crate::stream_slots::StreamSlots,
    pub identity: crate::service::identity::IdentityService,
    /// What the pkarr publisher did last.
    pub pkarr: Arc<crate::pkarr_publish::PkarrBoard>,
    /// The last readiness check (`GET /ready`, `hs_backend_up`).
    pub readiness: ReadinessBoard,
    pub server_key: Keypair,
    /// Users known to exist (a positive cache for rate limiting: keys are free to make,
    /// so only signed-up users get a bucket of their own).
    known_users: quick_cache::sync::Cache<String, ()>,
}

impl AppContext {
    /// Whether `user` (z32) has signed up; cached once seen.
    pub async fn known_user(&self, user: &str) -> bool {
        if self.known_users.get(user).is_some() {
            return true;
        }
        match self.stores.metadata.user(user).await {
            Ok(Some(_)) => {
                self.known_users.insert(user.to_owned(), ());
                true
            }
            _ => false,
        }
    }

    /// Checks readiness now (see [`crate::service::readiness`]): keeps the result for
    /// the probes, sets the gauges, and logs what changed.
    pub async fn check_readiness(&self) {
        let (now, before) = self.readiness.check(&self.admin, &self.policy).await;
        let stores = [
            ("metadata", &now.backends.metadata),
            ("blobs", &now.backends.blobs),
        ];
        for (label, store) in stores {
            self.metrics.backend_up(label).set(i64::from(store.is_ok()));
        }
        self.metrics.ready.set(i64::from(now.is_ready()));
        let problems = now.problems();
        if problems == before.problems() {
            return;
        }
        if problems.is_empty() {
            tracing::info!("ready: the stores answer and the guests serve");
        } else {
            // The causes (host names, paths) go to the log only, never to a probe.
            tracing::warn!(
                metadata_error = now.backends.metadata.error.as_deref(),
                blobs_error = now.backends.blobs.error.as_deref(),
                "not ready: {}",
                problems.join("; ")
            );
        }
    }

    /// Forgets a deleted user.
    pub fn forget_user(&self, user: &str) {
        self.known_users.remove(user);
    }

    /// The stores under the services, for tests that read or damage them behind the
    /// services' back. Only built with the `test-support` feature (the server's own tests
    /// turn it on), so no route can take this door.
    #[cfg(feature = "test-support")]
    pub fn stores(&self) -> &Stores {
        &self.stores
    }

    /// Builds every store and service; `shutdown` ends live streams and background work.
    pub async fn build(config: Config, shutdown: CancellationToken) -> Result<Self, StartError> {
        let metadata = persistence::open_metadata(
            &config.storage.database_url,
            &config.storage.backend_options(),
        )
        .await?;
        tracing::info!(database = %config.storage.database_url, blobs = %config.storage.blobs, "storage");
        let blobs = BlobStore::open(
            &config.storage.blobs,
            &config.s3,
            &config.storage.backend_options(),
        )?;
        let server_key = server_key::load_or_create(&config.keys.secret_key_file)?;
        let limits = StorageLimits {
            max_value_bytes: config.storage.max_value_bytes,
            quota_bytes: config.storage.quota_bytes,
            body_idle_timeout: Duration::from_secs(config.http.body_idle_timeout_secs),
            upload_timeout: Duration::from_secs(config.http.upload_timeout_secs),
            unproven_upload_memory_bytes: config.http.unproven_upload_memory_bytes,
        };
        let policy = Arc::new(load_policies(&config).await?);
        // Read-after-write across instances: a process cannot know in time what other
        // instances wrote, so it caches entries only from a store it owns.
        let entry_cache = Arc::new(match metadata.shared() {
            false => EntryCache::default(),
            true => EntryCache::disabled(),
        });
        let events = EventHub::new(
            metadata.clone(),
            entry_cache.clone(),
            shutdown,
            Duration::from_millis(config.storage.events_poll_ms),
        )
        .await?;
        let sessions = SessionService::new(metadata.clone());
        let pkarr_board = Arc::new(crate::pkarr_publish::PkarrBoard::default());
        Ok(Self {
            storage: StorageService::new(
                metadata.clone(),
                blobs.clone(),
                limits,
                events.clone(),
                entry_cache.clone(),
            ),
            admin: AdminService::new(
                metadata.clone(),
                blobs.clone(),
                events.clone(),
                config.storage.quota_bytes,
                entry_cache,
                sessions.clone(),
            ),
            access: AccessControl::new(sessions, policy.clone()),
            metrics: Arc::new(Metrics::new(Some(policy.clone()))?),
            policy,
            rate_limits: RateLimits::new(&config.rate_limit),
            stream_slots: crate::stream_slots::StreamSlots::new(config.http.max_streams_per_ip),
            identity: crate::service::identity::IdentityService::new(
                metadata.clone(),
                pkarr_board.clone(),
            ),
            pkarr: pkarr_board,
            readiness: ReadinessBoard::default(),
            events,
            signup: SignupService::new(metadata.clone(), config.signup.mode),
            stores: Stores { metadata, blobs },
            server_key,
            known_users: quick_cache::sync::Cache::new(100_000),
            config,
        })
    }
}

/// A running homeserver.
pub struct Homeserver {
    context: Arc<AppContext>,
    /// The local database and blob folder belong to this process until it stops.
    storage_lock: crate::persistence::LocalStorageLock,
    /// Keeps the policies folder watched while the server runs.
    _watcher: Option<homeserver_runtime::WatchHandle>,
    http_addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
    metrics_addr: Option<SocketAddr>,
    shutdown: CancellationToken,
    tasks: JoinSet<()>,
}

impl Homeserver {
    /// Builds the context, binds every listener, then starts serving.
    pub async fn start(config: Config) -> Result<Self, StartError> {
        let shutdown = CancellationToken::new();
        // Before anything is created: relative paths from `/` (a service without a
        // working directory) are refused; otherwise say where the files are.
        let local = crate::local_paths::resolve_here(&config)?;
        tracing::info!("local files: {}", crate::local_paths::describe(&local));
        // Before anything opens the stores: a second server on them is refused.
        let storage_lock =
            persistence::lock_local_storage(&config.storage.database_url, &config.storage.blobs)?;
        let context = Arc::new(AppContext::build(config, shutdown.clone()).await?);
        // So the first probe already hears the truth.
        context.check_readiness().await;
        let config = &context.config;

        // Bind everything first: a port in use fails the start before anything serves.
        let http = bind("http", config.http.listen).await?;
        let tls = match config.tls.listen {
            Some(address) => Some(bind("tls", address).await?),
            None => None,
        };
        let certificate = match (&config.http.tls_cert_file, &config.http.tls_key_file) {
            (Some(cert), Some(key)) => Some(tls::CertificateFiles::load(cert, key)?),
            _ => None,
        };
        let admin = match config.admin.password.is_empty() {
            true => None,
            false => Some(bind("admin", config.admin.listen).await?),
        };
        let metrics = match config.metrics.listen {
            Some(address) => Some(bind("metrics", address).await?),
            None => None,
        };

        let mut tasks = JoinSet::new();
        let limits = connection_limits(config);
        context
            .metrics
            .max_connections
            .set(i64::try_from(limits.max_connections).unwrap_or(i64::MAX));
        // One line per request on the client listeners (the client address after the
        // trusted proxies) and the admin one (its peer); not on the metrics listener.
        let access_log = |listener| {
            config
                .logging
                .access
                .then(|| AccessLog::new(listener, &config.rate_limit.trusted_proxies))
        };
        let admin_access_log = config.logging.access.then(|| AccessLog::new("admin", &[]));
        let http_addr = http.1;
        let http_transport = match &certificate {
            Some(files) => serve::Transport::Tls(files.server_config()),
            None => serve::Transport::Plain,
        };
        tasks.spawn(serve::serve(
            "http",
            http.0,
            http_transport,
            client_server::router(context.clone()),
            shutdown.clone(),
            limits.clone(),
            context.metrics.open_connections("http"),
            access_log("http"),
        ));
        tracing::info!(
            listener = "http",
            address = %http_addr,
            https = certificate.is_some(),
            "listening"
        );
        if let Some(files) = certificate {
            tasks.spawn(files.clone().watch(shutdown.clone()));
            #[cfg(unix)]
            tasks.spawn(reload_certificate_on_sighup(files, shutdown.clone()));
        }
        let tls_addr = tls.as_ref().map(|(_, a)| *a);
        if let Some((listener, address)) = tls {
            tasks.spawn(serve::serve(
                "tls",
                listener,
                serve::Transport::Tls(tls::raw_public_key_config(&context.server_key)),
                client_server::router(context.clone()),
                shutdown.clone(),
                limits.clone(),
                context.metrics.open_connections("tls"),
                access_log("tls"),
            ));
            tracing::info!(listener = "tls", %address, "listening (raw-public-key TLS)");
        }
        let admin_addr = admin.as_ref().map(|(_, a)| *a);
        match admin {
            Some((listener, address)) => {
                tasks.spawn(serve::serve(
                    "admin",
                    listener,
                    serve::Transport::Plain,
                    admin_server::router(context.clone()),
                    shutdown.clone(),
                    limits.clone(),
                    context.metrics.open_connections("admin"),
                    admin_access_log,
                ));
                tracing::info!(listener = "admin", %address, "listening");
            }
            None => tracing::info!("admin server off (set admin.password to enable it)"),
        }
        let metrics_addr = metrics.as_ref().map(|(_, a)| *a);
        if let Some((listener, address)) = metrics {
            tasks.spawn(serve::serve(
                "metrics",
                listener,
                serve::Transport::Plain,
                metrics_server::router(context.clone()),
                shutdown.clone(),
                limits.clone(),
                context.metrics.open_connections("metrics"),
                None,
            ));
            tracing::info!(listener = "metrics", %address, "listening");
        }
        tracing::info!(public_key = %context.server_key.public_key(), "server identity");

        let watcher = match context.policy.watch() {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::warn!(error = %e, "not watching the policies folder; reload with SIGHUP or the admin API");
                None
            }
        };
        #[cfg(unix)]
        tasks.spawn(reload_on_sighup(context.clone(), shutdown.clone()));
        tasks.spawn(context.events.clone().run_tailer());
        tasks.spawn(purge_replay_marks(context.clone(), shutdown.clone()));
        tasks.spawn(sweep_blobs(context.clone(), shutdown.clone()));
        tasks.spawn(check_readiness(context.clone(), shutdown.clone()));
        // Last: the DHT may be unreachable, and nothing above waits for it.
        crate::pkarr_publish::start(
            &context.config.pkarr,
            &context.server_key,
            tls_addr,
            context.stores.metadata.clone(),
            &context.pkarr,
            &mut tasks,
            shutdown.clone(),
        );

        Ok(Self {
            context,
            storage_lock,
            _watcher: watcher,
            http_addr,
            tls_addr,
            admin_addr,
            metrics_addr,
            shutdown,
            tasks,
        })
    }

    /// The server's own public key: its identity on the TLS listener and the DHT.
    pub fn server_key(&self) -> homeserver_protocol::PublicKey {
        self.context.server_key.public_key()
    }

    /// Where the raw-public-key TLS listener listens (None when it is off).
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// Where the admin server listens (None when it is off).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// Where the metrics server listens (None when it is off).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
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
        self.context.stores.metadata.close().await;
        // Only now may another process open the stores.
        drop(self.storage_lock);
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

/// Loads the guests (compiling takes ~100 ms a module without the cache: off the
/// async threads).
async fn load_policies(config: &Config) -> Result<PolicyRuntime, StartError> {
    let cache_dir = config.policies.cache_dir.clone();
    let defaults = RuntimeConfig::default();
    let p = &config.policies;
    let runtime_config = RuntimeConfig {
        policies_dir: p.dir.clone(),
        cache_dir: (!cache_dir.as_os_str().is_empty()).then_some(cache_dir),
        call_deadline: std::time::Duration::from_millis(p.call_deadline_ms),
        memory_limit_bytes: usize::try_from(p.memory_limit_mb.saturating_mul(1 << 20))
            .unwrap_or(usize::MAX),
        instance_max_calls: p.instance_max_calls,
        instances_per_slot: if p.instances_per_slot == 0 {
            defaults.instances_per_slot
        } else {
            p.instances_per_slot
        },
        max_instances: p.max_instances,
        guest_threads: if p.guest_threads == 0 {
            defaults.guest_threads
        } else {
            p.guest_threads
        },
        guest_wait: std::time::Duration::from_millis(p.guest_wait_ms),
        guest_nice: p.guest_nice,
        ..defaults
    };
    let runtime = tokio::task::spawn_blocking(move || PolicyRuntime::load(runtime_config))
        .await
        .map_err(|e| StartError::RuntimeStart(e.to_string()))??;
    let mut failed = Vec::new();
    for slot in runtime.status() {
        match (&slot.source, &slot.last_error) {
            (Some(source), None) => {
                tracing::info!(slot = %slot.slot, %source, blake3 = slot.blake3.as_deref().unwrap_or(""), "guest loaded")
            }
            (_, Some(error)) => failed.push(format!("policy slot {}: {error}", slot.slot)),
            (None, None) => tracing::warn!(slot = %slot.slot, "no guest for this slot"),
        }
    }
    if !failed.is_empty() {
        match config.policies.on_start_error {
            PolicyStartMode::Stop => return Err(StartError::PolicyLoad(failed.join("\n"))),
            PolicyStartMode::SafeDefault => {
                for failure in &failed {
                    tracing::error!(
                        "{failure}; starting anyway (policies.on_start_error = \"safe-default\"): \
                         the slot answers with its safe default until a reload fixes it"
                    );
                }
            }
        }
    }
    Ok(runtime)
}

/// SIGHUP also re-reads the HTTPS certificate files (beside the policies' own reload).
#[cfg(unix)]
async fn reload_certificate_on_sighup(files: Arc<tls::CertificateFiles>, stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangup) = signal(SignalKind::hangup()) else {
        return;
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            got = hangup.recv() => if got.is_none() { return },
        }
        files.reload_and_log("SIGHUP");
    }
}

async fn reload_on_sighup(context: Arc<AppContext>, stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangup) = signal(SignalKind::hangup()) else {
        return;
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            got = hangup.recv() => if got.is_none() { return },
        }
        let policy = context.policy.clone();
        match tokio::task::spawn_blocking(move || policy.reload()).await {
            Ok(report) if report.is_ok() => tracing::info!("policies reloaded (SIGHUP): {report}"),
            Ok(report) => tracing::error!("policies reloaded with errors (SIGHUP): {report}"),
            Err(e) => tracing::error!(error = %e, "policy reload panicked"),
        }
    }
}

/// The connection limits of every listener. The file-descriptor soft limit is raised to
/// the hard limit first (a connection is a descriptor; the default soft limit of 1024 on
/// many systems would stop `accept` long before the connection limit), and the
/// connection limit is lowered when the descriptors left would not cover it.
fn connection_limits(config: &Config) -> serve::ConnectionLimits {
    /// Descriptors kept for the database, blobs, guests and the other listeners.
    const RESERVED_FDS: u64 = 256;
    let mut max_connections = config.http.max_connections;
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(fds) => {
            // Three listeners share the descriptors.
            let affordable = usize::try_from(fds.saturating_sub(RESERVED_FDS) / 3)
                .unwrap_or(usize::MAX)
                .max(16);
            if affordable < max_connections {
                tracing::info!(
                    open_files_limit = fds,
                    configured = max_connections,
                    using = affordable,
                    "http.max_connections lowered to what the open-files limit allows \
                     (raise the hard limit for more, e.g. LimitNOFILE= or ulimit -Hn)"
                );
                max_connections = affordable;
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not raise the open-files limit"),
    }
    serve::ConnectionLimits {
        header_read_timeout: Duration::from_secs(config.http.header_read_timeout_secs),
        idle_timeout: Duration::from_secs(config.http.idle_timeout_secs),
        max_connections,
        per_ip: serve::PerIpLimit {
            max: config.http.max_connections_per_ip,
            exempt: Arc::new(config.rate_limit.trusted_proxies.iter().copied().collect()),
        },
    }
}

async fn bind(
    listener: &'static str,
    address: SocketAddr,
) -> Result<(TcpListener, SocketAddr), StartError> {
    let error = |source| StartError::Bind {
        listener,
        address,
        source,
    };
    let bound = TcpListener::bind(address).await.map_err(error)?;
    let local = bound.local_addr().map_err(error)?;
    Ok((bound, local))
}

async fn purge_replay_marks(context: Arc<AppContext>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(REPLAY_PURGE_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = context.stores.metadata.purge_replay_marks(now_secs()).await {
            tracing::warn!(error = %e, "purging replay marks failed");
        }
        if let Err(e) = context
            .stores
            .metadata
            .purge_sessions(now_secs() - EXPIRED_RETENTION_SECS)
            .await
        {
            tracing::warn!(error = %e, "purging expired sessions failed");
        }
        context.rate_limits.retain_recent();
    }
}

async fn check_readiness(context: Arc<AppContext>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(readiness::CHECK_INTERVAL);
    // A check that took the whole storage timeout is followed by a full interval, not
    // by a burst of checks that were due.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = context.check_readiness() => {}
        }
    }
}

async fn sweep_blobs(context: Arc<AppContext>, stop: CancellationToken) {
    let metadata = context.stores.metadata.clone();
    let blobs = context.stores.blobs.clone();
    let grace = Duration::from_secs(context.config.storage.blob_grace_secs);
    let orphan_min_age = context.config.orphan_min_age();
    // This process's name on the lease.
    let holder = uuid::Uuid::new_v4().to_string();
    let mut tick =
        tokio::time::interval(RETIRED_SWEEP_INTERVAL.min(grace.max(Duration::from_secs(1))));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first walk for orphans comes at the first tick that holds the lease.
    let mut next_walk = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let now = now_secs();
        match metadata
            .take_lease(SWEEP_LEASE, &holder, now, now + SWEEP_LEASE_SECS)
            .await
        {
            Ok(true) => {}
            // Another instance sweeps.
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "blob sweep: could not take its lease");
                continue;
            }
        }
        match blobs.sweep_retired(metadata.as_ref(), grace).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(
                removed = n,
                "deleted replaced values past their grace period"
            ),
            Err(e) => tracing::warn!(error = %e, "blob sweep (retired values) failed"),
        }
        if tokio::time::Instant::now() >= next_walk {
            next_walk = tokio::time::Instant::now() + BLOB_SWEEP_INTERVAL;
            match blobs.sweep(metadata.as_ref(), orphan_min_age).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(removed = n, "swept unreferenced blobs"),
                Err(e) => tracing::warn!(error = %e, "blob sweep failed"),
            }
        }
    }
    // Let another instance take over at once.
    if let Err(e) = metadata.release_lease(SWEEP_LEASE, &holder).await {
        tracing::debug!(error = %e, "blob sweep: could not release its lease");
    }
}
