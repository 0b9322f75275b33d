//! Configuration: the embedded `config.default.toml`, then an optional TOML file, then
//! `HOMESERVER__<SECTION>__<KEY>` environment variables, each overriding the one before.
//! Unknown keys are refused with a message naming them, so a typo never goes unnoticed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::{Deserialize, Serialize};

/// The defaults, embedded at build time.
pub const DEFAULT_CONFIG: &str = include_str!("../config.default.toml");

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub http: HttpConfig,
    pub admin: AdminConfig,
    pub metrics: MetricsConfig,
    pub rate_limit: RateLimitConfig,
    pub storage: StorageConfig,
    pub signup: SignupConfig,
    pub policies: PoliciesConfig,
    pub keys: KeysConfig,
    pub logging: LoggingConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Address of the plain HTTP API listener.
    pub listen: SocketAddr,
    /// Seconds a client has to send a complete request head (of connecting, for the
    /// first request; of the previous response, for later ones).
    pub header_read_timeout_secs: u64,
    /// Seconds a kept-alive connection may have no request in flight before it is closed.
    pub idle_timeout_secs: u64,
    /// Open connections at most, per listener.
    pub max_connections: usize,
    /// Seconds an upload may send no body bytes before it is dropped.
    pub body_idle_timeout_secs: u64,
    /// Bytes all signed uploads without a declared digest may hold in memory at once.
    pub unproven_upload_memory_bytes: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin listener.
    pub listen: SocketAddr,
    /// Bearer password; empty turns the admin server off.
    pub password: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address of the metrics listener; empty turns it off.
    #[serde(with = "optional_addr")]
    pub listen: Option<SocketAddr>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    pub enabled: bool,
    /// Per client IP, for callers without credentials.
    pub anonymous_per_minute: u32,
    /// Per public key, for signed callers.
    pub authenticated_per_minute: u32,
    /// Per client IP, for the signup-token check (always on).
    pub signup_token_check_per_minute: u32,
    /// Peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<std::net::IpAddr>,
}

