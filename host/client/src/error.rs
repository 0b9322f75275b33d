//! [`ClientError`]: everything a client operation can fail with. Error responses from the
//! server keep their status and parsed JSON body so callers can branch on the code.
//!
//! Display strings never repeat their source: print the `source()` chain to get the
//! whole story (the `pk` tool does).

use homeserver_protocol::event::EventParseError;
use homeserver_protocol::{ErrorBody, ErrorCode, PathError};
use reqwest::StatusCode;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error and the documented JSON body.
    #[error("{} ({}): {}", body.error.as_str(), status.as_u16(), body.message)]
    Api { status: StatusCode, body: ErrorBody },

    /// The server answered with an error whose body is not the documented JSON (a proxy
    /// in between, or a HEAD request, which has no body). `text` is the raw body.
    #[error("{}", unexpected_status_text(*status, text))]
    UnexpectedStatus { status: StatusCode, text: String },

    /// A 2xx answer whose body is not what the API documents.
    #[error("unexpected response from the homeserver: {0}")]
    InvalidResponse(String),

    /// An event on `/events-stream` that does not follow the event wire format.
    #[error("invalid event from the homeserver")]
    InvalidEvent {
        #[source]
        source: EventParseError,
    },

    /// The server ended an event stream that had already started with an `error` event;
    /// `message` is what it said. Resume after the last cursor received.
    #[error("the homeserver ended the event stream with an error: {message}")]
    StreamFailed { message: String },

    /// No connection to the homeserver could be made (refused, no such host, TLS
    /// handshake refused). `reason` is the deepest cause, e.g. "Connection refused".
    #[error("cannot connect to the homeserver at {url}: {reason}")]
    Unreachable {
        url: String,
        reason: String,
        /// The connection was refused: nothing listens there (a server that is not
        /// running, or the wrong address).
        refused: bool,
    },

    /// Connecting, sending or receiving failed.
    #[error("request to the homeserver failed")]
    Transport(#[from] reqwest::Error),

    /// A downloaded value whose BLAKE3 hash is not the one the server announced (its
    /// `ETag`): it was damaged on the way, or changed while it was read. Nothing was kept.
    #[error(
        "{path}: the downloaded value does not match its content hash (expected {expected}, got {actual})"
    )]
    HashMismatch {
        path: String,
        expected: String,
        actual: String,
    },

    /// A local file that would be replaced, and the caller did not ask for that.
    #[error("{} already exists", path.display())]
    DestinationExists { path: std::path::PathBuf },

    /// Reading or writing a local file or stream.
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// A storage path that the protocol rejects; checked before anything is sent.
    #[error("invalid path {path:?}")]
    InvalidPath {
        path: String,
        #[source]
        source: PathError,
    },

    /// A valid path of the wrong kind: an entry path where a listing (ending in `/`) is
    /// needed, or the other way round.
    #[error("invalid path {path:?}: {expected}")]
    PathKind {
        path: String,
        expected: &'static str,
    },

    /// The base URL cannot be used.
    #[error("invalid homeserver URL {url:?}: {reason}")]
    InvalidBaseUrl { url: String, reason: String },

    /// The operation needs a signature and the client has no key pair.
    #[error("this operation needs a secret key, and none is configured")]
    MissingKey,

    /// Finding a homeserver or a user's record on the DHT (pkarr) failed.
    #[error("{0}")]
    Resolve(String),
}

fn unexpected_status_text(status: StatusCode, text: &str) -> String {
    let reason = status.canonical_reason().unwrap_or("error");
    // A proxy's HTML page is not worth printing in full.
    let text = text.trim();
    if text.is_empty() {
        format!("HTTP {} {reason}", status.as_u16())
    } else {
        let mut shown: String = text.chars().take(200).collect();
        if shown.len() < text.len() {
            shown.push('…');
        }
        format!("HTTP {} {reason}: {shown}", status.as_u16())
    }
}

impl ClientError {
    /// Builds the error for a non-success answer from its status and raw body.
    pub fn from_response_body(status: StatusCode, body: &[u8]) -> Self {
        match serde_json::from_slice::<ErrorBody>(body) {
            Ok(body) => ClientError::Api { status, body },
            Err(_) => ClientError::UnexpectedStatus {
                status,
                text: String::from_utf8_lossy(body).into_owned(),
            },
        }
    }

