//! The metadata store in SQL: SQLite (embedded, one process, WAL mode) or PostgreSQL
//! (shared by any number of server instances), one implementation over both.
//!
//! Every query, row mapping and the write transaction are written once, against sqlx's
//! `Any` driver, with `$n` placeholders (both databases read them), `ON CONFLICT`
//! upserts and `RETURNING` (both have them), and integers for every number and time.
//! What truly differs is in [`dialect`]: connecting (SQLite's pragmas and single writer,
//! PostgreSQL's statement timeout), the migrations (`migrations/sqlite`,
//! `migrations/postgres`: the same tables in each one's types), classifying errors,
//! row locking, and how event cursors are drawn in commit order (and announced, on
//! PostgreSQL: [`listen`]).
//!
//! How the store keeps the contracts of `persistence::metadata`:
//! - **Per-user serialized writes**: SQLite has one writer connection; on PostgreSQL
//!   [`WriteTx::lock_user`] is `SELECT ... FOR UPDATE` on the user's row, held until
//!   commit, so writes of different users run in parallel.
//! - **Commit-ordered cursors**: SQLite's AUTOINCREMENT under its single writer; on
//!   PostgreSQL an identity column drawn under a transaction advisory lock (one key for
//!   the whole database) taken just before the events insert, a transaction's last step,
//!   and released only when the commit is visible: a reader that saw cursor N never later
//!   sees a smaller one appear.
//! - **Commits announced** (PostgreSQL): the same transaction sends `NOTIFY hs_events`;
//!   every instance LISTENs and wakes its event tailer at once
//!   ([`MetadataStore::remote_commits`]).
//! - **Failures typed**: connection loss, a pool that cannot connect in time, server
//!   shutdown, statement timeouts, serialization failures and SQLite's busy file are
//!   [`StoreError::Unavailable`]-class (503); the pools reconnect by themselves.
//!
//! Paths and keys compare bytewise on both (PostgreSQL's columns use the "C"
//! collation, see its migration), so listings are in the same order.

mod dialect;
mod listen;
pub(crate) mod rows;
mod write_tx;

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{AnyPool, Row};
use tokio::sync::Notify;

use super::BackendOptions;
use super::DatabaseUrl;
use super::metadata::{
    BlobState, EntryRange, EntryRecord, EventQuery, EventRecord, ListedEntry, MetadataStore,
    ReverseEventQuery, SessionRecord, SignupTokenRecord, SignupTokenRow, StoreError, StoreStats,
    UserRecord, WriteContext, WriteTx,
};
use dialect::Dialect;
use rows::{
    CHUNK, ENTRY_COLUMNS, ENTRY_COLUMNS_BEFORE_INLINE, EVENT_COLUMNS, LISTED_COLUMNS, Statement,
    USER_COLUMNS, USER_SELECT, decode_all, entry_from_row, event_from_row, hash32, listed_from_row,
    push_event_filters, to_i64, to_u64, user_from_row,
};
use write_tx::SqlWriteTx;

pub use dialect::known_sqlite_schema_version;

pub struct SqlStore {
    dialect: Dialect,
    /// SQLite: the one writer connection; PostgreSQL: the pool (as `reader` too).
    writer: AnyPool,
    /// SQLite: read-only connections beside the writer.
    reader: AnyPool,
    /// PostgreSQL: woken by other instances' commits, and the task that listens.
    remote_commits: Option<(Arc<Notify>, tokio::task::JoinHandle<()>)>,
}

impl SqlStore {
    /// The `columns` of one user's entries in `range`.
    async fn entry_range(
        &self,
        columns: &str,
        range: &EntryRange<'_>,
    ) -> Result<Vec<sqlx::any::AnyRow>, StoreError> {
        let order = if range.descending { "DESC" } else { "ASC" };
        sqlx::query(&format!(
            "SELECT {columns} FROM entries \
             WHERE owner = $1 AND path > $2 AND path < $3 ORDER BY path {order} LIMIT $4"
        ))
        .bind(range.user)
        .bind(range.after)
        .bind(range.before)
        .bind(i64::from(range.limit))
        .fetch_all(&self.reader)
        .await
        .map_err(self.err())
    }

