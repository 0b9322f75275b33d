//! Which backends the suite runs against, and a throwaway database on them.
//!
//! `HS_TEST_BACKEND` picks the metadata backend for the whole suite: `sqlite` (default)
//! or `postgres`. With `postgres`, every test gets a database of its own,
//! `hs_test_<pid>_<n>`, made on the server `HS_TEST_POSTGRES_URL` names (default
//! `postgres://postgres@127.0.0.1:5432/test`, trust auth on these machines) and dropped
//! when the test's host or database guard goes; databases a killed run left behind are
//! dropped at the start of the next run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use homeserver::persistence::{DatabaseUrl, MetadataStore, open_metadata};
use sqlx::Connection;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// The backend named by `HS_TEST_BACKEND`.
    pub fn current() -> Self {
        match std::env::var("HS_TEST_BACKEND").as_deref() {
            Err(_) | Ok("") | Ok("sqlite") => Backend::Sqlite,
            Ok("postgres") => Backend::Postgres,
            Ok(other) => panic!("HS_TEST_BACKEND={other}: expected sqlite or postgres"),
        }
    }

    /// Whether several server instances may share one database of this backend.
    pub fn shared(self) -> bool {
        self == Backend::Postgres
    }
}

fn admin_url() -> String {
    std::env::var("HS_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Runs a future to completion on a runtime of its own (usable from sync code and from
/// inside another runtime).
fn block_on<T: Send + 'static>(future: impl std::future::Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(future)
    })
    .join()
    .unwrap()
}

async fn admin_connection() -> sqlx::PgConnection {
    let url = admin_url();
    sqlx::PgConnection::connect(&url).await.unwrap_or_else(|e| {
        panic!(
            "HS_TEST_BACKEND=postgres but PostgreSQL at {url} cannot be reached ({e}); \
             start it or set HS_TEST_POSTGRES_URL"
        )
    })
}

/// Drops databases of earlier runs whose process is gone (once per run).
async fn drop_leftovers(conn: &mut sqlx::PgConnection) {
    let names: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE 'hs\\_test\\_%'")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    for name in names {
        let pid = name.split('_').nth(2).and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .execute(&mut *conn)
                .await;
        }
    }
}

/// Makes a new database and returns its URL.
fn create_postgres_database() -> String {
    static SWEPT: OnceLock<()> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "hs_test_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    let sweep = SWEPT.set(()).is_ok();
    let created = name.clone();
    block_on(async move {
        let mut conn = admin_connection().await;
        if sweep {
            drop_leftovers(&mut conn).await;
        }
        sqlx::query(&format!("CREATE DATABASE \"{created}\""))
            .execute(&mut conn)
            .await
            .unwrap();
    });
    let base = admin_url();
    let (server, _) = base.rsplit_once('/').expect("postgres URL with a database");
    format!("{server}/{name}")
}

fn drop_postgres_database(url: &str) {
    let Some((_, name)) = url.rsplit_once('/') else {
        return;
    };
    let name = name.to_owned();
    block_on(async move {
        let mut conn = admin_connection().await;
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .execute(&mut conn)
            .await;
    });
}

/// The database each test dir uses, so a server restarted on a dir finds its data.
fn databases() -> &'static Mutex<HashMap<PathBuf, String>> {
    static MAP: OnceLock<Mutex<HashMap<PathBuf, String>>> = OnceLock::new();
    MAP.get_or_init(Default::default)
}

/// The metadata database URL for servers whose data dir is `dir` (made on first use).
pub fn database_url_for(dir: &Path) -> DatabaseUrl {
    let url = match Backend::current() {
        Backend::Sqlite => format!("sqlite://{}/hs.db", dir.display()),
        Backend::Postgres => {
            let mut map = databases().lock().unwrap();
            map.entry(dir.to_owned())
                .or_insert_with(create_postgres_database)
                .clone()
        }
    };
    DatabaseUrl::parse(&url).unwrap()
}

