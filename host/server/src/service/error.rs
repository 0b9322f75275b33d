//! The errors services answer with. They name what went wrong in the API's terms; the
//! route layer maps each to one status and error code (client_server::error).

use crate::persistence::{BlobError, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    InvalidPath(String),
    #[error("{0}")]
    BadRequest(String),
    /// Missing, malformed, stale, forged or replayed credentials.
    #[error("{0}")]
    InvalidSignature(String),
    #[error("session expired")]
    ExpiredSession,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("value is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: u64 },
    #[error("storage quota exceeded: {used} of {quota} bytes used, this write needs {needed} more")]
    QuotaExceeded { used: u64, quota: u64, needed: u64 },
    /// A backing store cannot be reached; the caller may retry.
    #[error("{0}")]
    Unavailable(String),
    /// The server declines the request for now to protect itself (a bounded resource is
    /// in use); the message says what to do, and the caller may retry.
    #[error("{0}")]
    Busy(String),
    /// A bug or an unexpected backend failure; logged, never shown to the caller.
    #[error("{0}")]
    Internal(String),
    /// A metadata store failure, kept whole: unavailable (503) or internal (500).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A blob store failure, kept whole: unavailable (503) or internal (500).
    #[error(transparent)]
    Blob(#[from] BlobError),
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    #[test]
    fn a_store_failure_keeps_its_cause() {
        let store = StoreError::database(sqlx::Error::PoolTimedOut, true);
        assert!(store.is_unavailable());
        let service = ServiceError::from(store);
        // The driver's error is reachable through the chain, typed.
        let mut cause: Option<&(dyn Error + 'static)> = Some(&service);
        let mut found = false;
        while let Some(e) = cause {
            found |= e.downcast_ref::<sqlx::Error>().is_some();
            cause = e.source();
        }
        assert!(found, "{service:?}");
        assert!(service.to_string().contains("pool timed out"), "{service}");
        assert!(!StoreError::database(sqlx::Error::RowNotFound, false).is_unavailable());
    }
}
