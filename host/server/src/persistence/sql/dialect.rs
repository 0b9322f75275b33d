//! What differs between SQLite and PostgreSQL: connecting (SQLite's pragmas and its
//! single writer, PostgreSQL's statement timeout), the migrations, classifying errors,
//! row locking and how event cursors are drawn in commit order. Everything else is
//! written once, in the modules beside this one.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::Migrator;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AnyConnection, AnyPool, ConnectOptions, Executor};

use super::super::BackendOptions;
use super::super::metadata::StoreError;

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/postgres");

/// Read connections to a SQLite file; its reads are CPU-bound, so a few more than cores
/// is plenty.
const SQLITE_READ_CONNECTIONS: u32 = 4;

/// The advisory lock that serializes cursor assignment on PostgreSQL (any constant;
/// "hs-event").
const EVENTS_LOCK: i64 = 0x6873_2d65_7665_6e74;

/// The channel PostgreSQL announces commits with events on.
pub(super) const EVENTS_CHANNEL: &str = "hs_events";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialect {
    /// One file, one process: writes go through one connection, so they run one at a
    /// time and never meet SQLITE_BUSY; reads use read-only connections that WAL lets
    /// run beside the writer. The single writer is how this backend keeps the store's
    /// contracts: every write is serialized (per user, and in cursor order), so
    /// AUTOINCREMENT cursors are commit-ordered.
    Sqlite,
    /// Shared by any number of server instances: per-user writes are serialized by
    /// `SELECT ... FOR UPDATE` on the user's row; cursors come from an identity column
    /// drawn under a transaction advisory lock held to the commit (so in commit order);
    /// commits with events are announced with `NOTIFY hs_events`.
    Postgres,
}

/// The pools a store reads and writes through (the same pool on PostgreSQL).
pub(super) struct Pools {
    pub writer: AnyPool,
    pub reader: AnyPool,
}

