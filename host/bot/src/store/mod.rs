//! The bot's records in SQL, on SQLite (the default: one file) or PostgreSQL (processes
//! on several machines): the spec's tables (mentions, routing_decisions,
//! action_executions, artifacts, replies), the idempotency keys, where each reader
//! stopped, opt-outs, rate-limit notices, dead letters, the leader's fencing token and
//! the embedded index's posts.
//!
//! One implementation over both databases: every query, row mapping and transaction is
//! written once, against sqlx's `Any` driver, with `$1`-style placeholders (both
//! databases read them), `ON CONFLICT` upserts and `RETURNING` (both have them), and
//! integers for every number, time and flag. What truly differs is in [`Dialect`]: the
//! migrations (`migrations/sqlite`, `migrations/postgres`: the same versions, the types
//! of each), the connection set-up (SQLite's pragmas) and row locking.
//!
//! The database is the source of truth of the pipeline: every stage records what it
//! decided before it hands the mention on, so after a crash the pipeline is driven
//! again from these rows (see `pipeline::recover`), and each stage finds its own
//! earlier answer instead of doing the work twice. Writes of the leader's stages are
//! fenced ([`Fence`]).

mod actions;
mod fence;
mod index;
mod mentions;
mod records;
#[cfg(any(test, feature = "test-support"))]
pub mod scratch;

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::Histogram;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::Migrator;
use sqlx::{AnyPool, Executor};

pub use actions::Finished;
pub use fence::Fence;
pub use records::*;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("bot database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("bot database: migrating: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error(
        "bot database: `{0}` is not a database URL this bot knows (sqlite://PATH or postgres://...)"
    )]
    Url(String),
    /// A write of the leader's stages from a process that no longer holds the lease.
    #[error(
        "refused: this process no longer holds the leader lease (its fencing token {0} is stale)"
    )]
    Fenced(i64),
}

impl StoreError {
    /// Whether the write was refused because this process lost the leader lease.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::Fenced(_))
    }

    /// Whether a unique constraint refused the write.
    fn is_unique_violation(&self) -> bool {
        matches!(self, Self::Database(sqlx::Error::Database(e)) if e.is_unique_violation())
    }
}

type Result<T> = std::result::Result<T, StoreError>;

/// What differs between the two databases; everything else is written once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/postgres");

impl Dialect {
    /// The database of `url` (`sqlite:` or `postgres:`/`postgresql:`).
    pub fn of(url: &str) -> Result<Self> {
        let scheme = url.split(':').next().unwrap_or("");
        match scheme {
            "sqlite" => Ok(Self::Sqlite),
            "postgres" | "postgresql" => Ok(Self::Postgres),
            _ => Err(StoreError::Url(homeserver_protocol::secret::redact_url(
                url,
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }

    fn migrator(self) -> &'static Migrator {
        match self {
            Self::Sqlite => &SQLITE_MIGRATIONS,
            Self::Postgres => &POSTGRES_MIGRATIONS,
        }
    }

    /// The lock a fenced write takes on the fence row while it runs. On PostgreSQL a
    /// shared row lock: writes go side by side, and a new leader raising the token
    /// waits for those in flight (so none lands after it). SQLite runs one write at a
    /// time anyway.
    fn share_lock(self) -> &'static str {
        match self {
            Self::Sqlite => "",
            Self::Postgres => " FOR SHARE",
        }
    }

    /// The recursive step of a thread walk: the posts whose parent is a row `t` of the
    /// walk so far. PostgreSQL plans a plain join of a small table as a hash join over
    /// the whole table at every step; a lateral subquery (kept apart by `OFFSET 0`)
    /// makes it look each parent's replies up in the parent index instead (about half
    /// the time, measured). SQLite has no `LATERAL` and uses the index for the join.
    fn children_of_walk(self) -> &'static str {
        match self {
            Self::Sqlite => "index_posts p JOIN thread t ON p.parent_uri = t.uri",
            Self::Postgres => {
                "thread t CROSS JOIN LATERAL \
                 (SELECT * FROM index_posts q WHERE q.parent_uri = t.uri OFFSET 0) p"
            }
        }
    }

    /// Connections per process.
    fn max_connections(self) -> u32 {
        match self {
            // One writer at a time: more connections only wait on each other.
            Self::Sqlite => 4,
            Self::Postgres => 8,
        }
    }
}

/// The bot's database.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    dialect: Dialect,
    fence: Arc<Fence>,
    query_seconds: Histogram,
}

pub use homeserver_protocol::clock::unix_secs_i64 as now_secs;

/// A count or size as the database's integer.
fn int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

impl Store {
    /// Opens (creating and migrating) the database at `url`: `sqlite://PATH` (the file
    /// is made if missing) or `postgres://USER@HOST/DB` (the database must exist). A
    /// database migrated by a newer version of the bot is refused.
    pub async fn open(url: &str, query_seconds: Histogram) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let dialect = Dialect::of(url)?;
        let options = AnyConnectOptions::from_str(&connect_url(dialect, url))?;
        let pool = AnyPoolOptions::new()
            .max_connections(dialect.max_connections())
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if dialect == Dialect::Sqlite {
                        // WAL: readers never wait for the writer. FULL: a reply recorded
                        // as published survives a power loss. The busy timeout: several
                        // processes share the file.
                        for pragma in [
                            "PRAGMA journal_mode = WAL",
                            "PRAGMA synchronous = FULL",
                            "PRAGMA busy_timeout = 10000",
                            "PRAGMA foreign_keys = ON",
                        ] {
                            conn.execute(pragma).await?;
                        }
                    }
                    Ok(())
                })
            })
            .connect_with(options)
            .await?;
        dialect.migrator().run(&pool).await?;
        Ok(Self {
            pool,
            dialect,
            fence: Arc::new(Fence::default()),
            query_seconds,
        })
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The leader's fencing token as this process holds it (set by the lease).
    pub fn fence(&self) -> &Arc<Fence> {
        &self.fence
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    fn timed(&self) -> QueryTimer<'_> {
        QueryTimer {
            started: Instant::now(),
            histogram: &self.query_seconds,
        }
    }

    pub async fn ping(&self) -> Result<()> {
        let _t = self.timed();
        self.pool.execute("SELECT 1").await?;
        Ok(())
    }
}

/// The URL sqlx connects to: a SQLite file is made if missing (with its folder).
fn connect_url(dialect: Dialect, url: &str) -> String {
    if dialect != Dialect::Sqlite {
        return url.to_owned();
    }
    let path = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let path = path.split('?').next().unwrap_or("");
    if let Some(dir) = std::path::Path::new(path).parent()
        && !dir.as_os_str().is_empty()
    {
        let _ = std::fs::create_dir_all(dir);
    }
    if url.contains("mode=") || path.is_empty() || path == ":memory:" {
        url.to_owned()
    } else if url.contains('?') {
        format!("{url}&mode=rwc")
    } else {
        format!("{url}?mode=rwc")
    }
}

/// Records how long a query took when dropped.
struct QueryTimer<'a> {
    started: Instant,
    histogram: &'a Histogram,
}

impl Drop for QueryTimer<'_> {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
pub(crate) mod tests;
