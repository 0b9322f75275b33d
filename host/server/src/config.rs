//! Configuration: the embedded `config.default.toml`, then an optional TOML file, then
//! `HOMESERVER__<SECTION>__<KEY>` environment variables, each overriding the one before.
//! Unknown keys are refused with a message naming them, so a typo never goes unnoticed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::{Deserialize, Serialize};

use crate::persistence::{BlobsUrl, DatabaseUrl, S3Settings, Secret};

/// The defaults, embedded at build time.
pub const DEFAULT_CONFIG: &str = include_str!("../config.default.toml");

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub http: HttpConfig,
    pub tls: TlsConfig,
    pub pkarr: PkarrConfig,
    pub admin: AdminConfig,
    pub metrics: MetricsConfig,
    pub rate_limit: RateLimitConfig,
    pub storage: StorageConfig,
    /// How to reach the S3-compatible store of `storage.blobs = "s3://..."`.
    pub s3: S3Settings,
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
    /// Open connections one client address may hold, per listener (trusted proxies
    /// are exempt); 0 = only `max_connections`.
    pub max_connections_per_ip: usize,
    /// Event streams (`/events-stream`) one client address may have open at once;
    /// 0 = no limit of their own.
    pub max_streams_per_ip: usize,
    /// A live event stream, caught up with its history, writes at most once per this
    /// many ms: events that come in meanwhile go out together in the next write (one
    /// after a quiet spell goes out at once). 0 = every batch at once.
    pub event_stream_write_interval_ms: u64,
    /// Seconds an upload may send no body bytes before it is dropped.
    pub body_idle_timeout_secs: u64,
    /// Seconds a whole upload may take, however steadily it sends.
    pub upload_timeout_secs: u64,
    /// Bytes all signed uploads without a declared digest may hold in memory at once.
    pub unproven_upload_memory_bytes: usize,
    /// PEM certificate chain: when set with `tls_key_file`, the plain listener speaks
    /// HTTPS with this ordinary (X.509) certificate, re-read when the file changes.
    #[serde(with = "optional_path")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    #[serde(with = "optional_path")]
    pub tls_key_file: Option<PathBuf>,
    /// Origins whose web pages may call this API from a browser (CORS; both client
    /// listeners, never the admin API): `["*"]` any, a list of `scheme://host[:port]`,
    /// or `[]` none. See [`crate::http::cors`].
    pub cors_allowed_origins: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Address of the raw-public-key TLS listener (RFC 7250, the server's own key);
    /// empty turns it off.
    #[serde(with = "optional_addr")]
    pub listen: Option<SocketAddr>,
}

/// The domain and port of `pkarr.public_url` (None when empty): an `https://` URL
/// whose host is a domain name (an HTTPS record's target is a name).
pub fn public_endpoint(url: &str) -> Result<Option<(String, u16)>, String> {
    if url.trim().is_empty() {
        return Ok(None);
    }
    let parsed = url::Url::parse(url.trim()).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    if parsed.scheme() != "https" {
        return Err(format!("`{url}` must be an https:// URL"));
    }
    if parsed.path() != "/" || parsed.query().is_some() {
        return Err(format!(
            "`{url}`: only scheme, host and port (the API is at the root)"
        ));
    }
    match parsed.host() {
        Some(url::Host::Domain(domain)) => Ok(Some((
            domain.trim_end_matches('.').to_owned(),
            parsed.port_or_known_default().unwrap_or(443),
        ))),
        _ => Err(format!(
            "`{url}`: the host must be a domain name, not an address"
        )),
    }
}

/// Publishing on the mainline DHT (pkarr).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PkarrConfig {
    /// Publish the server's record and republish users' records.
    pub enabled: bool,
    /// DHT bootstrap nodes (`host:port`); empty = mainline's defaults.
    pub bootstrap: Vec<String>,
    /// pkarr relays to publish through as well; empty = none.
    pub relays: Vec<String>,
    /// Seconds between publications.
    pub republish_interval_secs: u64,
    /// The address published in the server's record; empty = the TLS listener's.
    pub host: String,
    /// Milliseconds one DHT request may take.
    pub request_timeout_ms: u64,
    /// The server's ordinary `https://` URL, published as a second endpoint; empty = none.
    pub public_url: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin listener.
    pub listen: SocketAddr,
    /// Bearer password; empty turns the admin server off. Shown as `****`.
    pub password: Secret,
    /// Host names accepted in `Host` besides IP literals and `localhost`.
    pub allowed_hosts: Vec<String>,
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

