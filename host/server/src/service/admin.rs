//! Operator actions: statistics, user inspection and control (disable, quota, delete the
//! whole account), and signup tokens. Reached only through the admin server.

use std::sync::Arc;

use homeserver_protocol::PublicKey;
use serde::{Deserialize, Serialize};

use super::entry_cache::EntryCache;
use super::events::{EventHub, to_wire};
use super::sessions::SessionService;
use super::{ServiceError, now_secs};
use crate::persistence::metadata::{ReverseEventQuery, StoreStats, UserRecord};
use crate::persistence::{BlobStore, MetadataStore, MetadataWrites};

/// What the admin API shows of a user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    pub public_key: String,
    pub storage_used: u64,
    /// The quota in force (the user's override or the default); 0 = unlimited.
    pub storage_quota: u64,
    pub created_at: i64,
    pub last_activity: i64,
    pub disabled: bool,
}

/// Answer to deleting an account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedAccount {
    pub public_key: String,
    pub entries_deleted: u64,
}

/// A page of the user list, in key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserPage {
    pub users: Vec<UserInfo>,
    /// The last key of this page (the next page's `cursor`); null on an empty page.
    pub cursor: Option<String>,
    pub has_more: bool,
}

/// A signup token as the admin API lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignupTokenInfo {
    pub token: String,
    /// `valid` or `used`.
    pub status: String,
    pub created_at: String,
    pub used_by: Option<String>,
    pub used_at: Option<String>,
}

/// A page of signup tokens, in token order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignupTokenPage {
    pub tokens: Vec<SignupTokenInfo>,
    pub cursor: Option<String>,
    pub has_more: bool,
}

/// An event as the admin API shows it: the feed's event and when it was committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecentEvent {
    #[serde(flatten)]
    pub event: homeserver_protocol::event::Event,
    pub created_at: String,
}

