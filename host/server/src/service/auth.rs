//! Credentials and signed requests. Signed requests are checked here; each accepted
//! state-changing signature becomes a [`ReplayMark`] that the write's own transaction
//! records, so a replay is refused atomically with the change it would repeat. Which
//! space a request touches and whether it may is `access`'s job.

use homeserver_protocol::{AuthHeader, BodyHash, MAX_CLOCK_SKEW_SECS, PublicKey, VerifyError};

use super::ServiceError;
use crate::persistence::metadata::ReplayMark;

/// Credentials as presented, parsed but not yet verified.
#[derive(Debug, Clone)]
pub enum Credentials {
    None,
    Signed(Box<AuthHeader>),
    /// A session token (`Bearer`).
    Session(String),
}

/// The request facts a signature covers.
#[derive(Debug, Clone)]
pub struct SignedTarget<'a> {
    pub method: &'a str,
    /// Path plus `?query`, exactly as sent.
    pub target: &'a str,
}

/// Whose space a read touches, and why it may.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadAccess {
    /// The owner (signed, or through a session) reads their own space.
    Owner(PublicKey),
    /// Anyone reads another user's public data.
    Public(PublicKey),
}

impl ReadAccess {
    pub fn space(&self) -> &PublicKey {
        match self {
            ReadAccess::Owner(k) | ReadAccess::Public(k) => k,
        }
    }
}

fn verify_error(e: VerifyError) -> ServiceError {
    match e {
        VerifyError::ClockSkew { .. } => ServiceError::InvalidSignature(e.to_string()),
        VerifyError::BadSignature => ServiceError::InvalidSignature(e.to_string()),
    }
}

fn now_u64() -> u64 {
    u64::try_from(super::now_secs()).unwrap_or(0)
}

/// Refuses a stale header before any body is read.
pub fn check_fresh(header: &AuthHeader) -> Result<(), ServiceError> {
    header.check_freshness(now_u64()).map_err(verify_error)
}

/// Full check of a signed request whose body hashes to `body_hash`.
pub fn verify(
    header: &AuthHeader,
    target: &SignedTarget<'_>,
    body_hash: &BodyHash,
) -> Result<(), ServiceError> {
    header
        .verify(target.method, target.target, body_hash, now_u64())
        .map_err(verify_error)
}

/// The replay mark of an accepted signature: kept as long as the signature could pass
/// the clock-skew check.
pub fn replay_mark(header: &AuthHeader) -> ReplayMark {
    let expires = header.timestamp.saturating_add(MAX_CLOCK_SKEW_SECS + 1);
    ReplayMark {
        signature_id: header.replay_id(),
        expires_at: i64::try_from(expires).unwrap_or(i64::MAX),
    }
}

pub fn replayed() -> ServiceError {
    ServiceError::InvalidSignature(
        "signature replayed: this signed request was already accepted once".into(),
    )
}

pub fn missing_credentials() -> ServiceError {
    ServiceError::InvalidSignature(
        "missing credentials: sign the request (Authorization: Pk ...), use a session \
         (Authorization: Bearer ...) or, to read public data, name the user with the \
         Pubky-Host header or pubky-host query parameter"
            .into(),
    )
}

pub fn private_reserved() -> ServiceError {
    ServiceError::Forbidden("/private/ is reserved for future use".into())
}