/// Drops the database of `dir`, if the backend made one (a test host going away).
pub fn forget_database_of(dir: &Path) {
    let url = databases().lock().unwrap().remove(dir);
    if let Some(url) = url {
        drop_postgres_database(&url);
    }
}

/// A database for one test, dropped with it.
pub struct TestDatabase {
    pub url: DatabaseUrl,
    dir: PathBuf,
}

impl TestDatabase {
    pub async fn create(dir: &Path) -> Self {
        let owned = dir.to_owned();
        let url = tokio::task::spawn_blocking(move || database_url_for(&owned))
            .await
            .unwrap();
        Self {
            url,
            dir: dir.to_owned(),
        }
    }

    /// A new connection pool to it, as a server instance would open.
    pub async fn open(&self) -> Arc<dyn MetadataStore> {
        open_metadata(&self.url, &Default::default()).await.unwrap()
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        forget_database_of(&self.dir);
    }
}

/// Runs one statement with one integer parameter (`?` is rewritten to `$1` for
/// PostgreSQL) on the database `url` names: for tests that must change what no API
/// changes (e.g. age a session).
pub async fn execute_with_i64(url: &DatabaseUrl, sql: &str, value: i64) {
    match url {
        DatabaseUrl::Sqlite(_) => {
            let db = sqlx::SqlitePool::connect(url.expose_secret())
                .await
                .unwrap();
            sqlx::query(sql).bind(value).execute(&db).await.unwrap();
            db.close().await;
        }
        DatabaseUrl::Postgres(_) => {
            let mut db = sqlx::PgConnection::connect(url.expose_secret())
                .await
                .unwrap();
            sqlx::query(&sql.replace('?', "$1"))
                .bind(value)
                .execute(&mut db)
                .await
                .unwrap();
        }
    }
}

/// The rows of a one-column BLOB/BYTEA query on the database `url` names.
pub async fn fetch_bytes(url: &DatabaseUrl, sql: &str) -> Vec<Vec<u8>> {
    match url {
        DatabaseUrl::Sqlite(_) => {
            let db = sqlx::SqlitePool::connect(url.expose_secret())
                .await
                .unwrap();
            let rows = sqlx::query_scalar(sql).fetch_all(&db).await.unwrap();
            db.close().await;
            rows
        }
        DatabaseUrl::Postgres(_) => {
            let mut db = sqlx::PgConnection::connect(url.expose_secret())
                .await
                .unwrap();
            sqlx::query_scalar(sql).fetch_all(&mut db).await.unwrap()
        }
    }
}

/// Which blob store the suite's servers use: `HS_TEST_BLOBS` = `file` (default) or `s3`
/// (a bucket per test on the suite's S3 server, see [`S3Server`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blobs {
    File,
    S3,
}

impl Blobs {
    pub fn current() -> Self {
        match std::env::var("HS_TEST_BLOBS").as_deref() {
            Err(_) | Ok("") | Ok("file") => Blobs::File,
            Ok("s3") => Blobs::S3,
            Ok(other) => panic!("HS_TEST_BLOBS={other}: expected file or s3"),
        }
    }
}

/// An S3-compatible server for the tests: `moto_server` (PyPI `moto[server]`), started
/// once per test binary on a free loopback port and stopped when the binary exits. The
/// binary comes from `HS_TEST_MOTO`, else `target/tools/moto/bin/moto_server` (where
/// .ci/run installs it), else the PATH.
pub struct S3Server {
    pub endpoint: String,
    child: Mutex<Option<std::process::Child>>,
    port: u16,
    program: PathBuf,
}

