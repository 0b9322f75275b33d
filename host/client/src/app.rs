//! pubky.app posts, the social app most homeserver users write with: the JSON value
//! under `/pub/pubky.app/posts/<id>`, post ids (13-character Crockford base32 of the
//! microsecond timestamp, so they sort by time) and `pubky://` URIs. Used by `pk post`,
//! `pk replies` and the mention bot.

use homeserver_protocol::PublicKey;
use serde::{Deserialize, Serialize};

/// Where a user's posts live.
pub const POSTS_PREFIX: &str = "/pub/pubky.app/posts/";
/// The longest content of a short post.
pub const MAX_SHORT_POST_CHARS: usize = 2000;

/// A post's value (the fields the bot uses; others are kept by serde's flatten when
/// reading and never written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PubkyAppPost {
    pub content: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

impl PubkyAppPost {
    /// A short reply to `parent` (a `pubky://` post URI).
    pub fn reply(content: String, parent: &PostUri) -> Self {
        Self {
            content,
            kind: "short".into(),
            parent: Some(parent.to_string()),
        }
    }
}

/// `pubky://<author>/pub/pubky.app/posts/<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PostUri {
    pub author: PublicKey,
    pub id: String,
}

impl PostUri {
    pub fn new(author: PublicKey, id: impl Into<String>) -> Self {
        Self {
            author,
            id: id.into(),
        }
    }

    /// The storage path of the post on its author's homeserver.
    pub fn path(&self) -> String {
        format!("{POSTS_PREFIX}{}", self.id)
    }

    /// `<author z32>:<post id>`: the mention id the bot records.
    pub fn key(&self) -> String {
        format!("{}:{}", self.author.to_z32(), self.id)
    }

    /// Parses `pubky://<z32>/pub/pubky.app/posts/<id>` (also with `pk://`).
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text
            .strip_prefix("pubky://")
            .or_else(|| text.strip_prefix("pk://"))?;
        let (author, path) = rest.split_once('/')?;
        let id = format!("/{path}").strip_prefix(POSTS_PREFIX)?.to_owned();
        if id.is_empty() || id.contains('/') {
            return None;
        }
        Some(Self::new(author.parse().ok()?, id))
    }

    /// The post's time, from its id (microseconds since the epoch), when the id is one.
    pub fn timestamp_micros(&self) -> Option<i64> {
        decode_post_id(&self.id)
    }
}

impl std::fmt::Display for PostUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pubky://{}{}", self.author.to_z32(), self.path())
    }
}

/// Crockford's base32 alphabet.
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// The 13-character id of a post made at `micros` (microseconds since the epoch):
/// Crockford base32 of the big-endian 64-bit time, so ids sort as their times do.
pub fn post_id(micros: i64) -> String {
    let bytes = micros.to_be_bytes();
    let mut bits: u128 = 0;
    for b in bytes {
        bits = (bits << 8) | u128::from(b);
    }
    // 64 bits in 13 groups of 5 (65 bits): one leading zero bit.
    (0..13)
        .rev()
        .map(|i| CROCKFORD[((bits >> (i * 5)) & 31) as usize] as char)
        .collect()
}

/// The microsecond time in a post id, or None when it is not one.
pub fn decode_post_id(id: &str) -> Option<i64> {
    if id.len() != 13 {
        return None;
    }
    let mut bits: u128 = 0;
    for c in id.bytes() {
        let value = CROCKFORD
            .iter()
            .position(|&a| a == c.to_ascii_uppercase())?;
        bits = (bits << 5) | value as u128;
    }
    i64::try_from(bits).ok()
}

/// The current time in microseconds.
pub use homeserver_protocol::clock::unix_micros as now_micros;

#[cfg(test)]
mod tests {
    use super::*;
    use homeserver_protocol::Keypair;

    #[test]
    fn post_ids_are_13_crockford_chars_that_sort_by_time() {
        let t = 1_732_000_000_123_456;
        let id = post_id(t);
        assert_eq!(id.len(), 13);
        assert_eq!(decode_post_id(&id), Some(t));
        assert!(post_id(t) < post_id(t + 1));
        assert!(post_id(9_999_999) < post_id(10_000_000_000));
        assert_eq!(post_id(0), "0000000000000");
        assert_eq!(decode_post_id("nope"), None);
        assert_eq!(decode_post_id("000000000000U"), None, "U is not Crockford");
    }

    #[test]
    fn uris_round_trip() {
        let author = Keypair::random().public_key();
        let uri = PostUri::new(author, "0034A0RRKZ7N0");
        let text = uri.to_string();
        assert_eq!(PostUri::parse(&text), Some(uri.clone()));
        assert_eq!(uri.path(), "/pub/pubky.app/posts/0034A0RRKZ7N0");
        assert!(PostUri::parse("pubky://nope/pub/pubky.app/posts/x").is_none());
        assert!(PostUri::parse(&format!("pubky://{}/pub/other/x", author.to_z32())).is_none());
    }
}
