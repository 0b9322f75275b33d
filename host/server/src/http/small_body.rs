//! Reading the small JSON or empty bodies of `POST /signup` and `POST /auth/session`:
//! bounded in size and in time, so a client that sends headers and then nothing (or
//! a byte now and then) cannot hold a connection and its memory.

use std::time::Duration;

use axum::body::{Body, to_bytes};
use bytes::Bytes;
use homeserver_protocol::ErrorCode;

use super::error::ApiError;

/// Largest body these requests may carry.
pub const MAX_SMALL_BODY: usize = 64 * 1024;

/// Reads `body` whole; 413 above [`MAX_SMALL_BODY`], 400 when it is not complete within
/// `deadline`. `what` names the request in the messages.
pub async fn read_small_body(
    body: Body,
    deadline: Duration,
    what: &str,
) -> Result<Bytes, ApiError> {
    match tokio::time::timeout(deadline, to_bytes(body, MAX_SMALL_BODY)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("{what} body is larger than {MAX_SMALL_BODY} bytes"),
        )),
        Err(_) => Err(ApiError::new(
            ErrorCode::BadRequest,
            format!(
                "{what} body was not complete within {} s",
                deadline.as_secs()
            ),
        )),
    }
}
