//! The orchestrator: builds the [`AppContext`] once (`context`), binds every listener
//! before serving any request, runs background upkeep, and owns graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::context::{AppContext, StartError};
use crate::http::access_log::AccessLog;
use crate::http::{serve, tls};
use crate::persistence;
use crate::service::readiness;
use crate::{admin_server, client_server, metrics_server};

/// How often expired replay marks and sessions are purged.
const REPLAY_PURGE_INTERVAL: Duration = Duration::from_secs(60);

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
        tasks.spawn(purge_expired(context.clone(), shutdown.clone()));
        tasks.spawn(context.clone().run_blob_sweep(shutdown.clone()));
        tasks.spawn(check_readiness(context.clone(), shutdown.clone()));
        // Last: the DHT may be unreachable, and nothing above waits for it.
        context.start_pkarr(tls_addr, &mut tasks, shutdown.clone());

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
        self.context.close_stores().await;
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

async fn purge_expired(context: Arc<AppContext>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(REPLAY_PURGE_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        context.purge_expired().await;
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