/// `""` ⇄ None for optional file paths.
mod optional_path {
    use std::path::PathBuf;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(p) => s.collect_str(&p.display()),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
        let text = String::deserialize(d)?;
        Ok((!text.trim().is_empty()).then(|| PathBuf::from(text)))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// The metadata database: `sqlite://PATH` or `postgres://USER:PASSWORD@HOST/DB`.
    /// Printed and logged with its password replaced by `****`.
    pub database_url: DatabaseUrl,
    /// A file holding the database URL (e.g. a mounted secret); when set, its content
    /// (trimmed) replaces `database_url`, so the password need not be in the config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database_url_file: Option<PathBuf>,
    /// The blob store: `file://DIR` or `s3://BUCKET[/PREFIX]` (see `[s3]`).
    pub blobs: BlobsUrl,
    /// Per-user quota in bytes; 0 = unlimited.
    pub quota_bytes: u64,
    /// Largest value in bytes.
    pub max_value_bytes: u64,
    /// Values up to this many bytes live in their entry's database row (no blob, no
    /// file or object, no fsync of their own); larger ones in the blob store. 0 = all
    /// in the blob store.
    pub inline_max_bytes: u64,
    /// Connections to a shared database (PostgreSQL) per server instance.
    pub pool_size: u32,
    /// Seconds any metadata or blob operation may take before the request gets 503
    /// (a backing store that is down or unreachable).
    pub timeout_secs: u64,
    /// Milliseconds between looks for events this process was not told about: another
    /// instance's commits whose PostgreSQL notification was lost (a reconnect).
    pub events_poll_ms: u64,
    /// Seconds a value replaced or deleted stays in the blob store before the sweep
    /// deletes it: a database snapshot plus a blob copy finished within this restores
    /// every value the snapshot points at.
    pub blob_grace_secs: u64,
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
    /// What a slot whose module fails to load at start does: stop the server (default),
    /// or serve the slot's safe default until a reload fixes it.
    pub on_start_error: PolicyStartMode,
    /// Wall-clock budget of one guest call.
    pub call_deadline_ms: u64,
    /// Linear memory one guest instance may use.
    pub memory_limit_mb: u64,
    /// Calls after which a warm instance is retired.
    pub instance_max_calls: u64,
    /// Warm instances kept per slot; 0 = twice the cores.
    pub instances_per_slot: usize,
    /// Guest instances alive at once across all slots.
    pub max_instances: u32,
    /// Calls of one slot running at once; 0 = eight per core.
    pub guest_concurrency: usize,
    /// How long a call waits for a place before its request is answered 503.
    pub guest_wait_ms: u64,
    /// The share of the cores guest calls may keep busy together (0 < share <= 1).
    pub guest_cpu_share: f64,
    /// No longer used (guest calls run on the async workers since 0.10): accepted so
    /// an older config file still loads, with a warning at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_threads: Option<usize>,
    /// No longer used, like `guest_threads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_nice: Option<u8>,
}

impl PoliciesConfig {
    /// The settings that are set but no longer do anything, for a warning at start.
    pub fn retired_settings(&self) -> Vec<&'static str> {
        let mut retired = Vec::new();
        if self.guest_threads.is_some() {
            retired.push("policies.guest_threads");
        }
        if self.guest_nice.is_some() {
            retired.push("policies.guest_nice");
        }
        retired
    }
}

/// See [`PoliciesConfig::on_start_error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyStartMode {
    /// Refuse to start, naming the slot and the error.
    Stop,
    /// Start; the slot yields its safe default (the capability policy: 503 to every
    /// request it decides), with an ERROR log, until a reload loads a working module.
    SafeDefault,
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
    /// One line per request (tracing target `access`) on the client and admin listeners.
    pub access: bool,
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