    /// Connects to the database `url` names (creating a SQLite file if missing),
    /// refuses one a newer homeserver migrated, and migrates it.
    pub async fn open(url: &DatabaseUrl, options: &BackendOptions) -> Result<Self, StoreError> {
        let dialect = match url {
            DatabaseUrl::Sqlite(_) => Dialect::Sqlite,
            DatabaseUrl::Postgres(_) => Dialect::Postgres,
        };
        let text = url.expose_secret();
        let pools = dialect.connect(text, options).await?;
        let err = |e| dialect.map_err(e);
        let migrations_table: i64 = sqlx::query_scalar(dialect.migrations_table_query())
            .fetch_one(&pools.writer)
            .await
            .map_err(err)?;
        if migrations_table > 0 {
            let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations")
                .fetch_all(&pools.writer)
                .await
                .map_err(err)?;
            super::refuse_newer_schema(&applied, dialect.migrator())?;
        }
        dialect
            .migrator()
            .run(&pools.writer)
            .await
            .map_err(|e| StoreError::Internal(format!("migrating the database: {e}")))?;
        let remote_commits = match dialect {
            Dialect::Sqlite => None,
            Dialect::Postgres => {
                let wake = Arc::new(Notify::new());
                let task = listen::spawn(text, wake.clone())?;
                Some((wake, task))
            }
        };
        Ok(Self {
            dialect,
            writer: pools.writer,
            reader: pools.reader,
            remote_commits,
        })
    }

    fn err(&self) -> impl Fn(sqlx::Error) -> StoreError + use<> {
        let dialect = self.dialect;
        move |e| dialect.map_err(e)
    }
}

impl Drop for SqlStore {
    fn drop(&mut self) {
        if let Some((_, task)) = &self.remote_commits {
            task.abort();
        }
    }
}

/// A SQLite database file read as it is (read-only, never migrated): a backup's
/// snapshot.
/// The SQLite migration that added `entries.inline_value`.
const SQLITE_SCHEMA_INLINE_VALUES: i64 = 6;

pub struct SqliteFile {
    pool: AnyPool,
}

impl SqliteFile {
    pub async fn open(path: &std::path::Path) -> Result<Self, StoreError> {
        let pool = dialect::open_sqlite_file(path).await?;
        Ok(Self { pool })
    }

