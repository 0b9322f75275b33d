//! The embedded metadata store: SQLite through sqlx, in WAL mode.
//!
//! Writes go through a pool of exactly one connection, so write transactions run one at
//! a time in this process and never meet SQLITE_BUSY; reads use a separate pool of
//! read-only connections that WAL lets run beside the writer. The single writer is how
//! this backend keeps the boundary's contracts: every write is serialized (per user,
//! and in cursor order), so AUTOINCREMENT cursors are commit-ordered. One process owns
//! a database file: scale-out deployments use PostgreSQL.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, Row, Sqlite, Transaction};

use homeserver_protocol::event::EventKind;

use super::metadata::{
    BlobState, EntryRange, EntryRecord, EventQuery, EventRecord, MetadataStore, NewEvent,
    ReplayMark, ReverseEventQuery, SessionRecord, SignupTokenRecord, SignupTokenRow, StoreError,
    StoreStats, TokenRedemption, UserCursor, UserRecord, WriteContext, WriteTx,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Read connections; SQLite reads are CPU-bound, so a few more than cores is plenty.
const READ_CONNECTIONS: u32 = 4;

pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://PATH`) and migrates it.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Internal(format!("database url: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a commit is on disk before it is answered, so a power loss cannot
            // take back a commit whose replaced blob was already deleted. (An fsync
            // costs ~0.2 ms on the machines measured in docs/BENCHMARKS.md.)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        if let Some(parent) = options.get_filename().parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent)
                .map_err(|e| StoreError::Internal(format!("creating {}: {e}", parent.display())))?;
        }
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await
            .map_err(map_err)?;
        let migrations_table: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
        )
        .fetch_optional(&writer)
        .await
        .map_err(map_err)?;
        if migrations_table.is_some() {
            let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations")
                .fetch_all(&writer)
                .await
                .map_err(map_err)?;
            super::refuse_newer_schema(&applied, &MIGRATOR)?;
        }
        MIGRATOR
            .run(&writer)
            .await
            .map_err(|e| StoreError::Internal(format!("migrating the database: {e}")))?;
        let reader = SqlitePoolOptions::new()
            .max_connections(READ_CONNECTIONS)
            .min_connections(1)
            .connect_with(options.read_only(true))
            .await
            .map_err(map_err)?;
        Ok(Self { writer, reader })
    }
}

/// The database file a `sqlite://` URL names (None for other backends and for
/// in-memory databases).
pub fn database_file(url: &super::DatabaseUrl) -> Option<std::path::PathBuf> {
    let super::DatabaseUrl::Sqlite(text) = url else {
        return None;
    };
    let options = SqliteConnectOptions::from_str(text).ok()?;
    let file = options.get_filename();
    (!file.as_os_str().is_empty() && file != std::path::Path::new(":memory:"))
        .then(|| file.to_owned())
}

/// The newest schema this binary knows (its last migration's version).
pub fn known_schema_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Writes a consistent copy of the database at `url` to `target` (a new file), beside a
/// running server: `VACUUM INTO` on a read-only connection reads one snapshot (WAL lets
/// the server keep committing meanwhile) and changes nothing in the source.
pub async fn snapshot_into(url: &super::DatabaseUrl, target: &Path) -> Result<(), StoreError> {
    let options = SqliteConnectOptions::from_str(url.expose_secret())
        .map_err(|e| StoreError::Internal(format!("database url: {e}")))?
        .read_only(true)
        .busy_timeout(Duration::from_secs(30));
    let mut connection = options.connect().await.map_err(map_err)?;
    let target = target
        .to_str()
        .ok_or_else(|| StoreError::Internal(format!("{} is not UTF-8", target.display())))?;
    let done = sqlx::query("VACUUM INTO ?")
        .bind(target)
        .execute(&mut connection)
        .await
        .map_err(map_err);
    let _ = connection.close().await;
    done.map(|_| ())
}

/// A database file read as it is (read-only, never migrated): a backup's snapshot.
pub struct SqliteFile {
    pool: SqlitePool,
}

