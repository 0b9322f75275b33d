//! The write transaction, on SQLite's single writer connection or on one pooled
//! PostgreSQL connection: the steps the procedures of `persistence::rules` are made of.

use async_trait::async_trait;
use sqlx::{Any, Row, Transaction};

use super::dialect::{Dialect, EVENTS_CHANNEL};
use super::rows::{
    self, CHUNK, ENTRY_COLUMNS, Statement, decode_all, entry_from_row, to_i64, to_u64,
};
use crate::persistence::metadata::{
    EntryRecord, NewEvent, ReplayMark, SessionRecord, StoreError, TokenRedemption, UserRecord,
    WriteTx,
};

pub(super) struct SqlWriteTx {
    pub tx: Transaction<'static, Any>,
    pub dialect: Dialect,
}

impl SqlWriteTx {
    fn err(&self) -> impl Fn(sqlx::Error) -> StoreError + use<> {
        let dialect = self.dialect;
        move |e| dialect.map_err(e)
    }
}

#[async_trait]
impl WriteTx for SqlWriteTx {
    async fn insert_replay_mark(&mut self, mark: ReplayMark) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO seen_signatures (signature_id, expires_at) VALUES ($1, $2) \
             ON CONFLICT (signature_id) DO NOTHING",
        )
        .bind(&mark.signature_id[..])
        .bind(mark.expires_at)
        .execute(&mut *self.tx)
        .await
        .map_err(self.err())?;
        Ok(done.rows_affected() == 1)
    }

    async fn insert_replay_marks(
        &mut self,
        marks: &[ReplayMark],
    ) -> Result<Vec<[u8; 32]>, StoreError> {
        let mut fresh = Vec::with_capacity(marks.len());
        for chunk in marks.chunks(CHUNK) {
            let mut sql = Statement::new("INSERT INTO seen_signatures (signature_id, expires_at) ");
            sql.push_values(chunk, |row, mark| {
                row.bind(&mark.signature_id[..]).bind(mark.expires_at);
            });
            // Only the rows inserted come back.
            sql.push(" ON CONFLICT (signature_id) DO NOTHING RETURNING signature_id");
            for row in sql.fetch_all(&mut *self.tx).await.map_err(self.err())? {
                let id = row.try_get("signature_id").and_then(rows::hash32);
                fresh.push(id.map_err(self.err())?);
            }
        }
        Ok(fresh)
    }

    async fn lock_user(&mut self, public_key: &str) -> Result<Option<UserRecord>, StoreError> {
        rows::user(&mut *self.tx, public_key, self.dialect.lock_row())
            .await
            .map_err(self.err())
    }

    async fn insert_user(
        &mut self,
        public_key: &str,
        now: i64,
        signup_token: Option<&str>,
    ) -> Result<bool, StoreError> {
        // On PostgreSQL, ON CONFLICT waits for a concurrent insert of the same key to end.
        let done = sqlx::query(
            "INSERT INTO users (public_key, created_at, last_activity, signup_token) \
             VALUES ($1, $2, $2, $3) ON CONFLICT (public_key) DO NOTHING",
        )
        .bind(public_key)
        .bind(now)
        .bind(signup_token)
        .execute(&mut *self.tx)
        .await
        .map_err(self.err())?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_user(&mut self, public_key: &str) -> Result<(), StoreError> {
        for table in ["sessions", "pkarr_packets"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE owner = $1"))
                .bind(public_key)
                .execute(&mut *self.tx)
                .await
                .map_err(self.err())?;
        }
        sqlx::query("DELETE FROM users WHERE public_key = $1")
            .bind(public_key)
            .execute(&mut *self.tx)
            .await
            .map_err(self.err())?;
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
            .execute(&mut *self.tx)
            .await
            .map_err(self.err())?;
        Ok(())
    }

    async fn redeem_signup_token(
        &mut self,
        token: &str,
        public_key: &str,
        now: i64,
    ) -> Result<TokenRedemption, StoreError> {
        // On PostgreSQL a concurrent redemption holds the row; this UPDATE waits for it
        // and then re-checks `used_by IS NULL`, so of two racing signups one wins.
        let redeemed = sqlx::query(
            "UPDATE signup_tokens SET used_by = $1, used_at = $2 \
             WHERE token = $3 AND used_by IS NULL",
        )
        .bind(public_key)
        .bind(now)
        .bind(token)
        .execute(&mut *self.tx)
        .await
        .map_err(self.err())?;
        if redeemed.rows_affected() == 1 {
            return Ok(TokenRedemption::Redeemed);
        }
        let known: Option<i64> = sqlx::query_scalar("SELECT 1 FROM signup_tokens WHERE token = $1")
            .bind(token)
            .fetch_optional(&mut *self.tx)
            .await
            .map_err(self.err())?;
        Ok(match known {
            Some(_) => TokenRedemption::Used,
            None => TokenRedemption::Unknown,
        })
    }

    async fn entry(&mut self, user: &str, path: &str) -> Result<Option<EntryRecord>, StoreError> {
        rows::entry(&mut *self.tx, user, path)
            .await
            .map_err(self.err())
    }

    async fn put_entries(&mut self, entries: &[(&str, &EntryRecord)]) -> Result<(), StoreError> {
        for chunk in entries.chunks(CHUNK) {
            rows::upsert_entries(chunk.iter().copied())
                .execute(&mut *self.tx)
                .await
                .map_err(self.err())?;
        }
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
        .fetch_optional(&mut *self.tx)
        .await
        .map_err(self.err())?;
        row.as_ref()
            .map(entry_from_row)
            .transpose()
            .map_err(self.err())
    }

    async fn remove_all_entries(&mut self, user: &str) -> Result<Vec<EntryRecord>, StoreError> {
        let found = sqlx::query(&format!(
            "DELETE FROM entries WHERE owner = $1 RETURNING {ENTRY_COLUMNS}"
        ))
        .bind(user)
        .fetch_all(&mut *self.tx)
        .await
        .map_err(self.err())?;
        let mut removed = decode_all(&found, entry_from_row).map_err(self.err())?;
        // RETURNING has no ORDER BY; path order, bytewise as the tables compare.
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
        .execute(&mut *self.tx)
        .await
        .map_err(self.err())?;
        Ok(())
    }

    async fn sum_entry_sizes(&mut self, user: &str) -> Result<u64, StoreError> {
        let sum: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM entries WHERE owner = $1",
        )
        .bind(user)
        .fetch_one(&mut *self.tx)
        .await
        .map_err(self.err())?;
        Ok(to_u64(sum))
    }

    async fn retire_blobs(&mut self, blob_keys: &[&str], at: i64) -> Result<(), StoreError> {
        for chunk in blob_keys.chunks(CHUNK) {
            let mut sql = Statement::new("INSERT INTO retired_blobs (blob_key, retired_at) ");
            sql.push_values(chunk, |row, key| {
                row.bind(*key).bind(at);
            });
            sql.push(" ON CONFLICT (blob_key) DO NOTHING");
            sql.execute(&mut *self.tx).await.map_err(self.err())?;
        }
        Ok(())
    }

    async fn append_events(&mut self, events: &[NewEvent<'_>]) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        // Held until commit: cursors are drawn in commit order (see `Dialect`).
        if let Some((lock, key)) = self.dialect.before_events() {
            sqlx::query(lock)
                .bind(key)
                .execute(&mut *self.tx)
                .await
                .map_err(self.err())?;
        }
        for chunk in events.chunks(CHUNK) {
            let mut sql =
                Statement::new("INSERT INTO events (owner, path, kind, content_hash, created_at) ");
            sql.push_values(chunk, |row, e| {
                row.bind(e.user)
                    .bind(e.path)
                    .bind(e.kind.as_str())
                    .bind(e.content_hash.map(|h| h.to_vec()))
                    .bind(e.created_at);
            });
            sql.execute(&mut *self.tx).await.map_err(self.err())?;
        }
        if let Some(announce) = self.dialect.after_events() {
            sqlx::query(announce)
                .bind(EVENTS_CHANNEL)
                .execute(&mut *self.tx)
                .await
                .map_err(self.err())?;
        }
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<(), StoreError> {
        let err = self.err();
        self.tx.commit().await.map_err(err)
    }
}
