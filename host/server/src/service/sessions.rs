//! Sessions: a signed `POST /auth/session` mints a bearer token limited to capabilities
//! for a time; `GET` shows it and `DELETE` revokes it. Only the token's SHA-256 is
//! stored. Which requests a session may make is decided by the capability-policy guest
//! (see `access`), never here.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use homeserver_protocol::{BodyHash, Capability};
use sha2::{Digest, Sha256};

use super::auth::{self, Signed, SignedTarget};
use super::{ServiceError, now_secs};
use crate::persistence::metadata::{CreateSessionOutcome, SessionRecord};
use crate::persistence::{MetadataStore, MetadataWrites};

pub const DEFAULT_TTL: u64 = 3600;
pub const MIN_TTL: u64 = 60;
pub const MAX_TTL: u64 = 30 * 24 * 3600;
pub const MAX_CAPABILITIES: usize = 32;
/// Expired sessions are kept this long so their tokens answer `expired_session`.
pub const EXPIRED_RETENTION_SECS: i64 = 7 * 24 * 3600;

pub use homeserver_protocol::wire::{SessionCreated, SessionInfo, SessionRequest};

impl From<&SessionRecord> for SessionInfo {
    fn from(s: &SessionRecord) -> Self {
        Self {
            public_key: s.user.clone(),
            capabilities: s.capabilities.clone(),
            created_at: s.created_at,
            expires_at: s.expires_at,
        }
    }
}

fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Sessions kept in memory (about 300 bytes each).
const CACHE_CAPACITY: usize = 100_000;

/// Live sessions by token hash, so a session request costs no database lookup. Only
/// for a store this process owns: on a shared store another instance may revoke a
/// session, and a revocation must hold at once everywhere, so there every request
/// reads the store. Expiry is checked on every use; a revocation (or an account
/// deletion) here removes the entry, and a lookup that raced one does not cache what it
/// read (the epoch check, as in `entry_cache`).
struct SessionCache {
    sessions: quick_cache::sync::Cache<[u8; 32], SessionRecord>,
    epoch: AtomicU64,
}

#[derive(Clone)]
pub struct SessionService {
    metadata: Arc<dyn MetadataStore>,
    cache: Option<Arc<SessionCache>>,
}

impl SessionService {
    pub fn new(metadata: Arc<dyn MetadataStore>) -> Self {
        let cache = (!metadata.shared()).then(|| {
            Arc::new(SessionCache {
                sessions: quick_cache::sync::Cache::new(CACHE_CAPACITY),
                epoch: AtomicU64::new(0),
            })
        });
        Self { metadata, cache }
    }

    /// Forgets every cached session (an account was deleted with its sessions).
    pub fn forget_all(&self) {
        if let Some(cache) = &self.cache {
            cache.epoch.fetch_add(1, Ordering::SeqCst);
            cache.sessions.clear();
        }
    }

    pub async fn create(
        &self,
        header: &Signed,
        target: &SignedTarget<'_>,
        body: &[u8],
    ) -> Result<SessionCreated, ServiceError> {
        auth::verify(header, target, &BodyHash::of(body))?;
        let request: SessionRequest = serde_json::from_slice(body).map_err(|e| {
            ServiceError::BadRequest(format!(
                "body must be {{\"capabilities\": [\"read:/pub/...\"], \"ttl\": seconds}}: {e}"
            ))
        })?;
        let ttl = request.ttl.unwrap_or(DEFAULT_TTL);
        if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
            return Err(ServiceError::BadRequest(format!(
                "ttl must be from {MIN_TTL} to {MAX_TTL} seconds, got {ttl}"
            )));
        }
        if request.capabilities.len() > MAX_CAPABILITIES {
            return Err(ServiceError::BadRequest(format!(
                "at most {MAX_CAPABILITIES} capabilities, got {}",
                request.capabilities.len()
            )));
        }
        for cap in &request.capabilities {
            cap.parse::<Capability>()
                .map_err(|e| ServiceError::BadRequest(format!("capability `{cap}`: {e}")))?;
        }
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| ServiceError::Internal(format!("RNG: {e}")))?;
        let token = URL_SAFE_NO_PAD.encode(raw);
        let now = now_secs();
        let expires_at = now + i64::try_from(ttl).unwrap_or(i64::MAX);
        let record = SessionRecord {
            token_hash: token_hash(&token),
            user: header.public_key.to_z32(),
            capabilities: request.capabilities,
            created_at: now,
            expires_at,
        };
        match self
            .metadata
            .create_session(&record, auth::replay_mark(header))
            .await?
        {
            CreateSessionOutcome::Created => Ok(SessionCreated { token, expires_at }),
            CreateSessionOutcome::Replayed => Err(auth::replayed()),
            CreateSessionOutcome::UnknownUser => Err(ServiceError::Forbidden(
                "this key has not signed up on this homeserver".into(),
            )),
            CreateSessionOutcome::Disabled => {
                Err(ServiceError::Forbidden("account disabled".into()))
            }
        }
    }

    /// The live session of a bearer token: 401 `invalid_signature` when unknown or
    /// revoked, 401 `expired_session` when expired.
    pub async fn resolve(&self, token: &str) -> Result<SessionRecord, ServiceError> {
        let hash = token_hash(token);
        let cached = self.cache.as_ref().and_then(|c| c.sessions.get(&hash));
        let session = match cached {
            Some(session) => session,
            None => {
                let epoch = self.cache.as_ref().map(|c| c.epoch.load(Ordering::SeqCst));
                let session = self.metadata.session(&hash).await?.ok_or_else(|| {
                    ServiceError::InvalidSignature(
                        "unknown or revoked session token (create a new session)".into(),
                    )
                })?;
                if let (Some(cache), Some(epoch)) = (&self.cache, epoch) {
                    cache.sessions.insert(hash, session.clone());
                    // A revocation meanwhile: do not keep what may be stale.
                    if cache.epoch.load(Ordering::SeqCst) != epoch {
                        cache.sessions.remove(&hash);
                    }
                }
                session
            }
        };
        if session.expires_at <= now_secs() {
            return Err(ServiceError::ExpiredSession);
        }
        if let Ok(owner) = session.user.parse() {
            super::caller::record(super::caller::ProvenCaller::Session(owner));
        }
        Ok(session)
    }

    pub async fn revoke(&self, token: &str) -> Result<(), ServiceError> {
        self.resolve(token).await?;
        let hash = token_hash(token);
        if let Some(cache) = &self.cache {
            cache.epoch.fetch_add(1, Ordering::SeqCst);
            cache.sessions.remove(&hash);
        }
        self.metadata.delete_session(&hash).await?;
        // Again: a lookup between the removal and the delete may have cached it.
        if let Some(cache) = &self.cache {
            cache.epoch.fetch_add(1, Ordering::SeqCst);
            cache.sessions.remove(&hash);
        }
        Ok(())
    }
}