    /// The schema version its migrations reached (0 for a database never migrated).
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        let version: Option<i64> =
            sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations WHERE success")
                .fetch_one(&self.pool)
                .await
                .map_err(|e| Dialect::Sqlite.map_err(e))?;
        Ok(version.unwrap_or(0))
    }

    /// Entries of every user after `(user, path)` in that order, at most `limit`.
    pub async fn entries_after(
        &self,
        after: (&str, &str),
        limit: u32,
    ) -> Result<Vec<(String, EntryRecord)>, StoreError> {
        let err = |e| Dialect::Sqlite.map_err(e);
        // A backup made before inline values (read as it is, never migrated).
        let columns = match self.schema_version().await? {
            v if v >= SQLITE_SCHEMA_INLINE_VALUES => ENTRY_COLUMNS,
            _ => ENTRY_COLUMNS_BEFORE_INLINE,
        };
        let found = sqlx::query(&format!(
            "SELECT owner, {columns} FROM entries WHERE (owner, path) > ($1, $2) \
             ORDER BY owner, path LIMIT $3"
        ))
        .bind(after.0)
        .bind(after.1)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(err)?;
        found
            .iter()
            .map(|row| Ok((row.try_get("owner")?, entry_from_row(row)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(err)
    }

    pub async fn close(self) {
        self.pool.close().await;
    }
}

#[async_trait]
impl MetadataStore for SqlStore {
    fn backend(&self) -> &'static str {
        self.dialect.name()
    }

    fn shared(&self) -> bool {
        self.dialect == Dialect::Postgres
    }

    fn remote_commits(&self) -> Option<Arc<Notify>> {
        self.remote_commits.as_ref().map(|(wake, _)| wake.clone())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.reader)
            .await
            .map_err(self.err())?;
        Ok(())
    }

    async fn begin_write(&self) -> Result<Box<dyn WriteTx>, StoreError> {
        let tx = self.writer.begin().await.map_err(self.err())?;
        Ok(Box::new(SqlWriteTx {
            tx,
            dialect: self.dialect,
        }))
    }

    async fn close(&self) {
        if let Some((_, task)) = &self.remote_commits {
            task.abort();
        }
        self.reader.close().await;
        self.writer.close().await;
    }

    async fn user(&self, public_key: &str) -> Result<Option<UserRecord>, StoreError> {
        rows::user(&self.reader, public_key, "")
            .await
            .map_err(self.err())
    }

    async fn write_context(&self, user: &str, path: &str) -> Result<WriteContext, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {USER_SELECT}, \
             (SELECT size FROM entries WHERE owner = $1 AND path = $2) AS existing_size \
             FROM users WHERE public_key = $1"
        ))
        .bind(user)
        .bind(path)
        .fetch_optional(&self.reader)
        .await
        .map_err(self.err())?;
        let Some(row) = row else {
            return Ok(WriteContext {
                user: None,
                existing_size: None,
            });
        };
        let existing: Option<i64> = row.try_get("existing_size").map_err(self.err())?;
        Ok(WriteContext {
            user: Some(user_from_row(&row).map_err(self.err())?),
            existing_size: existing.map(to_u64),
        })
    }

    async fn entry(&self, user: &str, path: &str) -> Result<Option<EntryRecord>, StoreError> {
        rows::entry(&self.reader, user, path)
            .await
            .map_err(self.err())
    }

    async fn entries(&self, range: EntryRange<'_>) -> Result<Vec<EntryRecord>, StoreError> {
        let found = self.entry_range(ENTRY_COLUMNS, &range).await?;
        decode_all(&found, entry_from_row).map_err(self.err())
    }

    async fn listing(&self, range: EntryRange<'_>) -> Result<Vec<ListedEntry>, StoreError> {
        let found = self.entry_range(LISTED_COLUMNS, &range).await?;
        decode_all(&found, listed_from_row).map_err(self.err())
    }

    async fn blob_referenced(&self, blob_key: &str) -> Result<bool, StoreError> {
        let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM entries WHERE blob_key = $1")
            .bind(blob_key)
            .fetch_optional(&self.reader)
            .await
            .map_err(self.err())?;
        Ok(found.is_some())
    }

    async fn blob_state(&self, blob_key: &str) -> Result<BlobState, StoreError> {
        // One statement: one snapshot of both tables.
        let row = sqlx::query(
            "SELECT (SELECT 1 FROM entries WHERE blob_key = $1 LIMIT 1) AS referenced, \
             (SELECT retired_at FROM retired_blobs WHERE blob_key = $1) AS retired_at",
        )
        .bind(blob_key)
        .fetch_one(&self.reader)
        .await
        .map_err(self.err())?;
        let referenced: Option<i64> = row.try_get("referenced").map_err(self.err())?;
        let retired_at: Option<i64> = row.try_get("retired_at").map_err(self.err())?;
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
            "SELECT blob_key FROM retired_blobs WHERE retired_at <= $1 \
             ORDER BY retired_at, blob_key LIMIT $2",
        )
        .bind(retired_before)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await
        .map_err(self.err())
    }

    async fn forget_retired_blobs(&self, blob_keys: &[String]) -> Result<u64, StoreError> {
        let mut forgotten = 0;
        for chunk in blob_keys.chunks(CHUNK) {
            let mut sql = Statement::new("DELETE FROM retired_blobs WHERE blob_key IN (");
            for (i, key) in chunk.iter().enumerate() {
                if i > 0 {
                    sql.push(", ");
                }
                sql.bind(key.as_str());
            }
            sql.push(")");
            forgotten += sql
                .execute(&self.writer)
                .await
                .map_err(self.err())?
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
        // Two instances racing on PostgreSQL: ON CONFLICT waits for the other's row and
        // re-checks the WHERE on it, so at most one of them gets a row back.
        let done = sqlx::query(
            "INSERT INTO leases (name, holder, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
             expires_at = excluded.expires_at \
             WHERE leases.expires_at <= $4 OR leases.holder = excluded.holder",
        )
        .bind(name)
        .bind(holder)
        .bind(expires_at)
        .bind(now)
        .execute(&self.writer)
        .await
        .map_err(self.err())?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_lease(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM leases WHERE name = $1 AND holder = $2")
            .bind(name)
            .bind(holder)
            .execute(&self.writer)
            .await
            .map_err(self.err())?;
        Ok(())
    }

    async fn session(&self, token_hash: &[u8; 32]) -> Result<Option<SessionRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT token_hash, owner, capabilities, created_at, expires_at FROM sessions \
             WHERE token_hash = $1",
        )
        .bind(&token_hash[..])
        .fetch_optional(&self.reader)
        .await
        .map_err(self.err())?;
        row.as_ref().map(session_from_row).transpose()
    }

    async fn delete_session(&self, token_hash: &[u8; 32]) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM sessions WHERE token_hash = $1")
            .bind(&token_hash[..])
            .execute(&self.writer)
            .await
            .map_err(self.err())?;
        Ok(done.rows_affected() == 1)
    }

    async fn active_sessions(&self, now: i64) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sessions WHERE expires_at > $1")
            .bind(now)
            .fetch_one(&self.reader)
            .await
            .map_err(self.err())?;
        Ok(to_u64(n))
    }

    async fn purge_sessions(&self, before: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM sessions WHERE expires_at < $1")
            .bind(before)
            .execute(&self.writer)
            .await
            .map_err(self.err())?;
        Ok(done.rows_affected())
    }

    async fn purge_replay_marks(&self, now: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM seen_signatures WHERE expires_at < $1")
            .bind(now)
            .execute(&self.writer)
            .await
            .map_err(self.err())?;
        Ok(done.rows_affected())
    }

    async fn latest_cursor(&self) -> Result<u64, StoreError> {
        let cursor: Option<i64> = sqlx::query_scalar("SELECT MAX(cursor) FROM events")
            .fetch_one(&self.reader)
            .await
            .map_err(self.err())?;
        Ok(cursor.map(to_u64).unwrap_or(0))
    }

    async fn events(&self, query: EventQuery<'_>) -> Result<Vec<EventRecord>, StoreError> {
        let mut sql = Statement::new(format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE cursor > "
        ));
        sql.bind(to_i64(query.after))
            .push(" AND cursor <= ")
            .bind(to_i64(query.up_to));
        push_event_filters(&mut sql, query.users, ">", query.path_prefix);
        sql.push(" ORDER BY cursor ASC LIMIT ")
            .bind(i64::from(query.limit));
        let found = sql.fetch_all(&self.reader).await.map_err(self.err())?;
        decode_all(&found, event_from_row).map_err(self.err())
    }

    async fn events_reverse(
        &self,
        query: ReverseEventQuery<'_>,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let mut sql = Statement::new(format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE cursor < "
        ));
        sql.bind(to_i64(query.before));
        push_event_filters(&mut sql, query.users, "<", query.path_prefix);
        sql.push(" ORDER BY cursor DESC LIMIT ")
            .bind(i64::from(query.limit));
        let found = sql.fetch_all(&self.reader).await.map_err(self.err())?;
        decode_all(&found, event_from_row).map_err(self.err())
    }

    async fn create_signup_token(&self, token: &str, now: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO signup_tokens (token, created_at) VALUES ($1, $2) \
             ON CONFLICT (token) DO NOTHING",
        )
        .bind(token)
        .bind(now)
        .execute(&self.writer)
        .await
        .map_err(self.err())?;
        Ok(done.rows_affected() == 1)
    }

    async fn signup_token(&self, token: &str) -> Result<Option<SignupTokenRecord>, StoreError> {
        let row = sqlx::query("SELECT created_at, used_by FROM signup_tokens WHERE token = $1")
            .bind(token)
            .fetch_optional(&self.reader)
            .await
            .map_err(self.err())?;
        row.map(|row| {
            Ok(SignupTokenRecord {
                created_at: row.try_get("created_at")?,
                used: row.try_get::<Option<String>, _>("used_by")?.is_some(),
            })
        })
        .transpose()
        .map_err(self.err())
    }

    async fn stats(&self) -> Result<StoreStats, StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS users, CAST(COALESCE(SUM(used_bytes), 0) AS BIGINT) AS total \
             FROM users",
        )
        .fetch_one(&self.reader)
        .await
        .map_err(self.err())?;
        Ok(StoreStats {
            users: to_u64(row.try_get("users").map_err(self.err())?),
            total_storage: to_u64(row.try_get("total").map_err(self.err())?),
        })
    }

    async fn set_user_disabled(&self, user: &str, disabled: bool) -> Result<bool, StoreError> {
        let done = sqlx::query("UPDATE users SET disabled = $1 WHERE public_key = $2")
            .bind(disabled)
            .bind(user)
            .execute(&self.writer)
            .await
            .map_err(self.err())?;
        Ok(done.rows_affected() == 1)
    }

    async fn set_user_quota(&self, user: &str, quota: Option<u64>) -> Result<bool, StoreError> {
        let done = sqlx::query("UPDATE users SET quota_bytes = $1 WHERE public_key = $2")
            .bind(quota.map(to_i64))
            .bind(user)
            .execute(&self.writer)
            .await
            .map_err(self.err())?;
        Ok(done.rows_affected() == 1)
    }

    async fn users_after(&self, after: &str, limit: u32) -> Result<Vec<UserRecord>, StoreError> {
        let found = sqlx::query(&format!(
            "SELECT {USER_SELECT} FROM users WHERE public_key > $1 ORDER BY public_key LIMIT $2"
        ))
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await
        .map_err(self.err())?;
        decode_all(&found, user_from_row).map_err(self.err())
    }

    async fn signup_tokens_after(
        &self,
        after: &str,
        limit: u32,
    ) -> Result<Vec<SignupTokenRow>, StoreError> {
        let found = sqlx::query(
            "SELECT token, created_at, used_by, used_at FROM signup_tokens \
             WHERE token > $1 ORDER BY token LIMIT $2",
        )
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await
        .map_err(self.err())?;
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
            .map_err(self.err())
    }

    async fn sessions_after(
        &self,
        after: &[u8; 32],
        limit: u32,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let found = sqlx::query(
            "SELECT token_hash, owner, capabilities, created_at, expires_at FROM sessions \
             WHERE token_hash > $1 ORDER BY token_hash LIMIT $2",
        )
        .bind(&after[..])
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await
        .map_err(self.err())?;
        found.iter().map(session_from_row).collect()
    }

    async fn copy_users(&self, users: &[UserRecord]) -> Result<(), StoreError> {
        for chunk in users.chunks(CHUNK) {
            let mut sql = Statement::new(format!("INSERT INTO users ({USER_COLUMNS}) "));
            sql.push_values(chunk, |row, u| {
                row.bind(u.public_key.as_str())
                    .bind(u.created_at)
                    .bind(to_i64(u.used_bytes))
                    .bind(u.quota_bytes.map(to_i64))
                    .bind(u.disabled)
                    .bind(u.last_activity);
            });
            sql.push(
                " ON CONFLICT (public_key) DO UPDATE SET created_at = excluded.created_at, \
                 used_bytes = excluded.used_bytes, quota_bytes = excluded.quota_bytes, \
                 disabled = excluded.disabled, last_activity = excluded.last_activity",
            );
            sql.execute(&self.writer).await.map_err(self.err())?;
        }
        Ok(())
    }

    async fn copy_entries(&self, user: &str, entries: &[EntryRecord]) -> Result<(), StoreError> {
        for chunk in entries.chunks(CHUNK) {
            rows::upsert_entries(chunk.iter().map(|e| (user, e)))
                .execute(&self.writer)
                .await
                .map_err(self.err())?;
        }
        Ok(())
    }

    async fn copy_events(&self, events: &[EventRecord]) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let mut tx = self.writer.begin().await.map_err(self.err())?;
        // Serialized with live appends, like them.
        if let Some((lock, key)) = self.dialect.before_events() {
            sqlx::query(lock)
                .bind(key)
                .execute(&mut *tx)
                .await
                .map_err(self.err())?;
        }
        let (overriding, move_sequence) = self.dialect.explicit_cursors();
        for chunk in events.chunks(CHUNK) {
            let mut sql = Statement::new(format!(
                "INSERT INTO events (cursor, owner, path, kind, content_hash, created_at){overriding} "
            ));
            sql.push_values(chunk, |row, e| {
                row.bind(to_i64(e.cursor))
                    .bind(e.user.as_str())
                    .bind(e.path.as_str())
                    .bind(e.kind.as_str())
                    .bind(e.content_hash.map(|h| h.to_vec()))
                    .bind(e.created_at);
            });
            sql.push(" ON CONFLICT (cursor) DO NOTHING");
            sql.execute(&mut *tx).await.map_err(self.err())?;
        }
        // Later appends continue above the copied cursors.
        if let Some(move_sequence) = move_sequence {
            sqlx::query(move_sequence)
                .execute(&mut *tx)
                .await
                .map_err(self.err())?;
        }
        tx.commit().await.map_err(self.err())
    }

    async fn copy_signup_tokens(&self, tokens: &[SignupTokenRow]) -> Result<(), StoreError> {
        for chunk in tokens.chunks(CHUNK) {
            let mut sql =
                Statement::new("INSERT INTO signup_tokens (token, created_at, used_by, used_at) ");
            sql.push_values(chunk, |row, t| {
                row.bind(t.token.as_str())
                    .bind(t.created_at)
                    .bind(t.used_by.as_deref())
                    .bind(t.used_at);
            });
            sql.push(
                " ON CONFLICT (token) DO UPDATE SET used_by = excluded.used_by, \
                 used_at = excluded.used_at",
            );
            sql.execute(&self.writer).await.map_err(self.err())?;
        }
        Ok(())
    }

    async fn copy_sessions(&self, sessions: &[SessionRecord]) -> Result<(), StoreError> {
        for chunk in sessions.chunks(CHUNK) {
            let mut rows = Vec::with_capacity(chunk.len());
            for s in chunk {
                let capabilities = serde_json::to_string(&s.capabilities)
                    .map_err(|e| StoreError::Internal(e.to_string()))?;
                rows.push((s, capabilities));
            }
            let mut sql = Statement::new(
                "INSERT INTO sessions (token_hash, owner, capabilities, created_at, expires_at) ",
            );
            sql.push_values(rows, |row, (s, capabilities)| {
                row.bind(s.token_hash.to_vec())
                    .bind(s.user.as_str())
                    .bind(capabilities)
                    .bind(s.created_at)
                    .bind(s.expires_at);
            });
            sql.push(" ON CONFLICT (token_hash) DO NOTHING");
            sql.execute(&self.writer).await.map_err(self.err())?;
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
             SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM users WHERE public_key = $1) \
             ON CONFLICT (owner) DO UPDATE SET timestamp = excluded.timestamp, \
             packet = excluded.packet WHERE excluded.timestamp > pkarr_packets.timestamp",
        )
        .bind(user)
        .bind(timestamp)
        .bind(packet)
        .execute(&self.writer)
        .await
        .map_err(self.err())?;
        Ok(done.rows_affected() == 1)
    }

    async fn pkarr_packets_after(
        &self,
        after: &str,
        limit: u32,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let rows = sqlx::query(
            "SELECT owner, packet FROM pkarr_packets WHERE owner > $1 ORDER BY owner LIMIT $2",
        )
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await
        .map_err(self.err())?;
        rows.into_iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(self.err())
    }
}

/// A session row (`token_hash, owner, capabilities, created_at, expires_at`).
fn session_from_row(row: &sqlx::any::AnyRow) -> Result<SessionRecord, StoreError> {
    let err = |e| StoreError::database(e, false);
    let capabilities: String = row.try_get("capabilities").map_err(err)?;
    Ok(SessionRecord {
        token_hash: hash32(row.try_get("token_hash").map_err(err)?).map_err(err)?,
        user: row.try_get("owner").map_err(err)?,
        capabilities: serde_json::from_str(&capabilities)
            .map_err(|e| StoreError::Internal(format!("session capabilities: {e}")))?,
        created_at: row.try_get("created_at").map_err(err)?,
        expires_at: row.try_get("expires_at").map_err(err)?,
    })
}
