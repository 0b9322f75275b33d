//! What every process of the bot must agree on besides the database: idempotency keys
//! (`mention:{id}`, `route:{id}`, `action:{type}:{id}`, 24 h) and the per-user rate
//! limit. With the Redis bus they live in Redis with their lifetimes (keys with `SET NX
//! EX`, each author's actions in a sorted set trimmed to the window, the "slow down"
//! notice as a key that expires with the window); with the in-process bus, in the
//! database (the same rules, counted from the routing decisions).

use std::time::Duration;

use redis::aio::ConnectionManager;

use crate::bus::RedisBus;
use crate::store::{Store, StoreError, now_secs};

#[derive(Debug, thiserror::Error)]
pub enum SharedError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

type Result<T> = std::result::Result<T, SharedError>;

pub enum SharedState {
    Database(Store),
    Redis(RedisShared),
}

pub struct RedisShared {
    conn: ConnectionManager,
    prefix: String,
    ops: prometheus::IntCounterVec,
}

impl RedisShared {
    pub fn new(bus: &RedisBus, ops: prometheus::IntCounterVec) -> Self {
        Self {
            conn: bus.connection(),
            prefix: bus.key(""),
            ops,
        }
    }

    fn key(&self, name: &str) -> String {
        format!("{}pkbot:{name}", self.prefix)
    }

    fn count(&self, operation: &str) {
        self.ops.with_label_values(&[operation]).inc();
    }
}

impl SharedState {
    /// Takes `key` for `ttl`; false when it is held.
    pub async fn claim_key(&self, key: &str, ttl: Duration) -> Result<bool> {
        match self {
            Self::Database(store) => Ok(store.claim_key(key, ttl).await?),
            Self::Redis(r) => {
                r.count("key");
                let set: Option<String> = redis::cmd("SET")
                    .arg(r.key(&format!("key:{key}")))
                    .arg(now_secs())
                    .arg("NX")
                    .arg("EX")
                    .arg(ttl.as_secs().max(1))
                    .query_async(&mut r.conn.clone())
                    .await?;
                Ok(set.is_some())
            }
        }
    }

    /// Actions (summaries, fact-checks) routed for `author` in the last `window`.
    pub async fn actions_in_window(&self, author: &str, window: Duration) -> Result<u32> {
        let since = now_secs().saturating_sub(secs(window));
        match self {
            Self::Database(store) => Ok(store.actions_for_author_since(author, since).await?),
            Self::Redis(r) => {
                r.count("rate");
                let key = r.key(&format!("rate:{author}"));
                let (_, count): (i64, u32) = redis::pipe()
                    .cmd("ZREMRANGEBYSCORE")
                    .arg(&key)
                    .arg("-inf")
                    .arg(format!("({since}"))
                    .cmd("ZCARD")
                    .arg(&key)
                    .query_async(&mut r.conn.clone())
                    .await?;
                Ok(count)
            }
        }
    }

    /// Counts an action routed for `author`'s mention `mention_id` (once per mention).
    pub async fn record_action(
        &self,
        author: &str,
        mention_id: &str,
        window: Duration,
    ) -> Result<()> {
        match self {
            // Counted from the routing decisions themselves.
            Self::Database(_) => Ok(()),
            Self::Redis(r) => {
                r.count("rate");
                let key = r.key(&format!("rate:{author}"));
                let _: redis::Value = redis::pipe()
                    .atomic()
                    .cmd("ZADD")
                    .arg(&key)
                    .arg("NX")
                    .arg(now_secs())
                    .arg(mention_id)
                    .cmd("EXPIRE")
                    .arg(&key)
                    .arg(secs(window).max(1))
                    .query_async(&mut r.conn.clone())
                    .await?;
                Ok(())
            }
        }
    }

    /// Whether `author` was told within `window` that the bot pauses for them.
    pub async fn rate_notice_in_window(&self, author: &str, window: Duration) -> Result<bool> {
        match self {
            Self::Database(store) => Ok(store
                .rate_notice_since(author, now_secs().saturating_sub(secs(window)))
                .await?),
            Self::Redis(r) => {
                r.count("rate");
                let exists: bool = redis::cmd("EXISTS")
                    .arg(r.key(&format!("rate-notice:{author}")))
                    .query_async(&mut r.conn.clone())
                    .await?;
                Ok(exists)
            }
        }
    }

    /// Notes that `author` was told (for `window`).
    pub async fn record_rate_notice(&self, author: &str, window: Duration) -> Result<()> {
        match self {
            Self::Database(store) => Ok(store.record_rate_notice(author).await?),
            Self::Redis(r) => {
                r.count("rate");
                let _: redis::Value = redis::cmd("SET")
                    .arg(r.key(&format!("rate-notice:{author}")))
                    .arg(now_secs())
                    .arg("EX")
                    .arg(secs(window).max(1))
                    .query_async(&mut r.conn.clone())
                    .await?;
                Ok(())
            }
        }
    }
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2)
}
