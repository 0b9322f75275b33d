//! Storage paths. Valid paths start with `/pub/` or `/private/` (reserved), are at most
//! 1024 bytes of `a-z A-Z 0-9 - _ / .`, and have no empty, `.` or `..` segment. A path
//! ending in `/` names a listing of everything under it; any other path names one entry.
//!
//! A request's path may carry one escape, `%2F` (either case) for `/`, because clients
//! generated from the OpenAPI document escape the slashes of a path parameter (the
//! convention GitLab's API uses for file paths). [`StoragePath::from_request_path`]
//! reads it into the one canonical path everything after the signature check sees; no
//! other `%xx` is read, so a path has exactly two spellings on the wire and one inside.

use std::fmt;

/// Longest valid path, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;

/// The public root.
pub const PUBLIC_ROOT: &str = "/pub/";
/// The reserved private root.
pub const PRIVATE_ROOT: &str = "/private/";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PathError {
    #[error("path must start with /pub/ or /private/")]
    Root,
    #[error("path is longer than {MAX_PATH_BYTES} bytes")]
    TooLong,
    #[error("path contains a character outside a-z A-Z 0-9 - _ / . (at byte {0})")]
    Character(usize),
    #[error("path contains an empty segment (//)")]
    EmptySegment,
    #[error("path contains a `.` or `..` segment")]
    DotSegment,
    #[error("path contains a percent-escape other than %2F (an escaped /) at byte {0}")]
    Escape(usize),
}

/// A validated storage path.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoragePath(String);

impl StoragePath {
    pub fn parse(path: &str) -> Result<Self, PathError> {
        if !(path.starts_with(PUBLIC_ROOT) || path.starts_with(PRIVATE_ROOT)) {
            return Err(PathError::Root);
        }
        if path.len() > MAX_PATH_BYTES {
            return Err(PathError::TooLong);
        }
        if let Some(at) = path
            .bytes()
            .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'/' | b'.')))
        {
            return Err(PathError::Character(at));
        }
        // Segments between the leading `/` and an optional trailing `/`.
        let inner = path[1..].strip_suffix('/').unwrap_or(&path[1..]);
        for segment in inner.split('/') {
            match segment {
                "" => return Err(PathError::EmptySegment),
                "." | ".." => return Err(PathError::DotSegment),
                _ => {}
            }
        }
        Ok(Self(path.to_owned()))
    }

    /// The path of a request target as sent: [`StoragePath::parse`] after reading each
    /// `%2F` or `%2f` as `/`. Any other `%` is [`PathError::Escape`] (its byte in
    /// `raw`); the rules (length included) apply to the path the escapes spell, so
    /// `/pub/a%2F..%2Fb` is a `..` segment and `/pub/a%2F%2Fb` an empty one.
    pub fn from_request_path(raw: &str) -> Result<Self, PathError> {
        if !raw.contains('%') {
            return Self::parse(raw);
        }
        let mut canonical = String::with_capacity(raw.len());
        let mut read = 0;
        while let Some(found) = raw[read..].find('%') {
            let at = read + found;
            if !matches!(raw.get(at..at + 3), Some("%2F" | "%2f")) {
                return Err(PathError::Escape(at));
            }
            canonical.push_str(&raw[read..at]);
            canonical.push('/');
            read = at + 3;
        }
        canonical.push_str(&raw[read..]);
        Self::parse(&canonical)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True when the path ends in `/`: a listing, not an entry.
    pub fn is_listing(&self) -> bool {
        self.0.ends_with('/')
    }

    /// True under the reserved `/private/` root.
    pub fn is_private(&self) -> bool {
        self.0.starts_with(PRIVATE_ROOT)
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for StoragePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for StoragePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoragePath({})", self.0)
    }
}