    /// A transport failure; connection failures become [`ClientError::Unreachable`].
    pub(crate) fn from_transport(error: reqwest::Error, base: &url::Url) -> Self {
        if !error.is_connect() {
            return ClientError::Transport(error);
        }
        // The deepest cause says what happened ("Connection refused (os error 111)",
        // "failed to lookup address information", a TLS alert); the layers above it only
        // repeat that a request was being sent.
        let mut deepest: &(dyn std::error::Error + 'static) = &error;
        let mut refused = false;
        while let Some(next) = deepest.source() {
            if let Some(io) = next.downcast_ref::<std::io::Error>() {
                refused |= io.kind() == std::io::ErrorKind::ConnectionRefused;
            }
            deepest = next;
        }
        ClientError::Unreachable {
            url: base.as_str().trim_end_matches('/').to_owned(),
            reason: deepest.to_string(),
            refused,
        }
    }

    /// True when no connection could be made to the homeserver.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, ClientError::Unreachable { .. })
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ClientError::Io {
            context: context.into(),
            source,
        }
    }

    /// The HTTP status, when the server answered.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Api { status, .. } | ClientError::UnexpectedStatus { status, .. } => {
                Some(*status)
            }
            ClientError::Transport(e) => e.status(),
            _ => None,
        }
    }

    /// The API error code, when the server sent a JSON error body.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { body, .. } => Some(body.error),
            _ => None,
        }
    }

    /// True for a 404, with or without a JSON body (HEAD answers have none).
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(StatusCode::NOT_FOUND)
    }

    /// True when the server refused a signature it had already seen.
    pub(crate) fn is_replay_refusal(&self) -> bool {
        matches!(self, ClientError::Api { status, body }
            if *status == StatusCode::UNAUTHORIZED
                && body.error == ErrorCode::InvalidSignature
                && body.message.to_ascii_lowercase().contains("replay"))
    }
}

impl From<homeserver_protocol::query::QueryError> for ClientError {
    fn from(e: homeserver_protocol::query::QueryError) -> Self {
        use homeserver_protocol::query::QueryError;
        match e {
            QueryError::Path { path, source } => ClientError::InvalidPath { path, source },
            // Building a query checks nothing else; reading one is the server's job.
            QueryError::Invalid(message) => ClientError::InvalidResponse(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_documented_error_body() {
        let err = ClientError::from_response_body(
            StatusCode::NOT_FOUND,
            br#"{"error":"not_found","message":"no entry at /pub/x","details":{"path":"/pub/x"}}"#,
        );
        match &err {
            ClientError::Api { status, body } => {
                assert_eq!(*status, StatusCode::NOT_FOUND);
                assert_eq!(body.error, ErrorCode::NotFound);
                assert_eq!(body.details["path"], "/pub/x");
            }
            other => panic!("expected Api, got {other:?}"),
        }
        assert_eq!(err.to_string(), "not_found (404): no entry at /pub/x");
        assert_eq!(err.code(), Some(ErrorCode::NotFound));
        assert!(err.is_not_found());
    }

    #[test]
    fn details_are_optional() {
        let err = ClientError::from_response_body(
            StatusCode::PAYLOAD_TOO_LARGE,
            br#"{"error":"payload_too_large","message":"too big"}"#,
        );
        assert_eq!(err.code(), Some(ErrorCode::PayloadTooLarge));
        assert_eq!(err.to_string(), "payload_too_large (413): too big");
    }

    #[test]
    fn keeps_raw_text_when_body_is_not_json() {
        let err =
            ClientError::from_response_body(StatusCode::BAD_GATEWAY, b"<html>bad gateway</html>");
        match &err {
            ClientError::UnexpectedStatus { status, text } => {
                assert_eq!(*status, StatusCode::BAD_GATEWAY);
                assert_eq!(text, "<html>bad gateway</html>");
            }
            other => panic!("expected UnexpectedStatus, got {other:?}"),
        }
        assert_eq!(
            err.to_string(),
            "HTTP 502 Bad Gateway: <html>bad gateway</html>"
        );
        assert_eq!(err.code(), None);
    }

    #[test]
    fn unknown_code_keeps_raw_text() {
        let raw = r#"{"error":"brand_new_code","message":"?"}"#;
        let err = ClientError::from_response_body(StatusCode::IM_A_TEAPOT, raw.as_bytes());
        assert!(matches!(err, ClientError::UnexpectedStatus { ref text, .. } if text == raw));
    }

    #[test]
    fn empty_body_shows_status() {
        let err = ClientError::from_response_body(StatusCode::NOT_FOUND, b"");
        assert_eq!(err.to_string(), "HTTP 404 Not Found");
        assert!(err.is_not_found());
    }

    #[test]
    fn recognises_replay_refusal() {
        let replayed = ClientError::from_response_body(
            StatusCode::UNAUTHORIZED,
            br#"{"error":"invalid_signature","message":"signature replayed"}"#,
        );
        assert!(replayed.is_replay_refusal());
        let bad = ClientError::from_response_body(
            StatusCode::UNAUTHORIZED,
            br#"{"error":"invalid_signature","message":"signature does not match the request"}"#,
        );
        assert!(!bad.is_replay_refusal());
    }
}