/// `""` ⇄ None for optional listen addresses.
mod optional_addr {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(a) => s.collect_str(a),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        let text = String::deserialize(d)?;
        if text.trim().is_empty() {
            return Ok(None);
        }
        text.parse().map(Some).map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// `sqlite://PATH` for the metadata database.
    pub database_url: String,
    /// `file://DIR` for the blob store.
    pub blobs: String,
    /// Per-user quota in bytes; 0 = unlimited.
    pub quota_bytes: u64,
    /// Largest value in bytes.
    pub max_value_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SignupMode {
    /// Any key may sign up.
    Open,
    /// A signup token is required.
    Token,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignupConfig {
    pub mode: SignupMode,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoliciesConfig {
    /// Folder of guest modules and their data.
    pub dir: PathBuf,
    /// Where compiled guests are cached; empty = no cache.
    pub cache_dir: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeysConfig {
    /// The server's secret key file (64 hex chars), created on first start.
    pub secret_key_file: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingConfig {
    pub format: LogFormat,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Defaults, then `file` if given, then the process environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULT_CONFIG));
        if let Some(path) = file {
            // Read it ourselves so a missing file is an error, not silently skipped.
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            figment = figment.merge(Toml::string(&text));
        }
        figment = figment.merge(Env::prefixed("HOMESERVER__").split("__"));
        let config: Config = figment
            .extract()
            .map_err(|e| ConfigError::Invalid(describe(e)))?;
        config.validate()?;
        Ok(config)
    }

    /// Only the embedded defaults (for tests and tools).
    pub fn defaults() -> Self {
        Figment::from(Toml::string(DEFAULT_CONFIG))
            .extract()
            .expect("embedded default config is valid")
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let storage = &self.storage;
        if !storage.database_url.starts_with("sqlite:") {
            return Err(ConfigError::Invalid(format!(
                "storage.database_url: `{}` is not supported (use sqlite://PATH)",
                storage.database_url
            )));
        }
        if !storage.blobs.starts_with("file://") {
            return Err(ConfigError::Invalid(format!(
                "storage.blobs: `{}` is not supported (use file://DIR)",
                storage.blobs
            )));
        }
        let limits = &self.rate_limit;
        for (key, value) in [
            (
                "rate_limit.anonymous_per_minute",
                limits.anonymous_per_minute,
            ),
            (
                "rate_limit.authenticated_per_minute",
                limits.authenticated_per_minute,
            ),
            (
                "rate_limit.signup_token_check_per_minute",
                limits.signup_token_check_per_minute,
            ),
        ] {
            if value == 0 {
                return Err(ConfigError::Invalid(format!(
                    "{key} must be at least 1 (set rate_limit.enabled = false to turn limits off)"
                )));
            }
        }
        for (key, value) in [
            (
                "http.header_read_timeout_secs",
                self.http.header_read_timeout_secs,
            ),
            ("http.idle_timeout_secs", self.http.idle_timeout_secs),
            (
                "http.body_idle_timeout_secs",
                self.http.body_idle_timeout_secs,
            ),
            ("http.max_connections", self.http.max_connections as u64),
        ] {
            if value == 0 {
                return Err(ConfigError::Invalid(format!("{key} must be at least 1")));
            }
        }
        if storage.max_value_bytes == 0 {
            return Err(ConfigError::Invalid(
                "storage.max_value_bytes must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Turns figment's errors into one line per problem, each naming the key.
fn describe(error: figment::Error) -> String {
    error
        .into_iter()
        .map(|e| {
            let key = e.path.join(".");
            let msg = e.kind.to_string();
            if key.is_empty() {
                msg
            } else {
                format!("{key}: {msg}")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_design() {
        let c = Config::defaults();
        assert_eq!(c.http.listen.to_string(), "127.0.0.1:6286");
        assert_eq!(c.storage.quota_bytes, 100 * 1024 * 1024);
        assert_eq!(c.storage.max_value_bytes, 10 * 1024 * 1024);
        assert_eq!(c.signup.mode, SignupMode::Open);
    }

    #[test]
    fn file_overrides_defaults_and_unknown_keys_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[storage]\nquota_bytes = 5\n").unwrap();
        let c = Config::load(Some(&path)).unwrap();
        assert_eq!(c.storage.quota_bytes, 5);
        assert_eq!(c.storage.max_value_bytes, 10 * 1024 * 1024);

        std::fs::write(&path, "[storage]\nquota_byte = 5\n").unwrap();
        let err = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("quota_byte"), "{err}");

        std::fs::write(&path, "[http]\nlisten = \"nonsense\"\n").unwrap();
        let err = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("http.listen"), "{err}");

        let err = Config::load(Some(&dir.path().join("missing.toml"))).unwrap_err();
        assert!(err.to_string().contains("missing.toml"));
    }

    #[test]
    fn design_sample_config_parses() {
        // The subset of DESIGN.md's sample that this build implements.
        let sample = r#"
            [http]
            listen = "127.0.0.1:6286"
            [admin]
            listen = "127.0.0.1:6288"
            password = "..."
            [metrics]
            listen = "127.0.0.1:6289"
            [storage]
            database_url = "sqlite://data/hs.db"
            blobs = "file://data/blobs"
            quota_bytes = 104857600
            max_value_bytes = 10485760
            [signup]
            mode = "open"
            [rate_limit]
            enabled = true
            anonymous_per_minute = 10
            authenticated_per_minute = 100
            [policies]
            dir = "policies"
            [keys]
            secret_key_file = "data/server.key"
        "#;
        let c: Config = Figment::from(Toml::string(DEFAULT_CONFIG))
            .merge(Toml::string(sample))
            .extract()
            .unwrap();
        c.validate().unwrap();
    }
}
