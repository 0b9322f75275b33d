//! What every process of the bot must agree on besides the database: idempotency keys
//! (`mention:{id}`, `route:{id}`, `action:{type}:{id}`, 24 h), claims on running
//! actions, and the per-user rate limit. With the Redis bus they live in Redis with
//! their lifetimes (keys with `SET NX EX`, claims with `SET NX PX` renewed by their
//! holder, each author's actions in a sorted set trimmed to the window, the "slow
//! down" notice as a key that expires with the window); with the in-process bus, in
//! the database (the same rules, counted from the routing decisions) and, for claims,
//! in memory (one process runs every action).
//!
//! An action claim says who runs an action now. Its holder renews it every third of
//! its lifetime while the action runs, so a claim is honoured while its holder lives;
//! a holder that dies (or freezes) stops renewing, the claim expires, and the next
//! worker takes it over.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
    Database(Store, LocalClaims),
    Redis(RedisShared),
}

/// Action claims of the in-process bus: key → (holder, until).
#[derive(Default)]
pub struct LocalClaims(Mutex<HashMap<String, (String, Instant)>>);

impl LocalClaims {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, (String, Instant)>) -> T) -> T {
        let mut claims = self.0.lock().unwrap_or_else(|e| e.into_inner());
        claims.retain(|_, (_, until)| *until > Instant::now());
        f(&mut claims)
    }
}

/// Renews claim KEYS[1] for ARGV[2] ms while it is ARGV[1]'s.
const RENEW_CLAIM: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0";

/// Releases claim KEYS[1] if it is ARGV[1]'s.
const RELEASE_CLAIM: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

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
            Self::Database(store, _) => Ok(store.claim_key(key, ttl).await?),
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

    /// Takes the claim `key` (an action's) for `holder` for `ttl`; false when another
    /// holder has it.
    pub async fn claim_action(&self, key: &str, holder: &str, ttl: Duration) -> Result<bool> {
        match self {
            Self::Database(_, claims) => Ok(claims.with(|c| {
                if c.contains_key(key) {
                    return false;
                }
                c.insert(key.to_owned(), (holder.to_owned(), Instant::now() + ttl));
                true
            })),
            Self::Redis(r) => {
                r.count("claim_action");
                let set: Option<String> = redis::cmd("SET")
                    .arg(r.key(&format!("claim:{key}")))
                    .arg(holder)
                    .arg("NX")
                    .arg("PX")
                    .arg(millis(ttl))
                    .query_async(&mut r.conn.clone())
                    .await?;
                Ok(set.is_some())
            }
        }
    }

    /// Extends `holder`'s claim `key` by `ttl`; false when it is no longer its own
    /// (it expired, and maybe another holder took it).
    pub async fn renew_action(&self, key: &str, holder: &str, ttl: Duration) -> Result<bool> {
        match self {
            Self::Database(_, claims) => Ok(claims.with(|c| match c.get_mut(key) {
                Some((h, until)) if h == holder => {
                    *until = Instant::now() + ttl;
                    true
                }
                _ => false,
            })),
            Self::Redis(r) => {
                r.count("claim_action");
                let renewed: i64 = redis::Script::new(RENEW_CLAIM)
                    .key(r.key(&format!("claim:{key}")))
                    .arg(holder)
                    .arg(millis(ttl))
                    .invoke_async(&mut r.conn.clone())
                    .await?;
                Ok(renewed == 1)
            }
        }
    }

    /// Gives `holder`'s claim `key` up (the action ended).
    pub async fn release_action(&self, key: &str, holder: &str) -> Result<()> {
        match self {
            Self::Database(_, claims) => {
                claims.with(|c| {
                    if c.get(key).is_some_and(|(h, _)| h == holder) {
                        c.remove(key);
                    }
                });
                Ok(())
            }
            Self::Redis(r) => {
                r.count("claim_action");
                let _: i64 = redis::Script::new(RELEASE_CLAIM)
                    .key(r.key(&format!("claim:{key}")))
                    .arg(holder)
                    .invoke_async(&mut r.conn.clone())
                    .await?;
                Ok(())
            }
        }
    }

    /// How long the claim `key` lasts unless its holder renews it; None when nobody
    /// holds it.
    pub async fn action_claim_left(&self, key: &str) -> Result<Option<Duration>> {
        match self {
            Self::Database(_, claims) => Ok(claims.with(|c| {
                c.get(key)
                    .map(|(_, until)| until.saturating_duration_since(Instant::now()))
            })),
            Self::Redis(r) => {
                r.count("claim_action");
                let ms: i64 = redis::cmd("PTTL")
                    .arg(r.key(&format!("claim:{key}")))
                    .query_async(&mut r.conn.clone())
                    .await?;
                Ok(u64::try_from(ms).ok().map(Duration::from_millis))
            }
        }
    }

    /// Actions (summaries, fact-checks) routed for `author` in the last `window`.
    pub async fn actions_in_window(&self, author: &str, window: Duration) -> Result<u32> {
        let since = now_secs().saturating_sub(secs(window));
        match self {
            Self::Database(store, _) => Ok(store.actions_for_author_since(author, since).await?),
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
            Self::Database(..) => Ok(()),
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
            Self::Database(store, _) => Ok(store
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
            Self::Database(store, _) => Ok(store.record_rate_notice(author).await?),
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

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2)
}
