//! Real `homeserver` processes, for tests that need several instances or a `kill -9`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::fixture::ADMIN_PASSWORD;

pub use hs_testkit::free_port;

pub struct ServerProcess {
    child: Child,
    /// The client API.
    pub url: String,
    /// The admin API (password [`ADMIN_PASSWORD`]).
    pub admin: String,
}

impl ServerProcess {
    /// Starts the binary in `dir` (its working directory: `./data`, `./policies`) on
    /// `port` (0 = a free one), with `env` on top of the test defaults (rate limits
    /// off, shared guest cache, admin API on, metrics off), and waits until it listens.
    pub async fn start(dir: &Path, port: u16, env: &[(String, String)]) -> Self {
        Self::start_with_config(dir, port, None, env).await
    }

    /// [`ServerProcess::start`] with `--config FILE` under the environment (which
    /// overrides the file, as for a user).
    // The guard kills and reaps the child in Drop, which the lint cannot see.
    #[allow(clippy::zombie_processes)]
    pub async fn start_with_config(
        dir: &Path,
        port: u16,
        config: Option<&Path>,
        env: &[(String, String)],
    ) -> Self {
        let port = if port == 0 { free_port() } else { port };
        let admin_port = free_port();
        std::fs::create_dir_all(dir).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_homeserver"));
        if let Some(config) = config {
            command.arg("--config").arg(config);
        }
        let child = command
            .current_dir(dir)
            .env("HOMESERVER__HTTP__LISTEN", format!("127.0.0.1:{port}"))
            .env(
                "HOMESERVER__ADMIN__LISTEN",
                format!("127.0.0.1:{admin_port}"),
            )
            .env("HOMESERVER__ADMIN__PASSWORD", ADMIN_PASSWORD)
            .env("HOMESERVER__METRICS__LISTEN", "")
            .env(
                "HOMESERVER__POLICIES__CACHE_DIR",
                crate::fixture::shared_guest_cache(),
            )
            .env("HOMESERVER__RATE_LIMIT__ENABLED", "false")
            .env("HOMESERVER__PKARR__ENABLED", "false")
            .env("RUST_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut server = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin_port}"),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("homeserver exited at start: {status}");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("homeserver did not listen on {port}");
    }

    /// The process id (for its `/proc` entries).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
