//! Signup: a signed `POST /signup` registers the signer. In `token` mode a signup token
//! is redeemed in the same transaction that creates the user, so two racing signups with
//! one token cannot both win.

use std::sync::Arc;

use homeserver_protocol::BodyHash;
use homeserver_protocol::wire::{SignupResult, SignupTokenStatus, normalize_signup_token};

use super::admin::iso8601;
use super::auth::{self, Signed, SignedTarget};
use super::{ServiceError, now_secs};
use crate::config::SignupMode;
use crate::persistence::metadata::SignupOutcome;
use crate::persistence::{MetadataStore, MetadataWrites};

#[derive(Clone)]
pub struct SignupService {
    metadata: Arc<dyn MetadataStore>,
    mode: SignupMode,
}

/// Whether a signup created the user or found it already there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signup {
    pub result: SignupResult,
    pub created: bool,
}

impl SignupService {
    pub fn new(metadata: Arc<dyn MetadataStore>, mode: SignupMode) -> Self {
        Self { metadata, mode }
    }

    /// The public token check: 400 for a malformed token or in open mode, 404 unknown.
    pub async fn token_status(&self, token: &str) -> Result<SignupTokenStatus, ServiceError> {
        if self.mode == SignupMode::Open {
            return Err(ServiceError::BadRequest(
                "this homeserver does not use signup tokens (signup is open)".into(),
            ));
        }
        let Some(token) = normalize_signup_token(token) else {
            return Err(ServiceError::BadRequest(
                "malformed signup token: expected XXXX-XXXX-XXXX".into(),
            ));
        };
        let record = self
            .metadata
            .signup_token(&token)
            .await?
            .ok_or_else(|| ServiceError::NotFound("unknown signup token".into()))?;
        Ok(SignupTokenStatus {
            status: if record.used { "used" } else { "valid" }.into(),
            created_at: iso8601(record.created_at),
        })
    }

    pub async fn sign_up(
        &self,
        header: &Signed,
        target: &SignedTarget<'_>,
        body_hash: &BodyHash,
        token: Option<&str>,
    ) -> Result<Signup, ServiceError> {
        auth::verify(header, target, body_hash)?;
        let token = match self.mode {
            SignupMode::Open => None,
            SignupMode::Token => match token {
                None => {
                    return Err(ServiceError::Forbidden(
                        "this homeserver requires a signup token (?signup_token=...)".into(),
                    ));
                }
                Some(t) => match normalize_signup_token(t) {
                    Some(t) => Some(t),
                    None => {
                        return Err(ServiceError::BadRequest(
                            "malformed signup token: expected XXXX-XXXX-XXXX".into(),
                        ));
                    }
                },
            },
        };
        let token = token.as_deref();
        let public_key = header.public_key.to_z32();
        let outcome = self
            .metadata
            .sign_up(&public_key, token, now_secs(), auth::replay_mark(header))
            .await?;
        let (created_at, created) = match outcome {
            SignupOutcome::Created { created_at } => (created_at, true),
            SignupOutcome::AlreadyExists { created_at } => (created_at, false),
            SignupOutcome::Replayed => return Err(auth::replayed()),
            SignupOutcome::TokenUnknown => {
                return Err(ServiceError::Forbidden("unknown signup token".into()));
            }
            SignupOutcome::TokenUsed => {
                return Err(ServiceError::Forbidden("signup token already used".into()));
            }
        };
        Ok(Signup {
            result: SignupResult {
                public_key,
                created_at,
            },
            created,
        })
    }
}
