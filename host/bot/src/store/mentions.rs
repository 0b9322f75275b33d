//! Mentions and their states, routing decisions, and what the router's rules read and
//! write: idempotency keys, reader positions, opt-outs, rate-limit notices, the
//! per-thread count.

use std::time::Duration;

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{
    ActionType, Effect, Mention, MentionStatus, Method, Result, RoutingDecision, Store, int,
    now_secs,
};

const MENTION_COLUMNS: &str =
    "id, author_pubky, post_id, post_uri, content, parent_uri, posted_at, status";

fn mention(r: &AnyRow) -> Result<Mention> {
    Ok(Mention {
        id: r.try_get(0)?,
        author: r.try_get(1)?,
        post_id: r.try_get(2)?,
        post_uri: r.try_get(3)?,
        content: r.try_get(4)?,
        parent_uri: r.try_get(5)?,
        posted_at: r.try_get(6)?,
        status: MentionStatus::parse(&r.try_get::<String, _>(7)?),
    })
}

impl Store {
    // -----------------------------------------------------------------------------
    // Idempotency keys and positions

    /// Takes `key` for `ttl`; false when it is held (and not expired).
    pub async fn claim_key(&self, key: &str, ttl: Duration) -> Result<bool> {
        let _t = self.timed();
        let now = now_secs();
        let done = sqlx::query(
            "INSERT INTO idempotency_keys (key, created_at, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (key) DO UPDATE SET created_at = excluded.created_at, \
             expires_at = excluded.expires_at WHERE idempotency_keys.expires_at <= $2",
        )
        .bind(key)
        .bind(now)
        .bind(now.saturating_add(int(ttl.as_secs())))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Whether `key` is held.
    pub async fn key_held(&self, key: &str) -> Result<bool> {
        let _t = self.timed();
        let row =
            sqlx::query("SELECT key FROM idempotency_keys WHERE key = $1 AND expires_at > $2")
                .bind(key)
                .bind(now_secs())
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.is_some())
    }

