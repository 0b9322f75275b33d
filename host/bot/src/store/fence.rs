//! Fencing: the writes of the leader's stages (mentions' states, routing decisions,
//! reply reservations and publications, positions, the index) succeed only while the
//! process holds the leader lease.
//!
//! The lease (`lease`) comes with a token that only grows. A process that takes it
//! raises the `fences` row to its token before its stages start ([`Store::raise_fence`]),
//! and every fenced write checks, in the same statement, that the row still holds the
//! token of the process that writes. So once a new leader has raised it, nothing an
//! older one does lands, even a process that was frozen (SIGSTOP) past its lease and
//! resumes mid-write. On PostgreSQL the check takes a shared lock on the row, so a
//! raise waits for the writes in flight. Before that, each process refuses by itself
//! once its lease may have expired (measured on its own monotonic clock from the last
//! renewal sent), without asking the database.
//!
//! A process that is not a leader (the in-process pipeline, workers, the `pkbot`
//! commands) holds token 0 and writes unfenced.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use super::{Result, Store, StoreError, int, now_secs};

/// The fence's name for the leader lease.
const LEADER: &str = "leader";

/// This process's fencing token and how long its lease surely lasts.
#[derive(Debug, Default)]
pub struct Fence {
    /// 0: unfenced (not a leader).
    token: AtomicI64,
    /// When the lease may have expired (None while unfenced).
    valid_until: Mutex<Option<Instant>>,
}

impl Fence {
    /// Leads with `token` until `valid_until` (extended by each renewal).
    pub fn lead(&self, token: i64, valid_until: Instant) {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(valid_until);
        self.token.store(token, Ordering::SeqCst);
    }

    /// A renewal succeeded: the lease lasts until `valid_until`.
    pub fn extend(&self, valid_until: Instant) {
        let mut until = self.valid_until.lock().unwrap_or_else(|e| e.into_inner());
        if until.is_some_and(|u| u < valid_until) {
            *until = Some(valid_until);
        }
    }

    /// The lease is lost: every fenced write is refused from now on.
    pub fn lose(&self) {
        let mut until = self.valid_until.lock().unwrap_or_else(|e| e.into_inner());
        if until.is_some() {
            *until = Some(Instant::now());
        }
    }

    pub fn token(&self) -> i64 {
        self.token.load(Ordering::SeqCst)
    }

    /// The token to write with: 0 (unfenced), or this process's while its lease lasts
    /// (an error once it may have expired).
    pub fn current(&self) -> Result<i64> {
        let token = self.token();
        if token == 0 {
            return Ok(0);
        }
        let until = *self.valid_until.lock().unwrap_or_else(|e| e.into_inner());
        match until {
            Some(until) if Instant::now() < until => Ok(token),
            _ => Err(StoreError::Fenced(token)),
        }
    }
}

impl Store {
    /// The condition of a fenced write, with the token bound as `$n`: true when the
    /// token is 0 (unfenced) or still the fence's.
    pub(super) fn fenced(&self, n: u8) -> String {
        format!(
            "(${n} = 0 OR EXISTS (SELECT 1 FROM fences WHERE name = '{LEADER}' AND token = ${n}{}))",
            self.dialect.share_lock()
        )
    }

    /// Inside a transaction about to write: Err(Fenced) unless `token` is 0 or still
    /// the fence's, and (PostgreSQL) the fence row share-locked until the commit, so a
    /// new leader's raise waits for this transaction (SQLite: one writer at a time).
    pub(super) async fn check_fence_in(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        token: i64,
    ) -> Result<()> {
        if token == 0 {
            return Ok(());
        }
        let held: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT token FROM fences WHERE name = '{LEADER}' AND token = $1{}",
            self.dialect.share_lock()
        ))
        .bind(token)
        .fetch_optional(&mut **tx)
        .await?;
        match held {
            Some(_) => Ok(()),
            None => Err(StoreError::Fenced(token)),
        }
    }

    /// After a fenced write changed nothing: the error when that was the fence (the
    /// token is stale), Ok when the write simply had nothing to change.
    pub(super) async fn refused_by_fence(&self, token: i64) -> Result<()> {
        if token == 0 || self.fence_holds(token).await? {
            Ok(())
        } else {
            Err(StoreError::Fenced(token))
        }
    }

    async fn fence_holds(&self, token: i64) -> Result<bool> {
        let _t = self.timed();
        let held: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT token FROM fences WHERE name = '{LEADER}' AND token = $1"
        ))
        .bind(token)
        .fetch_optional(&self.pool)
        .await?;
        Ok(held.is_some())
    }

    /// Raises the leader fence to `token` (a process that just took the lease, before
    /// its stages start). Returns the fence's token when it is already higher (the
    /// lease's counter was lost and restarted lower: the caller moves it past it).
    pub async fn raise_fence(&self, token: i64, holder: &str) -> Result<Option<i64>> {
        let _t = self.timed();
        let raised = sqlx::query(&format!(
            "INSERT INTO fences (name, token, holder, updated_at) VALUES ('{LEADER}', $1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET token = excluded.token, holder = excluded.holder, \
             updated_at = excluded.updated_at WHERE fences.token < excluded.token"
        ))
        .bind(token)
        .bind(holder)
        .bind(now_secs())
        .execute(&self.pool)
        .await?;
        if raised.rows_affected() == 1 {
            return Ok(None);
        }
        let current: Option<i64> =
            sqlx::query_scalar(&format!("SELECT token FROM fences WHERE name = '{LEADER}'"))
                .fetch_optional(&self.pool)
                .await?;
        Ok(Some(current.unwrap_or(int(0u8))))
    }

    /// Whether this process may still act as the leader: its lease has not expired by
    /// its own clock and the fence still holds its token (asked of the database).
    /// What the publisher checks before it writes a reply to the homeserver.
    pub async fn check_fence(&self) -> Result<()> {
        let token = self.fence.current()?;
        self.refused_by_fence(token).await
    }
}
