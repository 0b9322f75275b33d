//! Executions of actions with their artifacts, replies (reserved, then published) and
//! dead letters.

use std::time::Duration;

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{ActionType, Execution, Outcome, Reply, Result, Store, int, now_secs};
use crate::bus::DeadLetterEntry;

/// How recording a successful execution went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    /// Recorded: this run's reply is the action's.
    Recorded,
    /// Another run of the same action succeeded first (this one is recorded as
    /// superseded): its reply is the action's.
    Superseded(Execution),
}

fn reply(r: &AnyRow) -> Result<Reply> {
    Ok(Reply {
        mention_id: r.try_get(0)?,
        post_id: r.try_get(1)?,
        content: r.try_get(2)?,
        thread_root: r.try_get(3)?,
        published_at: r.try_get(4)?,
    })
}

const REPLY_COLUMNS: &str = "mention_id, post_id, content, thread_root, published_at";

impl Store {
    /// The successful execution of `action` for a mention, if there is one.
    pub async fn successful_execution(
        &self,
        mention_id: &str,
        action: ActionType,
    ) -> Result<Option<Execution>> {
        let _t = self.timed();
        let row = sqlx::query(
            "SELECT id, reply FROM action_executions WHERE mention_id = $1 AND action_type = $2 \
             AND status = 'success'",
        )
        .bind(mention_id)
        .bind(action.as_str())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(Execution {
                id: r.try_get(0)?,
                reply: r.try_get::<Option<String>, _>(1)?.unwrap_or_default(),
            })
        })
        .transpose()
    }

    /// Starts recording an execution; returns its id.
    pub async fn start_execution(&self, mention_id: &str, action: ActionType) -> Result<i64> {
        let _t = self.timed();
        Ok(sqlx::query_scalar(
            "INSERT INTO action_executions (mention_id, action_type, status, started_at) \
             VALUES ($1, $2, 'pending', $3) RETURNING id",
        )
        .bind(mention_id)
        .bind(action.as_str())
        .bind(now_secs())
        .fetch_one(&self.pool)
        .await?)
    }

    /// Records a success with its reply and artifacts, in one transaction, unless
    /// another run of the action succeeded first (at most one success per mention and
    /// action: a unique index says so): then this run is recorded as superseded.
    pub async fn finish_execution(
        &self,
        id: i64,
        mention_id: &str,
        action: ActionType,
        duration: Duration,
        outcome: &Outcome,
    ) -> Result<Finished> {
        let recorded = {
            let _t = self.timed();
            self.record_success(id, duration, outcome).await
        };
        match recorded {
            Ok(()) => Ok(Finished::Recorded),
            Err(e) if e.is_unique_violation() => {
                self.fail_execution(
                    id,
                    duration,
                    outcome.tokens_used,
                    "superseded: another run of this action succeeded first",
                )
                .await?;
                match self.successful_execution(mention_id, action).await? {
                    Some(first) => Ok(Finished::Superseded(first)),
                    None => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    async fn record_success(&self, id: i64, duration: Duration, outcome: &Outcome) -> Result<()> {
        let now = now_secs();
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE action_executions SET status = 'success', duration_ms = $1, tokens_used = $2, \
             reply = $3, error_details = NULL, finished_at = $4 WHERE id = $5",
        )
        .bind(int(duration.as_millis()))
        .bind(int(outcome.tokens_used))
        .bind(&outcome.reply)
        .bind(now)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        for (kind, content) in &outcome.artifacts {
            sqlx::query(
                "INSERT INTO artifacts (action_execution_id, artifact_type, content, created_at) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(id)
            .bind(*kind)
            .bind(content.to_string())
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Records a failure with what went wrong.
    pub async fn fail_execution(
        &self,
        id: i64,
        duration: Duration,
        tokens_used: u64,
        error: &str,
    ) -> Result<()> {
        let _t = self.timed();
        sqlx::query(
            "UPDATE action_executions SET status = 'failed', duration_ms = $1, tokens_used = $2, \
             error_details = $3, finished_at = $4 WHERE id = $5 AND status <> 'success'",
        )
        .bind(int(duration.as_millis()))
        .bind(int(tokens_used))
        .bind(error)
        .bind(now_secs())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Executions a stop left pending are failed as interrupted: all of them (at the
    /// start of a process that runs every stage), or those of one mention's action
    /// (when a worker runs it again after the one that ran it died: its claim expired).
    pub async fn fail_interrupted_executions(
        &self,
        only: Option<(&str, ActionType)>,
    ) -> Result<u64> {
        let _t = self.timed();
        let done = sqlx::query(
            "UPDATE action_executions SET status = 'failed', \
             error_details = 'interrupted: the process running it stopped during the action', \
             finished_at = $1 WHERE status = 'pending' \
             AND ($2 = 0 OR (mention_id = $3 AND action_type = $4))",
        )
        .bind(now_secs())
        .bind(i64::from(only.is_some()))
        .bind(only.map(|(id, _)| id).unwrap_or(""))
        .bind(only.map(|(_, action)| action.as_str()).unwrap_or(""))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Artifacts of an execution: (type, JSON text).
    pub async fn artifacts(&self, execution_id: i64) -> Result<Vec<(String, String)>> {
        let _t = self.timed();
        let rows = sqlx::query(
            "SELECT artifact_type, content FROM artifacts WHERE action_execution_id = $1 \
             ORDER BY id",
        )
        .bind(execution_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    // -----------------------------------------------------------------------------
    // Replies

    pub async fn reply(&self, mention_id: &str) -> Result<Option<Reply>> {
        let _t = self.timed();
        let row = sqlx::query(&format!(
            "SELECT {REPLY_COLUMNS} FROM replies WHERE mention_id = $1"
        ))
        .bind(mention_id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(reply).transpose()
    }

    /// Reserves the reply to a mention (its post id and text) unless one is reserved
    /// already (fenced); returns the one that counts, so a restart publishes that same
    /// post.
    pub async fn reserve_reply(&self, reply: &Reply) -> Result<Reply> {
        let token = self.fence.current()?;
        let done = {
            let _t = self.timed();
            sqlx::query(&format!(
                "INSERT INTO replies (mention_id, post_id, content, thread_root, created_at) \
                 SELECT $1, $2, $3, $4, $5 WHERE {} ON CONFLICT (mention_id) DO NOTHING",
                self.fenced(6)
            ))
            .bind(&reply.mention_id)
            .bind(&reply.post_id)
            .bind(&reply.content)
            .bind(&reply.thread_root)
            .bind(now_secs())
            .bind(token)
            .execute(&self.pool)
            .await?
        };
        if done.rows_affected() == 0 {
            self.refused_by_fence(token).await?;
        }
        Ok(self
            .reply(&reply.mention_id)
            .await?
            .unwrap_or_else(|| reply.clone()))
    }

    /// Notes that the homeserver has the reply (fenced).
    pub async fn mark_published(&self, mention_id: &str) -> Result<()> {
        let token = self.fence.current()?;
        let _t = self.timed();
        let done = sqlx::query(&format!(
            "UPDATE replies SET published_at = $1 WHERE mention_id = $2 \
             AND published_at IS NULL AND {}",
            self.fenced(3)
        ))
        .bind(now_secs())
        .bind(mention_id)
        .bind(token)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            self.refused_by_fence(token).await?;
        }
        Ok(())
    }

    /// Every reply, oldest first (tests, tools).
    pub async fn all_replies(&self) -> Result<Vec<Reply>> {
        let _t = self.timed();
        let rows = sqlx::query(&format!("SELECT {REPLY_COLUMNS} FROM replies ORDER BY id"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(reply).collect()
    }

    // -----------------------------------------------------------------------------
    // Dead letters

    /// Keeps a message no stage could process, with why; `bus_id` is its entry in
    /// `dead-letter.v1` when the bus keeps one (Redis).
    pub async fn dead_letter(
        &self,
        stream: &str,
        payload: &str,
        reason: &str,
        mention_id: Option<&str>,
        bus_id: Option<&str>,
    ) -> Result<()> {
        let _t = self.timed();
        sqlx::query(
            "INSERT INTO dead_letters (stream, payload, reason, created_at, mention_id, bus_id) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(stream)
        .bind(payload)
        .bind(reason)
        .bind(now_secs())
        .bind(mention_id)
        .bind(bus_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The dead letters kept in the database, oldest first.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetterEntry>> {
        let _t = self.timed();
        let rows = sqlx::query(
            "SELECT id, stream, payload, reason, created_at FROM dead_letters ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(DeadLetterEntry {
                    id: r.try_get::<i64, _>(0)?.to_string(),
                    stream: r.try_get(1)?,
                    message_id: String::new(),
                    payload: r.try_get(2)?,
                    reason: r.try_get(3)?,
                    deliveries: 0,
                    at: r.try_get(4)?,
                })
            })
            .collect()
    }

    /// Removes a dead letter (replayed) by its id; false when there was none.
    pub async fn remove_dead_letter(&self, id: i64) -> Result<bool> {
        let _t = self.timed();
        let done = sqlx::query("DELETE FROM dead_letters WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Removes the database's copy of a dead letter of the Redis bus (replayed there).
    pub async fn remove_bus_dead_letter(&self, bus_id: &str) -> Result<bool> {
        let _t = self.timed();
        let done = sqlx::query("DELETE FROM dead_letters WHERE bus_id = $1")
            .bind(bus_id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() >= 1)
    }
}
