//! Access control: resolves a request's credentials (a signed request or a session) and
//! asks the capability-policy guest about every authorized request, owners' included, so
//! an operator's policy can also restrict owners. A guest that fails (trap, timeout,
//! memory) never allows: the request gets a 500 (a 503 when no module is loaded at all).

use std::sync::Arc;

use homeserver_protocol::{AuthHeader, BodyHash, PublicKey, StoragePath};
use homeserver_runtime::{
    AuthorizeRequest, Caller as PolicyCaller, GuestFailure, Operation, PolicyRuntime,
};

use super::ServiceError;
use super::auth::{self, Credentials, ReadAccess, SignedTarget};
use super::sessions::SessionService;
use crate::persistence::metadata::SessionRecord;

/// Who writes, once access control let them.
#[derive(Debug)]
pub enum Writer<'a> {
    /// A signed request; its signature covers the body and is checked against it.
    Signed {
        header: &'a AuthHeader,
        target: SignedTarget<'a>,
    },
    /// A session the policy allowed.
    Session(SessionRecord),
}

impl Writer<'_> {
    /// z-base-32 key of the space written to.
    pub fn user(&self) -> String {
        match self {
            Writer::Signed { header, .. } => header.public_key.to_z32(),
            Writer::Session(s) => s.user.clone(),
        }
    }
}

/// A write that passed credentials, possibly with a refusal still to be answered (for a
/// signed PUT the refusal waits until the body proved the signature: 401 comes first).
#[derive(Debug)]
pub struct WriteGrant<'a> {
    pub writer: Writer<'a>,
    pub refusal: Option<ServiceError>,
}

#[derive(Clone)]
pub struct AccessControl {
    sessions: SessionService,
    policy: Arc<PolicyRuntime>,
}

fn guest_failed(e: GuestFailure) -> ServiceError {
    match e {
        // No module serves the slot (it failed to load and the operator chose to start
        // anyway): the server cannot decide until it is fixed, which is not the client's
        // fault nor a bug: 503, and the log says why.
        GuestFailure::Unavailable { reason, .. } => {
            tracing::error!(%reason, "no capability policy is loaded: answering 503");
            ServiceError::Busy(
                "the server's capability policy is not loaded, so it cannot decide this \
                 request; the operator must fix it (see GET /admin/policies); retry later"
                    .into(),
            )
        }
        // Every guest thread is busy (a guest looping until its deadline, or a burst):
        // fail closed, and say it may pass.
        GuestFailure::Busy { reason, .. } => {
            tracing::warn!(%reason, "capability policy busy: answering 503");
            ServiceError::Busy(
                "the server's capability policy is busy and could not decide this request \
                 in time; retry later"
                    .into(),
            )
        }
        other => ServiceError::Internal(format!("capability policy guest failed: {other}")),
    }
}

impl AccessControl {
    pub fn new(sessions: SessionService, policy: Arc<PolicyRuntime>) -> Self {
        Self { sessions, policy }
    }

    pub fn sessions(&self) -> &SessionService {
        &self.sessions
    }

    pub fn policy(&self) -> &Arc<PolicyRuntime> {
        &self.policy
    }

    /// Asks the policy (off the async workers: a guest that loops holds a guest thread
    /// until its deadline, never a worker); `Some(refusal)` when it denies.
    async fn decide(
        &self,
        operation: Operation,
        path: &StoragePath,
        caller: PolicyCaller,
        user: String,
    ) -> Result<Option<ServiceError>, ServiceError> {
        let decision = self
            .policy
            .authorize_isolated(AuthorizeRequest {
                operation,
                path: path.to_string(),
                caller,
                user,
            })
            .await
            .map_err(guest_failed)?;
        Ok((!decision.allow).then(|| {
            ServiceError::Forbidden(if decision.reason.is_empty() {
                "denied by the capability policy".to_owned()
            } else {
                decision.reason
            })
        }))
    }