impl StorageConfig {
    /// The settings every backend is opened with.
    pub fn backend_options(&self) -> crate::persistence::BackendOptions {
        crate::persistence::BackendOptions {
            max_connections: self.pool_size,
            timeout: std::time::Duration::from_secs(self.timeout_secs),
            group_commit: true,
        }
    }
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
            figment = figment.merge(Toml::string(&logging_alias(&text, path)?));
        }
        figment = figment.merge(Env::prefixed(ENV_PREFIX).split("__").map(|key| {
            // Keys are still as written here (lower-cased later).
            let alias = format!("{LOGGING_ALIAS}.");
            match key.as_str().get(..alias.len()) {
                Some(head) if head.eq_ignore_ascii_case(&alias) => {
                    format!("{LOGGING_SECTION}.{}", &key.as_str()[alias.len()..]).into()
                }
                _ => key.into(),
            }
        }));
        let unknown = unknown_keys(&figment, file);
        if !unknown.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "unknown key{}: {} (see `homeserver --print-config` for every key)",
                if unknown.len() == 1 { "" } else { "s" },
                unknown.join(", ")
            )));
        }
        let mut config: Config = figment
            .extract()
            .map_err(|e| ConfigError::Invalid(describe(e, file)))?;
        config.read_secret_files()?;
        check_loaded(&config, &figment, file)?;
        Ok(config)
    }

    /// Defaults, then `file`, without the environment (a second deployment's config,
    /// e.g. the target of `homeserver migrate`).
    pub fn load_file_only(file: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
            path: file.to_owned(),
            source,
        })?;
        let figment = Figment::from(Toml::string(DEFAULT_CONFIG))
            .merge(Toml::string(&logging_alias(&text, file)?));
        let unknown = unknown_keys(&figment, Some(file));
        if !unknown.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "unknown keys: {}",
                unknown.join(", ")
            )));
        }
        let mut config: Config = figment
            .extract()
            .map_err(|e| ConfigError::Invalid(describe(e, Some(file))))?;
        config.read_secret_files()?;
        check_loaded(&config, &figment, Some(file))?;
        Ok(config)
    }

    /// Only the embedded defaults (for tests and tools).
    pub fn defaults() -> Self {
        Figment::from(Toml::string(DEFAULT_CONFIG))
            .extract()
            .expect("embedded default config is valid")
    }

    /// Replaces settings that have a `*_file` variant with the file's content.
    fn read_secret_files(&mut self) -> Result<(), ConfigError> {
        let storage = &mut self.storage;
        if let Some(path) = storage
            .database_url_file
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty())
        {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            storage.database_url = DatabaseUrl::parse(&text).map_err(|e| {
                ConfigError::Invalid(format!(
                    "storage.database_url_file ({}): {e}",
                    path.display()
                ))
            })?;
        }
        if let Some(path) = self
            .s3
            .secret_access_key_file
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty())
        {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            self.s3.secret_access_key = Secret::new(text.trim());
        }
        Ok(())
    }

    /// How old an unreferenced blob must be before the sweep (or `fsck`) may delete it:
    /// older than any upload still in flight on any instance can be, with its commit
    /// (an S3 multipart object is dated when its upload began), and at least 10 min.
    pub fn orphan_min_age(&self) -> std::time::Duration {
        let in_flight = self.http.upload_timeout_secs + 2 * self.storage.timeout_secs + 60;
        std::time::Duration::from_secs(in_flight.max(600))
    }

    /// Checks the rules no type expresses (limits at least 1, keys that go together).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check(&|key| key.to_owned())
    }

    /// [`Config::validate`], naming each setting as `name` says (where it came from: an
    /// environment variable or a file), and every problem, not only the first.
    fn check(&self, name: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
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
                problems.push(format!(
                    "{} must be at least 1 (set rate_limit.enabled = false to turn limits off)",
                    name(key)
                ));
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
            ("http.upload_timeout_secs", self.http.upload_timeout_secs),
            ("http.max_connections", self.http.max_connections as u64),
            ("storage.timeout_secs", self.storage.timeout_secs),
            ("storage.events_poll_ms", self.storage.events_poll_ms),
            (
                "pkarr.republish_interval_secs",
                self.pkarr.republish_interval_secs,
            ),
            ("pkarr.request_timeout_ms", self.pkarr.request_timeout_ms),
            ("storage.pool_size", u64::from(self.storage.pool_size)),
            ("storage.max_value_bytes", self.storage.max_value_bytes),
            ("policies.call_deadline_ms", self.policies.call_deadline_ms),
            ("policies.memory_limit_mb", self.policies.memory_limit_mb),
            (
                "policies.instance_max_calls",
                self.policies.instance_max_calls,
            ),
            (
                "policies.max_instances",
                u64::from(self.policies.max_instances),
            ),
            ("policies.guest_wait_ms", self.policies.guest_wait_ms),
        ] {
            if value == 0 {
                problems.push(format!("{} must be at least 1", name(key)));
            }
        }
        if self.storage.inline_max_bytes > crate::persistence::values::MAX_INLINE_BYTES {
            problems.push(format!(
                "{} must be at most {} (1 MiB: a row is read whole with its entry; larger \
                 values belong in the blob store)",
                name("storage.inline_max_bytes"),
                crate::persistence::values::MAX_INLINE_BYTES
            ));
        }
        if self.http.event_stream_write_interval_ms > 1000 {
            problems.push(format!(
                "{} must be at most 1000 (events would wait over a second to go out)",
                name("http.event_stream_write_interval_ms")
            ));
        }
        // Beyond wasm32's 4 GiB a limit means nothing; a thread count like this is a typo.
        if self.policies.memory_limit_mb > 4096 {
            problems.push(format!(
                "{} must be at most 4096 (a wasm32 guest cannot address more)",
                name("policies.memory_limit_mb")
            ));
        }
        let share = self.policies.guest_cpu_share;
        if !(0.01..=1.0).contains(&share) {
            problems.push(format!(
                "{} must be from 0.01 to 1 (a share of the cores, e.g. 0.25)",
                name("policies.guest_cpu_share")
            ));
        }
        // Each call running (or waiting for the share) holds a guest instance, and the
        // instances are shared by the slots: more calls than instances would fail at
        // instantiation (500) instead of waiting for a place (503).
        let instances = usize::try_from(self.policies.max_instances).unwrap_or(usize::MAX);
        if self.policies.guest_concurrency > instances {
            problems.push(format!(
                "{} must be at most {} ({}: each call holds an instance; 0 = eight per \
                 core, at most a quarter of the instances)",
                name("policies.guest_concurrency"),
                instances,
                name("policies.max_instances")
            ));
        }
        if self.http.tls_cert_file.is_some() != self.http.tls_key_file.is_some() {
            problems.push(format!(
                "{} and {} go together: set both or neither",
                name("http.tls_cert_file"),
                name("http.tls_key_file")
            ));
        }
        if !self.pkarr.host.is_empty() && self.pkarr.host.parse::<std::net::IpAddr>().is_err() {
            problems.push(format!(
                "{} must be an IP address (the record's A/AAAA), got `{}`",
                name("pkarr.host"),
                self.pkarr.host
            ));
        }
        if let Err(e) = crate::http::cors::Cors::from_config(&self.http.cors_allowed_origins) {
            problems.push(format!("{}: {e}", name("http.cors_allowed_origins")));
        }
        if let Err(e) = public_endpoint(&self.pkarr.public_url) {
            problems.push(format!("{}: {e}", name("pkarr.public_url")));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems.join("; ")))
        }
    }
}

