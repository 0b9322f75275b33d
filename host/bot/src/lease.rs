//! The leader lease: with the Redis bus, exactly one process runs the poller, router
//! and reply publisher. It holds `<prefix>pkbot:leader` (`SET NX PX`, the value names
//! the holder and its fencing token) and renews it every third of its lifetime; a
//! process that finds it held sleeps until it expires (its remaining time, `PTTL`) and
//! tries again, so it takes over within one lifetime after the holder's last renewal.
//! Renewal and release only touch the key while it still holds this holder's value (a
//! Lua script: check and act in one step), so a process that lost the lease (paused
//! past its lifetime) never renews or deletes the next holder's.
//!
//! Each taking of the lease draws a fencing token from `<prefix>pkbot:leader:token`, a
//! counter that only grows: the store and the bus refuse writes of a holder whose
//! token is no longer the newest (`store::Fence`, `RedisBus::set_fence`).

use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionManager;

pub struct Lease {
    conn: ConnectionManager,
    key: String,
    token_key: String,
    holder: String,
    ttl: Duration,
    /// `<holder>#<token>` while held (what the key holds).
    value: std::sync::Mutex<String>,
}

/// Takes the lease if nobody holds it: draws the next token and stores
/// `<holder>#<token>`. Returns the token, or 0 when it is held.
const ACQUIRE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '#' .. token, 'PX', ARGV[2])
return token";

const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0";

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

/// Moves the token counter to at least ARGV[1] (the database's fence is higher: the
/// counter was lost with Redis's data).
const ADVANCE: &str = r"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1";

impl Lease {
    pub fn new(conn: ConnectionManager, key: String, holder: String, ttl: Duration) -> Self {
        Self {
            conn,
            token_key: format!("{key}:token"),
            key,
            holder,
            ttl,
            value: std::sync::Mutex::new(String::new()),
        }
    }

    /// How often to renew.
    pub fn period(&self) -> Duration {
        (self.ttl / 3).max(Duration::from_millis(50))
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The key's name.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// What the key holds while this process holds the lease (`<holder>#<token>`).
    pub fn value(&self) -> String {
        self.value.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Takes the lease if nobody holds it; returns its fencing token.
    pub async fn acquire(&self) -> Result<Option<i64>, redis::RedisError> {
        let token: i64 = Script::new(ACQUIRE)
            .key(&self.key)
            .key(&self.token_key)
            .arg(&self.holder)
            .arg(self.ttl.as_millis() as u64)
            .invoke_async(&mut self.conn.clone())
            .await?;
        if token == 0 {
            return Ok(None);
        }
        *self.value.lock().unwrap_or_else(|e| e.into_inner()) = format!("{}#{token}", self.holder);
        Ok(Some(token))
    }

    /// Extends the lease; false when it is no longer ours.
    pub async fn renew(&self) -> Result<bool, redis::RedisError> {
        let renewed: i64 = Script::new(RENEW)
            .key(&self.key)
            .arg(self.value())
            .arg(self.ttl.as_millis() as u64)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(renewed == 1)
    }

    /// Gives the lease up (a clean stop: the standby takes over at once).
    pub async fn release(&self) -> Result<(), redis::RedisError> {
        let _: i64 = Script::new(RELEASE)
            .key(&self.key)
            .arg(self.value())
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Moves the token counter past `token` (see [`ADVANCE`]).
    pub async fn advance_token(&self, token: i64) -> Result<(), redis::RedisError> {
        let _: i64 = Script::new(ADVANCE)
            .key(&self.token_key)
            .arg(token)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// How long the current holder's lease lasts unless renewed (None: nobody holds it).
    pub async fn expires_in(&self) -> Result<Option<Duration>, redis::RedisError> {
        let ms: i64 = redis::cmd("PTTL")
            .arg(&self.key)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(u64::try_from(ms).ok().map(Duration::from_millis))
    }

    /// Who holds it now (`<holder>#<token>`), if anyone.
    pub async fn current_holder(&self) -> Result<Option<String>, redis::RedisError> {
        redis::cmd("GET")
            .arg(&self.key)
            .query_async(&mut self.conn.clone())
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn conn(test: &str) -> Option<ConnectionManager> {
        let url = std::env::var("PKBOT_TEST_REDIS_URL")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let connected = async {
            let client = redis::Client::open(url.as_str())?;
            ConnectionManager::new(client).await
        }
        .await;
        match connected {
            Ok(c) => Some(c),
            Err(e) => {
                let why = format!("no Redis at {url}: {e}");
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "CI=true and {why}"
                );
                eprintln!("SKIPPED {test}: {why}");
                None
            }
        }
    }

    #[tokio::test]
    async fn one_holder_at_a_time_and_takeover_after_expiry() {
        let Some(conn) = conn("lease").await else {
            return;
        };
        let key = format!("test-lease-{}", std::process::id());
        let ttl = Duration::from_millis(600);
        let a = Lease::new(conn.clone(), key.clone(), "a".into(), ttl);
        let b = Lease::new(conn.clone(), key.clone(), "b".into(), ttl);
        let first = a.acquire().await.unwrap().expect("a takes it");
        assert_eq!(b.acquire().await.unwrap(), None);
        assert!(a.renew().await.unwrap());
        assert!(!b.renew().await.unwrap(), "b never held it");
        // a stops renewing (it died): b gets it after the lifetime.
        tokio::time::sleep(ttl + Duration::from_millis(200)).await;
        assert!(b.expires_in().await.unwrap().is_none());
        let second = b.acquire().await.unwrap().expect("b takes it");
        assert!(
            second > first,
            "the token only grows: {first} then {second}"
        );
        assert!(!a.renew().await.unwrap(), "a lost it");
        a.release().await.unwrap();
        assert_eq!(
            b.current_holder().await.unwrap(),
            Some(format!("b#{second}"))
        );
        assert!(
            b.expires_in()
                .await
                .unwrap()
                .is_some_and(|left| left <= ttl)
        );
        b.advance_token(second + 10).await.unwrap();
        b.release().await.unwrap();
        assert_eq!(a.acquire().await.unwrap(), Some(second + 11));
        a.release().await.unwrap();
        assert_eq!(b.current_holder().await.unwrap(), None);
        let _: i64 = redis::cmd("DEL")
            .arg(format!("{key}:token"))
            .query_async(&mut conn.clone())
            .await
            .unwrap();
    }
}
