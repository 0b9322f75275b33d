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
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(m) => ServiceError::Unavailable(m),
            StoreError::Internal(m) => ServiceError::Internal(m),
        }
    }
}

impl From<BlobError> for ServiceError {
    fn from(e: BlobError) -> Self {
        match e {
            BlobError::Unavailable(m) => ServiceError::Unavailable(m),
            other => ServiceError::Internal(other.to_string()),
        }
    }
}