/// Checks `config`, naming each setting where `figment` got it from.
fn check_loaded(
    config: &Config,
    figment: &Figment,
    file: Option<&Path>,
) -> Result<(), ConfigError> {
    config.check(&|key| {
        let path: Vec<String> = key.split('.').map(str::to_owned).collect();
        origin(figment.find_metadata(key), &path, file)
    })
}

/// The logging section's name; `[log]` (and `HOMESERVER__LOG__*`) is accepted for it,
/// the name the issue tracker and other servers use.
const LOGGING_SECTION: &str = "logging";
const LOGGING_ALIAS: &str = "log";

/// `text` with a `[log]` section renamed `[logging]` (merged with one that is there
/// too; a key in both is refused). Text that is not valid TOML is passed on for
/// figment to report.
fn logging_alias(text: &str, path: &Path) -> Result<String, ConfigError> {
    let Ok(mut table) = text.parse::<toml::Table>() else {
        return Ok(text.to_owned());
    };
    let Some(alias) = table.remove(LOGGING_ALIAS) else {
        return Ok(text.to_owned());
    };
    let toml::Value::Table(alias) = alias else {
        return Err(ConfigError::Invalid(format!(
            "{LOGGING_ALIAS} (in {}) must be a section: [{LOGGING_ALIAS}]",
            path.display()
        )));
    };
    let logging = table
        .entry(LOGGING_SECTION)
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let toml::Value::Table(logging) = logging else {
        return Ok(text.to_owned());
    };
    for (key, value) in alias {
        if logging.contains_key(&key) {
            return Err(ConfigError::Invalid(format!(
                "{key} is set in both [{LOGGING_ALIAS}] and [{LOGGING_SECTION}] (in {}): \
                 they are one section, keep one",
                path.display()
            )));
        }
        logging.insert(key, value);
    }
    Ok(table.to_string())
}

