//! Users' pkarr records: a user hands the homeserver their signed `_pubky` record
//! (`PUT /pkarr`), so that the server can republish it on the DHT while the user's own
//! devices are offline (`pkarr_publish`). The record must be signed by the requesting
//! user; only a newer one replaces what is stored.

use std::sync::Arc;

use homeserver_protocol::BodyHash;

use super::ServiceError;
use super::auth::{self, Signed, SignedTarget};
use crate::persistence::{MetadataStore, MetadataWrites};
use crate::service::pkarr_publish;

/// The largest record pkarr carries as a relay payload: a 64-byte signature, an 8-byte
/// timestamp and at most 1000 bytes of DNS packet (BEP 44's limit on a value).
pub const MAX_PACKET_BYTES: usize = 64 + 8 + 1000;

#[derive(Clone)]
pub struct IdentityService {
    metadata: Arc<dyn MetadataStore>,
    publisher: Arc<pkarr_publish::PkarrBoard>,
}

impl IdentityService {
    pub fn new(
        metadata: Arc<dyn MetadataStore>,
        publisher: Arc<pkarr_publish::PkarrBoard>,
    ) -> Self {
        Self {
            metadata,
            publisher,
        }
    }

    /// Stores the signer's record (`body`: pkarr's relay payload). Returns whether it
    /// replaced the stored one (false: the stored one is as new or newer).
    pub async fn store_packet(
        &self,
        header: &Signed,
        target: &SignedTarget<'_>,
        body: &[u8],
    ) -> Result<bool, ServiceError> {
        auth::verify(header, target, &BodyHash::of(body))?;
        if !self
            .metadata
            .mark_signature(auth::replay_mark(header))
            .await?
        {
            return Err(auth::replayed());
        }
        let user = header.public_key.to_z32();
        match self.metadata.user(&user).await? {
            None => {
                return Err(ServiceError::Forbidden(
                    "sign up first: this homeserver keeps records of its users only".into(),
                ));
            }
            Some(u) if u.disabled => {
                return Err(ServiceError::Forbidden("this account is disabled".into()));
            }
            Some(_) => {}
        }
        if body.len() > MAX_PACKET_BYTES {
            return Err(ServiceError::PayloadTooLarge {
                limit: MAX_PACKET_BYTES as u64,
            });
        }
        let key = pkarr::PublicKey::try_from(header.public_key.as_bytes())
            .map_err(|e| ServiceError::Internal(e.to_string()))?;
        let packet = pkarr_publish::user_packet(&key, body).map_err(ServiceError::BadRequest)?;
        let timestamp = i64::try_from(packet.timestamp().as_u64()).unwrap_or(i64::MAX);
        let stored = self
            .metadata
            .put_pkarr_packet(&user, timestamp, body)
            .await?;
        if stored {
            // On the DHT soon, not at the next interval.
            self.publisher.handed_in(user, body.to_vec());
        }
        Ok(stored)
    }
}
