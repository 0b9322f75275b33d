//! Settings that must never show: a password, an API key, a mnemonic, a URL with a
//! password in it. [`Secret`] and [`SecretUrl`] print `****` in their `Debug`, `Display`
//! and serialized forms (logs, `--print-config`), so a whole configuration can be logged
//! or printed; only `expose` hands out the real text, to the code that uses it. The
//! server and the bot hold every secret setting in one of these two types.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Shown in place of a secret.
pub const REDACTED: &str = "****";

/// Query parameters that carry secrets: PostgreSQL's (`password`, `sslpassword`,
/// `sslkey`) and Redis's (`pass`, `password`, as `redis+unix://` URLs carry it).
const SECRET_PARAMETERS: &[&str] = &["password", "sslpassword", "sslkey", "pass"];

/// A secret setting: shown as `****` when set (and as empty when not, so a reader can
/// tell whether it is set).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The secret itself, for the code that uses it. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Self {
        Self(text)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { REDACTED })
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "" } else { REDACTED })
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A URL that may carry a password (`redis://:pw@host`, `postgres://u:pw@host/db`, a
/// `password=` query parameter): shown with the password replaced by `****`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretUrl(String);

impl SecretUrl {
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The URL with its secrets, for the driver that connects. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with its secrets replaced by `****`.
    pub fn redacted(&self) -> String {
        redact_url(&self.0)
    }
}

impl From<&str> for SecretUrl {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.redacted(), f)
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl<'de> Deserialize<'de> for SecretUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self)
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `text` with the password of its authority and the values of secret query parameters
/// replaced by `****`. Text that is not a URL with an authority but has an `@` (it might
/// hold a password) is hidden whole; other text (a SQLite path) is returned as it is.
pub fn redact_url(text: &str) -> String {
    let Ok(mut url) = url::Url::parse(text) else {
        return if text.contains('@') {
            REDACTED.into()
        } else {
            text.into()
        };
    };
    // `user:password@host` without a scheme parses as scheme `user` with an opaque path:
    // no authority to find a password in, so hide it all.
    if url.cannot_be_a_base() && text.contains('@') {
        return REDACTED.into();
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_shows() {
        let secret = Secret::new("hunter2");
        for shown in [
            format!("{secret:?}"),
            format!("{secret}"),
            serde_json::to_string(&secret).unwrap(),
        ] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains(REDACTED), "{shown}");
        }
        assert_eq!(secret.expose(), "hunter2");
        assert_eq!(format!("{:?}", Secret::default()), "\"\"");
        let back: Secret = serde_json::from_str("\"hunter2\"").unwrap();
        assert_eq!(back, secret);
    }

    #[test]
    fn urls_lose_their_passwords() {
        for (text, shown) in [
            (
                "redis://:pw@127.0.0.1:6379/0",
                "redis://:****@127.0.0.1:6379/0",
            ),
            ("postgres://u:pw@db/x", "postgres://u:****@db/x"),
            (
                "postgres://u@db/x?sslmode=require&password=pw",
                "postgres://u@db/x?sslmode=require&password=****",
            ),
            (
                "redis+unix:///run/redis.sock?pass=pw&db=1",
                "redis+unix:///run/redis.sock?pass=****&db=1",
            ),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("sqlite://data/bot.db", "sqlite://data/bot.db"),
            ("data/bot.db", "data/bot.db"),
            ("u:pw@not a url", REDACTED),
            ("bot:pw@db.example/bot", REDACTED),
            ("sqlite::memory:", "sqlite::memory:"),
        ] {
            assert_eq!(redact_url(text), shown, "{text}");
            let url = SecretUrl::new(text);
            assert!(!format!("{url:?}{url}").contains("pw@"), "{text}");
            assert_eq!(url.expose(), text);
        }
    }
}
