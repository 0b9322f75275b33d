//! The one place service errors become HTTP responses: status, error code and the JSON
//! body `{"error", "message", "details"}`. Internal causes are logged, never sent.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use homeserver_protocol::{ErrorBody, ErrorCode};
use serde_json::json;

use crate::service::ServiceError;

/// 503: logged as a warning with its cause (the request span names the request).
fn unavailable(cause: &dyn std::fmt::Display) -> ErrorBody {
    tracing::warn!(%cause, "backing store unavailable");
    ErrorBody::new(
        ErrorCode::ServiceUnavailable,
        "a backing store is unavailable; retry later",
    )
}

/// 500: the cause is logged, never sent.
fn internal(cause: &dyn std::fmt::Display) -> ErrorBody {
    tracing::error!(%cause, "internal error");
    ErrorBody::new(ErrorCode::ServerError, "internal server error")
}

/// A complete error answer.
#[derive(Debug, Clone)]
pub struct ApiError(pub ErrorBody);

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self(ErrorBody::new(code, message))
    }

    pub fn not_found_route() -> Self {
        Self::new(ErrorCode::NotFound, "no such endpoint")
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        let body = match e {
            ServiceError::InvalidPath(m) => ErrorBody::new(ErrorCode::InvalidPath, m),
            ServiceError::BadRequest(m) => ErrorBody::new(ErrorCode::BadRequest, m),
            ServiceError::InvalidSignature(m) => ErrorBody::new(ErrorCode::InvalidSignature, m),
            ServiceError::ExpiredSession => {
                ErrorBody::new(ErrorCode::ExpiredSession, "session expired")
            }
            ServiceError::Forbidden(m) => ErrorBody::new(ErrorCode::InsufficientPermissions, m),
            ServiceError::NotFound(m) => ErrorBody::new(ErrorCode::NotFound, m),
            e @ ServiceError::PayloadTooLarge { limit } => {
                ErrorBody::new(ErrorCode::PayloadTooLarge, e.to_string())
                    .with_details(json!({ "max_value_bytes": limit }))
            }
            e @ ServiceError::QuotaExceeded {
                used,
                quota,
                needed,
            } => ErrorBody::new(ErrorCode::StorageQuotaExceeded, e.to_string()).with_details(
                json!({ "used_bytes": used, "quota_bytes": quota, "needed_bytes": needed }),
            ),
            ServiceError::Unavailable(cause) => unavailable(&cause),
            ServiceError::Store(e) if e.is_unavailable() => unavailable(&e),
            ServiceError::Blob(e) if e.is_unavailable() => unavailable(&e),
            ServiceError::Store(e) => internal(&e),
            ServiceError::Blob(e) => internal(&e),
            ServiceError::Busy(message) => ErrorBody::new(ErrorCode::ServiceUnavailable, message),
            ServiceError::Internal(cause) => internal(&cause),
        };
        Self(body)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.error.status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, Json(self.0)).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
