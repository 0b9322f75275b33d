//! Access control: resolves a request's credentials (a signed request or a session) and
//! asks the capability-policy guest about every request to a space: owners' included,
//! so an operator's policy can also restrict owners, and the public's (WIT 0.2.0), so
//! it can hide paths from everyone: a public read it denies is 404, as if nothing were
//! there, and a public listing leaves denied entries out. A guest that fails (trap,
//! timeout, memory) never allows: the request gets a 500 (a 503 when no module is
//! loaded at all, or when the policy's calls are all taken by others for
//! `policies.guest_wait_ms`).

use std::sync::Arc;

use homeserver_protocol::{BodyHash, PublicKey, StoragePath};
use homeserver_runtime::{
    AuthorizeRequest, Caller as PolicyCaller, GuestFailure, Method, Operation, PolicyRuntime,
};

use super::ServiceError;
use super::auth::{self, Credentials, ReadAccess, Signed, SignedTarget};
use super::sessions::SessionService;
use super::visibility::PublicFilter;
use crate::persistence::metadata::SessionRecord;

/// Who writes, once access control let them.
#[derive(Debug)]
pub enum Writer<'a> {
    /// A signed request; its signature covers the body and is checked against it.
    Signed {
        header: &'a Signed,
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
        // Every place for a policy call is taken (a guest looping until its deadline,
        // or a burst): fail closed, and say it may pass.
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

    /// Asks the policy (an async call: a guest that loops yields the worker every
    /// millisecond until its deadline); `Some(refusal)` when it denies: 403 with the
    /// policy's reason, or to the public 404 without it.
    async fn decide(
        &self,
        request: AuthorizeRequest,
    ) -> Result<Option<ServiceError>, ServiceError> {
        let decision = self
            .policy
            .authorize_isolated(&request)
            .await
            .map_err(guest_failed)?;
        Ok((!decision.allow).then(|| {
            if request.caller == PolicyCaller::Public {
                ServiceError::NotFound(format!("no entry at {}", request.path))
            } else {
                ServiceError::Forbidden(if decision.reason.is_empty() {
                    "denied by the capability policy".to_owned()
                } else {
                    decision.reason
                })
            }
        }))
    }

    /// The policy's public answers as a [`PublicFilter`], for the services that page
    /// through paths (public listings and event streams).
    pub fn public_filter(&self) -> PublicFilter {
        let access = self.clone();
        let policy = self.policy.clone();
        PublicFilter::new(
            Arc::new(move |items: Vec<(String, String)>| {
                let access = access.clone();
                Box::pin(async move {
                    access
                        .public_can_read(items.iter().map(|(u, p)| (u.as_str(), p.as_str())))
                        .await
                })
            }),
            Arc::new(move || policy.public_answers_generation()),
        )
    }

    /// Whether the public may read each `(user, path)`, asked as a GET (a listing when
    /// the path ends in `/`), in one call's place for those not answered before.
    /// Events name paths, so feeds and streams ask this too.
    pub async fn public_can_read<'p>(
        &self,
        items: impl Iterator<Item = (&'p str, &'p str)>,
    ) -> Result<Vec<bool>, ServiceError> {
        let requests: Vec<AuthorizeRequest> = items
            .map(|(user, path)| {
                let mut req = AuthorizeRequest::new(
                    Operation::Read,
                    path,
                    PolicyCaller::Public,
                    user.to_owned(),
                );
                req.method = Some(Method::Get);
                req
            })
            .collect();
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let decisions = self
            .policy
            .authorize_many_isolated(requests)
            .await
            .map_err(guest_failed)?;
        Ok(decisions.into_iter().map(|d| d.allow).collect())
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

    /// A read (GET, HEAD, listing) of `path`; `head` for HEAD.
    pub async fn read(
        &self,
        credentials: &Credentials,
        host: Option<&PublicKey>,
        target: &SignedTarget<'_>,
        path: &StoragePath,
        head: bool,
    ) -> Result<ReadAccess, ServiceError> {
        let question = |caller: PolicyCaller, space: &PublicKey| {
            let mut req =
                AuthorizeRequest::new(Operation::Read, path.to_string(), caller, space.to_z32());
            req.method = Some(if head { Method::Head } else { Method::Get });
            req.listing = Some(path.is_listing());
            req
        };
        let (space, caller) = match credentials {
            Credentials::Session(token) => match self.sessions.resolve(token).await {
                Ok(session) => {
                    let space: PublicKey = session
                        .user
                        .parse()
                        .map_err(|e| ServiceError::Internal(format!("session user: {e}")))?;
                    match host {
                        // Naming another user: a public read, the session is not used.
                        Some(h) if h != &space => return self.public(*h, path, question).await,
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
                Some(host) if host != &h.public_key => {
                    return self.public(*host, path, question).await;
                }
                _ => {
                    auth::verify(h, target, &BodyHash::empty())?;
                    (h.public_key, PolicyCaller::Owner)
                }
            },
            Credentials::None => match host {
                Some(h) => return self.public(*h, path, question).await,
                None => return Err(auth::missing_credentials()),
            },
        };
        if path.is_private() {
            return Err(auth::private_reserved());
        }
        if let Some(refusal) = self.decide(question(caller, &space)).await? {
            return Err(refusal);
        }
        Ok(ReadAccess::Owner(space))
    }

    /// A read by the public of `host`'s space.
    async fn public(
        &self,
        host: PublicKey,
        path: &StoragePath,
        question: impl FnOnce(PolicyCaller, &PublicKey) -> AuthorizeRequest,
    ) -> Result<ReadAccess, ServiceError> {
        if path.is_private() {
            return Err(auth::private_reserved());
        }
        match self.decide(question(PolicyCaller::Public, &host)).await? {
            Some(_) if path.is_listing() => Ok(ReadAccess::PublicHiddenListing(host)),
            Some(refusal) => Err(refusal),
            None => Ok(ReadAccess::Public(host)),
        }
    }

    /// A write of `path`, only in the writer's own space: a PUT declaring `size` bytes
    /// (when it declares a length), or a DELETE (`size` is then `None`).
    pub async fn write<'a>(
        &self,
        credentials: &'a Credentials,
        host: Option<&PublicKey>,
        target: SignedTarget<'a>,
        path: &StoragePath,
        method: WriteMethod,
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
            let mut req =
                AuthorizeRequest::new(Operation::Write, path.to_string(), caller, space.to_z32());
            (req.method, req.size) = match method {
                WriteMethod::Put { size } => (Some(Method::Put), size),
                WriteMethod::Delete => (Some(Method::Delete), None),
            };
            req.listing = Some(false);
            self.decide(req).await?
        };
        Ok(WriteGrant { writer, refusal })
    }
}

/// What a write does, for the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMethod {
    /// A PUT; `size` is its declared `Content-Length`, when it has one.
    Put {
        size: Option<u64>,
    },
    Delete,
}
