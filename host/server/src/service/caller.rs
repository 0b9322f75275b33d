//! Who the request being served has proven to be, for the access log: recorded where a
//! signature is verified ([`super::auth::verify`]) or a session token resolved
//! ([`super::sessions::SessionService::resolve`]), and read by the HTTP layer when the
//! request ends. A task-local, so nothing is verified twice to write the log, and the
//! services stay free of HTTP types: outside a request's scope (tools, tests of a
//! service) recording does nothing.

use std::cell::Cell;
use std::future::Future;

use homeserver_protocol::PublicKey;
use tokio::task::futures::TaskLocalFuture;

/// What a request proved about its caller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProvenCaller {
    /// No credentials, or none that were checked and held.
    #[default]
    Anonymous,
    /// A valid signature by this key.
    Key(PublicKey),
    /// A valid session of this key's owner.
    Session(PublicKey),
}

impl ProvenCaller {
    /// `anonymous`, `key` or `session`.
    pub fn kind(&self) -> &'static str {
        match self {
            ProvenCaller::Anonymous => "anonymous",
            ProvenCaller::Key(_) => "key",
            ProvenCaller::Session(_) => "session",
        }
    }

    /// The signing key, or the session owner's.
    pub fn key(&self) -> Option<&PublicKey> {
        match self {
            ProvenCaller::Anonymous => None,
            ProvenCaller::Key(key) | ProvenCaller::Session(key) => Some(key),
        }
    }
}

tokio::task_local! {
    static PROVEN: Cell<ProvenCaller>;
}

/// Runs `request` with a caller slot of its own (read it back with
/// [`TaskLocalFuture::take_value`] once the future is done).
pub fn scope<F: Future>(request: F) -> TaskLocalFuture<Cell<ProvenCaller>, F> {
    PROVEN.scope(Cell::new(ProvenCaller::Anonymous), request)
}

/// Records what the current request proved (the last proof wins: a request proves one
/// identity, possibly more than once).
pub fn record(caller: ProvenCaller) {
    let _ = PROVEN.try_with(|slot| slot.set(caller));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_reads_back_what_it_proved_and_nothing_leaks_outside() {
        let key = homeserver_protocol::Keypair::random().public_key();
        let mut request = std::pin::pin!(scope(async move { record(ProvenCaller::Key(key)) }));
        request.as_mut().await;
        let proven = request.as_mut().take_value().map(Cell::into_inner);
        assert_eq!(proven, Some(ProvenCaller::Key(key)));
        // Outside any request: ignored, no panic.
        record(ProvenCaller::Session(key));
        let mut other = std::pin::pin!(scope(async {}));
        other.as_mut().await;
        assert_eq!(
            other.as_mut().take_value().map(Cell::into_inner),
            Some(ProvenCaller::Anonymous)
        );
    }
}
