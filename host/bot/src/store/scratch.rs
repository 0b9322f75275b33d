//! Throwaway databases for tests (the `test-support` feature): a SQLite file in a
//! folder, or a PostgreSQL database made for the test (`CREATE DATABASE` with a random
//! name on `PKBOT_TEST_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/test`)
//! and dropped when the value is dropped. Without a PostgreSQL server the test is
//! skipped with the reason printed; with `CI=true` that is a failure.

use sqlx::{Connection, Executor, PgConnection};

/// Where the tests' PostgreSQL server is (a database on it to connect to first).
pub fn postgres_admin_url() -> String {
    std::env::var("PKBOT_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A database of the test's own on the tests' PostgreSQL server.
pub struct ScratchPostgres {
    pub url: String,
    name: String,
}

impl ScratchPostgres {
    /// Makes one, or None (the reason printed) when there is no PostgreSQL server.
    pub async fn create_or_skip(test: &str) -> Option<Self> {
        let admin = postgres_admin_url();
        let mut conn = match PgConnection::connect(&admin).await {
            Ok(conn) => conn,
            Err(e) => {
                let why = format!(
                    "no PostgreSQL at {} ({e}; set PKBOT_TEST_POSTGRES_URL)",
                    homeserver_protocol::secret::redact_url(&admin)
                );
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "CI=true and {why}"
                );
                eprintln!("SKIPPED {test} on PostgreSQL: {why}");
                return None;
            }
        };
        let mut tag = [0u8; 6];
        getrandom::fill(&mut tag).expect("random bytes");
        let name = format!(
            "pkbot_test_{}_{}",
            std::process::id(),
            tag.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        conn.execute(format!("CREATE DATABASE \"{name}\"").as_str())
            .await
            .expect("CREATE DATABASE");
        let _ = conn.close().await;
        let (server, _) = admin
            .rsplit_once('/')
            .expect("a PostgreSQL URL with a database");
        Some(Self {
            url: format!("{server}/{name}"),
            name,
        })
    }
}

impl Drop for ScratchPostgres {
    fn drop(&mut self) {
        // Dropped from sync code, maybe inside a runtime: a thread of its own.
        let (admin, name) = (postgres_admin_url(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let mut conn = PgConnection::connect(&admin).await.ok()?;
                conn.execute(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)").as_str())
                    .await
                    .ok()
            })
        });
        let _ = dropped.join();
    }
}
