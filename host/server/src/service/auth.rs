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
    /// A public listing of a folder the capability policy hides: answered as an empty
    /// folder, exactly like one that does not exist (a 404 would tell hidden from
    /// missing).
    PublicHiddenListing(PublicKey),
}

impl ReadAccess {
    pub fn space(&self) -> &PublicKey {
        match self {
            ReadAccess::Owner(k) | ReadAccess::Public(k) | ReadAccess::PublicHiddenListing(k) => k,
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
    verify_signature(header, target.method, target.target, body_hash).map_err(verify_error)
}

/// Signatures proven moments ago, by signature, with a digest of exactly what each
/// signed. The rate limiter proves a request's signature to pick its bucket and the
/// route proves it again: with this, one request costs one Ed25519 verification. A hit
/// needs the same signature over the same key, method, target, time and body, so
/// nothing unproven passes; freshness is checked every time.
static PROVEN: std::sync::LazyLock<quick_cache::sync::Cache<[u8; 64], [u8; 32]>> =
    std::sync::LazyLock::new(|| quick_cache::sync::Cache::new(8192));

/// [`AuthHeader::verify`], remembering what it proved.
pub fn verify_signature(
    header: &AuthHeader,
    method: &str,
    target: &str,
    body_hash: &BodyHash,
) -> Result<(), VerifyError> {
    let now = now_u64();
    header.check_freshness(now)?;
    let signature = header.signature.to_bytes();
    let mut signed = blake3::Hasher::new();
    signed.update(header.public_key.as_bytes());
    signed.update(method.as_bytes());
    signed.update(&[0]);
    signed.update(target.as_bytes());
    signed.update(&[0]);
    signed.update(&header.timestamp.to_le_bytes());
    signed.update(&body_hash.0);
    let signed: [u8; 32] = signed.finalize().into();
    if PROVEN.get(&signature) != Some(signed) {
        header.verify(method, target, body_hash, now)?;
        PROVEN.insert(signature, signed);
    }
    super::caller::record(super::caller::ProvenCaller::Key(header.public_key));
    Ok(())
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

#[cfg(test)]
mod tests {
    use homeserver_protocol::Keypair;

    use super::*;

    #[test]
    fn a_remembered_signature_proves_only_what_it_signed() {
        let key = Keypair::random();
        let body = BodyHash::of(b"value");
        let header = AuthHeader::sign(&key, "PUT", "/pub/a", now_u64(), &body);
        assert!(verify_signature(&header, "PUT", "/pub/a", &body).is_ok());
        // Proven once, remembered: the same message passes again...
        assert!(verify_signature(&header, "PUT", "/pub/a", &body).is_ok());
        // ...and the same signature over anything else does not.
        assert!(verify_signature(&header, "PUT", "/pub/b", &body).is_err());
        assert!(verify_signature(&header, "DELETE", "/pub/a", &body).is_err());
        assert!(verify_signature(&header, "PUT", "/pub/a", &BodyHash::of(b"other")).is_err());
        let mut other_key = header.clone();
        other_key.public_key = Keypair::random().public_key();
        assert!(verify_signature(&other_key, "PUT", "/pub/a", &body).is_err());
        let mut other_time = header.clone();
        other_time.timestamp -= 1;
        assert!(verify_signature(&other_time, "PUT", "/pub/a", &body).is_err());
    }
}
