//! The scale-out metadata store: PostgreSQL through sqlx, shared by any number of server
//! instances.
//!
//! How it keeps the boundary's contracts (persistence::metadata) with several writers in
//! several processes:
//! - **Per-user serialized writes**: [`WriteTx::lock_user`] is `SELECT ... FOR UPDATE`
//!   on the user's row, held until commit; writes of different users run in parallel.
//! - **Commit-ordered cursors**: [`WriteTx::append_events`] first takes a transaction
//!   advisory lock (one key for the whole database), then inserts the events, whose
//!   cursors come from an identity column; the lock is released only after the commit
//!   is visible. So cursors are drawn in commit order: a reader that saw cursor N never
//!   later sees a smaller one appear. The lock is held from the events insert (a
//!   transaction's last step) to the commit: a short section.
//! - **Commits announced**: the same transaction sends `NOTIFY hs_events`; every
//!   instance LISTENs and wakes its event tailer at once ([`MetadataStore::remote_commits`]).
//! - **Failures typed**: connection loss, a pool that cannot connect within the
//!   configured timeout, server shutdown, statement timeouts and serialization failures
//!   are [`StoreError::Unavailable`] (503); the pool reconnects by itself when the
//!   database is back.
//!
//! Paths and keys use the "C" collation (see the migration), so listings are bytewise.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{Postgres, Row, Transaction};
use tokio::sync::Notify;

use homeserver_protocol::event::EventKind;

use super::BackendOptions;
use super::metadata::{
    BlobState, EntryRange, EntryRecord, EventQuery, EventRecord, MetadataStore, NewEvent,
    ReplayMark, ReverseEventQuery, SessionRecord, SignupTokenRecord, SignupTokenRow, StoreError,
    StoreStats, TokenRedemption, UserCursor, UserRecord, WriteContext, WriteTx,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// The advisory lock that serializes cursor assignment (any constant; "hs-event").
const EVENTS_LOCK: i64 = 0x6873_2d65_7665_6e74;
/// The channel commits are announced on.
const EVENTS_CHANNEL: &str = "hs_events";

pub struct PostgresStore {
    pool: PgPool,
    remote_commits: Arc<Notify>,
    listener: tokio::task::JoinHandle<()>,
}

impl PostgresStore {
    /// Connects to the database `url` names and migrates it.
    pub async fn open(url: &str, options: &BackendOptions) -> Result<Self, StoreError> {
        let statement_timeout = options.timeout.as_millis().to_string();
        let connect = PgConnectOptions::from_str(url)
            // The parser's message does not echo the URL (no password in logs).
            .map_err(|e| StoreError::Internal(format!("database url: {e}")))?
            .application_name("homeserver")
            // A statement that hangs (a lock held elsewhere, a database in trouble)
            // fails within the configured timeout instead of holding a request.
            .options([("statement_timeout", statement_timeout.as_str())]);
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(2))
            .acquire_timeout(options.timeout)
            .connect_with(connect)
            .await
            .map_err(map_err)?;
        let migrations_table: bool =
            sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
                .fetch_one(&pool)
                .await
                .map_err(map_err)?;
        if migrations_table {
            let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations")
                .fetch_all(&pool)
                .await
                .map_err(map_err)?;
            super::refuse_newer_schema(&applied, &MIGRATOR)?;
        }
        MIGRATOR
            .run(&pool)
            .await
            .map_err(|e| StoreError::Internal(format!("migrating the database: {e}")))?;
        let remote_commits = Arc::new(Notify::new());
        let listener = tokio::spawn(listen(pool.clone(), remote_commits.clone()));
        Ok(Self {
            pool,
            remote_commits,
            listener,
        })
    }
}