    pub async fn purge_expired_keys(&self) -> Result<u64> {
        let _t = self.timed();
        let done = sqlx::query("DELETE FROM idempotency_keys WHERE expires_at <= $1")
            .bind(now_secs())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    pub async fn position(&self, name: &str) -> Result<Option<String>> {
        let _t = self.timed();
        Ok(
            sqlx::query_scalar("SELECT position FROM positions WHERE name = $1")
                .bind(name)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// Saves where a reader stopped (fenced: the leader's poller).
    pub async fn set_position(&self, name: &str, position: &str) -> Result<()> {
        let token = self.fence.current()?;
        let _t = self.timed();
        let done = sqlx::query(&format!(
            "INSERT INTO positions (name, position, updated_at) SELECT $1, $2, $3 WHERE {} \
             ON CONFLICT (name) DO UPDATE SET position = excluded.position, \
             updated_at = excluded.updated_at",
            self.fenced(4)
        ))
        .bind(name)
        .bind(position)
        .bind(now_secs())
        .bind(token)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            self.refused_by_fence(token).await?;
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------
    // Mentions

    /// Records a mention; false when it was recorded before.
    pub async fn insert_mention(&self, m: &Mention) -> Result<bool> {
        let inserted = self.insert_mentions(std::slice::from_ref(m)).await?;
        Ok(inserted.first().copied().unwrap_or(false))
    }

    /// Records mentions in one transaction (one commit, whatever their number); for each,
    /// whether it is new. Fenced: a process whose leader token is stale records nothing.
    pub async fn insert_mentions(&self, mentions: &[Mention]) -> Result<Vec<bool>> {
        if mentions.is_empty() {
            return Ok(Vec::new());
        }
        let token = self.fence.current()?;
        let _t = self.timed();
        let now = now_secs();
        let mut tx = self.pool.begin().await?;
        self.check_fence_in(&mut tx, token).await?;
        let mut inserted = Vec::with_capacity(mentions.len());
        for m in mentions {
            let done = sqlx::query(
                "INSERT INTO mentions (id, author_pubky, post_id, post_uri, content, parent_uri, \
                 posted_at, received_at, status, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $8) \
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(&m.id)
            .bind(&m.author)
            .bind(&m.post_id)
            .bind(&m.post_uri)
            .bind(&m.content)
            .bind(&m.parent_uri)
            .bind(m.posted_at)
            .bind(now)
            .bind(m.status.as_str())
            .execute(&mut *tx)
            .await?;
            inserted.push(done.rows_affected() > 0);
        }
        tx.commit().await?;
        Ok(inserted)
    }

    pub async fn mention(&self, id: &str) -> Result<Option<Mention>> {
        let _t = self.timed();
        let row = sqlx::query(&format!(
            "SELECT {MENTION_COLUMNS} FROM mentions WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(mention).transpose()
    }

    /// Moves a mention to `status` (fenced); a final state also stamps `processed_at`.
    /// A completed (or skipped) mention is never changed afterwards, except to
    /// `completed` again: a late duplicate of its work cannot undo its answer.
    pub async fn set_mention_status(
        &self,
        id: &str,
        status: MentionStatus,
        error: Option<&str>,
    ) -> Result<()> {
        let token = self.fence.current()?;
        let _t = self.timed();
        let finished = matches!(
            status,
            MentionStatus::Completed | MentionStatus::Failed | MentionStatus::SkippedOld
        );
        let done = sqlx::query(&format!(
            "UPDATE mentions SET status = $1, error = COALESCE($2, error), updated_at = $3, \
             processed_at = CASE WHEN $4 = 1 THEN $3 ELSE processed_at END WHERE id = $5 \
             AND (status NOT IN ('completed', 'skipped_old') OR $1 = 'completed') AND {}",
            self.fenced(6)
        ))
        .bind(status.as_str())
        .bind(error)
        .bind(now_secs())
        .bind(i64::from(finished))
        .bind(id)
        .bind(token)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            self.refused_by_fence(token).await?;
        }
        Ok(())
    }

    /// The router handed a pending mention on: `pending` → `processing` (fenced).
    /// False when it was not pending (routed before, or finished meanwhile).
    pub async fn mark_routed(&self, id: &str) -> Result<bool> {
        let token = self.fence.current()?;
        let _t = self.timed();
        let done = sqlx::query(&format!(
            "UPDATE mentions SET status = 'processing', updated_at = $1 \
             WHERE id = $2 AND status = 'pending' AND {}",
            self.fenced(3)
        ))
        .bind(now_secs())
        .bind(id)
        .bind(token)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            self.refused_by_fence(token).await?;
            return Ok(false);
        }
        Ok(true)
    }

    /// Moves a failed mention back to `status` (a replayed dead letter), forgetting
    /// why it failed; a mention in any other state is left as it is.
    pub async fn reopen_mention(&self, id: &str, status: MentionStatus) -> Result<bool> {
        let _t = self.timed();
        let done = sqlx::query(
            "UPDATE mentions SET status = $1, error = NULL, processed_at = NULL, updated_at = $2 \
             WHERE id = $3 AND status = 'failed'",
        )
        .bind(status.as_str())
        .bind(now_secs())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Mentions in `status` whose state last changed at or before `changed_by` (Unix
    /// seconds), oldest first, at most `limit`.
    pub async fn mentions_in_state(
        &self,
        status: MentionStatus,
        changed_by: i64,
        limit: u32,
    ) -> Result<Vec<Mention>> {
        let _t = self.timed();
        let rows = sqlx::query(&format!(
            "SELECT {MENTION_COLUMNS} FROM mentions WHERE status = $1 AND updated_at <= $2 \
             ORDER BY updated_at, id LIMIT $3"
        ))
        .bind(status.as_str())
        .bind(changed_by)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(mention).collect()
    }

    /// Mentions per status (health, tests).
    pub async fn mention_counts(&self) -> Result<Vec<(String, i64)>> {
        let _t = self.timed();
        let rows =
            sqlx::query("SELECT status, COUNT(*) FROM mentions GROUP BY status ORDER BY status")
                .fetch_all(&self.pool)
                .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    // -----------------------------------------------------------------------------
    // Routing

    pub async fn routing_decision(&self, mention_id: &str) -> Result<Option<RoutingDecision>> {
        let _t = self.timed();
        let row = sqlx::query(
            "SELECT method, action_type, confidence, reasoning, notice, effect, thread_root \
             FROM routing_decisions WHERE mention_id = $1",
        )
        .bind(mention_id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = row else {
            return Ok(None);
        };
        Ok(Some(RoutingDecision {
            mention_id: mention_id.to_owned(),
            method: if r.try_get::<String, _>(0)? == "llm" {
                Method::Llm
            } else {
                Method::Heuristic
            },
            action: ActionType::parse(&r.try_get::<String, _>(1)?).unwrap_or(ActionType::None),
            confidence: r.try_get::<Option<f64>, _>(2)?.map(|c| c as f32),
            reasoning: r.try_get(3)?,
            notice: r.try_get(4)?,
            effect: r
                .try_get::<Option<String>, _>(5)?
                .as_deref()
                .and_then(Effect::parse),
            thread_root: r.try_get(6)?,
        }))
    }

    /// Stores a decision unless one is there (fenced); returns the one that counts.
    pub async fn decide(&self, d: &RoutingDecision) -> Result<RoutingDecision> {
        let token = self.fence.current()?;
        let done = {
            let _t = self.timed();
            // The confidence goes as a flag and a number, never as a NULL number:
            // sqlx's Any driver (0.8.6) sends a NULL double as a PostgreSQL `float4`,
            // the connection keeps the statement prepared with that type, and the
            // next decision with a confidence (8 bytes) on that connection was
            // refused ("incorrect binary data format in bind parameter 4").
            sqlx::query(&format!(
                "INSERT INTO routing_decisions (mention_id, method, action_type, confidence, \
                 reasoning, notice, effect, thread_root, created_at) \
                 SELECT $1, $2, $3, CASE WHEN $4 THEN $5 END, $6, $7, $8, $9, $10 WHERE {} \
                 ON CONFLICT (mention_id) DO NOTHING",
                self.fenced(11)
            ))
            .bind(&d.mention_id)
            .bind(d.method.as_str())
            .bind(d.action.as_str())
            .bind(d.confidence.is_some())
            .bind(d.confidence.map_or(0.0, f64::from))
            .bind(&d.reasoning)
            .bind(&d.notice)
            .bind(d.effect.map(Effect::as_str))
            .bind(&d.thread_root)
            .bind(now_secs())
            .bind(token)
            .execute(&self.pool)
            .await?
        };
        if done.rows_affected() == 0 {
            self.refused_by_fence(token).await?;
        }
        Ok(self
            .routing_decision(&d.mention_id)
            .await?
            .unwrap_or_else(|| d.clone()))
    }

    /// Actions (summary, factcheck) routed for `author`'s mentions since `since`.
    pub async fn actions_for_author_since(&self, author: &str, since: i64) -> Result<u32> {
        let _t = self.timed();
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM routing_decisions d JOIN mentions m ON m.id = d.mention_id \
             WHERE m.author_pubky = $1 AND d.created_at >= $2 \
             AND d.action_type IN ('summary', 'factcheck')",
        )
        .bind(author)
        .bind(since)
        .fetch_one(&self.pool)
        .await?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Replies in the thread rooted at `root` that count against the per-thread cap:
    /// those published, and those still on their way (the mention's action or notice
    /// decided and not yet done with). A reply that was blocked, or whose action
    /// failed, leaves its slot free; one replayed from the dead letters takes it again.
    /// Counts at most `up_to` (the cap: past it the number does not matter, and a long
    /// thread is not counted through at every decision).
    pub async fn replies_in_thread(&self, root: &str, up_to: u32) -> Result<u32> {
        let _t = self.timed();
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM (SELECT 1 FROM routing_decisions d \
             JOIN mentions m ON m.id = d.mention_id \
             LEFT JOIN replies r ON r.mention_id = d.mention_id \
             WHERE d.thread_root = $1 \
             AND (d.action_type IN ('summary', 'factcheck') OR d.notice IS NOT NULL) \
             AND (r.published_at IS NOT NULL OR m.status IN ('pending', 'processing')) \
             LIMIT $2) counted",
        )
        .bind(root)
        .bind(i64::from(up_to))
        .fetch_one(&self.pool)
        .await?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    pub async fn rate_notice_since(&self, author: &str, since: i64) -> Result<bool> {
        let _t = self.timed();
        let row = sqlx::query(
            "SELECT author_pubky FROM rate_notices WHERE author_pubky = $1 AND sent_at >= $2",
        )
        .bind(author)
        .bind(since)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.is_some())
    }

    pub async fn record_rate_notice(&self, author: &str) -> Result<()> {
        let _t = self.timed();
        sqlx::query("INSERT INTO rate_notices (author_pubky, sent_at) VALUES ($1, $2)")
            .bind(author)
            .bind(now_secs())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn opted_out(&self, author: &str) -> Result<bool> {
        let _t = self.timed();
        let row = sqlx::query("SELECT author_pubky FROM opt_outs WHERE author_pubky = $1")
            .bind(author)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    pub async fn set_opted_out(&self, author: &str, out: bool) -> Result<()> {
        let _t = self.timed();
        if out {
            sqlx::query(
                "INSERT INTO opt_outs (author_pubky, since) VALUES ($1, $2) \
                 ON CONFLICT (author_pubky) DO NOTHING",
            )
            .bind(author)
            .bind(now_secs())
            .execute(&self.pool)
            .await?;
        } else {
            sqlx::query("DELETE FROM opt_outs WHERE author_pubky = $1")
                .bind(author)
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }
}
