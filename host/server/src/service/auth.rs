//! Credentials and signed requests. Signed requests are checked here; each accepted
//! state-changing signature becomes a [`ReplayMark`] that the write's own transaction
//! records, so a replay is refused atomically with the change it would repeat. Which
//! space a request touches and whether it may is `access`'s job.

use homeserver_protocol::{AuthHeader, BodyHash, MAX_CLOCK_SKEW_SECS, PublicKey, VerifyError};

use super::ServiceError;
use crate::persistence::metadata::ReplayMark;

/// Credentials as presented, parsed once per request (by the client API's first layer,
/// which rate limiting, access control and the handlers then all read).
#[derive(Debug, Clone)]
pub enum Credentials {
    None,
    Signed(Box<Signed>),
    /// A session token (`Bearer`).
    Session(String),
}

/// A signed request's `Authorization: Pk` header, with the proof of its signature when
/// it was verified already for this request (the rate limiter proves a bodiless or
/// digest-declaring request up front to pick its bucket): the service's check then
/// costs a hash, not a second Ed25519 verification.
#[derive(Debug, Clone)]
pub struct Signed {
    header: AuthHeader,
    proof: Option<Proof>,
}

impl Signed {
    pub fn new(header: AuthHeader) -> Self {
        Self {
            header,
            proof: None,
        }
    }

    /// Proves the signature over `method`, `target` and `body_hash` now (fresh, and
    /// valid), keeping the proof for this request's later checks.
    pub fn prove(
        &mut self,
        method: &str,
        target: &str,
        body_hash: &BodyHash,
    ) -> Result<(), ServiceError> {
        self.proof = Some(verify_signature(&self.header, method, target, body_hash)?);
        Ok(())
    }

    /// Whether [`Self::prove`] succeeded for this request.
    pub fn is_proven(&self) -> bool {
        self.proof.is_some()
    }
}

impl std::ops::Deref for Signed {
    type Target = AuthHeader;

    fn deref(&self) -> &AuthHeader {
        &self.header
    }
}

/// What a verified signature signed (a digest of key, method, target, time and body),
/// so a later check of the same request can tell it is the same message. Only
/// [`verify_signature`] makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proof([u8; 32]);

impl Proof {
    fn of(header: &AuthHeader, method: &str, target: &str, body_hash: &BodyHash) -> Self {
        let mut signed = blake3::Hasher::new();
        signed.update(header.public_key.as_bytes());
        signed.update(&header.signature.to_bytes());
        signed.update(method.as_bytes());
        signed.update(&[0]);
        signed.update(target.as_bytes());
        signed.update(&[0]);
        signed.update(&header.timestamp.to_le_bytes());
        signed.update(&body_hash.0);
        Self(signed.finalize().into())
    }
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

/// Full check of a signed request whose body hashes to `body_hash`: freshness, then
/// the signature (unless this request's proof shows it was verified for exactly this
/// message already).
pub fn verify(
    signed: &Signed,
    target: &SignedTarget<'_>,
    body_hash: &BodyHash,
) -> Result<(), ServiceError> {
    let proven = signed.proof.is_some_and(|proof| {
        proof == Proof::of(&signed.header, target.method, target.target, body_hash)
    });
    if proven {
        check_fresh(&signed.header)?;
        super::caller::record(super::caller::ProvenCaller::Key(signed.header.public_key));
        return Ok(());
    }
    verify_signature(&signed.header, target.method, target.target, body_hash)?;
    Ok(())
}

/// [`AuthHeader::verify`] (freshness and signature), recording who the request proved
/// to be; the proof of what was verified.
fn verify_signature(
    header: &AuthHeader,
    method: &str,
    target: &str,
    body_hash: &BodyHash,
) -> Result<Proof, ServiceError> {
    header
        .verify(method, target, body_hash, now_u64())
        .map_err(verify_error)?;
    super::caller::record(super::caller::ProvenCaller::Key(header.public_key));
    Ok(Proof::of(header, method, target, body_hash))
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

    fn signed(header: &AuthHeader) -> Signed {
        Signed::new(header.clone())
    }

    fn target<'a>(method: &'a str, target: &'a str) -> SignedTarget<'a> {
        SignedTarget { method, target }
    }

    #[test]
    fn a_proof_covers_only_what_was_signed() {
        let key = Keypair::random();
        let body = BodyHash::of(b"value");
        let header = AuthHeader::sign(&key, "PUT", "/pub/a", now_u64(), &body);
        let mut proven = signed(&header);
        proven.prove("PUT", "/pub/a", &body).unwrap();
        assert!(verify(&proven, &target("PUT", "/pub/a"), &body).is_ok());
        // The proof passes the same message only; anything else is verified afresh,
        // and fails.
        assert!(verify(&proven, &target("PUT", "/pub/b"), &body).is_err());
        assert!(verify(&proven, &target("DELETE", "/pub/a"), &body).is_err());
        assert!(verify(&proven, &target("PUT", "/pub/a"), &BodyHash::of(b"other")).is_err());
        // A proof moved onto another header (key, time or signature) proves nothing.
        for change in [
            |h: &mut AuthHeader| h.public_key = Keypair::random().public_key(),
            |h: &mut AuthHeader| h.timestamp -= 1,
        ] {
            let mut other = proven.clone();
            change(&mut other.header);
            assert!(verify(&other, &target("PUT", "/pub/a"), &body).is_err());
        }
        // Without a proof, the signature itself is checked.
        assert!(verify(&signed(&header), &target("PUT", "/pub/a"), &body).is_ok());
        let forged = AuthHeader::sign(&Keypair::random(), "PUT", "/pub/a", now_u64(), &body);
        let mut forged_signed = signed(&forged);
        forged_signed.header.public_key = key.public_key();
        assert!(forged_signed.prove("PUT", "/pub/a", &body).is_err());
        assert!(verify(&forged_signed, &target("PUT", "/pub/a"), &body).is_err());
    }

    #[test]
    fn a_proof_does_not_outlive_freshness() {
        let key = Keypair::random();
        let body = BodyHash::empty();
        let stale = now_u64() - MAX_CLOCK_SKEW_SECS - 10;
        let header = AuthHeader::sign(&key, "GET", "/pub/a", stale, &body);
        let mut s = signed(&header);
        assert!(s.prove("GET", "/pub/a", &body).is_err());
        s.proof = Some(Proof::of(&header, "GET", "/pub/a", &body));
        assert!(verify(&s, &target("GET", "/pub/a"), &body).is_err());
    }
}
