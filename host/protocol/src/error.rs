//! Error codes of the API, their HTTP statuses, and the JSON error body
//! `{"error": code, "message": text, "details": {...}}` sent on every non-2xx but 304.

use serde::{Deserialize, Serialize};

/// Every error code the API answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidPath,
    BadRequest,
    InvalidSignature,
    ExpiredSession,
    InsufficientPermissions,
    NotFound,
    MethodNotAllowed,
    PayloadTooLarge,
    /// The request target is longer than the server reads (414).
    UriTooLong,
    /// The request headers are larger than the server reads (431).
    HeadersTooLarge,
    RateLimitExceeded,
    ServerError,
    ServiceUnavailable,
    StorageQuotaExceeded,
}

impl ErrorCode {
    /// The HTTP status this code is always sent with.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::InvalidPath | ErrorCode::BadRequest => 400,
            ErrorCode::InvalidSignature | ErrorCode::ExpiredSession => 401,
            ErrorCode::InsufficientPermissions => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::UriTooLong => 414,
            ErrorCode::HeadersTooLarge => 431,
            ErrorCode::RateLimitExceeded => 429,
            ErrorCode::ServerError => 500,
            ErrorCode::ServiceUnavailable => 503,
            ErrorCode::StorageQuotaExceeded => 507,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidPath => "invalid_path",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::InvalidSignature => "invalid_signature",
            ErrorCode::ExpiredSession => "expired_session",
            ErrorCode::InsufficientPermissions => "insufficient_permissions",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::UriTooLong => "uri_too_long",
            ErrorCode::HeadersTooLarge => "headers_too_large",
            ErrorCode::RateLimitExceeded => "rate_limit_exceeded",
            ErrorCode::ServerError => "server_error",
            ErrorCode::ServiceUnavailable => "service_unavailable",
            ErrorCode::StorageQuotaExceeded => "storage_quota_exceeded",
        }
    }
}

/// The JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub details: serde_json::Value,
}

impl ErrorBody {
    pub fn new(error: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            error,
            message: message.into(),
            details: serde_json::Value::Null,
        }
    }

    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = details;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_as_documented() {
        let body = ErrorBody::new(ErrorCode::StorageQuotaExceeded, "full");
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"error": "storage_quota_exceeded", "message": "full"})
        );
        assert_eq!(ErrorCode::StorageQuotaExceeded.status(), 507);
    }

    /// Every code. The match below stops compiling when a code is added, so the list
    /// (and the tests over it) cannot silently miss one.
    const ALL: [ErrorCode; 14] = {
        use ErrorCode::*;
        [
            InvalidPath,
            BadRequest,
            InvalidSignature,
            ExpiredSession,
            InsufficientPermissions,
            NotFound,
            MethodNotAllowed,
            PayloadTooLarge,
            UriTooLong,
            HeadersTooLarge,
            RateLimitExceeded,
            ServerError,
            ServiceUnavailable,
            StorageQuotaExceeded,
        ]
    };

    #[allow(dead_code)]
    fn all_is_complete(code: ErrorCode) {
        use ErrorCode::*;
        match code {
            InvalidPath
            | BadRequest
            | InvalidSignature
            | ExpiredSession
            | InsufficientPermissions
            | NotFound
            | MethodNotAllowed
            | PayloadTooLarge
            | UriTooLong
            | HeadersTooLarge
            | RateLimitExceeded
            | ServerError
            | ServiceUnavailable
            | StorageQuotaExceeded => {}
        }
    }

    #[test]
    fn as_str_matches_serde() {
        for code in ALL {
            let json = serde_json::to_value(code).unwrap();
            assert_eq!(json.as_str(), Some(code.as_str()));
        }
    }

    /// docs/API.md has one table of the error codes: each code in exactly one row, with
    /// the status it is always sent with.
    #[test]
    fn the_api_docs_table_lists_every_code_with_its_status() {
        let docs = include_str!("../../../docs/API.md");
        for code in ALL {
            let row = format!("| `{}` | {} |", code.as_str(), code.status());
            assert_eq!(
                docs.matches(&row).count(),
                1,
                "docs/API.md's error table needs one row starting {row}"
            );
        }
        // Rows of the form "| `code` | 4xx/5xx |".
        let is_error_row = |line: &str| {
            let Some((_, rest)) = line.strip_prefix("| `").and_then(|l| l.split_once("` | "))
            else {
                return false;
            };
            rest.len() > 4
                && rest.as_bytes()[..3].iter().all(u8::is_ascii_digit)
                && matches!(rest.as_bytes()[0], b'4' | b'5')
                && rest[3..].starts_with(" |")
        };
        let rows = docs.lines().filter(|line| is_error_row(line)).count();
        assert_eq!(rows, ALL.len(), "the table has a row per code and no more");
    }
}
