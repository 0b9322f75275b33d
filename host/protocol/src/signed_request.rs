//! Signed requests: `Authorization: Pk <z32 key>:<signature>:<timestamp>`.
//!
//! The signed message is `METHOD:PATH:TIMESTAMP:BODY_HASH` where METHOD is upper case,
//! PATH is the request target exactly as sent (path plus `?query`), TIMESTAMP is decimal
//! Unix seconds and BODY_HASH is the lower-case hex SHA-256 of the body (of the empty
//! string when there is none). The signature is standard base64 (padded) of the 64-byte
//! Ed25519 signature, verified strictly. Replay protection is the server's job: this
//! module only says whether a header is authentic and fresh.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::Signature;
use sha2::{Digest, Sha256};

use crate::keys::{Keypair, PublicKey, PublicKeyError};

/// Largest accepted difference between the signer's clock and the verifier's, either way.
pub const MAX_CLOCK_SKEW_SECS: u64 = 300;

/// The authorization scheme word.
pub const SCHEME: &str = "Pk";

/// SHA-256 of a request body.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BodyHash(pub [u8; 32]);

impl BodyHash {
    pub fn of(body: &[u8]) -> Self {
        Self(Sha256::digest(body).into())
    }

    /// The hash of the empty body (GET, HEAD, DELETE).
    pub fn empty() -> Self {
        Self::of(b"")
    }

    /// Finishes an incremental hash of a streamed body.
    pub fn from_hasher(hasher: Sha256) -> Self {
        Self(hasher.finalize().into())
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The `Content-Digest` value (RFC 9530) declaring a body with this hash:
    /// `sha-256=:<standard base64>:`.
    pub fn to_content_digest(&self) -> String {
        format!("sha-256=:{}:", STANDARD.encode(self.0))
    }

    /// The SHA-256 a `Content-Digest` value declares. Other algorithms in the same field
    /// are ignored; a field without `sha-256` is an error, as is one that is not a
    /// structured-field dictionary or whose `sha-256` is not 32 bytes.
    pub fn from_content_digest(value: &str) -> Result<Self, ContentDigestError> {
        let dictionary: sfv::Dictionary = sfv::Parser::new(value)
            .parse()
            .map_err(|e| ContentDigestError::Malformed(e.to_string()))?;
        let entry = dictionary
            .iter()
            .find(|(key, _)| key.as_str() == "sha-256")
            .map(|(_, entry)| entry)
            .ok_or(ContentDigestError::NoSha256)?;
        let bytes = match entry {
            sfv::ListEntry::Item(item) => item.bare_item.as_byte_sequence(),
            sfv::ListEntry::InnerList(_) => None,
        }
        .ok_or(ContentDigestError::NotBytes)?;
        let hash: [u8; 32] = <[u8; 32]>::try_from(bytes)
            .map_err(|_| ContentDigestError::WrongLength(bytes.len()))?;
        Ok(Self(hash))
    }
}

/// The header in which a client may declare its body's SHA-256 before sending the body,
/// so the server checks the signature first (RFC 9530).
pub const CONTENT_DIGEST_HEADER: &str = "content-digest";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContentDigestError {
    #[error("Content-Digest is not a structured-field dictionary: {0}")]
    Malformed(String),
    #[error("Content-Digest has no sha-256 member")]
    NoSha256,
    #[error("Content-Digest's sha-256 is not a byte sequence (:base64:)")]
    NotBytes,
    #[error("Content-Digest's sha-256 has {0} bytes; a SHA-256 has 32")]
    WrongLength(usize),
}

impl fmt::Debug for BodyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BodyHash({})", self.to_hex())
    }
}

/// The exact bytes that are signed.
pub fn signed_message(method: &str, target: &str, timestamp: u64, body_hash: &BodyHash) -> String {
    format!(
        "{}:{}:{}:{}",
        method.to_ascii_uppercase(),
        target,
        timestamp,
        body_hash.to_hex()
    )
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthHeaderError {
    #[error("authorization scheme must be `Pk` or `Bearer`")]
    Scheme,
    #[error("`Pk` credentials must be `<public key>:<signature>:<timestamp>`")]
    Shape,
    #[error("invalid public key in authorization: {0}")]
    PublicKey(#[from] PublicKeyError),
    #[error("signature must be standard base64 of 64 bytes")]
    Signature,
    #[error("timestamp must be decimal Unix seconds")]
    Timestamp,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    #[error(
        "request timestamp is {skew} s away from the server's clock (at most {MAX_CLOCK_SKEW_SECS} s allowed)"
    )]
    ClockSkew { skew: u64 },
    #[error("signature does not match the request")]
    BadSignature,
}