/// One backing store's state, for `GET /admin/stats`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreHealth {
    /// `sqlite`, `postgres`, `file` or `s3`.
    pub backend: String,
    /// `ok` or `down`.
    pub status: String,
    /// Why it is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl StoreHealth {
    fn of(backend: &str, error: Option<impl std::fmt::Display>) -> Self {
        Self {
            backend: backend.to_owned(),
            status: if error.is_none() { "ok" } else { "down" }.to_owned(),
            error: error.map(|e| e.to_string()),
        }
    }

    pub fn is_ok(&self) -> bool {
        self.status == "ok"
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BackendHealth {
    pub metadata: StoreHealth,
    pub blobs: StoreHealth,
}

#[derive(Clone)]
pub struct AdminService {
    metadata: Arc<dyn MetadataStore>,
    blobs: BlobStore,
    events: Arc<EventHub>,
    default_quota: u64,
    entry_cache: Arc<EntryCache>,
    sessions: SessionService,
}

impl AdminService {
    pub fn new(
        metadata: Arc<dyn MetadataStore>,
        blobs: BlobStore,
        events: Arc<EventHub>,
        default_quota: u64,
        entry_cache: Arc<EntryCache>,
        sessions: SessionService,
    ) -> Self {
        Self {
            metadata,
            blobs,
            events,
            default_quota,
            entry_cache,
            sessions,
        }
    }

    pub async fn stats(&self) -> Result<StoreStats, ServiceError> {
        Ok(self.metadata.stats().await?)
    }

    /// Sessions that have not expired (a gauge of the metrics server).
    pub async fn active_sessions(&self) -> Result<u64, ServiceError> {
        Ok(self.metadata.active_sessions(now_secs()).await?)
    }

    /// Whether each backing store answers now (both asked at once, each within the
    /// storage timeout), so an operator sees which one is down.
    pub async fn backend_health(&self) -> BackendHealth {
        let (metadata, blobs) = tokio::join!(self.metadata.ping(), self.blobs.ping());
        BackendHealth {
            metadata: StoreHealth::of(self.metadata.backend(), metadata.err()),
            blobs: StoreHealth::of(self.blobs.backend(), blobs.err()),
        }
    }

    pub async fn user(&self, key: &PublicKey) -> Result<UserInfo, ServiceError> {
        let user = self
            .metadata
            .user(&key.to_z32())
            .await?
            .ok_or_else(|| unknown_user(key))?;
        Ok(self.user_info(user))
    }

    fn user_info(&self, user: UserRecord) -> UserInfo {
        UserInfo {
            storage_quota: user.quota_bytes.unwrap_or(self.default_quota),
            public_key: user.public_key,
            storage_used: user.used_bytes,
            created_at: user.created_at,
            last_activity: user.last_activity,
            disabled: user.disabled,
        }
    }

    /// Users whose key starts with `prefix` (z-base-32; empty = every user), in key
    /// order, after the key `after` (a previous page's cursor), at most `limit`.
    pub async fn users(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<UserPage, ServiceError> {
        // Every key starting with the prefix sorts after it (keys are longer), except a
        // whole key, which is looked up alone.
        if prefix.len() == homeserver_protocol::keys::PUBLIC_KEY_TEXT_LEN {
            let user = match after {
                Some(after) if after >= prefix => None,
                _ => self.metadata.user(prefix).await?,
            };
            let users: Vec<UserInfo> = user.into_iter().map(|u| self.user_info(u)).collect();
            return Ok(UserPage {
                cursor: users.last().map(|u| u.public_key.clone()),
                users,
                has_more: false,
            });
        }
        let start = after.filter(|a| *a > prefix).unwrap_or(prefix);
        let mut rows = self.metadata.users_after(start, limit + 1).await?;
        rows.retain(|u| u.public_key.starts_with(prefix));
        let has_more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        let users: Vec<UserInfo> = rows.into_iter().map(|u| self.user_info(u)).collect();
        Ok(UserPage {
            cursor: users.last().map(|u| u.public_key.clone()),
            users,
            has_more,
        })
    }

    /// Signup tokens in token order after `after`, at most `limit`, used or not.
    pub async fn signup_tokens(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<SignupTokenPage, ServiceError> {
        let mut rows = self
            .metadata
            .signup_tokens_after(after.unwrap_or(""), limit + 1)
            .await?;
        let has_more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        let tokens: Vec<SignupTokenInfo> = rows
            .into_iter()
            .map(|t| SignupTokenInfo {
                status: if t.used_by.is_some() { "used" } else { "valid" }.into(),
                token: t.token,
                created_at: iso8601(t.created_at),
                used_by: t.used_by,
                used_at: t.used_at.map(iso8601),
            })
            .collect();
        Ok(SignupTokenPage {
            cursor: tokens.last().map(|t| t.token.clone()),
            tokens,
            has_more,
        })
    }

    /// The newest `limit` events, newest first, whatever user they belong to.
    pub async fn recent_events(&self, limit: u32) -> Result<Vec<RecentEvent>, ServiceError> {
        let records = self
            .metadata
            .events_reverse(ReverseEventQuery {
                users: &[],
                before: i64::MAX as u64,
                path_prefix: None,
                limit,
            })
            .await?;
        Ok(records
            .iter()
            .map(|e| RecentEvent {
                event: to_wire(e),
                created_at: iso8601(e.created_at),
            })
            .collect())
    }

    pub async fn set_disabled(
        &self,
        key: &PublicKey,
        disabled: bool,
    ) -> Result<UserInfo, ServiceError> {
        if !self
            .metadata
            .set_user_disabled(&key.to_z32(), disabled)
            .await?
        {
            return Err(unknown_user(key));
        }
        self.user(key).await
    }

    /// `None` returns the user to the configured default.
    pub async fn set_quota(
        &self,
        key: &PublicKey,
        quota: Option<u64>,
    ) -> Result<UserInfo, ServiceError> {
        if !self.metadata.set_user_quota(&key.to_z32(), quota).await? {
            return Err(unknown_user(key));
        }
        self.user(key).await
    }

    /// Deletes the user and every entry in one transaction (a DEL event each, their
    /// blobs retired for the sweep). The key may sign up again later, with an empty space.
    pub async fn delete_account(&self, key: &PublicKey) -> Result<DeletedAccount, ServiceError> {
        let values = self
            .metadata
            .delete_account(&key.to_z32(), now_secs())
            .await?
            .ok_or_else(|| unknown_user(key))?;
        // The tailer would invalidate each entry as it sees the events; don't wait.
        self.entry_cache.clear();
        self.sessions.forget_all();
        self.events.committed();
        // The transaction retired the blobs: the sweep deletes them after the grace.
        let entries_deleted = values.len() as u64;
        Ok(DeletedAccount {
            public_key: key.to_z32(),
            entries_deleted,
        })
    }

    /// A new signup token `XXXX-XXXX-XXXX`.
    pub async fn create_signup_token(&self) -> Result<String, ServiceError> {
        for _ in 0..8 {
            let token = random_token()?;
            if self
                .metadata
                .create_signup_token(&token, now_secs())
                .await?
            {
                return Ok(token);
            }
        }
        Err(ServiceError::Internal(
            "could not find an unused signup token".into(),
        ))
    }
}

fn unknown_user(key: &PublicKey) -> ServiceError {
    ServiceError::NotFound(format!("no user {key}"))
}

/// RFC 4648 base32 alphabet; 256 is a multiple of 32, so `byte % 32` is unbiased.
const TOKEN_ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

fn random_token() -> Result<String, ServiceError> {
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).map_err(|e| ServiceError::Internal(format!("RNG: {e}")))?;
    let chars: Vec<char> = bytes
        .iter()
        .map(|b| TOKEN_ALPHABET[usize::from(b % 32)] as char)
        .collect();
    Ok(chars
        .chunks(4)
        .map(|c| c.iter().collect::<String>())
        .collect::<Vec<_>>()
        .join("-"))
}

/// Unix seconds as ISO 8601 UTC (`YYYY-MM-DDTHH:MM:SSZ`).
pub fn iso8601(unix: i64) -> String {
    let time =
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(u64::try_from(unix).unwrap_or(0));
    humantime::format_rfc3339_seconds(time).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use homeserver_protocol::wire::is_signup_token;

    #[test]
    fn tokens_have_the_documented_format() {
        for _ in 0..100 {
            let t = random_token().unwrap();
            assert!(is_signup_token(&t), "{t}");
        }
    }

    #[test]
    fn iso8601_dates() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601(1_795_320_780), "2026-11-22T04:13:00Z");
    }
}