impl Dialect {
    pub fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }

    pub fn migrator(self) -> &'static Migrator {
        match self {
            Self::Sqlite => &SQLITE_MIGRATIONS,
            Self::Postgres => &POSTGRES_MIGRATIONS,
        }
    }

    /// Connects to the database `url` names (creating a SQLite file and its folder if
    /// missing). Errors never echo the URL (it may hold a password).
    pub async fn connect(self, url: &str, options: &BackendOptions) -> Result<Pools, StoreError> {
        sqlx::any::install_default_drivers();
        match self {
            Self::Sqlite => {
                let writer = AnyPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(30))
                    .after_connect(|conn, _| Box::pin(sqlite_pragmas(conn, true)))
                    .connect_with(sqlite_options(url, false)?)
                    .await
                    .map_err(|e| self.map_err(e))?;
                let reader = AnyPoolOptions::new()
                    .max_connections(SQLITE_READ_CONNECTIONS)
                    .min_connections(1)
                    .after_connect(|conn, _| Box::pin(sqlite_pragmas(conn, false)))
                    // Made lazily: the file must be migrated (it may not exist yet).
                    .connect_lazy_with(sqlite_options(url, true)?);
                Ok(Pools { writer, reader })
            }
            Self::Postgres => {
                let connect = AnyConnectOptions::from_str(url)
                    // The parser's message does not echo the URL (no password in logs).
                    .map_err(|e| StoreError::Internal(format!("database url: {e}")))?;
                let statement_timeout = options.timeout.as_millis();
                let pool = AnyPoolOptions::new()
                    .max_connections(options.max_connections.max(2))
                    .acquire_timeout(options.timeout)
                    .after_connect(move |conn, _| {
                        Box::pin(async move {
                            // A statement that hangs (a lock held elsewhere, a database in
                            // trouble) fails within the configured timeout instead of
                            // holding a request.
                            conn.execute(&*format!("SET statement_timeout = {statement_timeout}"))
                                .await?;
                            conn.execute("SET application_name = 'homeserver'").await?;
                            Ok(())
                        })
                    })
                    .connect_with(connect)
                    .await
                    .map_err(|e| self.map_err(e))?;
                Ok(Pools {
                    writer: pool.clone(),
                    reader: pool,
                })
            }
        }
    }

    /// Whether the migrations table exists (a database never migrated has none).
    pub fn migrations_table_query(self) -> &'static str {
        match self {
            Self::Sqlite => {
                "SELECT COUNT(*) FROM sqlite_master \
                 WHERE type = 'table' AND name = '_sqlx_migrations'"
            }
            Self::Postgres => {
                "SELECT CAST(COUNT(*) AS BIGINT) FROM pg_class \
                 WHERE oid = to_regclass('_sqlx_migrations')"
            }
        }
    }

    /// A driver error, classified: the database cannot be reached or is overloaded
    /// (503) or anything else (500).
    pub fn map_err(self, e: sqlx::Error) -> StoreError {
        let unavailable = match (&e, self) {
            (sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_), _) => true,
            (
                sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed,
                Self::Postgres,
            ) => true,
            // SQLITE_BUSY / SQLITE_LOCKED after the busy timeout.
            (sqlx::Error::Database(db), Self::Sqlite) => {
                db.code().is_some_and(|c| c == "5" || c == "6")
            }
            (sqlx::Error::Database(db), Self::Postgres) => {
                let code = db.code().unwrap_or_default();
                // 08: connection exception; 57P0x: shutdown / cannot connect now; 53300:
                // too many connections; 57014: statement timeout; 40001/40P01:
                // serialization failure / deadlock (retryable).
                code.starts_with("08")
                    || code.starts_with("57P0")
                    || code == "53300"
                    || code == "57014"
                    || code == "40001"
                    || code == "40P01"
            }
            _ => false,
        };
        StoreError::database(e, unavailable)
    }

    /// What a write transaction appends to the `SELECT` of the user's row to hold it
    /// until commit. SQLite's single writer connection is the lock already.
    pub fn lock_row(self) -> &'static str {
        match self {
            Self::Sqlite => "",
            Self::Postgres => " FOR UPDATE",
        }
    }

    /// The statement a transaction runs before it inserts events, so that cursors are
    /// drawn in commit order (PostgreSQL: an advisory lock held until the commit;
    /// SQLite's single writer serializes them already).
    pub fn before_events(self) -> Option<(&'static str, i64)> {
        match self {
            Self::Sqlite => None,
            // Wrapped: the Any driver reads every row, and a `void` column it cannot.
            Self::Postgres => Some((
                "SELECT 1 FROM (SELECT pg_advisory_xact_lock($1)) AS locked",
                EVENTS_LOCK,
            )),
        }
    }

    /// The statement a transaction that inserted events runs last: PostgreSQL announces
    /// them to every listening instance, delivered when (and only if) it commits.
    pub fn after_events(self) -> Option<&'static str> {
        match self {
            Self::Sqlite => None,
            Self::Postgres => Some("SELECT 1 FROM (SELECT pg_notify($1, '')) AS notified"),
        }
    }

    /// Inserting events with their cursors given (a copy): what the `INSERT` needs, and
    /// what moves the cursor sequence past them afterwards. SQLite's AUTOINCREMENT
    /// counter moves past an explicit cursor by itself.
    pub fn explicit_cursors(self) -> (&'static str, Option<&'static str>) {
        match self {
            Self::Sqlite => ("", None),
            Self::Postgres => (
                " OVERRIDING SYSTEM VALUE",
                Some(
                    "SELECT setval(pg_get_serial_sequence('events', 'cursor'), \
                     (SELECT MAX(cursor) FROM events))",
                ),
            ),
        }
    }
}

/// The newest SQLite schema this binary knows (its last migration's version).
pub fn known_sqlite_schema_version() -> i64 {
    SQLITE_MIGRATIONS
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap_or(0)
}