/// A parsed `Pk` authorization header.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthHeader {
    pub public_key: PublicKey,
    pub signature: Signature,
    pub timestamp: u64,
}

impl AuthHeader {
    /// Signs a request. `target` is the path plus `?query` exactly as it will be sent.
    pub fn sign(
        keypair: &Keypair,
        method: &str,
        target: &str,
        timestamp: u64,
        body_hash: &BodyHash,
    ) -> Self {
        let message = signed_message(method, target, timestamp, body_hash);
        Self {
            public_key: keypair.public_key(),
            signature: keypair.sign(message.as_bytes()),
            timestamp,
        }
    }

    /// Parses the full header value, scheme included (`Pk key:sig:ts`).
    pub fn parse(value: &str) -> Result<Self, AuthHeaderError> {
        let credentials = value
            .strip_prefix(SCHEME)
            .and_then(|rest| rest.strip_prefix(' '))
            .ok_or(AuthHeaderError::Scheme)?;
        Self::parse_credentials(credentials.trim())
    }

    /// Parses the part after the scheme word.
    pub fn parse_credentials(credentials: &str) -> Result<Self, AuthHeaderError> {
        let mut parts = credentials.split(':');
        let (Some(key), Some(sig), Some(ts), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(AuthHeaderError::Shape);
        };
        let public_key: PublicKey = key.parse()?;
        let sig_bytes = STANDARD
            .decode(sig)
            .map_err(|_| AuthHeaderError::Signature)?;
        let sig_bytes: [u8; 64] = sig_bytes
            .try_into()
            .map_err(|_| AuthHeaderError::Signature)?;
        if ts.is_empty() || !ts.bytes().all(|b| b.is_ascii_digit()) {
            return Err(AuthHeaderError::Timestamp);
        }
        let timestamp = ts.parse().map_err(|_| AuthHeaderError::Timestamp)?;
        Ok(Self {
            public_key,
            signature: Signature::from_bytes(&sig_bytes),
            timestamp,
        })
    }

    /// The full header value, scheme included.
    pub fn to_header_value(&self) -> String {
        format!(
            "{SCHEME} {}:{}:{}",
            self.public_key,
            STANDARD.encode(self.signature.to_bytes()),
            self.timestamp
        )
    }

    /// Checks the timestamp against `now` (Unix seconds). Cheap: do it before reading a body.
    pub fn check_freshness(&self, now: u64) -> Result<(), VerifyError> {
        let skew = now.abs_diff(self.timestamp);
        if skew > MAX_CLOCK_SKEW_SECS {
            return Err(VerifyError::ClockSkew { skew });
        }
        Ok(())
    }

    /// Full verification: freshness, then a strict signature check over the request.
    pub fn verify(
        &self,
        method: &str,
        target: &str,
        body_hash: &BodyHash,
        now: u64,
    ) -> Result<(), VerifyError> {
        self.check_freshness(now)?;
        let message = signed_message(method, target, self.timestamp, body_hash);
        if self
            .public_key
            .verify_strict(message.as_bytes(), &self.signature)
        {
            Ok(())
        } else {
            Err(VerifyError::BadSignature)
        }
    }

    /// A stable identifier of this signature, for replay bookkeeping.
    pub fn replay_id(&self) -> [u8; 32] {
        Sha256::digest(self.signature.to_bytes()).into()
    }
}

