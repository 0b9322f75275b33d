//! Storage URLs, parsed once when the configuration loads: which metadata database and
//! which blob store to open. A URL may carry a password; its `Debug`, `Display` and
//! serialized forms (logs, `--print-config`) show `****` instead, so a secret never
//! reaches a log line or a terminal. Only [`DatabaseUrl::expose_secret`] hands out
//! the real text, to the backend that connects with it.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use homeserver_protocol::secret::Secret;
use homeserver_protocol::secret::redact_url;

/// The metadata database (`[storage] database_url`).
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// `sqlite://PATH` (or any form sqlx's SQLite driver reads, e.g. `sqlite:PATH`).
    Sqlite(String),
    /// `postgres://` or `postgresql://`, user, password, host, port, database, options.
    Postgres(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UrlError(String);

impl DatabaseUrl {
    pub fn parse(text: &str) -> Result<Self, UrlError> {
        let text = text.trim();
        if text.starts_with("sqlite:") {
            if text == "sqlite:" || text == "sqlite://" {
                return Err(UrlError(
                    "sqlite URL names no file: use sqlite://PATH".into(),
                ));
            }
            return Ok(Self::Sqlite(text.to_owned()));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            let url = url::Url::parse(text)
                // The parser's message never echoes the input, so no secret leaks here.
                .map_err(|e| UrlError(format!("invalid PostgreSQL URL: {e}")))?;
            if url.host_str().is_none_or(str::is_empty) {
                return Err(UrlError(
                    "PostgreSQL URL names no host: use postgres://USER:PASSWORD@HOST:PORT/DATABASE"
                        .into(),
                ));
            }
            return Ok(Self::Postgres(text.to_owned()));
        }
        let scheme = text.split_once("://").map_or("", |(s, _)| s);
        Err(UrlError(format!(
            "unsupported database URL scheme `{scheme}`: use sqlite://PATH or \
             postgres://USER:PASSWORD@HOST:PORT/DATABASE"
        )))
    }

    /// The backend's name, for logs and stats.
    pub fn backend(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }

    /// The full URL with its secrets, for the driver that connects. Never log it.
    pub fn expose_secret(&self) -> &str {
        match self {
            Self::Sqlite(s) | Self::Postgres(s) => s,
        }
    }

    /// The URL with passwords replaced by `****`.
    pub fn redacted(&self) -> String {
        match self {
            Self::Sqlite(s) => s.clone(),
            Self::Postgres(s) => redact_url(s),
        }
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({})", self.redacted())
    }
}

impl std::str::FromStr for DatabaseUrl {
    type Err = UrlError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl<'de> Deserialize<'de> for DatabaseUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Serializes redacted: the serialized config is for people to read.
impl Serialize for DatabaseUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

/// The blob store (`[storage] blobs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobsUrl {
    /// `file://DIR`: a folder on the local disk (created if missing).
    File(PathBuf),
    /// `s3://BUCKET[/PREFIX]`: an S3-compatible object store (endpoint, region and
    /// credentials in `[s3]` or the standard AWS environment variables). Keys go under
    /// PREFIX when given, so several deployments can share a bucket.
    S3 {
        bucket: String,
        prefix: Option<String>,
    },
}

impl BlobsUrl {
    pub fn parse(text: &str) -> Result<Self, UrlError> {
        let text = text.trim();
        if let Some(dir) = text.strip_prefix("file://") {
            if dir.is_empty() {
                return Err(UrlError(
                    "file:// URL names no folder: use file://DIR".into(),
                ));
            }
            return Ok(Self::File(PathBuf::from(dir)));
        }
        if let Some(rest) = text.strip_prefix("s3://") {
            let (bucket, prefix) = match rest.split_once('/') {
                Some((bucket, prefix)) => (bucket, prefix.trim_matches('/')),
                None => (rest, ""),
            };
            // S3's bucket naming rules: 3-63 of a-z 0-9 . -
            let valid = (3..=63).contains(&bucket.len())
                && bucket.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-'
                });
            if !valid {
                return Err(UrlError(format!(
                    "invalid S3 bucket name `{bucket}`: 3 to 63 characters of a-z, 0-9, . and -"
                )));
            }
            return Ok(Self::S3 {
                bucket: bucket.to_owned(),
                prefix: (!prefix.is_empty()).then(|| prefix.to_owned()),
            });
        }
        Err(UrlError(format!(
            "unsupported blob store URL `{text}`: use file://DIR or s3://BUCKET[/PREFIX]"
        )))
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Self::File(_) => "file",
            Self::S3 { .. } => "s3",
        }
    }
}

impl fmt::Display for BlobsUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(dir) => write!(f, "file://{}", dir.display()),
            Self::S3 { bucket, prefix } => match prefix {
                Some(prefix) => write!(f, "s3://{bucket}/{prefix}"),
                None => write!(f, "s3://{bucket}"),
            },
        }
    }
}