/// Follows `NOTIFY hs_events` and wakes the event tailer. sqlx's listener reconnects by
/// itself; after a reconnect it wakes the tailer too (notifications sent meanwhile
/// were lost, and the tailer's read catches up on them).
async fn listen(pool: PgPool, wake: Arc<Notify>) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "event LISTEN connection failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(e) = listener.listen(EVENTS_CHANNEL).await {
            tracing::debug!(error = %e, "LISTEN failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        wake.notify_one();
        loop {
            match listener.try_recv().await {
                Ok(Some(_)) => wake.notify_one(),
                // The connection was lost; the next try_recv reconnects.
                Ok(None) => wake.notify_one(),
                Err(e) => {
                    tracing::debug!(error = %e, "event LISTEN connection lost; reconnecting");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    break;
                }
            }
        }
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

fn map_err(e: sqlx::Error) -> StoreError {
    let unavailable = match &e {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
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

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn user_from_row(row: &PgRow) -> Result<UserRecord, sqlx::Error> {
    Ok(UserRecord {
        public_key: row.try_get("public_key")?,
        created_at: row.try_get("created_at")?,
        used_bytes: to_u64(row.try_get("used_bytes")?),
        quota_bytes: row.try_get::<Option<i64>, _>("quota_bytes")?.map(to_u64),
        disabled: row.try_get("disabled")?,
        last_activity: row.try_get("last_activity")?,
    })
}

fn hash32(bytes: Vec<u8>) -> Result<[u8; 32], sqlx::Error> {
    bytes
        .try_into()
        .map_err(|_| sqlx::Error::Decode("content_hash is not 32 bytes".into()))
}

fn entry_from_row(row: &PgRow) -> Result<EntryRecord, sqlx::Error> {
    Ok(EntryRecord {
        path: row.try_get("path")?,
        blob_key: row.try_get("blob_key")?,
        size: to_u64(row.try_get("size")?),
        content_hash: hash32(row.try_get("content_hash")?)?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn event_from_row(row: &PgRow) -> Result<EventRecord, sqlx::Error> {
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
    rows: &[PgRow],
    decode: fn(&PgRow) -> Result<T, sqlx::Error>,
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

/// Appends `AND ((owner = $n AND cursor <op> $m) OR ...)` and the path-prefix range.
/// A per-user cursor of 0 means no bound.
fn push_event_filters<'a>(
    sql: &mut sqlx::QueryBuilder<'a, Postgres>,
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
        // Every path under `prefix` sorts in [prefix, prefix + '{') bytewise ("C").
        sql.push(" AND path >= ")
            .push_bind(prefix)
            .push(" AND path < ")
            .push_bind(format!("{prefix}{{"));
    }
}

/// A write transaction on one pooled connection.
struct PgWriteTx(Transaction<'static, Postgres>);

#[async_trait]
impl WriteTx for PgWriteTx {
    async fn insert_replay_mark(&mut self, mark: ReplayMark) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO seen_signatures (signature_id, expires_at) VALUES ($1, $2) \
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
        let row = sqlx::query(&format!(
            "SELECT {USER_COLUMNS} FROM users WHERE public_key = $1 FOR UPDATE"
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
        // ON CONFLICT waits for a concurrent insert of the same key to end.
        let done = sqlx::query(
            "INSERT INTO users (public_key, created_at, last_activity, signup_token) \
             VALUES ($1, $2, $2, $3) ON CONFLICT (public_key) DO NOTHING",
        )
        .bind(public_key)
        .bind(now)
        .bind(signup_token)
        .execute(&mut *self.0)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_user(&mut self, public_key: &str) -> Result<(), StoreError> {
        for table in ["sessions", "pkarr_packets"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE owner = $1"))
                .bind(public_key)
                .execute(&mut *self.0)
                .await
                .map_err(map_err)?;
        }
        sqlx::query("DELETE FROM users WHERE public_key = $1")
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
        sqlx::query("UPDATE users SET used_bytes = $1, last_activity = $2 WHERE public_key = $3")
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
        // A concurrent redemption holds the row; this UPDATE waits for it and then
        // re-checks `used_by IS NULL`, so of two racing signups one wins.
        let redeemed = sqlx::query(
            "UPDATE signup_tokens SET used_by = $1, used_at = $2 \
             WHERE token = $3 AND used_by IS NULL",
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
        let known: Option<i32> = sqlx::query_scalar("SELECT 1 FROM signup_tokens WHERE token = $1")
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
            "SELECT {ENTRY_COLUMNS} FROM entries WHERE owner = $1 AND path = $2"
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
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
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
            "DELETE FROM entries WHERE owner = $1 AND path = $2 RETURNING {ENTRY_COLUMNS}"
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
            "DELETE FROM entries WHERE owner = $1 RETURNING {ENTRY_COLUMNS}"
        ))
        .bind(user)
        .fetch_all(&mut *self.0)
        .await
        .map_err(map_err)?;
        let mut removed = rows(&found, entry_from_row)?;
        // RETURNING has no ORDER BY; path order, bytewise as the "C" collation.
        removed.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(removed)
    }

    async fn insert_session(&mut self, session: &SessionRecord) -> Result<(), StoreError> {
        let capabilities = serde_json::to_string(&session.capabilities)
            .map_err(|e| StoreError::Internal(e.to_string()))?;
        sqlx::query(
            "INSERT INTO sessions (token_hash, owner, capabilities, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5)",
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
            "SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM entries WHERE owner = $1",
        )
        .bind(user)
        .fetch_one(&mut *self.0)
        .await
        .map_err(map_err)?;
        Ok(to_u64(sum))
    }

    async fn retire_blobs(&mut self, blob_keys: &[&str], at: i64) -> Result<(), StoreError> {
        for chunk in blob_keys.chunks(1000) {
            let mut sql = sqlx::QueryBuilder::<Postgres>::new(
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
        if events.is_empty() {
            return Ok(());
        }
        // Held until commit: cursors are drawn in commit order (module header).
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(EVENTS_LOCK)
            .execute(&mut *self.0)
            .await
            .map_err(map_err)?;
        // PostgreSQL allows 65535 bound values a statement; 5 an event.
        for chunk in events.chunks(10_000) {
            let mut sql = sqlx::QueryBuilder::<Postgres>::new(
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
        // Delivered to every listening instance when (and only if) this commits.
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(EVENTS_CHANNEL)
            .execute(&mut *self.0)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<(), StoreError> {
        self.0.commit().await.map_err(map_err)
    }
}

#[async_trait]
impl MetadataStore for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn shared(&self) -> bool {
        true
    }

    fn remote_commits(&self) -> Option<Arc<Notify>> {
        Some(self.remote_commits.clone())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn begin_write(&self) -> Result<Box<dyn WriteTx>, StoreError> {
        let tx = self.pool.begin().await.map_err(map_err)?;
        Ok(Box::new(PgWriteTx(tx)))
    }

    async fn close(&self) {
        self.listener.abort();
        self.pool.close().await;
    }

    async fn user(&self, public_key: &str) -> Result<Option<UserRecord>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {USER_COLUMNS} FROM users WHERE public_key = $1"
        ))
        .bind(public_key)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        row.as_ref().map(user_from_row).transpose().map_err(map_err)
    }

    async fn write_context(&self, user: &str, path: &str) -> Result<WriteContext, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {USER_COLUMNS}, \
             (SELECT size FROM entries WHERE owner = $1 AND path = $2) AS existing_size \
             FROM users WHERE public_key = $1"
        ))
        .bind(user)
        .bind(path)
        .fetch_optional(&self.pool)
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
            "SELECT {ENTRY_COLUMNS} FROM entries WHERE owner = $1 AND path = $2"
        ))
        .bind(user)
        .bind(path)
        .fetch_optional(&self.pool)
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
             WHERE owner = $1 AND path > $2 AND path < $3 ORDER BY path {order} LIMIT $4"
        ))
        .bind(range.user)
        .bind(range.after)
        .bind(range.before)
        .bind(i64::from(range.limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows(&found, entry_from_row)
    }

    async fn blob_referenced(&self, blob_key: &str) -> Result<bool, StoreError> {
        let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM entries WHERE blob_key = $1")
            .bind(blob_key)
            .fetch_optional(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(found.is_some())
    }

    async fn blob_state(&self, blob_key: &str) -> Result<BlobState, StoreError> {
        // One statement: one snapshot of both tables.
        let row = sqlx::query(
            "SELECT (SELECT 1 FROM entries WHERE blob_key = $1 LIMIT 1) AS referenced, \
             (SELECT retired_at FROM retired_blobs WHERE blob_key = $1) AS retired_at",
        )
        .bind(blob_key)
        .fetch_one(&self.pool)
        .await
        .map_err(map_err)?;
        let referenced: Option<i32> = row.try_get("referenced").map_err(map_err)?;
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
            "SELECT blob_key FROM retired_blobs WHERE retired_at <= $1 \
             ORDER BY retired_at, blob_key LIMIT $2",
        )
        .bind(retired_before)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)
    }

    async fn forget_retired_blobs(&self, blob_keys: &[String]) -> Result<u64, StoreError> {
        let mut forgotten = 0;
        for chunk in blob_keys.chunks(1000) {
            let mut sql = sqlx::QueryBuilder::<Postgres>::new(
                "DELETE FROM retired_blobs WHERE blob_key IN (",
            );
            let mut keys = sql.separated(", ");
            for key in chunk {
                keys.push_bind(key);
            }
            sql.push(")");
            forgotten += sql
                .build()
                .execute(&self.pool)
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
        // Two instances racing: ON CONFLICT waits for the other's row and re-checks the
        // WHERE on it, so at most one of them gets a row back.
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
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_lease(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM leases WHERE name = $1 AND holder = $2")
            .bind(name)
            .bind(holder)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn session(&self, token_hash: &[u8; 32]) -> Result<Option<SessionRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT owner, capabilities, created_at, expires_at FROM sessions \
             WHERE token_hash = $1",
        )
        .bind(&token_hash[..])
        .fetch_optional(&self.pool)
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
        let done = sqlx::query("DELETE FROM sessions WHERE token_hash = $1")
            .bind(&token_hash[..])
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn active_sessions(&self, now: i64) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sessions WHERE expires_at > $1")
            .bind(now)
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(to_u64(n))
    }

    async fn purge_sessions(&self, before: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM sessions WHERE expires_at < $1")
            .bind(before)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    async fn purge_replay_marks(&self, now: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM seen_signatures WHERE expires_at < $1")
            .bind(now)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    async fn latest_cursor(&self) -> Result<u64, StoreError> {
        let cursor: Option<i64> = sqlx::query_scalar("SELECT MAX(cursor) FROM events")
            .fetch_one(&self.pool)
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
        let found = sql.build().fetch_all(&self.pool).await.map_err(map_err)?;
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
        let found = sql.build().fetch_all(&self.pool).await.map_err(map_err)?;
        rows(&found, event_from_row)
    }

    async fn create_signup_token(&self, token: &str, now: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO signup_tokens (token, created_at) VALUES ($1, $2) \
             ON CONFLICT (token) DO NOTHING",
        )
        .bind(token)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn signup_token(&self, token: &str) -> Result<Option<SignupTokenRecord>, StoreError> {
        let row = sqlx::query("SELECT created_at, used_by FROM signup_tokens WHERE token = $1")
            .bind(token)
            .fetch_optional(&self.pool)
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
            "SELECT COUNT(*) AS users, COALESCE(SUM(used_bytes), 0)::BIGINT AS total FROM users",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(StoreStats {
            users: to_u64(row.try_get("users").map_err(map_err)?),
            total_storage: to_u64(row.try_get("total").map_err(map_err)?),
        })
    }

    async fn set_user_disabled(&self, user: &str, disabled: bool) -> Result<bool, StoreError> {
        let done = sqlx::query("UPDATE users SET disabled = $1 WHERE public_key = $2")
            .bind(disabled)
            .bind(user)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn set_user_quota(&self, user: &str, quota: Option<u64>) -> Result<bool, StoreError> {
        let done = sqlx::query("UPDATE users SET quota_bytes = $1 WHERE public_key = $2")
            .bind(quota.map(to_i64))
            .bind(user)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn users_after(&self, after: &str, limit: u32) -> Result<Vec<UserRecord>, StoreError> {
        let found = sqlx::query(&format!(
            "SELECT {USER_COLUMNS} FROM users WHERE public_key > $1 ORDER BY public_key LIMIT $2"
        ))
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
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
             WHERE token > $1 ORDER BY token LIMIT $2",
        )
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
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
             WHERE token_hash > $1 ORDER BY token_hash LIMIT $2",
        )
        .bind(&after[..])
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
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
                sqlx::QueryBuilder::<Postgres>::new(format!("INSERT INTO users ({USER_COLUMNS}) "));
            sql.push_values(chunk, |mut row, u| {
                row.push_bind(&u.public_key)
                    .push_bind(u.created_at)
                    .push_bind(to_i64(u.used_bytes))
                    .push_bind(u.quota_bytes.map(to_i64))
                    .push_bind(u.disabled)
                    .push_bind(u.last_activity);
            });
            sql.push(
                " ON CONFLICT (public_key) DO UPDATE SET created_at = excluded.created_at, \
                 used_bytes = excluded.used_bytes, quota_bytes = excluded.quota_bytes, \
                 disabled = excluded.disabled, last_activity = excluded.last_activity",
            );
            sql.build().execute(&self.pool).await.map_err(map_err)?;
        }
        Ok(())
    }

    async fn copy_entries(&self, user: &str, entries: &[EntryRecord]) -> Result<(), StoreError> {
        for chunk in entries.chunks(1000) {
            let mut sql = sqlx::QueryBuilder::<Postgres>::new(format!(
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
            sql.build().execute(&self.pool).await.map_err(map_err)?;
        }
        Ok(())
    }

    async fn copy_events(&self, events: &[EventRecord]) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        // Serialized with live appends, like them.
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(EVENTS_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        for chunk in events.chunks(10_000) {
            let mut sql = sqlx::QueryBuilder::<Postgres>::new(
                "INSERT INTO events (cursor, owner, path, kind, content_hash, created_at) \
                 OVERRIDING SYSTEM VALUE ",
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
            sql.build().execute(&mut *tx).await.map_err(map_err)?;
        }
        // Later appends continue above the copied cursors.
        sqlx::query(
            "SELECT setval(pg_get_serial_sequence('events', 'cursor'), \
             (SELECT MAX(cursor) FROM events))",
        )
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)
    }

    async fn copy_signup_tokens(&self, tokens: &[SignupTokenRow]) -> Result<(), StoreError> {
        for chunk in tokens.chunks(1000) {
            let mut sql = sqlx::QueryBuilder::<Postgres>::new(
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
            sql.build().execute(&self.pool).await.map_err(map_err)?;
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
            let mut sql = sqlx::QueryBuilder::<Postgres>::new(
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
            sql.build().execute(&self.pool).await.map_err(map_err)?;
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
        .execute(&self.pool)
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
            "SELECT owner, packet FROM pkarr_packets WHERE owner > $1 ORDER BY owner LIMIT $2",
        )
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.into_iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(map_err)
    }
}
