//! The bot's records in SQLite (sqlx, migrations in `migrations/`): the spec's tables
//! (mentions, routing_decisions, action_executions, artifacts, replies), the
//! idempotency keys, where each reader stopped, opt-outs, rate-limit notices, and the
//! embedded index's posts.
//!
//! The database is the source of truth of the pipeline: every stage records what it
//! decided before it hands the mention on, so after a crash the pipeline is driven
//! again from these rows (see `pipeline::recover`), and each stage finds its own
//! earlier answer instead of doing the work twice.

use std::str::FromStr;
use std::time::{Duration, Instant};

use prometheus::Histogram;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

/// One change of the embedded index.
#[derive(Debug, Clone)]
pub enum IndexChange {
    Put(IndexedPost),
    /// A post deleted (by URI).
    Delete(String),
}

/// A mention's state (the spec's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MentionStatus {
    Pending,
    Processing,
    Completed,
    Failed,
    SkippedOld,
}

impl MentionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Processing => "processing",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::SkippedOld => "skipped_old",
        }
    }

    fn parse(text: &str) -> Self {
        match text {
            "processing" => Self::Processing,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "skipped_old" => Self::SkippedOld,
            _ => Self::Pending,
        }
    }
}

/// The two actions, and `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionType {
    Summary,
    Factcheck,
    None,
}

impl ActionType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Summary => "summary",
            Self::Factcheck => "factcheck",
            Self::None => "none",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "summary" => Some(Self::Summary),
            "factcheck" => Some(Self::Factcheck),
            "none" => Some(Self::None),
            _ => None,
        }
    }
}

/// How a decision was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Heuristic,
    Llm,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Heuristic => "heuristic",
            Self::Llm => "llm",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mention {
    pub id: String,
    pub author: String,
    pub post_id: String,
    pub post_uri: String,
    pub content: String,
    pub parent_uri: Option<String>,
    /// Unix seconds of the post.
    pub posted_at: i64,
    pub status: MentionStatus,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RoutingDecision {
    pub mention_id: String,
    pub method: Method,
    pub action: ActionType,
    pub confidence: Option<f32>,
    pub reasoning: String,
    /// What to answer instead of running an action (opt-out confirmed, slow down).
    pub notice: Option<String>,
    /// What the decision changes besides the mention.
    pub effect: Option<Effect>,
    /// The root of the mention's thread.
    pub thread_root: Option<String>,
}

/// A change a routing decision makes besides the mention's own state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    OptOut,
    OptIn,
    RateNotice,
}

impl Effect {
    fn as_str(self) -> &'static str {
        match self {
            Self::OptOut => "opt_out",
            Self::OptIn => "opt_in",
            Self::RateNotice => "rate_notice",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "opt_out" => Some(Self::OptOut),
            "opt_in" => Some(Self::OptIn),
            "rate_notice" => Some(Self::RateNotice),
            _ => None,
        }
    }
}

/// A finished, successful execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    pub id: i64,
    pub reply: String,
}

/// What an execution produced, to store with it.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub reply: String,
    pub tokens_used: u64,
    /// (artifact_type, JSON document)
    pub artifacts: Vec<(&'static str, serde_json::Value)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub mention_id: String,
    pub post_id: String,
    pub content: String,
    pub thread_root: String,
    pub published_at: Option<i64>,
}

/// A post of the embedded index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedPost {
    pub seq: i64,
    pub uri: String,
    pub author: String,
    pub post_id: String,
    pub content: String,
    pub kind: String,
    pub parent_uri: Option<String>,
    pub mentions_bot: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("bot database: {0}")]
pub struct StoreError(#[from] sqlx::Error);

type Result<T> = std::result::Result<T, StoreError>;

/// The bot's database.
#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
    query_seconds: Histogram,
}

pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl Store {
    /// Opens (creating and migrating) the database at `url` (`sqlite://PATH`).
    pub async fn open(url: &str, query_seconds: Histogram) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // A reply recorded as published must survive a power loss.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        if let Some(dir) = std::path::Path::new(options.get_filename()).parent()
            && !dir.as_os_str().is_empty()
        {
            let _ = std::fs::create_dir_all(dir);
        }
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations")
            .run(&pool)
            .await
            .map_err(|e| StoreError(e.into()))?;
        Ok(Self {
            pool,
            query_seconds,
        })
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
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    // -----------------------------------------------------------------------------
    // Idempotency keys and positions

    /// Takes `key` for `ttl`; false when it is held (and not expired).
    pub async fn claim_key(&self, key: &str, ttl: Duration) -> Result<bool> {
        let _t = self.timed();
        let now = now_secs();
        let expires = now + i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX / 2);
        let done = sqlx::query(
            "INSERT INTO idempotency_keys (key, created_at, expires_at) VALUES (?, ?, ?) \
             ON CONFLICT (key) DO UPDATE SET created_at = excluded.created_at, \
             expires_at = excluded.expires_at WHERE idempotency_keys.expires_at <= ?",
        )
        .bind(key)
        .bind(now)
        .bind(expires)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Whether `key` is held.
    pub async fn key_held(&self, key: &str) -> Result<bool> {
        let _t = self.timed();
        let row = sqlx::query("SELECT 1 FROM idempotency_keys WHERE key = ? AND expires_at > ?")
            .bind(key)
            .bind(now_secs())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    pub async fn purge_expired_keys(&self) -> Result<u64> {
        let _t = self.timed();
        let done = sqlx::query("DELETE FROM idempotency_keys WHERE expires_at <= ?")
            .bind(now_secs())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    pub async fn position(&self, name: &str) -> Result<Option<String>> {
        let _t = self.timed();
        let row = sqlx::query("SELECT position FROM positions WHERE name = ?")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    pub async fn set_position(&self, name: &str, position: &str) -> Result<()> {
        let _t = self.timed();
        sqlx::query(
            "INSERT INTO positions (name, position, updated_at) VALUES (?, ?, ?) \
             ON CONFLICT (name) DO UPDATE SET position = excluded.position, \
             updated_at = excluded.updated_at",
        )
        .bind(name)
        .bind(position)
        .bind(now_secs())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    // -----------------------------------------------------------------------------
    // Mentions

    /// Records a mention; false when it was recorded before (it is never ingested twice).
    pub async fn insert_mention(&self, m: &Mention) -> Result<bool> {
        let _t = self.timed();
        let done = sqlx::query(
            "INSERT INTO mentions (id, author_pubky, post_id, post_uri, content, parent_uri, \
             posted_at, received_at, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(&m.id)
        .bind(&m.author)
        .bind(&m.post_id)
        .bind(&m.post_uri)
        .bind(&m.content)
        .bind(&m.parent_uri)
        .bind(m.posted_at)
        .bind(now_secs())
        .bind(m.status.as_str())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    pub async fn mention(&self, id: &str) -> Result<Option<Mention>> {
        let _t = self.timed();
        let row = sqlx::query(
            "SELECT id, author_pubky, post_id, post_uri, content, parent_uri, posted_at, status \
             FROM mentions WHERE id = ?",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| Mention {
            id: r.get(0),
            author: r.get(1),
            post_id: r.get(2),
            post_uri: r.get(3),
            content: r.get(4),
            parent_uri: r.get(5),
            posted_at: r.get(6),
            status: MentionStatus::parse(r.get::<&str, _>(7)),
        }))
    }

    /// Moves a mention to `status`; a final state also stamps `processed_at`. A
    /// completed (or skipped) mention is never failed afterwards: a late duplicate of
    /// its work cannot undo its answer.
    pub async fn set_mention_status(
        &self,
        id: &str,
        status: MentionStatus,
        error: Option<&str>,
    ) -> Result<()> {
        let _t = self.timed();
        let finished = matches!(
            status,
            MentionStatus::Completed | MentionStatus::Failed | MentionStatus::SkippedOld
        );
        sqlx::query(
            "UPDATE mentions SET status = ?, error = COALESCE(?, error), \
             processed_at = CASE WHEN ? THEN ? ELSE processed_at END WHERE id = ? \
             AND (status NOT IN ('completed', 'skipped_old') OR ? = 'completed')",
        )
        .bind(status.as_str())
        .bind(error)
        .bind(finished)
        .bind(now_secs())
        .bind(id)
        .bind(status.as_str())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Moves a failed mention back to `status` (a replayed dead letter), forgetting
    /// why it failed; a mention in any other state is left as it is.
    pub async fn reopen_mention(&self, id: &str, status: MentionStatus) -> Result<bool> {
        let _t = self.timed();
        let done = sqlx::query(
            "UPDATE mentions SET status = ?, error = NULL, processed_at = NULL \
             WHERE id = ? AND status = 'failed'",
        )
        .bind(status.as_str())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Mentions not in a final state, to drive again, oldest first: (id, posted_at).
    /// With `pending_received_by`, only `pending` ones received at or before that time.
    pub async fn unfinished_mentions(
        &self,
        pending_received_by: Option<i64>,
    ) -> Result<Vec<(String, i64)>> {
        let _t = self.timed();
        let rows = sqlx::query(
            "SELECT id, posted_at FROM mentions \
             WHERE (status = 'pending' AND received_at <= COALESCE(?, received_at)) \
             OR (status = 'processing' AND ? IS NULL) \
             ORDER BY received_at, id",
        )
        .bind(pending_received_by)
        .bind(pending_received_by)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Mentions per status (health, tests).
    pub async fn mention_counts(&self) -> Result<Vec<(String, i64)>> {
        let _t = self.timed();
        let rows =
            sqlx::query("SELECT status, COUNT(*) FROM mentions GROUP BY status ORDER BY status")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    // -----------------------------------------------------------------------------
    // Routing

    pub async fn routing_decision(&self, mention_id: &str) -> Result<Option<RoutingDecision>> {
        let _t = self.timed();
        let row = sqlx::query(
            "SELECT method, action_type, confidence, reasoning, notice, effect, thread_root \
             FROM routing_decisions WHERE mention_id = ?",
        )
        .bind(mention_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| RoutingDecision {
            mention_id: mention_id.to_owned(),
            method: if r.get::<&str, _>(0) == "llm" {
                Method::Llm
            } else {
                Method::Heuristic
            },
            action: ActionType::parse(r.get(1)).unwrap_or(ActionType::None),
            confidence: r.get::<Option<f64>, _>(2).map(|c| c as f32),
            reasoning: r.get(3),
            notice: r.get(4),
            effect: r.get::<Option<&str>, _>(5).and_then(Effect::parse),
            thread_root: r.get(6),
        }))
    }

    /// Stores a decision unless one is there; returns the one that counts.
    pub async fn decide(&self, d: &RoutingDecision) -> Result<RoutingDecision> {
        {
            let _t = self.timed();
            sqlx::query(
                "INSERT INTO routing_decisions (mention_id, method, action_type, confidence, \
                 reasoning, notice, effect, thread_root, created_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (mention_id) DO NOTHING",
            )
            .bind(&d.mention_id)
            .bind(d.method.as_str())
            .bind(d.action.as_str())
            .bind(d.confidence.map(f64::from))
            .bind(&d.reasoning)
            .bind(&d.notice)
            .bind(d.effect.map(Effect::as_str))
            .bind(&d.thread_root)
            .bind(now_secs())
            .execute(&self.pool)
            .await?;
        }
        Ok(self
            .routing_decision(&d.mention_id)
            .await?
            .unwrap_or_else(|| d.clone()))
    }

    /// Actions (summary, factcheck) routed for `author`'s mentions since `since`.
    pub async fn actions_for_author_since(&self, author: &str, since: i64) -> Result<u32> {
        let _t = self.timed();
        let row = sqlx::query(
            "SELECT COUNT(*) FROM routing_decisions d JOIN mentions m ON m.id = d.mention_id \
             WHERE m.author_pubky = ? AND d.created_at >= ? \
             AND d.action_type IN ('summary', 'factcheck')",
        )
        .bind(author)
        .bind(since)
        .fetch_one(&self.pool)
        .await?;
        Ok(u32::try_from(row.get::<i64, _>(0)).unwrap_or(u32::MAX))
    }

    pub async fn rate_notice_since(&self, author: &str, since: i64) -> Result<bool> {
        let _t = self.timed();
        let row = sqlx::query("SELECT 1 FROM rate_notices WHERE author_pubky = ? AND sent_at >= ?")
            .bind(author)
            .bind(since)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    pub async fn record_rate_notice(&self, author: &str) -> Result<()> {
        let _t = self.timed();
        sqlx::query("INSERT INTO rate_notices (author_pubky, sent_at) VALUES (?, ?)")
            .bind(author)
            .bind(now_secs())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn opted_out(&self, author: &str) -> Result<bool> {
        let _t = self.timed();
        let row = sqlx::query("SELECT 1 FROM opt_outs WHERE author_pubky = ?")
            .bind(author)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    pub async fn set_opted_out(&self, author: &str, out: bool) -> Result<()> {
        let _t = self.timed();
        if out {
            sqlx::query(
                "INSERT INTO opt_outs (author_pubky, since) VALUES (?, ?) ON CONFLICT DO NOTHING",
            )
            .bind(author)
            .bind(now_secs())
            .execute(&self.pool)
            .await?;
        } else {
            sqlx::query("DELETE FROM opt_outs WHERE author_pubky = ?")
                .bind(author)
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------
    // Executions and artifacts

    /// The successful execution of `action` for a mention, if there is one.
    pub async fn successful_execution(
        &self,
        mention_id: &str,
        action: ActionType,
    ) -> Result<Option<Execution>> {
        let _t = self.timed();
        let row = sqlx::query(
            "SELECT id, reply FROM action_executions WHERE mention_id = ? AND action_type = ? \
             AND status = 'success' ORDER BY id DESC LIMIT 1",
        )
        .bind(mention_id)
        .bind(action.as_str())
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| Execution {
            id: r.get(0),
            reply: r.get::<Option<String>, _>(1).unwrap_or_default(),
        }))
    }

    /// Starts recording an execution; returns its id.
    pub async fn start_execution(&self, mention_id: &str, action: ActionType) -> Result<i64> {
        let _t = self.timed();
        let row = sqlx::query(
            "INSERT INTO action_executions (mention_id, action_type, status, started_at) \
             VALUES (?, ?, 'pending', ?) RETURNING id",
        )
        .bind(mention_id)
        .bind(action.as_str())
        .bind(now_secs())
        .fetch_one(&self.pool)
        .await?;
        Ok(row.get(0))
    }

    /// Records a success with its reply and artifacts, in one transaction.
    pub async fn finish_execution(
        &self,
        id: i64,
        duration: Duration,
        outcome: &Outcome,
    ) -> Result<()> {
        let _t = self.timed();
        let now = now_secs();
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE action_executions SET status = 'success', duration_ms = ?, tokens_used = ?, \
             reply = ?, finished_at = ? WHERE id = ?",
        )
        .bind(i64::try_from(duration.as_millis()).unwrap_or(i64::MAX))
        .bind(i64::try_from(outcome.tokens_used).unwrap_or(i64::MAX))
        .bind(&outcome.reply)
        .bind(now)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        for (kind, content) in &outcome.artifacts {
            sqlx::query(
                "INSERT INTO artifacts (action_execution_id, artifact_type, content, created_at) \
                 VALUES (?, ?, ?, ?)",
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
            "UPDATE action_executions SET status = 'failed', duration_ms = ?, tokens_used = ?, \
             error_details = ?, finished_at = ? WHERE id = ?",
        )
        .bind(i64::try_from(duration.as_millis()).unwrap_or(i64::MAX))
        .bind(i64::try_from(tokens_used).unwrap_or(i64::MAX))
        .bind(error)
        .bind(now_secs())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Executions a crash left pending are failed as interrupted: all of them (at the
    /// start of a process that runs every stage), or those of one mention's action
    /// started at least `min_age` ago (when a worker runs it again after another one
    /// died on it: a younger one may still be running in another process).
    pub async fn fail_interrupted_executions(
        &self,
        only: Option<(&str, ActionType)>,
        min_age: Duration,
    ) -> Result<u64> {
        let _t = self.timed();
        let now = now_secs();
        let done = sqlx::query(
            "UPDATE action_executions SET status = 'failed', \
             error_details = 'interrupted: the bot stopped during the action', finished_at = ? \
             WHERE status = 'pending' AND started_at <= ? \
             AND (? IS NULL OR (mention_id = ? AND action_type = ?))",
        )
        .bind(now)
        .bind(now.saturating_sub(i64::try_from(min_age.as_secs()).unwrap_or(i64::MAX)))
        .bind(only.map(|(id, _)| id))
        .bind(only.map(|(id, _)| id))
        .bind(only.map(|(_, action)| action.as_str()))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Artifacts of an execution: (type, JSON text).
    pub async fn artifacts(&self, execution_id: i64) -> Result<Vec<(String, String)>> {
        let _t = self.timed();
        let rows = sqlx::query(
            "SELECT artifact_type, content FROM artifacts WHERE action_execution_id = ? ORDER BY id",
        )
        .bind(execution_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    // -----------------------------------------------------------------------------
    // Replies

    pub async fn reply(&self, mention_id: &str) -> Result<Option<Reply>> {
        let _t = self.timed();
        let row = sqlx::query(
            "SELECT post_id, content, thread_root, published_at FROM replies WHERE mention_id = ?",
        )
        .bind(mention_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| Reply {
            mention_id: mention_id.to_owned(),
            post_id: r.get(0),
            content: r.get(1),
            thread_root: r.get(2),
            published_at: r.get(3),
        }))
    }

    /// Reserves the reply to a mention (its post id and text) unless one is reserved
    /// already; returns the one that counts, so a restart publishes that same post.
    pub async fn reserve_reply(&self, reply: &Reply) -> Result<Reply> {
        {
            let _t = self.timed();
            sqlx::query(
                "INSERT INTO replies (mention_id, post_id, content, thread_root, created_at) \
                 VALUES (?, ?, ?, ?, ?) ON CONFLICT (mention_id) DO NOTHING",
            )
            .bind(&reply.mention_id)
            .bind(&reply.post_id)
            .bind(&reply.content)
            .bind(&reply.thread_root)
            .bind(now_secs())
            .execute(&self.pool)
            .await?;
        }
        Ok(self
            .reply(&reply.mention_id)
            .await?
            .unwrap_or_else(|| reply.clone()))
    }

    pub async fn mark_published(&self, mention_id: &str) -> Result<()> {
        let _t = self.timed();
        sqlx::query(
            "UPDATE replies SET published_at = ? WHERE mention_id = ? AND published_at IS NULL",
        )
        .bind(now_secs())
        .bind(mention_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Replies the bot decided to make in the thread rooted at `root` (an action or a
    /// notice), whether or not they are published yet: what the per-thread cap counts.
    pub async fn replies_in_thread(&self, root: &str) -> Result<u32> {
        let _t = self.timed();
        let row = sqlx::query(
            "SELECT COUNT(*) FROM routing_decisions WHERE thread_root = ? \
             AND (action_type IN ('summary', 'factcheck') OR notice IS NOT NULL)",
        )
        .bind(root)
        .fetch_one(&self.pool)
        .await?;
        Ok(u32::try_from(row.get::<i64, _>(0)).unwrap_or(u32::MAX))
    }

    /// Keeps a message no stage could process, with why.
    pub async fn dead_letter(&self, stream: &str, payload: &str, reason: &str) -> Result<()> {
        let _t = self.timed();
        sqlx::query(
            "INSERT INTO dead_letters (stream, payload, reason, created_at) VALUES (?, ?, ?, ?)",
        )
        .bind(stream)
        .bind(payload)
        .bind(reason)
        .bind(now_secs())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Dead letters, oldest first: (stream, payload, reason).
    /// The dead letters of the in-process bus, oldest first.
    pub async fn dead_letters(&self) -> Result<Vec<crate::bus::DeadLetterEntry>> {
        let _t = self.timed();
        let rows = sqlx::query(
            "SELECT id, stream, payload, reason, created_at FROM dead_letters ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| crate::bus::DeadLetterEntry {
                id: r.get::<i64, _>(0).to_string(),
                stream: r.get(1),
                message_id: String::new(),
                payload: r.get(2),
                reason: r.get(3),
                deliveries: 0,
                at: r.get(4),
            })
            .collect())
    }

    /// Removes a dead letter (replayed); false when there was none with that id.
    pub async fn remove_dead_letter(&self, id: i64) -> Result<bool> {
        let _t = self.timed();
        let done = sqlx::query("DELETE FROM dead_letters WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Every reply, oldest first (tests, tools).
    pub async fn all_replies(&self) -> Result<Vec<Reply>> {
        let _t = self.timed();
        let rows = sqlx::query(
            "SELECT mention_id, post_id, content, thread_root, published_at FROM replies ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| Reply {
                mention_id: r.get(0),
                post_id: r.get(1),
                content: r.get(2),
                thread_root: r.get(3),
                published_at: r.get(4),
            })
            .collect())
    }

    // -----------------------------------------------------------------------------
    // The embedded index

    /// Stores a post (an edit replaces it and takes a new place in the order, so an
    /// edit that adds a mention is seen).
    /// Applies a page of the feed (posts written, posts deleted) and moves the
    /// follower's position past it, in one transaction (one fsync per page, and a
    /// crash keeps either all of it or none).
    pub async fn index_apply(
        &self,
        changes: &[IndexChange],
        position_name: &str,
        position: &str,
    ) -> Result<()> {
        let _t = self.timed();
        let mut tx = self.pool.begin().await?;
        for change in changes {
            match change {
                IndexChange::Put(post) => {
                    sqlx::query("DELETE FROM index_posts WHERE uri = ?")
                        .bind(&post.uri)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(
                        "INSERT INTO index_posts (uri, author, post_id, content, kind, \
                         parent_uri, mentions_bot, indexed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    )
                    .bind(&post.uri)
                    .bind(&post.author)
                    .bind(&post.post_id)
                    .bind(&post.content)
                    .bind(&post.kind)
                    .bind(&post.parent_uri)
                    .bind(post.mentions_bot)
                    .bind(now_secs())
                    .execute(&mut *tx)
                    .await?;
                }
                IndexChange::Delete(uri) => {
                    sqlx::query("UPDATE index_posts SET deleted = 1 WHERE uri = ?")
                        .bind(uri)
                        .execute(&mut *tx)
                        .await?;
                }
            }
        }
        sqlx::query(
            "INSERT INTO positions (name, position, updated_at) VALUES (?, ?, ?) \
             ON CONFLICT (name) DO UPDATE SET position = excluded.position, \
             updated_at = excluded.updated_at",
        )
        .bind(position_name)
        .bind(position)
        .bind(now_secs())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn index_post(&self, uri: &str) -> Result<Option<IndexedPost>> {
        let _t = self.timed();
        let row = sqlx::query(&format!("{INDEX_COLUMNS} WHERE uri = ? AND deleted = 0"))
            .bind(uri)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(indexed_post))
    }

    /// Posts replying to `uri`, oldest first.
    pub async fn index_replies(&self, uri: &str, limit: u32) -> Result<Vec<IndexedPost>> {
        let _t = self.timed();
        let rows = sqlx::query(&format!(
            "{INDEX_COLUMNS} WHERE parent_uri = ? AND deleted = 0 ORDER BY post_id LIMIT ?"
        ))
        .bind(uri)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(indexed_post).collect())
    }

    /// Posts naming the bot, after position `seq`, in index order.
    pub async fn index_mentions_after(&self, seq: i64, limit: u32) -> Result<Vec<IndexedPost>> {
        let _t = self.timed();
        let rows = sqlx::query(&format!(
            "{INDEX_COLUMNS} WHERE mentions_bot = 1 AND seq > ? AND deleted = 0 ORDER BY seq LIMIT ?"
        ))
        .bind(seq)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(indexed_post).collect())
    }
}

const INDEX_COLUMNS: &str = "SELECT seq, uri, author, post_id, content, kind, parent_uri, \
                             mentions_bot FROM index_posts";

fn indexed_post(r: sqlx::sqlite::SqliteRow) -> IndexedPost {
    IndexedPost {
        seq: r.get(0),
        uri: r.get(1),
        author: r.get(2),
        post_id: r.get(3),
        content: r.get(4),
        kind: r.get(5),
        parent_uri: r.get(6),
        mentions_bot: r.get(7),
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