/// Prefix of the environment variables that override settings.
const ENV_PREFIX: &str = "HOMESERVER__";

/// Settings that have no default (so are absent from config.default.toml).
const OPTIONAL_KEYS: &[&str] = &[
    "storage.database_url_file",
    "s3.secret_access_key_file",
    // Retired in 0.10 (guest threads); accepted with a warning (`retired_settings`).
    "policies.guest_threads",
    "policies.guest_nice",
];

/// Where a setting came from, as the operator wrote it: the environment variable's
/// name, or the key and the config file.
fn origin(metadata: Option<&figment::Metadata>, key: &[String], file: Option<&Path>) -> String {
    let from_env = metadata.is_some_and(|m| m.name.contains("environment"));
    if from_env {
        return format!("{ENV_PREFIX}{}", key.join("__").to_ascii_uppercase());
    }
    match file {
        Some(path) => format!("{} (in {})", key.join("."), path.display()),
        None => key.join("."),
    }
}

/// Every key set in a file or the environment that no setting has (serde would name
/// only the first).
fn unknown_keys(figment: &Figment, file: Option<&Path>) -> Vec<String> {
    let Ok(known) = DEFAULT_CONFIG.parse::<toml::Table>() else {
        return Vec::new();
    };
    let Ok(merged) = figment.extract::<figment::value::Dict>() else {
        return Vec::new();
    };
    let mut unknown = Vec::new();
    for (section, value) in &merged {
        let keys = match (known.get(section), value) {
            (Some(toml::Value::Table(keys)), figment::value::Value::Dict(_, set)) => (keys, set),
            (Some(_), _) => continue,
            (None, value) => {
                let metadata = figment.get_metadata(value.tag());
                unknown.push(origin(metadata, std::slice::from_ref(section), file));
                continue;
            }
        };
        for (key, value) in keys.1 {
            let dotted = format!("{section}.{key}");
            if keys.0.contains_key(key) || OPTIONAL_KEYS.contains(&dotted.as_str()) {
                continue;
            }
            let metadata = figment.get_metadata(value.tag());
            unknown.push(origin(metadata, &[section.clone(), key.clone()], file));
        }
    }
    unknown
}