impl AsRef<str> for StoragePath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_paths() {
        for p in [
            "/pub/a",
            "/pub/",
            "/pub/a/b/c.txt",
            "/pub/pubky.app/posts/0033SSE3B1FQ0",
            "/pub/a-b_c.d/",
            "/private/x",
            "/pub/...a",
            "/pub/a..b",
        ] {
            assert!(StoragePath::parse(p).is_ok(), "{p}");
        }
        assert!(StoragePath::parse("/pub/").unwrap().is_listing());
        assert!(!StoragePath::parse("/pub/a").unwrap().is_listing());
        assert!(StoragePath::parse("/private/a").unwrap().is_private());
    }

    #[test]
    fn invalid_paths() {
        let cases = [
            ("", PathError::Root),
            ("/", PathError::Root),
            ("/pub", PathError::Root),
            ("pub/a", PathError::Root),
            ("/public/a", PathError::Root),
            ("/pub/a b", PathError::Character(6)),
            ("/pub/a%20b", PathError::Character(6)),
            ("/pub/ä", PathError::Character(5)),
            ("/pub/a?b", PathError::Character(6)),
            ("/pub//a", PathError::EmptySegment),
            ("/pub/a//", PathError::EmptySegment),
            ("/pub/./a", PathError::DotSegment),
            ("/pub/a/..", PathError::DotSegment),
            ("/pub/../", PathError::DotSegment),
        ];
        for (p, e) in cases {
            assert_eq!(StoragePath::parse(p), Err(e), "{p:?}");
        }
    }

    #[test]
    fn escaped_slashes_read_as_slashes() {
        for (raw, canonical) in [
            ("/pub/a%2Fb", "/pub/a/b"),
            ("/pub/a%2fb", "/pub/a/b"),
            ("/pub/example.com%2Fhello.txt", "/pub/example.com/hello.txt"),
            ("/pub/a%2Fb%2F", "/pub/a/b/"),
            ("/pub%2Fa", "/pub/a"),
            ("/pub/a/b", "/pub/a/b"),
        ] {
            let path = StoragePath::from_request_path(raw).unwrap();
            assert_eq!(path, StoragePath::parse(canonical).unwrap(), "{raw}");
        }
    }

    #[test]
    fn no_other_escape_is_read() {
        let cases = [
            ("/pub/a%20b", PathError::Escape(6)),
            ("/pub/a%2Eb", PathError::Escape(6)),
            ("/pub/a%25", PathError::Escape(6)),
            ("/pub/a%2", PathError::Escape(6)),
            ("/pub/a%", PathError::Escape(6)),
            ("/pub/a%2Fb%2E", PathError::Escape(10)),
            ("/pub/a%2F%2Fb", PathError::EmptySegment),
            ("/pub/a%2F..%2Fb", PathError::DotSegment),
            ("/pub/a%2F.", PathError::DotSegment),
            ("/%2Fpub/a", PathError::Root),
            ("/pub/a%2Fb c", PathError::Character(8)),
        ];
        for (raw, e) in cases {
            assert_eq!(StoragePath::from_request_path(raw), Err(e), "{raw:?}");
        }
        // `%` followed by a multi-byte character is not an escape either.
        assert_eq!(
            StoragePath::from_request_path("/pub/%2é"),
            Err(PathError::Escape(5))
        );
    }

    #[test]
    fn limits_apply_to_the_canonical_path() {
        let name = "a".repeat(MAX_PATH_BYTES - 7);
        let escaped = format!("/pub/a%2F{name}");
        assert!(escaped.len() > MAX_PATH_BYTES);
        assert_eq!(
            StoragePath::from_request_path(&escaped)
                .unwrap()
                .as_str()
                .len(),
            MAX_PATH_BYTES
        );
        assert_eq!(
            StoragePath::from_request_path(&format!("{escaped}a")),
            Err(PathError::TooLong)
        );
    }

    #[test]
    fn length_limit() {
        let ok = format!("/pub/{}", "a".repeat(MAX_PATH_BYTES - 5));
        assert_eq!(ok.len(), MAX_PATH_BYTES);
        assert!(StoragePath::parse(&ok).is_ok());
        let long = format!("{ok}a");
        assert_eq!(StoragePath::parse(&long), Err(PathError::TooLong));
    }
}
