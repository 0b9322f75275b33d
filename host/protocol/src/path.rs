//! Storage paths. Valid paths start with `/pub/` or `/private/` (reserved), are at most
//! 1024 bytes of `a-z A-Z 0-9 - _ / .`, and have no empty, `.` or `..` segment. A path
//! ending in `/` names a listing of everything under it; any other path names one entry.

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
    fn length_limit() {
        let ok = format!("/pub/{}", "a".repeat(MAX_PATH_BYTES - 5));
        assert_eq!(ok.len(), MAX_PATH_BYTES);
        assert!(StoragePath::parse(&ok).is_ok());
        let long = format!("{ok}a");
        assert_eq!(StoragePath::parse(&long), Err(PathError::TooLong));
    }
}