/// Turns figment's errors into one line per problem, each naming the setting as the
/// operator wrote it (the key in the file, or the environment variable).
fn describe(error: figment::Error, file: Option<&Path>) -> String {
    error
        .into_iter()
        .map(|e| {
            let msg = e.kind.to_string();
            if e.path.is_empty() {
                msg
            } else {
                format!("{}: {msg}", origin(e.metadata.as_ref(), &e.path, file))
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
// figment's Jail closures return figment::Error, which is large; fine in tests.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_design() {
        let c = Config::defaults();
        assert_eq!(c.http.listen.to_string(), "127.0.0.1:6286");
        assert_eq!(c.storage.quota_bytes, 100 * 1024 * 1024);
        assert_eq!(c.storage.max_value_bytes, 10 * 1024 * 1024);
        assert_eq!(c.signup.mode, SignupMode::Open);
        // Chosen for a public server and a first try (docs/OPERATIONS.md "Rate limits"
        // says why); the design's sample configuration shows lower figures.
        assert_eq!(c.rate_limit.anonymous_per_minute, 600);
        assert_eq!(c.rate_limit.authenticated_per_minute, 1200);
        assert_eq!(c.rate_limit.signup_token_check_per_minute, 10);
    }

    #[test]
    fn public_urls() {
        assert_eq!(public_endpoint("").unwrap(), None);
        assert_eq!(
            public_endpoint("https://hs.example.org").unwrap(),
            Some(("hs.example.org".to_owned(), 443))
        );
        assert_eq!(
            public_endpoint("https://hs.example.org:8443/").unwrap(),
            Some(("hs.example.org".to_owned(), 8443))
        );
        for bad in [
            "http://hs.example.org",
            "https://203.0.113.7",
            "https://x.org/api",
            "nope",
        ] {
            assert!(public_endpoint(bad).is_err(), "{bad}");
        }
    }

    /// Every secret setting set, the whole configuration logged (`Debug`) and printed
    /// (`--print-config`'s TOML): no secret in either.
    #[test]
    fn no_secret_shows_when_the_config_is_logged_or_printed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            r#"
            [admin]
            password = "s3cret-admin"
            [storage]
            database_url = "postgres://hs:s3cret-db@127.0.0.1/hs?sslpassword=s3cret-ssl"
            blobs = "s3://bucket/prefix"
            [s3]
            access_key_id = "AKIAEXAMPLE"
            secret_access_key = "s3cret-s3"
            "#,
        )
        .unwrap();
        let c = Config::load_file_only(&path).unwrap();
        assert_eq!(c.admin.password.expose(), "s3cret-admin");
        let logged = format!("{c:?} {c:#?}");
        let printed = toml::to_string_pretty(&c).unwrap();
        for shown in [&logged, &printed] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("****"), "{shown}");
        }
        assert!(printed.contains("AKIAEXAMPLE"), "not a secret: {printed}");
    }

    /// `[log]` is another name for `[logging]`, in a file and in the environment.
    #[test]
    fn the_log_section_is_the_logging_section() {
        figment::Jail::expect_with(|jail| {
            assert!(Config::defaults().logging.access, "on by default");
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("c.toml");
            std::fs::write(&path, "[log]\naccess = false\nformat = \"json\"\n").unwrap();
            let c = Config::load(Some(&path)).unwrap();
            assert!(!c.logging.access);
            assert_eq!(c.logging.format, LogFormat::Json);
            assert!(!Config::load_file_only(&path).unwrap().logging.access);

            // Both names in one file: merged, unless they disagree on a key.
            std::fs::write(
                &path,
                "[log]\naccess = false\n[logging]\nformat = \"json\"\n",
            )
            .unwrap();
            let c = Config::load(Some(&path)).unwrap();
            assert!(!c.logging.access);
            assert_eq!(c.logging.format, LogFormat::Json);
            std::fs::write(&path, "[log]\naccess = false\n[logging]\naccess = true\n").unwrap();
            let err = Config::load(Some(&path)).unwrap_err().to_string();
            assert!(
                err.contains("access is set in both [log] and [logging]"),
                "{err}"
            );

            // The environment, either name; it overrides the file.
            std::fs::write(&path, "[log]\naccess = false\n").unwrap();
            jail.set_env("HOMESERVER__LOG__ACCESS", "true");
            assert!(Config::load(Some(&path)).unwrap().logging.access);
            jail.set_env("HOMESERVER__LOG__ACCESS", "false");
            assert!(!Config::load(None).unwrap().logging.access);
            jail.clear_env();
            jail.set_env("HOMESERVER__LOGGING__ACCESS", "false");
            assert!(!Config::load(None).unwrap().logging.access);
            Ok(())
        });
    }

    #[test]
    fn an_event_stream_write_interval_over_a_second_is_refused() {
        figment::Jail::expect_with(|_| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("c.toml");
            std::fs::write(&path, "[http]\nevent_stream_write_interval_ms = 5000\n").unwrap();
            let err = Config::load(Some(&path)).unwrap_err().to_string();
            assert!(
                err.contains("event_stream_write_interval_ms (in")
                    && err.contains("must be at most 1000"),
                "{err}"
            );
            std::fs::write(&path, "[http]\nevent_stream_write_interval_ms = 0\n").unwrap();
            assert_eq!(
                Config::load(Some(&path))
                    .unwrap()
                    .http
                    .event_stream_write_interval_ms,
                0
            );
            Ok(())
        });
    }

    #[test]
    fn guest_settings_are_checked_and_retired_ones_still_load() {
        figment::Jail::expect_with(|jail| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("c.toml");
            std::fs::write(
                &path,
                "[policies]\nguest_cpu_share = 0\nguest_concurrency = 300\n",
            )
            .unwrap();
            let err = Config::load(Some(&path)).unwrap_err().to_string();
            assert!(
                err.contains("guest_cpu_share (in") && err.contains("must be from 0.01 to 1"),
                "{err}"
            );
            assert!(
                err.contains("guest_concurrency (in") && err.contains("must be at most 256"),
                "{err}"
            );
            // A 0.9 config with the guest threads' settings loads; they are named for
            // the warning at start.
            std::fs::write(&path, "[policies]\nguest_threads = 4\nguest_nice = 10\n").unwrap();
            let config = Config::load(Some(&path)).unwrap();
            assert_eq!(
                config.policies.retired_settings(),
                ["policies.guest_threads", "policies.guest_nice"]
            );
            jail.set_env("HOMESERVER__POLICIES__GUEST_CPU_SHARE", "0.1");
            std::fs::write(&path, "").unwrap();
            let config = Config::load(Some(&path)).unwrap();
            assert_eq!(config.policies.guest_cpu_share, 0.1);
            assert!(config.policies.retired_settings().is_empty());
            Ok(())
        });
    }

    #[test]
    fn invalid_values_are_all_named_where_they_were_set() {
        figment::Jail::expect_with(|jail| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("c.toml");
            std::fs::write(&path, "[http]\nidle_timeout_secs = 0\n").unwrap();
            jail.set_env("HOMESERVER__RATE_LIMIT__ANONYMOUS_PER_MINUTE", "0");
            jail.set_env("HOMESERVER__STORAGE__POOL_SIZE", "0");
            let err = Config::load(Some(&path)).unwrap_err().to_string();
            assert!(
                err.contains("HOMESERVER__RATE_LIMIT__ANONYMOUS_PER_MINUTE must be at least 1"),
                "{err}"
            );
            assert!(
                err.contains("HOMESERVER__STORAGE__POOL_SIZE must be at least 1"),
                "{err}"
            );
            assert!(
                err.contains(&format!(
                    "http.idle_timeout_secs (in {}) must be at least 1",
                    path.display()
                )),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    fn cors_origins_come_from_the_file_or_the_environment() {
        figment::Jail::expect_with(|jail| {
            assert_eq!(Config::defaults().http.cors_allowed_origins, ["*"]);
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("c.toml");
            std::fs::write(
                &path,
                "[http]\ncors_allowed_origins = [\"*\", \"https://a.example\"]\n",
            )
            .unwrap();
            let err = Config::load(Some(&path)).unwrap_err().to_string();
            assert!(
                err.contains(&format!(
                    "http.cors_allowed_origins (in {}): `*` allows every origin",
                    path.display()
                )),
                "{err}"
            );
            jail.set_env(
                "HOMESERVER__HTTP__CORS_ALLOWED_ORIGINS",
                r#"["https://pubky.app", "http://localhost:5173"]"#,
            );
            let config = Config::load(None).unwrap();
            assert_eq!(
                config.http.cors_allowed_origins,
                ["https://pubky.app", "http://localhost:5173"]
            );
            jail.set_env("HOMESERVER__HTTP__CORS_ALLOWED_ORIGINS", r#"["pubky.app"]"#);
            let err = Config::load(None).unwrap_err().to_string();
            assert!(
                err.contains(
                    "HOMESERVER__HTTP__CORS_ALLOWED_ORIGINS: `pubky.app` is not an origin"
                ),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    fn file_overrides_defaults_and_unknown_keys_are_named() {
        // In a jail: another test sets HOMESERVER__ variables.
        figment::Jail::expect_with(|_| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("c.toml");
            std::fs::write(&path, "[storage]\nquota_bytes = 5\n").unwrap();
            let c = Config::load(Some(&path)).unwrap();
            assert_eq!(c.storage.quota_bytes, 5);
            assert_eq!(c.storage.max_value_bytes, 10 * 1024 * 1024);

            std::fs::write(&path, "[storage]\nquota_byte = 5\n").unwrap();
            let err = Config::load(Some(&path)).unwrap_err().to_string();
            assert!(err.contains("quota_byte"), "{err}");

            // Every unknown key is named, not only the first, with where it is.
            std::fs::write(
                &path,
                "[storage]\nquota_byte = 5\nblob = \"x\"\n[htp]\nlisten = \"x\"\n",
            )
            .unwrap();
            let err = Config::load(Some(&path)).unwrap_err().to_string();
            for key in ["storage.quota_byte", "storage.blob", "htp"] {
                assert!(err.contains(key), "{key} missing from: {err}");
            }
            assert!(err.contains("c.toml"), "{err}");

            std::fs::write(&path, "[http]\nlisten = \"nonsense\"\n").unwrap();
            let err = Config::load(Some(&path)).unwrap_err().to_string();
            assert!(err.contains("http.listen"), "{err}");

            let err = Config::load(Some(&dir.path().join("missing.toml"))).unwrap_err();
            assert!(err.to_string().contains("missing.toml"));
            Ok(())
        });
    }

    #[test]
    fn environment_variables_are_named_as_written() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("HOMESERVER__HTTP__LISTEN", "nonsense");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("HOMESERVER__HTTP__LISTEN"), "{err}");

            jail.set_env("HOMESERVER__HTTP__LISTEN", "127.0.0.1:1");
            jail.set_env("HOMESERVER__STORAGE__QUOTA_BYTE", "5");
            jail.set_env("HOMESERVER__HTTP__LISTN", "x");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("HOMESERVER__STORAGE__QUOTA_BYTE"), "{err}");
            assert!(err.contains("HOMESERVER__HTTP__LISTN"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn database_url_from_a_file_and_never_printed() {
        // In a jail: another test sets HOMESERVER__ variables.
        figment::Jail::expect_with(|_| {
            let dir = tempfile::tempdir().unwrap();
            let secret = dir.path().join("database-url");
            std::fs::write(&secret, "postgres://hs:pa55word@db.internal:5432/hs\n").unwrap();
            let path = dir.path().join("c.toml");
            std::fs::write(
                &path,
                format!("[storage]\ndatabase_url_file = \"{}\"\n", secret.display()),
            )
            .unwrap();
            let c = Config::load(Some(&path)).unwrap();
            assert_eq!(
                c.storage.database_url.expose_secret(),
                "postgres://hs:pa55word@db.internal:5432/hs"
            );
            let printed = toml::to_string_pretty(&c).unwrap();
            assert!(!printed.contains("pa55word"), "{printed}");
            assert!(printed.contains("hs:****@db.internal"), "{printed}");
            assert!(!format!("{c:?}").contains("pa55word"));

            std::fs::write(&secret, "mysql://x").unwrap();
            let err = Config::load(Some(&path)).unwrap_err().to_string();
            assert!(err.contains("database_url_file"), "{err}");
            std::fs::remove_file(&secret).unwrap();
            let err = Config::load(Some(&path)).unwrap_err().to_string();
            assert!(err.contains("database-url"), "{err}");

            std::fs::write(&path, "[storage]\nblobs = \"ftp://x\"\n").unwrap();
            let err = Config::load(Some(&path)).unwrap_err().to_string();
            assert!(err.contains("storage.blobs"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn design_sample_config_parses() {
        // The subset of the design's sample configuration that this build implements.
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