impl S3Server {
    /// The suite's S3 server, or why there is none (moto is not installed). With
    /// `CI=true` a missing server fails the test instead.
    pub fn get() -> Result<&'static S3Server, String> {
        static SERVER: OnceLock<Result<S3Server, String>> = OnceLock::new();
        let server = SERVER
            .get_or_init(Self::start)
            .as_ref()
            .map_err(Clone::clone);
        if let Err(why) = &server
            && std::env::var("CI").as_deref() == Ok("true")
        {
            panic!("CI=true and no S3 server for the tests: {why}");
        }
        server
    }

    /// The server, or a printed reason to skip the calling test.
    pub fn or_skip(test: &str) -> Option<&'static S3Server> {
        match Self::get() {
            Ok(server) => Some(server),
            Err(why) => {
                eprintln!("SKIPPED {test}: {why}");
                None
            }
        }
    }

    fn program() -> Option<PathBuf> {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        if let Some(p) = std::env::var_os("HS_TEST_MOTO") {
            // Relative to the repository (tests run in their package's folder).
            return Some(repo.join(p));
        }
        let installed = repo.join("target/tools/moto/bin/moto_server");
        if installed.exists() {
            return Some(installed);
        }
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("moto_server"))
                .find(|p| p.exists())
        })
    }

    /// A server of the calling test's own (for tests that stop and restart it), or a
    /// printed reason to skip the test; stopped when dropped.
    pub fn private_or_skip(test: &str) -> Option<S3Server> {
        match Self::start() {
            Ok(server) => Some(server),
            Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
                panic!("CI=true and no S3 server for {test}: {why}")
            }
            Err(why) => {
                eprintln!("SKIPPED {test}: {why}");
                None
            }
        }
    }

    fn start() -> Result<S3Server, String> {
        let program = Self::program().ok_or(
            "moto_server not found (install it with `python3 -m venv target/tools/moto && \
             target/tools/moto/bin/pip install 'moto[server]'`, as .ci/run does)",
        )?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let server = S3Server {
            endpoint: format!("http://127.0.0.1:{port}"),
            child: Mutex::new(None),
            port,
            program,
        };
        server.spawn()?;
        Ok(server)
    }

    /// Starts moto on the server's port under a watcher that stops it when this test
    /// process exits (statics are never dropped).
    fn spawn(&self) -> Result<(), String> {
        let script = format!(
            "\"$0\" -H 127.0.0.1 -p {port} >/dev/null 2>&1 & moto=$!; \
             trap 'kill $moto 2>/dev/null' EXIT TERM; \
             while kill -0 {parent} 2>/dev/null && kill -0 $moto 2>/dev/null; do sleep 0.5; done",
            port = self.port,
            parent = std::process::id()
        );
        let child = std::process::Command::new("bash")
            .arg("-c")
            .arg(script)
            .arg(&self.program)
            .stdin(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.program.display()))?;
        let mut slot = self.child.lock().unwrap();
        let child = slot.insert(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            // The watcher ends as soon as moto does: no point waiting then.
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "{} exited ({status}) before listening on {}",
                    self.program.display(),
                    self.port
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Err(format!(
            "{} did not listen on {}",
            self.program.display(),
            self.port
        ))
    }

    /// Stops the server (an outage); [`S3Server::restart`] brings it back, empty.
    pub fn stop(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            // SIGTERM, so the watcher's trap stops moto (a SIGKILL would skip it).
            let _ = std::process::Command::new("kill")
                .arg(child.id().to_string())
                .status();
            let _ = child.wait();
        }
        // The watcher's trap stops moto; wait until the port is closed.
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
    }

    pub fn restart(&self) {
        self.spawn().unwrap();
    }

    /// Creates a new, empty bucket and returns its name.
    pub fn new_bucket(&self) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let bucket = format!(
            "hs-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let url = format!("{}/{bucket}", self.endpoint);
        let status = block_on(async move {
            reqwest::Client::new()
                .put(url)
                .send()
                .await
                .map(|r| r.status())
        })
        .unwrap();
        assert!(status.is_success(), "creating bucket: {status}");
        bucket
    }

    /// The `[s3]` settings that reach this server.
    pub fn settings(&self) -> homeserver::persistence::S3Settings {
        homeserver::persistence::S3Settings {
            endpoint: self.endpoint.clone(),
            region: "us-east-1".into(),
            path_style: true,
            allow_http: true,
            access_key_id: "test".into(),
            secret_access_key: homeserver::persistence::Secret::new("test"),
            secret_access_key_file: None,
        }
    }
}

