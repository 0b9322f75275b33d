//! The event wire format: one event per committed PUT or DELETE, with a server-wide,
//! strictly increasing cursor.
//!
//! On `/events-stream` (SSE) an event is
//! ```text
//! event: PUT
//! id: 42
//! data: pk://<user z32>/pub/some/path
//! data: cursor: 42
//! data: content_hash: <base64 BLAKE3>      (PUT only)
//! ```
//! and on `/events/` (JSON) it is `{"type", "url", "cursor", "content_hash"}`.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

/// URL scheme of resources in events.
pub const RESOURCE_SCHEME: &str = "pk://";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    #[serde(rename = "PUT")]
    Put,
    #[serde(rename = "DEL")]
    Del,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Put => "PUT",
            EventKind::Del => "DEL",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "PUT" => Some(EventKind::Put),
            "DEL" => Some(EventKind::Del),
            _ => None,
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event, as both endpoints carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// `pk://<user z32>/<path without its leading />`.
    pub url: String,
    pub cursor: u64,
    /// Standard base64 (padded) of the 32-byte BLAKE3 hash of the value; PUT only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_hash: Option<String>,
}

/// A page of `/events/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventPage {
    pub events: Vec<Event>,
    /// The last event's cursor, or the one asked for when the page is empty.
    pub cursor: u64,
}

/// `pk://<user>/<path without leading />`.
pub fn resource_url(user_z32: &str, path: &str) -> String {
    format!(
        "{RESOURCE_SCHEME}{user_z32}/{}",
        path.strip_prefix('/').unwrap_or(path)
    )
}

/// Splits a resource URL into the user's z32 key and the path (with its leading `/`).
pub fn split_resource_url(url: &str) -> Option<(&str, String)> {
    let rest = url.strip_prefix(RESOURCE_SCHEME)?;
    let (user, path) = rest.split_once('/')?;
    Some((user, format!("/{path}")))
}

pub fn encode_content_hash(hash: &[u8; 32]) -> String {
    STANDARD.encode(hash)
}

/// Length of [`encode_content_hash`]'s text (base64 with padding of 32 bytes).
pub const ENCODED_CONTENT_HASH_LEN: usize = 44;

/// [`encode_content_hash`] into a buffer of the caller's, for paths that answer many
/// requests (the `ETag` of every GET) and should not allocate for it.
pub fn encode_content_hash_into(hash: &[u8; 32], out: &mut [u8; ENCODED_CONTENT_HASH_LEN]) {
    let written = STANDARD
        .encode_slice(hash, out)
        .expect("32 bytes encode to 44 base64 characters");
    debug_assert_eq!(written, ENCODED_CONTENT_HASH_LEN);
}

impl Event {
    /// The SSE `data` field (lines joined by `\n`).
    pub fn sse_data(&self) -> String {
        match &self.content_hash {
            Some(hash) => format!(
                "{}\ncursor: {}\ncontent_hash: {hash}",
                self.url, self.cursor
            ),
            None => format!("{}\ncursor: {}", self.url, self.cursor),
        }
    }

    /// The whole SSE frame of this event, as `/events-stream` sends it: `event`, `id`
    /// (the cursor, for `Last-Event-ID`), one `data` line per line of [`Self::sse_data`],
    /// and the blank line that ends it.
    pub fn sse_frame(&self) -> String {
        let mut frame = format!("event: {}\nid: {}\n", self.kind.as_str(), self.cursor);
        for line in self.sse_data().lines() {
            frame.push_str("data: ");
            frame.push_str(line);
            frame.push('\n');
        }
        frame.push('\n');
        frame
    }

    /// Parses an SSE event (its `event` name and `data` with lines joined by `\n`).
    pub fn from_sse(name: &str, data: &str) -> Result<Self, EventParseError> {
        let kind = EventKind::parse(name).ok_or_else(|| EventParseError::Kind(name.into()))?;
        let mut lines = data.lines();
        let url = lines
            .next()
            .ok_or(EventParseError::Missing("url"))?
            .to_owned();
        if !url.starts_with(RESOURCE_SCHEME) {
            return Err(EventParseError::Missing("url"));
        }
        let mut cursor = None;
        let mut content_hash = None;
        for line in lines {
            if let Some(v) = line.strip_prefix("cursor: ") {
                cursor = Some(v.parse().map_err(|_| EventParseError::Cursor)?);
            } else if let Some(v) = line.strip_prefix("content_hash: ") {
                content_hash = Some(v.to_owned());
            }
        }
        Ok(Self {
            kind,
            url,
            cursor: cursor.ok_or(EventParseError::Missing("cursor"))?,
            content_hash,
        })
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventParseError {
    #[error("unknown event type `{0}`")]
    Kind(String),
    #[error("event has no {0} line")]
    Missing(&'static str),
    #[error("event cursor is not an integer")]
    Cursor,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_content_hash_encodes_alike_into_a_buffer() {
        for hash in [[0u8; 32], [0xff; 32], std::array::from_fn(|i| i as u8 * 7)] {
            let mut out = [0; ENCODED_CONTENT_HASH_LEN];
            encode_content_hash_into(&hash, &mut out);
            assert_eq!(out.as_slice(), encode_content_hash(&hash).as_bytes());
        }
    }

    #[test]
    fn sse_round_trip() {
        let put = Event {
            kind: EventKind::Put,
            url: resource_url("abc", "/pub/x"),
            cursor: 7,
            content_hash: Some(encode_content_hash(&[1; 32])),
        };
        assert_eq!(put.url, "pk://abc/pub/x");
        assert_eq!(Event::from_sse("PUT", &put.sse_data()), Ok(put.clone()));
        let del = Event {
            kind: EventKind::Del,
            content_hash: None,
            ..put
        };
        assert_eq!(del.sse_data(), "pk://abc/pub/x\ncursor: 7");
        assert_eq!(
            del.sse_frame(),
            "event: DEL\nid: 7\ndata: pk://abc/pub/x\ndata: cursor: 7\n\n"
        );
        assert_eq!(Event::from_sse("DEL", &del.sse_data()), Ok(del));
        assert!(Event::from_sse("POST", "pk://a/b\ncursor: 1").is_err());
        assert!(Event::from_sse("PUT", "pk://a/b").is_err());
    }

    #[test]
    fn json_shape() {
        let e = Event {
            kind: EventKind::Del,
            url: "pk://a/pub/b".into(),
            cursor: 3,
            content_hash: None,
        };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"type": "DEL", "url": "pk://a/pub/b", "cursor": 3})
        );
        assert_eq!(
            split_resource_url("pk://a/pub/b"),
            Some(("a", "/pub/b".into()))
        );
    }
}
