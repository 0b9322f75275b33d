//! Storage URLs, parsed once when the configuration loads: which metadata database and
//! which blob store to open. A URL may carry a password; its `Debug`, `Display` and
//! serialized forms (logs, `--print-config`) show `****` instead, so a secret never
//! reaches a log line or a terminal. Only [`DatabaseUrl::expose_secret`] hands out
//! the real text, to the backend that connects with it.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Shown in place of a secret.
const REDACTED: &str = "****";

/// Query parameters of a PostgreSQL URL that carry secrets.
const SECRET_PARAMETERS: &[&str] = &["password", "sslpassword", "sslkey"];

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

/// Replaces the password in the authority and secret query parameters.
fn redact_url(text: &str) -> String {
    let Ok(mut url) = url::Url::parse(text) else {
        // Unreachable for a parsed DatabaseUrl; never risk showing the original.
        return REDACTED.into();
    };
    if url.password().is_some() {
        let _ = url.set_password(Some(REDACTED));
    }
    let has_secret = url
        .query_pairs()
        .any(|(k, _)| SECRET_PARAMETERS.contains(&k.as_ref()));
    if has_secret {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let v = if SECRET_PARAMETERS.contains(&k.as_ref()) {
                    REDACTED.to_owned()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.to_string()
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
}

impl BlobsUrl {
    pub fn parse(text: &str) -> Result<Self, UrlError> {
        let text = text.trim();
        match text.strip_prefix("file://") {
            Some("") => Err(UrlError(
                "file:// URL names no folder: use file://DIR".into(),
            )),
            Some(dir) => Ok(Self::File(PathBuf::from(dir))),
            None => Err(UrlError(format!(
                "unsupported blob store URL `{text}`: use file://DIR"
            ))),
        }
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Self::File(_) => "file",
        }
    }
}

impl fmt::Display for BlobsUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(dir) => write!(f, "file://{}", dir.display()),
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
    fn blob_urls() {
        assert_eq!(
            BlobsUrl::parse("file://data/blobs").unwrap(),
            BlobsUrl::File("data/blobs".into())
        );
        assert_eq!(
            BlobsUrl::parse("file:///var/hs").unwrap().to_string(),
            "file:///var/hs"
        );
        assert!(BlobsUrl::parse("s3://bucket").is_err());
        assert!(BlobsUrl::parse("file://").is_err());
    }
}