impl fmt::Debug for AuthHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthHeader")
            .field("public_key", &self.public_key)
            .field("timestamp", &self.timestamp)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn content_digest_round_trips_and_refuses_what_is_not_a_sha256() {
        let hash = BodyHash::of(b"hello");
        let value = hash.to_content_digest();
        assert_eq!(
            value,
            "sha-256=:LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=:"
        );
        assert_eq!(BodyHash::from_content_digest(&value), Ok(hash));
        // Other algorithms beside it are ignored (RFC 9530 allows several).
        let both = format!("sha-512=:AAAA:, {value}");
        assert_eq!(BodyHash::from_content_digest(&both), Ok(hash));
        assert_eq!(
            BodyHash::from_content_digest("sha-512=:AAAA:"),
            Err(ContentDigestError::NoSha256)
        );
        assert_eq!(
            BodyHash::from_content_digest("sha-256=:AAAA:"),
            Err(ContentDigestError::WrongLength(3))
        );
        assert_eq!(
            BodyHash::from_content_digest("sha-256=abc"),
            Err(ContentDigestError::NotBytes)
        );
        assert!(matches!(
            BodyHash::from_content_digest("sha-256=:not base64"),
            Err(ContentDigestError::Malformed(_))
        ));
    }

    use super::*;

    const NOW: u64 = 1_700_000_000;

    fn keypair() -> Keypair {
        Keypair::from_seed(&[42; 32])
    }

    fn signed(method: &str, target: &str, body: &[u8]) -> AuthHeader {
        AuthHeader::sign(&keypair(), method, target, NOW, &BodyHash::of(body))
    }

    #[test]
    fn round_trip_verifies() {
        let header = signed("PUT", "/pub/a.txt", b"hello");
        let parsed = AuthHeader::parse(&header.to_header_value()).unwrap();
        assert_eq!(parsed, header);
        parsed
            .verify("PUT", "/pub/a.txt", &BodyHash::of(b"hello"), NOW)
            .unwrap();
    }

    #[test]
    fn tampering_is_detected() {
        let header = signed("PUT", "/pub/a.txt?x=1", b"hello");
        let ok = |m: &str, t: &str, b: &[u8]| header.verify(m, t, &BodyHash::of(b), NOW);
        assert_eq!(
            ok("PUT", "/pub/a.txt?x=1", b"hellO"),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            ok("PUT", "/pub/b.txt?x=1", b"hello"),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            ok("PUT", "/pub/a.txt?x=2", b"hello"),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            ok("PUT", "/pub/a.txt", b"hello"),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            ok("POST", "/pub/a.txt?x=1", b"hello"),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(ok("PUT", "/pub/a.txt?x=1", b"hello"), Ok(()));
    }

    #[test]
    fn other_key_fails() {
        let mut header = signed("GET", "/pub/", b"");
        header.public_key = Keypair::from_seed(&[1; 32]).public_key();
        assert_eq!(
            header.verify("GET", "/pub/", &BodyHash::empty(), NOW),
            Err(VerifyError::BadSignature)
        );
    }

    #[test]
    fn clock_skew_limits() {
        let header = signed("GET", "/pub/", b"");
        let body = BodyHash::empty();
        assert!(header.verify("GET", "/pub/", &body, NOW + 300).is_ok());
        assert!(header.verify("GET", "/pub/", &body, NOW - 300).is_ok());
        assert_eq!(
            header.verify("GET", "/pub/", &body, NOW + 301),
            Err(VerifyError::ClockSkew { skew: 301 })
        );
        assert_eq!(
            header.verify("GET", "/pub/", &body, NOW - 301),
            Err(VerifyError::ClockSkew { skew: 301 })
        );
    }

    #[test]
    fn malformed_headers() {
        let good = signed("GET", "/pub/", b"").to_header_value();
        let key = keypair().public_key().to_z32();
        let sig = good.split(':').nth(1).unwrap().to_string();
        let cases: Vec<(String, AuthHeaderError)> = vec![
            ("Basic abc".into(), AuthHeaderError::Scheme),
            ("pk x".into(), AuthHeaderError::Scheme),
            ("Pk".into(), AuthHeaderError::Scheme),
            (format!("Pk {key}:{sig}"), AuthHeaderError::Shape),
            (format!("Pk {key}:{sig}:1:2"), AuthHeaderError::Shape),
            (
                format!("Pk abc:{sig}:1"),
                AuthHeaderError::PublicKey(PublicKeyError::Length(3)),
            ),
            (format!("Pk {key}:!!!:1"), AuthHeaderError::Signature),
            (format!("Pk {key}:AAAA:1"), AuthHeaderError::Signature),
            (format!("Pk {key}:{sig}:-1"), AuthHeaderError::Timestamp),
            (format!("Pk {key}:{sig}:"), AuthHeaderError::Timestamp),
            (format!("Pk {key}:{sig}:1.5"), AuthHeaderError::Timestamp),
            (
                format!("Pk {key}:{sig}:99999999999999999999999"),
                AuthHeaderError::Timestamp,
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(AuthHeader::parse(&value), Err(expected), "{value}");
        }
    }

    #[test]
    fn empty_body_hash_is_sha256_of_nothing() {
        assert_eq!(
            BodyHash::empty().to_hex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn method_is_upper_cased() {
        assert!(signed_message("put", "/p", 1, &BodyHash::empty()).starts_with("PUT:/p:1:"));
    }
}