/// One read-only connection to the SQLite file at `path`, as it is (never migrated).
pub(super) async fn open_sqlite_file(path: &Path) -> Result<AnyPool, StoreError> {
    sqlx::any::install_default_drivers();
    let file = std::path::absolute(path)
        .map_err(|e| StoreError::Internal(format!("{}: {e}", path.display())))?;
    let options = SqliteConnectOptions::new()
        .filename(file)
        .read_only(true)
        .create_if_missing(false);
    let options = AnyConnectOptions::from_url(&options.to_url_lossy())
        .map_err(|e| StoreError::Internal(format!("{}: {e}", path.display())))?;
    AnyPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .map_err(|e| Dialect::Sqlite.map_err(e))
}

/// SQLite's connection settings, run on every new connection.
async fn sqlite_pragmas(conn: &mut AnyConnection, writer: bool) -> Result<(), sqlx::Error> {
    // The busy timeout covers a checkpoint or another tool holding the file briefly.
    conn.execute("PRAGMA busy_timeout = 5000").await?;
    if writer {
        // WAL: readers never wait for the writer. FULL: a commit is on disk before it
        // is answered, so a power loss cannot take back a commit whose replaced blob
        // was already deleted (an fsync costs ~0.2 ms on the machines measured in
        // docs/BENCHMARKS.md). Statement journals (the undo of a multi-row write, a few
        // pages) in memory, not written page by page to a temporary file.
        for pragma in [
            "PRAGMA journal_mode = WAL",
            "PRAGMA synchronous = FULL",
            "PRAGMA foreign_keys = ON",
            "PRAGMA temp_store = MEMORY",
        ] {
            conn.execute(pragma).await?;
        }
    }
    Ok(())
}

/// The Any driver's options for the SQLite file `url` names: read-only, or read-write
/// creating it (and its folder). The URL is rebuilt from sqlx's own parse of it, with
/// the file's absolute path: a URL parser would read `sqlite://Data/hs.db` as the host
/// `data` (lower-cased).
fn sqlite_options(url: &str, read_only: bool) -> Result<AnyConnectOptions, StoreError> {
    let parsed = SqliteConnectOptions::from_str(url)
        .map_err(|e| StoreError::Internal(format!("database url: {e}")))?;
    let in_memory = parsed
        .to_url_lossy()
        .query()
        .is_some_and(|q| q.contains("mode=memory"));
    let parsed = if in_memory {
        parsed
    } else {
        let file = std::path::absolute(parsed.get_filename()).map_err(|e| {
            StoreError::Internal(format!("{}: {e}", parsed.get_filename().display()))
        })?;
        if !read_only && let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| StoreError::Internal(format!("creating {}: {e}", parent.display())))?;
        }
        parsed
            .filename(file)
            .read_only(read_only)
            .create_if_missing(!read_only)
    };
    AnyConnectOptions::from_url(&parsed.to_url_lossy())
        .map_err(|e| StoreError::Internal(format!("database url: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sqlite_url_keeps_its_folder_s_case_and_odd_characters() {
        // Read-only: nothing is created.
        let url = sqlite_options("sqlite://Data Dir/h#s.db", true)
            .unwrap()
            .database_url;
        let back = SqliteConnectOptions::from_url(&url).unwrap();
        let expected = std::path::absolute("Data Dir/h#s.db").unwrap();
        assert_eq!(back.get_filename(), expected);
    }

    #[test]
    fn the_reader_is_read_only_and_the_writer_creates() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/new/hs.db", dir.path().display());
        let reader = sqlite_options(&url, true).unwrap().database_url;
        assert!(reader.as_str().contains("mode=ro"), "{reader}");
        assert!(!dir.path().join("new").exists());
        let writer = sqlite_options(&url, false).unwrap().database_url;
        assert!(writer.as_str().contains("mode=rwc"), "{writer}");
        assert!(dir.path().join("new").is_dir());
    }
}
