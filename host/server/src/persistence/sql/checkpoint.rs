//! SQLite's checkpoints, off the writer's path.
//!
//! In WAL mode a commit appends pages to the write-ahead log; a checkpoint copies them
//! into the database file (and syncs it) so the log can start over. By default the
//! connection that commits does it, once the log passes 1,000 pages: on the one writer
//! connection, inside a commit a whole group of requests waits for (a profile of small
//! PUTs put 18% of the writer thread's time there, docs/BENCHMARKS.md). The writer
//! turns that off (`wal_autocheckpoint = 0`, see `dialect`) and this task checkpoints
//! from a connection of its own every [`INTERVAL`] instead.
//!
//! The checkpoints are PASSIVE: they never wait for the writer or a reader, nor make
//! them wait; pages a reader may still need are copied at a later tick. Durability is
//! unchanged: each commit is synced in the log before it is answered, and a crash at any
//! point leaves the log for the next open to recover, as before.

use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, Executor};

/// How often the log is copied into the database file. At 5,000 small writes a second
/// the log holds ~400 pages at a tick, under the 1,000 SQLite's own threshold let it
/// reach (100 ms and 1 s measured the same within the noise, docs/BENCHMARKS.md).
pub(super) const INTERVAL: Duration = Duration::from_millis(250);

/// Starts checkpointing the database `options` opens (read-write: a checkpoint writes
/// the database file); its connection is made at the first tick.
pub(super) fn spawn(options: AnyConnectOptions) -> tokio::task::JoinHandle<()> {
    let pool = AnyPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("PRAGMA busy_timeout = 5000").await?;
                Ok(())
            })
        })
        .connect_lazy_with(options);
    tokio::spawn(checkpoints(pool))
}

async fn checkpoints(pool: AnyPool) {
    let mut ticks = tokio::time::interval(INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        ticks.tick().await;
        match sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_all(&pool)
            .await
        {
            Ok(_) => failing = false,
            // Said once, not ten times a second; the log keeps every commit meanwhile
            // (it grows until a checkpoint succeeds).
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "SQLite checkpoint failed; retrying");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use crate::persistence::metadata::{EntryRecord, MetadataStore, Stored, UserRecord};
    use crate::persistence::sql::SqlStore;
    use crate::persistence::{BackendOptions, DatabaseUrl};

    /// The writer never checkpoints (`wal_autocheckpoint = 0`): what it commits reaches
    /// the database file only through this task.
    #[tokio::test]
    async fn commits_reach_the_database_file_beside_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hs.db");
        let url = DatabaseUrl::parse(&format!("sqlite://{}", file.display())).unwrap();
        let store = SqlStore::open(&url, &BackendOptions::default())
            .await
            .unwrap();
        let user = UserRecord {
            public_key: "alice".into(),
            created_at: 1,
            used_bytes: 0,
            quota_bytes: None,
            disabled: false,
            last_activity: 1,
        };
        store.copy_users(&[user]).await.unwrap();
        let entries: Vec<EntryRecord> = (0..200)
            .map(|n| EntryRecord {
                path: format!("/pub/{n:03}"),
                stored: Stored::Inline(vec![n as u8; 8 * 1024].into()),
                size: 8 * 1024,
                content_hash: [0; 32],
                created_at: 1,
                updated_at: 1,
            })
            .collect();
        let before = std::fs::metadata(&file).unwrap().len();
        store.copy_entries("alice", &entries).await.unwrap();
        let started = Instant::now();
        loop {
            let size = std::fs::metadata(&file).unwrap().len();
            if size >= before + 200 * 8 * 1024 {
                break;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "1.6 MB committed, yet the database file is {size} bytes after 10 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // Everything is readable all along, through the reader connections.
        assert_eq!(
            store
                .entry("alice", "/pub/199")
                .await
                .unwrap()
                .unwrap()
                .size,
            8192
        );
        store.close().await;
    }
}