/// The blob store URL (and `[s3]` settings) for servers whose data dir is `dir`: a
/// folder in it, or a bucket of its own on the suite's S3 server (made on first use,
/// so a server restarted on `dir` finds its values).
pub fn blobs_for(
    dir: &Path,
) -> (
    homeserver::persistence::BlobsUrl,
    homeserver::persistence::S3Settings,
) {
    match Blobs::current() {
        Blobs::File => (
            format!("file://{}/blobs", dir.display()).parse().unwrap(),
            Default::default(),
        ),
        Blobs::S3 => {
            static BUCKETS: OnceLock<Mutex<HashMap<PathBuf, String>>> = OnceLock::new();
            let s3 = S3Server::get().unwrap();
            let bucket = BUCKETS
                .get_or_init(Default::default)
                .lock()
                .unwrap()
                .entry(dir.to_owned())
                .or_insert_with(|| s3.new_bucket())
                .clone();
            (format!("s3://{bucket}").parse().unwrap(), s3.settings())
        }
    }
}

/// Environment variables that point a `homeserver` process whose data dir is `dir` at
/// the suite's backends (for tests that start the real binary).
pub fn server_env(dir: &Path) -> Vec<(String, String)> {
    let (blobs, s3) = blobs_for(dir);
    let mut env = vec![
        (
            "HOMESERVER__STORAGE__DATABASE_URL".to_owned(),
            database_url_for(dir).expose_secret().to_owned(),
        ),
        ("HOMESERVER__STORAGE__BLOBS".to_owned(), blobs.to_string()),
    ];
    if Blobs::current() == Blobs::S3 {
        for (key, value) in [
            ("ENDPOINT", s3.endpoint.clone()),
            ("REGION", s3.region.clone()),
            ("PATH_STYLE", s3.path_style.to_string()),
            ("ALLOW_HTTP", s3.allow_http.to_string()),
            ("ACCESS_KEY_ID", s3.access_key_id.clone()),
            (
                "SECRET_ACCESS_KEY",
                s3.secret_access_key.expose().to_owned(),
            ),
        ] {
            env.push((format!("HOMESERVER__S3__{key}"), value));
        }
    }
    env
}

/// The keys of every blob under `prefix` (e.g. a user's key), sorted.
pub async fn blob_keys(blobs: &homeserver::persistence::BlobStore, prefix: &str) -> Vec<String> {
    use futures_util::TryStreamExt;
    let mut keys: Vec<String> = blobs
        .list(Some(prefix))
        .map_ok(|meta| meta.key)
        .try_collect()
        .await
        .unwrap();
    keys.sort();
    keys
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A PostgreSQL database of the calling test's own, whatever the suite's backend, or a
/// printed reason to skip the test (no server; with `CI=true` that fails instead).
/// Dropped with the guard.
pub struct PgDatabase {
    pub url: DatabaseUrl,
}

impl PgDatabase {
    pub fn or_skip(test: &str) -> Option<Self> {
        let url = admin_url();
        let reachable = block_on(async move { sqlx::PgConnection::connect(&url).await.is_ok() });
        if !reachable {
            let why = format!("no PostgreSQL at {}", redact(&admin_url()));
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("CI=true and {why} for {test}");
            }
            eprintln!("SKIPPED {test}: {why} (set HS_TEST_POSTGRES_URL)");
            return None;
        }
        Some(Self {
            url: DatabaseUrl::parse(&create_postgres_database()).unwrap(),
        })
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        drop_postgres_database(self.url.expose_secret());
    }
}

fn redact(url: &str) -> String {
    DatabaseUrl::parse(url).map_or_else(|_| "?".into(), |u| u.to_string())
}