    /// Whose account a request about the caller's account (`GET /account`) names: the
    /// signer of a valid signed request (bodiless), or the owner of a valid session (any
    /// capabilities: the account's usage is not data under a path). No path is involved,
    /// so the capability policy is not asked.
    pub async fn account_holder(
        &self,
        credentials: &Credentials,
        target: &SignedTarget<'_>,
    ) -> Result<PublicKey, ServiceError> {
        match credentials {
            Credentials::Signed(h) => {
                auth::verify(h, target, &BodyHash::empty())?;
                Ok(h.public_key)
            }
            Credentials::Session(token) => {
                let session = self.sessions.resolve(token).await?;
                session
                    .user
                    .parse()
                    .map_err(|e| ServiceError::Internal(format!("session user: {e}")))
            }
            Credentials::None => Err(ServiceError::InvalidSignature(
                "missing credentials: sign the request (Authorization: Pk ...) or use a \
                 session (Authorization: Bearer ...)"
                    .into(),
            )),
        }
    }

    /// A read (GET, HEAD, listing) of `path`.
    pub async fn read(
        &self,
        credentials: &Credentials,
        host: Option<&PublicKey>,
        target: &SignedTarget<'_>,
        path: &StoragePath,
    ) -> Result<ReadAccess, ServiceError> {
        let (space, caller) = match credentials {
            Credentials::Session(token) => match self.sessions.resolve(token).await {
                Ok(session) => {
                    let space: PublicKey = session
                        .user
                        .parse()
                        .map_err(|e| ServiceError::Internal(format!("session user: {e}")))?;
                    match host {
                        // Naming another user: a public read, the session is not used.
                        Some(h) if h != &space => return public(*h, path),
                        _ => (
                            space,
                            PolicyCaller::Session {
                                capabilities: session.capabilities,
                            },
                        ),
                    }
                }
                // Credentials that are present are checked: a failed token is an
                // error even on a read that names a host.
                Err(e) => return Err(e),
            },
            Credentials::Signed(h) => match host {
                Some(host) if host != &h.public_key => return public(*host, path),
                _ => {
                    auth::verify(h, target, &BodyHash::empty())?;
                    (h.public_key, PolicyCaller::Owner)
                }
            },
            Credentials::None => match host {
                Some(h) => return public(*h, path),
                None => return Err(auth::missing_credentials()),
            },
        };
        if path.is_private() {
            return Err(auth::private_reserved());
        }
        if let Some(refusal) = self
            .decide(Operation::Read, path, caller, space.to_z32())
            .await?
        {
            return Err(refusal);
        }
        Ok(ReadAccess::Owner(space))
    }

    /// A write (PUT, DELETE) of `path`: only in the writer's own space.
    pub async fn write<'a>(
        &self,
        credentials: &'a Credentials,
        host: Option<&PublicKey>,
        target: SignedTarget<'a>,
        path: &StoragePath,
    ) -> Result<WriteGrant<'a>, ServiceError> {
        let (writer, caller, space) = match credentials {
            Credentials::Signed(header) => {
                auth::check_fresh(header)?;
                let space = header.public_key;
                (
                    Writer::Signed { header, target },
                    PolicyCaller::Owner,
                    space,
                )
            }
            Credentials::Session(token) => {
                let session = self.sessions.resolve(token).await?;
                let space: PublicKey = session
                    .user
                    .parse()
                    .map_err(|e| ServiceError::Internal(format!("session user: {e}")))?;
                let caller = PolicyCaller::Session {
                    capabilities: session.capabilities.clone(),
                };
                (Writer::Session(session), caller, space)
            }
            Credentials::None => {
                return Err(ServiceError::InvalidSignature(
                    "missing credentials: writes must be signed (Authorization: Pk ...) or \
                     use a session (Authorization: Bearer ...)"
                        .into(),
                ));
            }
        };
        let refusal = if host.is_some_and(|h| h != &space) {
            Some(ServiceError::Forbidden(
                "cannot write to another user's space".into(),
            ))
        } else if path.is_private() {
            Some(auth::private_reserved())
        } else {
            self.decide(Operation::Write, path, caller, space.to_z32())
                .await?
        };
        Ok(WriteGrant { writer, refusal })
    }
}

fn public(host: PublicKey, path: &StoragePath) -> Result<ReadAccess, ServiceError> {
    if path.is_private() {
        return Err(auth::private_reserved());
    }
    Ok(ReadAccess::Public(host))
}
