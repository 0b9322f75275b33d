//! TLS to a homeserver named by its public key (RFC 7250 raw public keys).
//!
//! A homeserver's TLS listener presents no certificate, only its Ed25519 public key. A
//! client that knows which key to expect (from `pk --homeserver <z32>`, or the user's
//! pkarr record) accepts the connection only when the key presented is that one, and
//! says so plainly when it is not. The TLS 1.3 signature over the handshake proves the
//! server holds the key's secret (rustls' raw-key signature check); nothing here
//! depends on DNS or a CA.

use std::sync::Arc;

use homeserver_protocol::PublicKey;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls13_signature_with_raw_key};
use rustls::pki_types::{CertificateDer, ServerName, SubjectPublicKeyInfoDer, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

/// The DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410): the 32 key bytes follow.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// The public key inside an Ed25519 SubjectPublicKeyInfo, if it is one.
pub fn ed25519_key_of_spki(spki: &[u8]) -> Option<PublicKey> {
    let key: &[u8; 32] = spki.strip_prefix(&ED25519_SPKI_PREFIX)?.try_into().ok()?;
    PublicKey::from_bytes(key).ok()
}

/// A client config that accepts exactly the server whose key is `expected`.
pub fn pinned_key_config(expected: PublicKey) -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map(|b| {
            b.dangerous()
                .with_custom_certificate_verifier(Arc::new(PinnedServerKey {
                    expected,
                    algorithms: rustls::crypto::ring::default_provider()
                        .signature_verification_algorithms,
                }))
                .with_no_client_auth()
        })
        // ring supports TLS 1.3: this cannot fail.
        .unwrap_or_else(|e| unreachable!("ring lacks TLS 1.3: {e}"));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

/// Accepts the server's raw public key when it is the expected one.
#[derive(Debug)]
pub struct PinnedServerKey {
    expected: PublicKey,
    algorithms: WebPkiSupportedAlgorithms,
}

/// Why a server's key was refused, as rustls reports it to the caller (rustls prints
/// this error with `Debug`, so `Debug` says the same as `Display`).
#[derive(thiserror::Error)]
pub enum ServerKeyMismatch {
    #[error(
        "the server presented key {found}, but {expected} was expected: it is not that homeserver"
    )]
    OtherKey {
        expected: PublicKey,
        found: PublicKey,
    },
    #[error("the server presented a key that is not Ed25519; {expected} was expected")]
    NotEd25519 { expected: PublicKey },
}

impl std::fmt::Debug for ServerKeyMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl ServerCertVerifier for PinnedServerKey {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let refuse = |e: ServerKeyMismatch| {
            rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(
                Arc::new(e),
            )))
        };
        match ed25519_key_of_spki(end_entity.as_ref()) {
            Some(found) if found == self.expected => Ok(ServerCertVerified::assertion()),
            Some(found) => Err(refuse(ServerKeyMismatch::OtherKey {
                expected: self.expected,
                found,
            })),
            None => Err(refuse(ServerKeyMismatch::NotEd25519 {
                expected: self.expected,
            })),
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General(
            "raw public keys are used with TLS 1.3 only".into(),
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature_with_raw_key(
            message,
            &SubjectPublicKeyInfoDer::from(cert.as_ref()),
            dss,
            &self.algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }

    fn requires_raw_public_keys(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use homeserver_protocol::Keypair;

    #[test]
    fn the_key_is_read_from_an_ed25519_spki() {
        let key = Keypair::from_seed(&[9; 32]).public_key();
        let mut spki = ED25519_SPKI_PREFIX.to_vec();
        spki.extend_from_slice(key.as_bytes());
        assert_eq!(ed25519_key_of_spki(&spki), Some(key));
        assert_eq!(ed25519_key_of_spki(&spki[1..]), None);
        spki.push(0);
        assert_eq!(ed25519_key_of_spki(&spki), None);
    }
}
