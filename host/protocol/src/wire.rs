//! The storage API's wire names and JSON bodies, shared by server, client and load
//! generator.

use serde::{Deserialize, Serialize};

/// Header naming the user whose public data a read is about (`Pubky-Host: <z32>`).
pub const PUBKY_HOST_HEADER: &str = "pubky-host";
/// The query parameter doing the same, for clients that cannot set headers.
pub const PUBKY_HOST_QUERY: &str = "pubky-host";

/// Answer to `PUT /:path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutResult {
    pub path: String,
    pub size: u64,
    pub created_at: i64,
}

/// Answer to `DELETE /:path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteResult {
    pub path: String,
    pub deleted_at: i64,
}

/// One item of a listing. In a shallow listing a sub-folder appears as an item whose
/// path ends in `/` and that carries no size or timestamps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListEntry {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<i64>,
    /// The value's BLAKE3 hash, standard base64 with padding: the same string as the
    /// entry's `ETag` (unquoted) and its events' `content_hash`. Lets a client tell
    /// which entries changed without reading them (`pk sync`). Absent for sub-folders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_hash: Option<String>,
}

/// Answer to `GET /.../` (a listing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListResult {
    pub entries: Vec<ListEntry>,
    /// Opaque; pass it back as `cursor` to get the next page. Null when the page is empty.
    pub cursor: Option<String>,
    pub has_more: bool,
}

/// Answer to `POST /signup`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignupResult {
    pub public_key: String,
    pub created_at: i64,
}

/// Answer to `GET /account`: the caller's own account, for a signed request or a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountInfo {
    /// The account's public key (z-base-32).
    pub public_key: String,
    /// When the key signed up (Unix seconds).
    pub created_at: i64,
    /// Bytes stored: the sum of the sizes of the account's values.
    pub used_bytes: u64,
    /// The quota in force (the account's own or the server's default); 0 = unlimited.
    pub quota_bytes: u64,
    /// The largest value the server accepts, in bytes.
    pub max_value_bytes: u64,
    /// A disabled account's writes are refused (403).
    pub disabled: bool,
}

/// Whether `token` has the signup token format `XXXX-XXXX-XXXX` (upper-case RFC 4648
/// base32 characters: A-Z and 2-7).
pub fn is_signup_token(token: &str) -> bool {
    let groups: Vec<&str> = token.split('-').collect();
    groups.len() == 3
        && groups.iter().all(|g| {
            g.len() == 4
                && g.bytes()
                    .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b))
        })
}

/// A signup token as a person may type it (lower case, surrounding spaces) in its
/// canonical form, or None when it is not a token at all.
pub fn normalize_signup_token(text: &str) -> Option<String> {
    let token = text.trim().to_ascii_uppercase();
    is_signup_token(&token).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signup_tokens_are_normalized() {
        assert_eq!(
            normalize_signup_token(" abcd-EFGH-2345\n").as_deref(),
            Some("ABCD-EFGH-2345")
        );
        assert_eq!(normalize_signup_token("abcd-efgh-2341"), None);
    }

    #[test]
    fn signup_token_format() {
        assert!(is_signup_token("ABCD-EFGH-2345"));
        for bad in [
            "abcd-efgh-2345",
            "ABCD-EFGH-2341",
            "ABCDEFGH2345",
            "ABCD-EFGH",
            "ABC-DEFG-HIJK",
            "",
        ] {
            assert!(!is_signup_token(bad), "{bad}");
        }
    }
}

/// Answer to `GET /signup_tokens/{token}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignupTokenStatus {
    /// `valid` (unused) or `used`.
    pub status: String,
    /// ISO 8601 UTC, e.g. `2026-11-22T04:13:00Z`.
    pub created_at: String,
}

/// Body of `POST /auth/session`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// `<read|write|*>:<path prefix>` strings.
    pub capabilities: Vec<String>,
    /// Seconds; 3600 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u64>,
}

/// Answer to `POST /auth/session`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionCreated {
    pub token: String,
    pub expires_at: i64,
}

/// Answer to `GET /auth/session`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub public_key: String,
    pub capabilities: Vec<String>,
    pub created_at: i64,
    pub expires_at: i64,
}
