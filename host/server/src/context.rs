//! The application context: everything a request handler may need, built once from the
//! configuration ([`AppContext::build`]: stores, services, the guest runtime, keys).
//! The listeners import it; it imports none of them, nor the orchestrator (`app`), which
//! builds it and runs the upkeep it offers (purging, the blob sweep, pkarr publishing).
//! The stores stay private here: routes reach data only through the services.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use homeserver_protocol::Keypair;
use homeserver_runtime::{PolicyRuntime, RuntimeConfig};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, PolicyStartMode};
use crate::http::rate_limit::RateLimits;
use crate::http::stream_slots::StreamSlots;
use crate::http::tls;
use crate::metrics::Metrics;
use crate::persistence::{self, BlobStore};
use crate::server_key;
use crate::service::access::AccessControl;
use crate::service::admin::AdminService;
use crate::service::entry_cache::EntryCache;
use crate::service::events::EventHub;
use crate::service::identity::IdentityService;
use crate::service::maintenance::Stores;
use crate::service::now_secs;
use crate::service::pkarr_publish::{self, PkarrBoard};
use crate::service::readiness::ReadinessBoard;
use crate::service::sessions::{EXPIRED_RETENTION_SECS, SessionService};
use crate::service::signup::SignupService;
use crate::service::storage::{StorageLimits, StorageService};

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
/// stores under them are private to this module, for the upkeep it runs for the orchestrator (and,
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
    pub stream_slots: StreamSlots,
    pub identity: IdentityService,
    /// What the pkarr publisher did last.
    pub pkarr: Arc<PkarrBoard>,
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
            inline_max_bytes: config.storage.inline_max_bytes,
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
        let access = AccessControl::new(sessions.clone(), policy.clone());
        events.answer_public_questions_with(access.public_filter());
        let pkarr_board = Arc::new(PkarrBoard::default());
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
            access,
            metrics: Arc::new(Metrics::new(Some(policy.clone()))?),
            policy,
            rate_limits: RateLimits::new(&config.rate_limit),
            stream_slots: StreamSlots::new(config.http.max_streams_per_ip),
            identity: IdentityService::new(metadata.clone(), pkarr_board.clone()),
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

    /// Purges expired replay marks and sessions (kept a while past expiry) once.
    pub(crate) async fn purge_expired(&self) {
        if let Err(e) = self.stores.metadata.purge_replay_marks(now_secs()).await {
            tracing::warn!(error = %e, "purging replay marks failed");
        }
        if let Err(e) = self
            .stores
            .metadata
            .purge_sessions(now_secs() - EXPIRED_RETENTION_SECS)
            .await
        {
            tracing::warn!(error = %e, "purging expired sessions failed");
        }
        self.rate_limits.retain_recent();
    }

    /// Starts publishing the server's and its users' records on the DHT (a task in
    /// `tasks`), unless `[pkarr] enabled = false`.
    pub(crate) fn start_pkarr(
        &self,
        tls_addr: Option<SocketAddr>,
        tasks: &mut JoinSet<()>,
        shutdown: CancellationToken,
    ) {
        pkarr_publish::start(
            &self.config.pkarr,
            &self.server_key,
            tls_addr,
            self.stores.metadata.clone(),
            &self.pkarr,
            tasks,
            shutdown,
        );
    }

    /// Closes the metadata store (after every task that uses it has ended).
    pub(crate) async fn close_stores(&self) {
        self.stores.metadata.close().await;
    }

    /// The blob sweep, run by one instance at a time (a lease in the metadata store):
    /// retired blobs past their grace period every minute, unreferenced blobs hourly.
    pub(crate) async fn run_blob_sweep(self: Arc<Self>, stop: CancellationToken) {
        let context = self;
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
        // The default leaves room in the instance pool for the other slots' calls.
        guest_concurrency: if p.guest_concurrency == 0 {
            let quarter = usize::try_from(p.max_instances / 4).unwrap_or(usize::MAX);
            defaults.guest_concurrency.min(quarter).max(1)
        } else {
            p.guest_concurrency
        },
        guest_wait: std::time::Duration::from_millis(p.guest_wait_ms),
        guest_cpu_share: p.guest_cpu_share,
        ..defaults
    };
    for setting in p.retired_settings() {
        tracing::warn!(
            "{setting} is no longer used and is ignored: guest calls run on the async \
             workers (see policies.guest_concurrency and policies.guest_cpu_share)"
        );
    }
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
