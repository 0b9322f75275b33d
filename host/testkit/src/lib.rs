//! What the end-to-end tests of `pk` (host/client/tests/cli) and `pkbot`
//! (host/bot/tests/e2e) share: a free port, the `homeserver` binary built next to the
//! test, and a real homeserver process on a throwaway folder; and, for any test that
//! checks what was logged, [`CapturedLog`]; and [`promtool`] for the tests that lint
//! metrics or check alert rules. (The server's own suite,
//! host/server/tests/api, has fixtures of its own: most of its servers run in the test
//! process, and its binary processes need the admin API and `./data`; it shares
//! `free_port`.)
//!
//! Only for tests: the helpers panic on failure, with the process's log.

pub mod promtool;

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest wait for a process to listen (a bound, never a timing assertion).
pub const START_WITHIN: Duration = Duration::from_secs(60);

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Waits until `child` listens on `port`; panics with its log (`log`) if it exits
/// first or does not listen within [`START_WITHIN`].
pub fn wait_listening(port: u16, child: &mut Child, what: &str, log: &Path) {
    let deadline = Instant::now() + START_WITHIN;
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{what} exited with {status} before listening:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not listen on {port} within {START_WITHIN:?}:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `$HOMESERVER_BIN`, else the `homeserver` binary next to the running test
/// (target/<profile>/deps/<test>-xxxx → target/<profile>/homeserver).
pub fn homeserver_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("HOMESERVER_BIN") {
        return Some(PathBuf::from(path));
    }
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let bin = profile_dir.join(format!("homeserver{}", std::env::consts::EXE_SUFFIX));
    bin.is_file().then_some(bin)
}

/// The homeserver binary, or `None` with the reason printed: the test is then skipped
/// (`cargo test -p pk-client` or `-p pkbot` alone does not build the binary; `cargo test
/// --workspace` does). With `CI=true` or `PK_E2E_REQUIRE_HOMESERVER` set (for pk's and
/// pkbot's tests alike), a missing binary is a failure instead, never a silent pass.
pub fn homeserver_binary_or_skip(test: &str) -> Option<PathBuf> {
    let bin = homeserver_binary();
    if bin.is_none() {
        let why = "the homeserver binary is not built next to this test (run `cargo build -p \
                   homeserver` with the same target dir, or set HOMESERVER_BIN)";
        assert!(
            std::env::var_os("PK_E2E_REQUIRE_HOMESERVER").is_none()
                && std::env::var("CI").as_deref() != Ok("true"),
            "{test}: {why}"
        );
        eprintln!("SKIPPED {test}: {why}");
    }
    bin
}

/// A real `homeserver` process working in its own folder (SQLite, file blobs, key and
/// policies there), on a free port. Killed when dropped; its log (`homeserver.log` in
/// the folder, appended to, so a restart's log follows the first run's) is printed if
/// the test is failing.
pub struct Homeserver {
    child: Option<Child>,
    bin: PathBuf,
    dir: PathBuf,
    env: Vec<(String, String)>,
    port: u16,
    log: PathBuf,
    /// The client API, `http://127.0.0.1:<port>`.
    pub url: String,
}

impl Homeserver {
    pub fn start(bin: &Path, dir: &Path) -> Self {
        Self::start_with(bin, dir, &[])
    }

    /// Starts the server with `env` on top of the test settings, and waits until it
    /// listens.
    pub fn start_with(bin: &Path, dir: &Path, env: &[(&str, &str)]) -> Self {
        std::fs::create_dir_all(dir).expect("the server's folder");
        let port = free_port();
        let mut server = Self {
            child: None,
            bin: bin.to_owned(),
            dir: dir.to_owned(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            port,
            log: dir.join("homeserver.log"),
            url: format!("http://127.0.0.1:{port}"),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let (dir, port) = (&self.dir, self.port);
        // Appended to: a restarted server's log follows the first one's.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the server's log file");
        // End-to-end tests make many requests from one address, faster than any person
        // would (rate limits have tests of their own), and several servers may run at
        // once: no fixed metrics port, no DHT.
        let child = Command::new(&self.bin)
            .current_dir(dir)
            .env("HOMESERVER__HTTP__LISTEN", format!("127.0.0.1:{port}"))
            .env("HOMESERVER__RATE_LIMIT__ENABLED", "false")
            .env("HOMESERVER__PKARR__ENABLED", "false")
            // Load tests keep both cores busy: a guest call may wait past the serving
            // default of 100 ms for a core, and an overrun fails the request (500).
            .env("HOMESERVER__POLICIES__CALL_DEADLINE_MS", "1000")
            .env("HOMESERVER__METRICS__LISTEN", "")
            .env(
                "HOMESERVER__STORAGE__DATABASE_URL",
                format!("sqlite://{}/hs.db", dir.display()),
            )
            .env(
                "HOMESERVER__STORAGE__BLOBS",
                format!("file://{}/blobs", dir.display()),
            )
            .env("HOMESERVER__KEYS__SECRET_KEY_FILE", dir.join("server.key"))
            .env("HOMESERVER__POLICIES__DIR", dir.join("policies"))
            // Compiled guests shared across test servers (safe: written by rename).
            .env(
                "HOMESERVER__POLICIES__CACHE_DIR",
                std::env::temp_dir().join("homeserver-test-guest-cache"),
            )
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log file again"))
            .stderr(log)
            .spawn()
            .expect("the homeserver starts");
        // Kept before waiting, so that a server that never listens is killed on drop.
        let child = self.child.insert(child);
        wait_listening(port, child, "homeserver", &self.log);
    }

    /// kill -9: the server is gone until [`Self::start_again`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, folder and settings.
    pub fn start_again(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Everything the server has logged so far.
    /// The process's id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Homeserver {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("--- homeserver log ---\n{}", self.log_text());
        }
    }
}

/// Log output kept in memory, for a test to read what was logged: hand
/// `move || log.clone()` to `tracing_subscriber::fmt().with_writer(...)`.
#[derive(Debug, Clone, Default)]
pub struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl CapturedLog {
    /// Everything written so far.
    pub fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl std::io::Write for CapturedLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Polls `condition` every 20 ms until it holds, failing the test after `deadline` (a
/// bound on a wait, not a timing assertion: make it generous, so a loaded machine passes).
pub async fn eventually<F, Fut>(what: &str, deadline: std::time::Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = std::time::Instant::now() + deadline;
    while !condition().await {
        assert!(
            std::time::Instant::now() < until,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