impl std::str::FromStr for BlobsUrl {
    type Err = UrlError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl<'de> Deserialize<'de> for BlobsUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl Serialize for BlobsUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// How to reach the S3-compatible store of `s3://` blobs (`[s3]`). Empty settings fall
/// back to the standard AWS environment variables (`AWS_ENDPOINT`, `AWS_REGION`,
/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, ...), then to
/// AWS's own defaults (instance credentials).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Settings {
    /// The store's URL, e.g. `http://127.0.0.1:9000` (empty: AWS S3 of `region`).
    pub endpoint: String,
    /// The region (most self-hosted stores accept any, e.g. `us-east-1`).
    pub region: String,
    /// Path-style requests (`ENDPOINT/BUCKET/KEY`), as most self-hosted stores want;
    /// false: virtual-hosted style (`BUCKET.ENDPOINT/KEY`), as AWS prefers.
    pub path_style: bool,
    /// Allow a plain `http://` endpoint (a store on a private network or loopback).
    pub allow_http: bool,
    pub access_key_id: String,
    /// Shown as `****`; prefer `secret_access_key_file` or `AWS_SECRET_ACCESS_KEY`.
    pub secret_access_key: Secret,
    /// A file whose content (trimmed) is the secret access key (e.g. a mounted secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key_file: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls() {
        let url = DatabaseUrl::parse("sqlite://data/hs.db").unwrap();
        assert_eq!(url.backend(), "sqlite");
        assert_eq!(url.expose_secret(), "sqlite://data/hs.db");
        assert_eq!(url.to_string(), "sqlite://data/hs.db");
        assert!(DatabaseUrl::parse("sqlite://").is_err());
    }

    #[test]
    fn postgres_passwords_never_show() {
        let text = "postgres://hs:s3cret-pw@db.example:5432/hs?sslmode=require&password=other-pw";
        let url = DatabaseUrl::parse(text).unwrap();
        assert_eq!(url.backend(), "postgres");
        assert_eq!(url.expose_secret(), text);
        for shown in [
            url.to_string(),
            format!("{url:?}"),
            toml::Value::try_from(&url).unwrap().to_string(),
        ] {
            assert!(!shown.contains("s3cret-pw"), "{shown}");
            assert!(!shown.contains("other-pw"), "{shown}");
            assert!(shown.contains("hs:****@db.example:5432/hs"), "{shown}");
            assert!(shown.contains("sslmode=require"), "{shown}");
        }
        // No password: nothing to hide, nothing changed.
        let plain = DatabaseUrl::parse("postgresql://postgres@127.0.0.1/test").unwrap();
        assert_eq!(plain.to_string(), "postgresql://postgres@127.0.0.1/test");
    }

    #[test]
    fn bad_urls_are_refused_without_echoing_secrets() {
        for bad in [
            "mysql://u:topsecret@h/db",
            "postgres://u:topsecret@/db",
            "hs.db",
        ] {
            let e = DatabaseUrl::parse(bad).unwrap_err().to_string();
            assert!(!e.contains("topsecret"), "{e}");
        }
        assert!(
            DatabaseUrl::parse("mysql://h/db")
                .unwrap_err()
                .to_string()
                .contains("`mysql`")
        );
    }

    #[test]
    fn secrets_never_show() {
        let settings = S3Settings {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: Secret::new("wJalrXUtnFEMI"),
            ..S3Settings::default()
        };
        for shown in [format!("{settings:?}"), toml::to_string(&settings).unwrap()] {
            assert!(!shown.contains("wJalrXUtnFEMI"), "{shown}");
            assert!(shown.contains("****"), "{shown}");
        }
        assert_eq!(settings.secret_access_key.expose(), "wJalrXUtnFEMI");
        assert_eq!(format!("{:?}", Secret::default()), "\"\"");
    }

    #[test]
    fn blob_urls() {
        assert_eq!(
            BlobsUrl::parse("file://data/blobs").unwrap(),
            BlobsUrl::File("data/blobs".into())
        );
        assert_eq!(
            BlobsUrl::parse("file:///var/hs").unwrap().to_string(),
            "file:///var/hs"
        );
        assert_eq!(
            BlobsUrl::parse("s3://hs-blobs").unwrap(),
            BlobsUrl::S3 {
                bucket: "hs-blobs".into(),
                prefix: None
            }
        );
        let with_prefix = BlobsUrl::parse("s3://hs-blobs/prod/eu/").unwrap();
        assert_eq!(with_prefix.to_string(), "s3://hs-blobs/prod/eu");
        assert!(BlobsUrl::parse("s3://Bad_Bucket").is_err());
        assert!(BlobsUrl::parse("s3://").is_err());
        assert!(BlobsUrl::parse("gs://bucket").is_err());
        assert!(BlobsUrl::parse("file://").is_err());
    }
}