impl SqliteFile {
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .read_only(true)
            .create_if_missing(false);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(map_err)?;
        Ok(Self { pool })
    }

    /// The schema version its migrations reached (0 for a database never migrated).
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        let version: Option<i64> =
            sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations WHERE success")
                .fetch_one(&self.pool)
                .await
                .map_err(map_err)?;
        Ok(version.unwrap_or(0))
    }

    /// Entries of every user after `(user, path)` in that order, at most `limit`.
    pub async fn entries_after(
        &self,
        after: (&str, &str),
        limit: u32,
    ) -> Result<Vec<(String, EntryRecord)>, StoreError> {
        let found = sqlx::query(&format!(
            "SELECT owner, {ENTRY_COLUMNS} FROM entries WHERE (owner, path) > (?, ?) \
             ORDER BY owner, path LIMIT ?"
        ))
        .bind(after.0)
        .bind(after.1)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        found
            .iter()
            .map(|row| Ok((row.try_get("owner")?, entry_from_row(row)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(map_err)
    }

    pub async fn close(self) {
        self.pool.close().await;
    }
}

fn map_err(e: sqlx::Error) -> StoreError {
    let unavailable = match &e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
        // SQLITE_BUSY / SQLITE_LOCKED after the busy timeout.
        sqlx::Error::Database(db) => db.code().is_some_and(|c| c == "5" || c == "6"),
        _ => false,
    };
    StoreError::database(e, unavailable)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn user_from_row(row: &SqliteRow) -> Result<UserRecord, sqlx::Error> {
    Ok(UserRecord {
        public_key: row.try_get("public_key")?,
        created_at: row.try_get("created_at")?,
        used_bytes: to_u64(row.try_get("used_bytes")?),
        quota_bytes: row.try_get::<Option<i64>, _>("quota_bytes")?.map(to_u64),
        disabled: row.try_get::<i64, _>("disabled")? != 0,
        last_activity: row.try_get("last_activity")?,
    })
}

fn hash32(bytes: Vec<u8>) -> Result<[u8; 32], sqlx::Error> {
    bytes
        .try_into()
        .map_err(|_| sqlx::Error::Decode("content_hash is not 32 bytes".into()))
}

fn entry_from_row(row: &SqliteRow) -> Result<EntryRecord, sqlx::Error> {
    Ok(EntryRecord {
        path: row.try_get("path")?,
        blob_key: row.try_get("blob_key")?,
        size: to_u64(row.try_get("size")?),
        content_hash: hash32(row.try_get("content_hash")?)?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn event_from_row(row: &SqliteRow) -> Result<EventRecord, sqlx::Error> {
    let kind: String = row.try_get("kind")?;
    Ok(EventRecord {
        cursor: to_u64(row.try_get("cursor")?),
        user: row.try_get("owner")?,
        path: row.try_get("path")?,
        kind: EventKind::parse(&kind)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown event kind {kind}").into()))?,
        content_hash: row
            .try_get::<Option<Vec<u8>>, _>("content_hash")?
            .map(hash32)
            .transpose()?,
        created_at: row.try_get("created_at")?,
    })
}

fn rows<T>(
    rows: &[SqliteRow],
    decode: fn(&SqliteRow) -> Result<T, sqlx::Error>,
) -> Result<Vec<T>, StoreError> {
    rows.iter()
        .map(decode)
        .collect::<Result<_, _>>()
        .map_err(map_err)
}

const USER_COLUMNS: &str =
    "public_key, created_at, used_bytes, quota_bytes, disabled, last_activity";
const ENTRY_COLUMNS: &str = "path, blob_key, size, content_hash, created_at, updated_at";
const EVENT_COLUMNS: &str = "cursor, owner, path, kind, content_hash, created_at";

/// Appends `AND ((owner = ? AND cursor <op> ?) OR ...)` and the path-prefix range.
/// A per-user cursor of 0 means no bound.
fn push_event_filters<'a>(
    sql: &mut sqlx::QueryBuilder<'a, Sqlite>,
    users: &'a [UserCursor],
    cursor_op: &str,
    path_prefix: Option<&'a str>,
) {
    if !users.is_empty() {
        sql.push(" AND (");
        for (i, u) in users.iter().enumerate() {
            if i > 0 {
                sql.push(" OR ");
            }
            sql.push("(owner = ").push_bind(u.user.as_str());
            if u.cursor != 0 {
                sql.push(" AND cursor ")
                    .push(cursor_op)
                    .push(" ")
                    .push_bind(to_i64(u.cursor));
            }
            sql.push(")");
        }
        sql.push(")");
    }
    if let Some(prefix) = path_prefix {
        // Every path under `prefix` sorts in [prefix, prefix + '{'): '{' is above every
        // character a path may contain. Unlike LIKE, `_` needs no escaping.
        sql.push(" AND path >= ")
            .push_bind(prefix)
            .push(" AND path < ")
            .push_bind(format!("{prefix}{{"));
    }
}

/// A write transaction on the single writer connection.
struct SqliteWriteTx(Transaction<'static, Sqlite>);

#[async_trait]
impl WriteTx for SqliteWriteTx {
    async fn insert_replay_mark(&mut self, mark: ReplayMark) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO seen_signatures (signature_id, expires_at) VALUES (?, ?) \
             ON CONFLICT (signature_id) DO NOTHING",
        )
        .bind(&mark.signature_id[..])
        .bind(mark.expires_at)
        .execute(&mut *self.0)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn lock_user(&mut self, public_key: &str) -> Result<Option<UserRecord>, StoreError> {
        // The single writer connection is the lock.
        let row = sqlx::query(&format!(
            "SELECT {USER_COLUMNS} FROM users WHERE public_key = ?"
        ))
        .bind(public_key)
        .fetch_optional(&mut *self.0)
        .await
        .map_err(map_err)?;
        row.as_ref().map(user_from_row).transpose().map_err(map_err)
    }

    async fn insert_user(
        &mut self,
        public_key: &str,
        now: i64,
        signup_token: Option<&str>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO users (public_key, created_at, last_activity, signup_token) \
             VALUES (?, ?, ?, ?) ON CONFLICT (public_key) DO NOTHING",
        )
        .bind(public_key)
        .bind(now)
        .bind(now)
        .bind(signup_token)
        .execute(&mut *self.0)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_user(&mut self, public_key: &str) -> Result<(), StoreError> {
        for table in ["sessions", "pkarr_packets"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE owner = ?"))
                .bind(public_key)
                .execute(&mut *self.0)
                .await
                .map_err(map_err)?;
        }
        sqlx::query("DELETE FROM users WHERE public_key = ?")
            .bind(public_key)
            .execute(&mut *self.0)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn set_usage(
        &mut self,
        public_key: &str,
        used_bytes: u64,
        last_activity: i64,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE users SET used_bytes = ?, last_activity = ? WHERE public_key = ?")
            .bind(to_i64(used_bytes))
            .bind(last_activity)
            .bind(public_key)
            .execute(&mut *self.0)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn redeem_signup_token(
        &mut self,
        token: &str,
        public_key: &str,
        now: i64,
    ) -> Result<TokenRedemption, StoreError> {
        let redeemed = sqlx::query(
            "UPDATE signup_tokens SET used_by = ?, used_at = ? \
             WHERE token = ? AND used_by IS NULL",
        )
        .bind(public_key)
        .bind(now)
        .bind(token)
        .execute(&mut *self.0)
        .await
        .map_err(map_err)?;
        if redeemed.rows_affected() == 1 {
            return Ok(TokenRedemption::Redeemed);
        }
        let known: Option<i64> = sqlx::query_scalar("SELECT 1 FROM signup_tokens WHERE token = ?")
            .bind(token)
            .fetch_optional(&mut *self.0)
            .await
            .map_err(map_err)?;
        Ok(match known {
            Some(_) => TokenRedemption::Used,
            None => TokenRedemption::Unknown,
        })
    }

    async fn entry(&mut self, user: &str, path: &str) -> Result<Option<EntryRecord>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {ENTRY_COLUMNS} FROM entries WHERE owner = ? AND path = ?"
        ))
        .bind(user)
        .bind(path)
        .fetch_optional(&mut *self.0)
        .await
        .map_err(map_err)?;
        row.as_ref()
            .map(entry_from_row)
            .transpose()
            .map_err(map_err)
    }

    async fn put_entry(&mut self, user: &str, entry: &EntryRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO entries (owner, path, blob_key, size, content_hash, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (owner, path) DO UPDATE SET blob_key = excluded.blob_key, \
             size = excluded.size, content_hash = excluded.content_hash, \
             created_at = excluded.created_at, updated_at = excluded.updated_at",
        )
        .bind(user)
        .bind(&entry.path)
        .bind(&entry.blob_key)
        .bind(to_i64(entry.size))
        .bind(&entry.content_hash[..])
        .bind(entry.created_at)
        .bind(entry.updated_at)
        .execute(&mut *self.0)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn remove_entry(
        &mut self,
        user: &str,
        path: &str,
    ) -> Result<Option<EntryRecord>, StoreError> {
        let row = sqlx::query(&format!(
            "DELETE FROM entries WHERE owner = ? AND path = ? RETURNING {ENTRY_COLUMNS}"
        ))
        .bind(user)
        .bind(path)
        .fetch_optional(&mut *self.0)
        .await
        .map_err(map_err)?;
        row.as_ref()
            .map(entry_from_row)
            .transpose()
            .map_err(map_err)
    }

    async fn remove_all_entries(&mut self, user: &str) -> Result<Vec<EntryRecord>, StoreError> {
        let found = sqlx::query(&format!(
            "DELETE FROM entries WHERE owner = ? RETURNING {ENTRY_COLUMNS}"
        ))
        .bind(user)
        .fetch_all(&mut *self.0)
        .await
        .map_err(map_err)?;
        let mut removed = rows(&found, entry_from_row)?;
        // RETURNING has no ORDER BY.
        removed.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(removed)
    }

    async fn insert_session(&mut self, session: &SessionRecord) -> Result<(), StoreError> {
        let capabilities = serde_json::to_string(&session.capabilities)
            .map_err(|e| StoreError::Internal(e.to_string()))?;
        sqlx::query(
            "INSERT INTO sessions (token_hash, owner, capabilities, created_at, expires_at) \
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(&session.token_hash[..])
        .bind(&session.user)
        .bind(capabilities)
        .bind(session.created_at)
        .bind(session.expires_at)
        .execute(&mut *self.0)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn sum_entry_sizes(&mut self, user: &str) -> Result<u64, StoreError> {
        let sum: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM entries WHERE owner = ?",
        )
        .bind(user)
        .fetch_one(&mut *self.0)
        .await
        .map_err(map_err)?;
        Ok(to_u64(sum))
    }

    async fn retire_blobs(&mut self, blob_keys: &[&str], at: i64) -> Result<(), StoreError> {
        for chunk in blob_keys.chunks(1000) {
            let mut sql = sqlx::QueryBuilder::<Sqlite>::new(
                "INSERT INTO retired_blobs (blob_key, retired_at) ",
            );
            sql.push_values(chunk, |mut row, key| {
                row.push_bind(*key).push_bind(at);
            });
            sql.push(" ON CONFLICT (blob_key) DO NOTHING");
            sql.build().execute(&mut *self.0).await.map_err(map_err)?;
        }
        Ok(())
    }

    async fn append_events(&mut self, events: &[NewEvent<'_>]) -> Result<(), StoreError> {
        // SQLite allows 32766 bound values a statement; 5 an event.
        for chunk in events.chunks(1000) {
            let mut sql = sqlx::QueryBuilder::<Sqlite>::new(
                "INSERT INTO events (owner, path, kind, content_hash, created_at) ",
            );
            sql.push_values(chunk, |mut row, e| {
                row.push_bind(e.user)
                    .push_bind(e.path)
                    .push_bind(e.kind.as_str())
                    .push_bind(e.content_hash.map(|h| h.to_vec()))
                    .push_bind(e.created_at);
            });
            sql.build().execute(&mut *self.0).await.map_err(map_err)?;
        }
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<(), StoreError> {
        self.0.commit().await.map_err(map_err)
    }
}

#[async_trait]
impl MetadataStore for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.reader)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn begin_write(&self) -> Result<Box<dyn WriteTx>, StoreError> {
        let tx = self.writer.begin().await.map_err(map_err)?;
        Ok(Box::new(SqliteWriteTx(tx)))
    }

    async fn close(&self) {
        self.reader.close().await;
        self.writer.close().await;
    }

    async fn user(&self, public_key: &str) -> Result<Option<UserRecord>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {USER_COLUMNS} FROM users WHERE public_key = ?"
        ))
        .bind(public_key)
        .fetch_optional(&self.reader)
        .await
        .map_err(map_err)?;
        row.as_ref().map(user_from_row).transpose().map_err(map_err)
    }

    async fn write_context(&self, user: &str, path: &str) -> Result<WriteContext, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {USER_COLUMNS}, \
             (SELECT size FROM entries WHERE owner = ?1 AND path = ?2) AS existing_size \
             FROM users WHERE public_key = ?1"
        ))
        .bind(user)
        .bind(path)
        .fetch_optional(&self.reader)
        .await
        .map_err(map_err)?;
        let Some(row) = row else {
            return Ok(WriteContext {
                user: None,
                existing_size: None,
            });
        };
        let existing: Option<i64> = row.try_get("existing_size").map_err(map_err)?;
        Ok(WriteContext {
            user: Some(user_from_row(&row).map_err(map_err)?),
            existing_size: existing.map(to_u64),
        })
    }

    async fn entry(&self, user: &str, path: &str) -> Result<Option<EntryRecord>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {ENTRY_COLUMNS} FROM entries WHERE owner = ? AND path = ?"
        ))
        .bind(user)
        .bind(path)
        .fetch_optional(&self.reader)
        .await
        .map_err(map_err)?;
        row.as_ref()
            .map(entry_from_row)
            .transpose()
            .map_err(map_err)
    }

    async fn entries(&self, range: EntryRange<'_>) -> Result<Vec<EntryRecord>, StoreError> {
        let order = if range.descending { "DESC" } else { "ASC" };
        let found = sqlx::query(&format!(
            "SELECT {ENTRY_COLUMNS} FROM entries \
             WHERE owner = ? AND path > ? AND path < ? ORDER BY path {order} LIMIT ?"
        ))
        .bind(range.user)
        .bind(range.after)
        .bind(range.before)
        .bind(i64::from(range.limit))
        .fetch_all(&self.reader)
        .await
        .map_err(map_err)?;
        rows(&found, entry_from_row)
    }

    async fn blob_referenced(&self, blob_key: &str) -> Result<bool, StoreError> {
        let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM entries WHERE blob_key = ?")
            .bind(blob_key)
            .fetch_optional(&self.reader)
            .await
            .map_err(map_err)?;
        Ok(found.is_some())
    }

    async fn blob_state(&self, blob_key: &str) -> Result<BlobState, StoreError> {
        let row = sqlx::query(
            "SELECT (SELECT 1 FROM entries WHERE blob_key = ?1 LIMIT 1) AS referenced, \
             (SELECT retired_at FROM retired_blobs WHERE blob_key = ?1) AS retired_at",
        )
        .bind(blob_key)
        .fetch_one(&self.reader)
        .await
        .map_err(map_err)?;
        let referenced: Option<i64> = row.try_get("referenced").map_err(map_err)?;
        let retired_at: Option<i64> = row.try_get("retired_at").map_err(map_err)?;
        Ok(match (referenced, retired_at) {
            (Some(_), _) => BlobState::Referenced,
            (None, Some(retired_at)) => BlobState::Retired { retired_at },
            (None, None) => BlobState::Unknown,
        })
    }

    async fn retired_blobs(
        &self,
        retired_before: i64,
        limit: u32,
    ) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar(
            "SELECT blob_key FROM retired_blobs WHERE retired_at <= ? \
             ORDER BY retired_at, blob_key LIMIT ?",
        )
        .bind(retired_before)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await
        .map_err(map_err)
    }

    async fn forget_retired_blobs(&self, blob_keys: &[String]) -> Result<u64, StoreError> {
        let mut forgotten = 0;
        for chunk in blob_keys.chunks(1000) {
            let mut sql =
                sqlx::QueryBuilder::<Sqlite>::new("DELETE FROM retired_blobs WHERE blob_key IN (");
            let mut keys = sql.separated(", ");
            for key in chunk {
                keys.push_bind(key);
            }
            sql.push(")");
            forgotten += sql
                .build()
                .execute(&self.writer)
                .await
                .map_err(map_err)?
                .rows_affected();
        }
        Ok(forgotten)
    }

    async fn take_lease(
        &self,
        name: &str,
        holder: &str,
        now: i64,
        expires_at: i64,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO leases (name, holder, expires_at) VALUES (?1, ?2, ?3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
             expires_at = excluded.expires_at \
             WHERE leases.expires_at <= ?4 OR leases.holder = excluded.holder",
        )
        .bind(name)
        .bind(holder)
        .bind(expires_at)
        .bind(now)
        .execute(&self.writer)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_lease(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM leases WHERE name = ? AND holder = ?")
            .bind(name)
            .bind(holder)
            .execute(&self.writer)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn session(&self, token_hash: &[u8; 32]) -> Result<Option<SessionRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT owner, capabilities, created_at, expires_at FROM sessions WHERE token_hash = ?",
        )
        .bind(&token_hash[..])
        .fetch_optional(&self.reader)
        .await
        .map_err(map_err)?;
        let Some(row) = row else { return Ok(None) };
        let capabilities: String = row.try_get("capabilities").map_err(map_err)?;
        Ok(Some(SessionRecord {
            token_hash: *token_hash,
            user: row.try_get("owner").map_err(map_err)?,
            capabilities: serde_json::from_str(&capabilities)
                .map_err(|e| StoreError::Internal(format!("session capabilities: {e}")))?,
            created_at: row.try_get("created_at").map_err(map_err)?,
            expires_at: row.try_get("expires_at").map_err(map_err)?,
        }))
    }

    async fn delete_session(&self, token_hash: &[u8; 32]) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM sessions WHERE token_hash = ?")
            .bind(&token_hash[..])
            .execute(&self.writer)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn active_sessions(&self, now: i64) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sessions WHERE expires_at > ?")
            .bind(now)
            .fetch_one(&self.reader)
            .await
            .map_err(map_err)?;
        Ok(to_u64(n))
    }

    async fn purge_sessions(&self, before: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM sessions WHERE expires_at < ?")
            .bind(before)
            .execute(&self.writer)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    async fn purge_replay_marks(&self, now: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM seen_signatures WHERE expires_at < ?")
            .bind(now)
            .execute(&self.writer)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    async fn latest_cursor(&self) -> Result<u64, StoreError> {
        let cursor: Option<i64> = sqlx::query_scalar("SELECT MAX(cursor) FROM events")
            .fetch_one(&self.reader)
            .await
            .map_err(map_err)?;
        Ok(cursor.map(to_u64).unwrap_or(0))
    }

    async fn events(&self, query: EventQuery<'_>) -> Result<Vec<EventRecord>, StoreError> {
        let mut sql = sqlx::QueryBuilder::new(format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE cursor > "
        ));
        sql.push_bind(to_i64(query.after))
            .push(" AND cursor <= ")
            .push_bind(to_i64(query.up_to));
        push_event_filters(&mut sql, query.users, ">", query.path_prefix);
        sql.push(" ORDER BY cursor ASC LIMIT ")
            .push_bind(i64::from(query.limit));
        let found = sql.build().fetch_all(&self.reader).await.map_err(map_err)?;
        rows(&found, event_from_row)
    }

    async fn events_reverse(
        &self,
        query: ReverseEventQuery<'_>,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let mut sql = sqlx::QueryBuilder::new(format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE cursor < "
        ));
        sql.push_bind(to_i64(query.before));
        push_event_filters(&mut sql, query.users, "<", query.path_prefix);
        sql.push(" ORDER BY cursor DESC LIMIT ")
            .push_bind(i64::from(query.limit));
        let found = sql.build().fetch_all(&self.reader).await.map_err(map_err)?;
        rows(&found, event_from_row)
    }

    async fn create_signup_token(&self, token: &str, now: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO signup_tokens (token, created_at) VALUES (?, ?) \
             ON CONFLICT (token) DO NOTHING",
        )
        .bind(token)
        .bind(now)
        .execute(&self.writer)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn signup_token(&self, token: &str) -> Result<Option<SignupTokenRecord>, StoreError> {
        let row = sqlx::query("SELECT created_at, used_by FROM signup_tokens WHERE token = ?")
            .bind(token)
            .fetch_optional(&self.reader)
            .await
            .map_err(map_err)?;
        row.map(|row| {
            Ok(SignupTokenRecord {
                created_at: row.try_get("created_at")?,
                used: row.try_get::<Option<String>, _>("used_by")?.is_some(),
            })
        })
        .transpose()
        .map_err(map_err)
    }

    async fn stats(&self) -> Result<StoreStats, StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS users, COALESCE(SUM(used_bytes), 0) AS total FROM users",
        )
        .fetch_one(&self.reader)
        .await
        .map_err(map_err)?;
        Ok(StoreStats {
            users: to_u64(row.try_get("users").map_err(map_err)?),
            total_storage: to_u64(row.try_get("total").map_err(map_err)?),
        })
    }

    async fn set_user_disabled(&self, user: &str, disabled: bool) -> Result<bool, StoreError> {
        let done = sqlx::query("UPDATE users SET disabled = ? WHERE public_key = ?")
            .bind(i64::from(disabled))
            .bind(user)
            .execute(&self.writer)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn set_user_quota(&self, user: &str, quota: Option<u64>) -> Result<bool, StoreError> {
        let done = sqlx::query("UPDATE users SET quota_bytes = ? WHERE public_key = ?")
            .bind(quota.map(to_i64))
            .bind(user)
            .execute(&self.writer)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn users_after(&self, after: &str, limit: u32) -> Result<Vec<UserRecord>, StoreError> {
        let found = sqlx::query(&format!(
            "SELECT {USER_COLUMNS} FROM users WHERE public_key > ? ORDER BY public_key LIMIT ?"
        ))
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await
        .map_err(map_err)?;
        rows(&found, user_from_row)
    }

    async fn signup_tokens_after(
        &self,
        after: &str,
        limit: u32,
    ) -> Result<Vec<SignupTokenRow>, StoreError> {
        let found = sqlx::query(
            "SELECT token, created_at, used_by, used_at FROM signup_tokens \
             WHERE token > ? ORDER BY token LIMIT ?",
        )
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await
        .map_err(map_err)?;
        found
            .iter()
            .map(|row| {
                Ok(SignupTokenRow {
                    token: row.try_get("token")?,
                    created_at: row.try_get("created_at")?,
                    used_by: row.try_get("used_by")?,
                    used_at: row.try_get("used_at")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(map_err)
    }

    async fn sessions_after(
        &self,
        after: &[u8; 32],
        limit: u32,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let found = sqlx::query(
            "SELECT token_hash, owner, capabilities, created_at, expires_at FROM sessions \
             WHERE token_hash > ? ORDER BY token_hash LIMIT ?",
        )
        .bind(&after[..])
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await
        .map_err(map_err)?;
        found
            .iter()
            .map(|row| {
                let capabilities: String = row.try_get("capabilities").map_err(map_err)?;
                Ok(SessionRecord {
                    token_hash: hash32(row.try_get("token_hash").map_err(map_err)?)
                        .map_err(map_err)?,
                    user: row.try_get("owner").map_err(map_err)?,
                    capabilities: serde_json::from_str(&capabilities)
                        .map_err(|e| StoreError::Internal(format!("session capabilities: {e}")))?,
                    created_at: row.try_get("created_at").map_err(map_err)?,
                    expires_at: row.try_get("expires_at").map_err(map_err)?,
                })
            })
            .collect()
    }

    async fn copy_users(&self, users: &[UserRecord]) -> Result<(), StoreError> {
        for chunk in users.chunks(1000) {
            let mut sql =
                sqlx::QueryBuilder::<Sqlite>::new(format!("INSERT INTO users ({USER_COLUMNS}) "));
            sql.push_values(chunk, |mut row, u| {
                row.push_bind(&u.public_key)
                    .push_bind(u.created_at)
                    .push_bind(to_i64(u.used_bytes))
                    .push_bind(u.quota_bytes.map(to_i64))
                    .push_bind(i64::from(u.disabled))
                    .push_bind(u.last_activity);
            });
            sql.push(
                " ON CONFLICT (public_key) DO UPDATE SET created_at = excluded.created_at, \
                 used_bytes = excluded.used_bytes, quota_bytes = excluded.quota_bytes, \
                 disabled = excluded.disabled, last_activity = excluded.last_activity",
            );
            sql.build().execute(&self.writer).await.map_err(map_err)?;
        }
        Ok(())
    }

    async fn copy_entries(&self, user: &str, entries: &[EntryRecord]) -> Result<(), StoreError> {
        for chunk in entries.chunks(1000) {
            let mut sql = sqlx::QueryBuilder::<Sqlite>::new(format!(
                "INSERT INTO entries (owner, {ENTRY_COLUMNS}) "
            ));
            sql.push_values(chunk, |mut row, e| {
                row.push_bind(user)
                    .push_bind(&e.path)
                    .push_bind(&e.blob_key)
                    .push_bind(to_i64(e.size))
                    .push_bind(e.content_hash.to_vec())
                    .push_bind(e.created_at)
                    .push_bind(e.updated_at);
            });
            sql.push(
                " ON CONFLICT (owner, path) DO UPDATE SET blob_key = excluded.blob_key, \
                 size = excluded.size, content_hash = excluded.content_hash, \
                 created_at = excluded.created_at, updated_at = excluded.updated_at",
            );
            sql.build().execute(&self.writer).await.map_err(map_err)?;
        }
        Ok(())
    }

    async fn copy_events(&self, events: &[EventRecord]) -> Result<(), StoreError> {
        // An explicit cursor also moves AUTOINCREMENT's counter past it.
        for chunk in events.chunks(1000) {
            let mut sql = sqlx::QueryBuilder::<Sqlite>::new(
                "INSERT INTO events (cursor, owner, path, kind, content_hash, created_at) ",
            );
            sql.push_values(chunk, |mut row, e| {
                row.push_bind(to_i64(e.cursor))
                    .push_bind(&e.user)
                    .push_bind(&e.path)
                    .push_bind(e.kind.as_str())
                    .push_bind(e.content_hash.map(|h| h.to_vec()))
                    .push_bind(e.created_at);
            });
            sql.push(" ON CONFLICT (cursor) DO NOTHING");
            sql.build().execute(&self.writer).await.map_err(map_err)?;
        }
        Ok(())
    }

    async fn copy_signup_tokens(&self, tokens: &[SignupTokenRow]) -> Result<(), StoreError> {
        for chunk in tokens.chunks(1000) {
            let mut sql = sqlx::QueryBuilder::<Sqlite>::new(
                "INSERT INTO signup_tokens (token, created_at, used_by, used_at) ",
            );
            sql.push_values(chunk, |mut row, t| {
                row.push_bind(&t.token)
                    .push_bind(t.created_at)
                    .push_bind(&t.used_by)
                    .push_bind(t.used_at);
            });
            sql.push(
                " ON CONFLICT (token) DO UPDATE SET used_by = excluded.used_by, \
                 used_at = excluded.used_at",
            );
            sql.build().execute(&self.writer).await.map_err(map_err)?;
        }
        Ok(())
    }

    async fn copy_sessions(&self, sessions: &[SessionRecord]) -> Result<(), StoreError> {
        for chunk in sessions.chunks(1000) {
            let mut rows = Vec::with_capacity(chunk.len());
            for s in chunk {
                let capabilities = serde_json::to_string(&s.capabilities)
                    .map_err(|e| StoreError::Internal(e.to_string()))?;
                rows.push((s, capabilities));
            }
            let mut sql = sqlx::QueryBuilder::<Sqlite>::new(
                "INSERT INTO sessions (token_hash, owner, capabilities, created_at, expires_at) ",
            );
            sql.push_values(rows, |mut row, (s, capabilities)| {
                row.push_bind(s.token_hash.to_vec())
                    .push_bind(&s.user)
                    .push_bind(capabilities)
                    .push_bind(s.created_at)
                    .push_bind(s.expires_at);
            });
            sql.push(" ON CONFLICT (token_hash) DO NOTHING");
            sql.build().execute(&self.writer).await.map_err(map_err)?;
        }
        Ok(())
    }

    async fn put_pkarr_packet(
        &self,
        user: &str,
        timestamp: i64,
        packet: &[u8],
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO pkarr_packets (owner, timestamp, packet) \
             SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM users WHERE public_key = ?1) \
             ON CONFLICT (owner) DO UPDATE SET timestamp = excluded.timestamp, \
             packet = excluded.packet WHERE excluded.timestamp > pkarr_packets.timestamp",
        )
        .bind(user)
        .bind(timestamp)
        .bind(packet)
        .execute(&self.writer)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn pkarr_packets_after(
        &self,
        after: &str,
        limit: u32,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let rows = sqlx::query(
            "SELECT owner, packet FROM pkarr_packets WHERE owner > ? ORDER BY owner LIMIT ?",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.reader)
        .await
        .map_err(map_err)?;
        rows.into_iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(map_err)
    }
}
