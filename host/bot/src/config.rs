//! Configuration: the embedded `config.default.toml`, then an optional TOML file, then
//! `PKBOT__<SECTION>__<KEY>` environment variables, then the spec's own variable names
//! (`MENTION_POLL_INTERVAL_MS`, `WORKER_CONCURRENCY_SUMMARY`,
//! `WORKER_CONCURRENCY_FACTCHECK`, `WORKER_TYPE`, `BOT_MNEMONIC`), each overriding the
//! one before. Unknown keys are refused, so a typo never goes unnoticed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use homeserver_protocol::secret::{Secret, SecretUrl};
use serde::{Deserialize, Serialize};

/// The defaults, embedded at build time.
pub const DEFAULT_CONFIG: &str = include_str!("../config.default.toml");

/// The spec's environment variables and the settings they set.
const SPEC_ENV: [(&str, &str); 5] = [
    ("MENTION_POLL_INTERVAL_MS", "poller.interval_ms"),
    ("WORKER_CONCURRENCY_SUMMARY", "workers.summary_concurrency"),
    (
        "WORKER_CONCURRENCY_FACTCHECK",
        "workers.factcheck_concurrency",
    ),
    ("WORKER_TYPE", "workers.worker_type"),
    ("BOT_MNEMONIC", "identity.mnemonic"),
];

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BotConfig {
    pub homeserver: HomeserverConfig,
    pub identity: IdentityConfig,
    pub index: IndexConfig,
    pub poller: PollerConfig,
    pub workers: WorkersConfig,
    pub bus: BusConfig,
    pub router: RouterConfig,
    pub summary: SummaryConfig,
    pub factcheck: FactcheckConfig,
    pub ai: AiConfig,
    pub search: SearchConfig,
    pub safety: SafetyConfig,
    pub policies: PoliciesConfig,
    pub limits: LimitsConfig,
    pub storage: StorageConfig,
    pub http: HttpConfig,
    pub logging: LoggingConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HomeserverConfig {
    /// The homeserver the bot's account lives on.
    pub url: String,
    /// A signup token for a homeserver in token mode; empty = none.
    pub signup_token: Secret,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityConfig {
    /// 12 BIP39 words; empty = `mnemonic_file`.
    pub mnemonic: Secret,
    /// Where the mnemonic is read from (and written to on first start).
    pub mnemonic_file: PathBuf,
    /// Names besides the bot's key that count as a mention.
    pub handles: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexKind {
    Embedded,
    Nexus,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexConfig {
    pub kind: IndexKind,
    /// Milliseconds between reads of the homeserver's event feed (embedded index).
    pub follow_interval_ms: u64,
    /// The Nexus indexer (index kind "nexus").
    pub nexus_url: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollerConfig {
    /// Milliseconds between polls of the index.
    pub interval_ms: u64,
    /// Mentions older than this many seconds are skipped.
    pub max_age_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkersConfig {
    pub summary_concurrency: usize,
    pub factcheck_concurrency: usize,
    /// Replies published at once (by the leader).
    pub publisher_concurrency: usize,
    /// Mentions routed at once (by the leader), in lanes by author: one author's
    /// mentions are decided one at a time, in the order they came in.
    pub router_concurrency: usize,
    /// How often mentions a passing failure left unanswered are tried again.
    pub redrive_interval_secs: u64,
    /// "" (poller, router, publisher), or a worker type (needs the Redis bus).
    pub worker_type: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BusKind {
    InProcess,
    Redis,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BusConfig {
    pub kind: BusKind,
    /// `redis://[user:password@]host:port[/db]`.
    pub redis_url: SecretUrl,
    /// Put before every Redis key.
    pub prefix: String,
    pub claim_idle_ms: u64,
    pub max_deliveries: u64,
    pub lease_ttl_ms: u64,
}

impl BusConfig {
    /// What the Redis bus runs with (reads wait up to 2 s for a message).
    pub fn redis(&self) -> crate::bus::RedisBusConfig {
        crate::bus::RedisBusConfig {
            url: self.redis_url.expose().to_owned(),
            prefix: self.prefix.clone(),
            claim_idle: std::time::Duration::from_millis(self.claim_idle_ms),
            max_deliveries: self.max_deliveries,
            block: std::time::Duration::from_secs(2),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    /// Ask the AI classifier about mentions with no action keyword too.
    pub ask_ai_without_keywords: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SummaryConfig {
    pub max_input_tokens: usize,
    pub max_output_tokens: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FactcheckConfig {
    pub max_claims: usize,
    pub results_per_claim: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AiConfig {
    /// Base URL of an OpenAI-compatible API (…/v1); empty with no key = local mode.
    pub base_url: String,
    pub api_key: Secret,
    pub model: String,
    pub timeout_secs: u64,
    /// Tries again after a 429 or a 5xx (or no answer), per provider.
    pub max_retries: u32,
    /// A 429 asking for a longer wait than this moves on to the next provider.
    pub max_retry_wait_secs: u64,
    /// Providers tried in order when the one before fails (after its retries).
    pub fallbacks: Vec<AiFallback>,
    /// How JSON answers are asked for: "json_object" or "json_schema".
    pub json_mode: String,
}

/// A fallback AI provider.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AiFallback {
    pub base_url: String,
    #[serde(default)]
    pub api_key: Secret,
    pub model: String,
}

impl AiConfig {
    /// Whether an AI provider is configured (otherwise: local mode).
    pub fn enabled(&self) -> bool {
        !self.base_url.is_empty() || !self.api_key.is_empty()
    }

    /// The API's base URL: the configured one, or OpenAI's when only a key is set.
    pub fn base(&self) -> &str {
        if self.base_url.is_empty() {
            "https://api.openai.com/v1"
        } else {
            self.base_url.trim_end_matches('/')
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchConfig {
    /// "brave", "tavily", "searxng" or "" (none).
    pub provider: String,
    pub base_url: String,
    pub api_key: Secret,
    pub timeout_secs: u64,
    pub max_retries: u32,
    pub max_retry_wait_secs: u64,
    /// Search APIs tried in order when the one before fails.
    pub fallbacks: Vec<SearchFallback>,
}

/// A fallback search API.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchFallback {
    pub provider: String,
    #[serde(default)]
    pub base_url: String,
    #[serde(default)]
    pub api_key: Secret,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SafetyConfig {
    pub wordlist: WordlistConfig,
}

/// The spec's `safety.wordlist` object.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WordlistConfig {
    pub enabled: bool,
    #[serde(rename = "blockOnMatch")]
    pub block_on_match: bool,
    pub lists: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoliciesConfig {
    pub dir: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    pub per_user_actions: u32,
    pub per_user_window_secs: u64,
    pub per_thread_replies: u32,
    pub known_bots: Vec<String>,
    pub opt_out_phrase: String,
    pub opt_in_phrase: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// The bot's records: `sqlite://PATH` (the default) or `postgres://...`.
    pub database_url: SecretUrl,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    pub listen: SocketAddr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Json,
    Text,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingConfig {
    pub format: LogFormat,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl BotConfig {
    /// Defaults, then `file`, then the environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULT_CONFIG));
        if let Some(path) = file {
            // Read it here, so a missing file is an error rather than silently skipped.
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            figment = figment.merge(Toml::string(&text));
        }
        figment = figment.merge(Env::prefixed("PKBOT__").split("__"));
        for (variable, key) in SPEC_ENV {
            if let Ok(value) = std::env::var(variable) {
                let value = spec_value(variable, key, &value)?;
                figment = figment.merge(Serialized::default(key, value));
            }
        }
        let config: BotConfig = figment
            .extract()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Only the embedded defaults (tests and tools).
    pub fn defaults() -> Self {
        Figment::from(Toml::string(DEFAULT_CONFIG))
            .extract()
            .expect("embedded default config is valid")
    }

    /// Checks what no type expresses.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        for (key, value) in [
            ("poller.interval_ms", self.poller.interval_ms),
            ("index.follow_interval_ms", self.index.follow_interval_ms),
            (
                "workers.summary_concurrency",
                self.workers.summary_concurrency as u64,
            ),
            (
                "workers.factcheck_concurrency",
                self.workers.factcheck_concurrency as u64,
            ),
            (
                "workers.publisher_concurrency",
                self.workers.publisher_concurrency as u64,
            ),
            (
                "workers.router_concurrency",
                self.workers.router_concurrency as u64,
            ),
            (
                "workers.redrive_interval_secs",
                self.workers.redrive_interval_secs,
            ),
            (
                "limits.per_user_window_secs",
                self.limits.per_user_window_secs,
            ),
            ("ai.timeout_secs", self.ai.timeout_secs),
            ("bus.claim_idle_ms", self.bus.claim_idle_ms),
            ("bus.max_deliveries", self.bus.max_deliveries),
            ("bus.lease_ttl_ms", self.bus.lease_ttl_ms),
            ("search.timeout_secs", self.search.timeout_secs),
        ] {
            if value == 0 {
                problems.push(format!("{key} must be at least 1"));
            }
        }
        match self.workers.worker_type.as_str() {
            "" => {}
            "summary" | "factcheck" if self.bus.kind != BusKind::Redis => problems.push(format!(
                "WORKER_TYPE={} runs one worker type in its own process, which needs the \
                 Redis bus (bus.kind = \"redis\", PKBOT__BUS__KIND=redis)",
                self.workers.worker_type
            )),
            "summary" | "factcheck" => {}
            other => problems.push(format!(
                "WORKER_TYPE must be summary or factcheck (or unset), got `{other}`"
            )),
        }
        match self.search.provider.as_str() {
            "" => {}
            "brave" | "tavily" => {}
            "searxng" if self.search.base_url.is_empty() => {
                problems.push("search.provider = \"searxng\" needs search.base_url".into());
            }
            "searxng" => {}
            other => problems.push(format!(
                "search.provider must be brave, tavily, searxng or empty, got `{other}`"
            )),
        }
        for (i, f) in self.search.fallbacks.iter().enumerate() {
            match f.provider.as_str() {
                "brave" | "tavily" => {}
                "searxng" if !f.base_url.is_empty() => {}
                other => problems.push(format!(
                    "search.fallbacks[{i}]: provider must be brave, tavily or searxng (searxng \
                     with a base_url), got `{other}`"
                )),
            }
        }
        if self.bus.kind == BusKind::Redis {
            // Workers renew their claims every third of the claim time, the leader its
            // lease every third of its lifetime: shorter than a second leaves too
            // little room for a busy Redis or machine.
            for (key, value) in [
                ("bus.claim_idle_ms", self.bus.claim_idle_ms),
                ("bus.lease_ttl_ms", self.bus.lease_ttl_ms),
            ] {
                if value < 1000 {
                    problems.push(format!("{key} must be at least 1000, got {value}"));
                }
            }
            if self.storage.database_url.expose().contains(":memory:") {
                problems.push(
                    "bus.kind = \"redis\" runs the bot in several processes, which must share \
                     one database: storage.database_url cannot be in memory"
                        .into(),
                );
            }
        }
        if !matches!(self.ai.json_mode.as_str(), "json_object" | "json_schema") {
            problems.push(format!(
                "ai.json_mode must be json_object or json_schema, got `{}`",
                self.ai.json_mode
            ));
        }
        for (i, f) in self.ai.fallbacks.iter().enumerate() {
            if f.base_url.is_empty() {
                problems.push(format!("ai.fallbacks[{i}] needs a base_url"));
            }
        }
        if self.index.kind == IndexKind::Nexus && self.index.nexus_url.is_empty() {
            problems.push("index.kind = \"nexus\" needs index.nexus_url".into());
        }
        for key in &self.limits.known_bots {
            if key.parse::<homeserver_protocol::PublicKey>().is_err() {
                problems.push(format!("limits.known_bots: `{key}` is not a public key"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems.join("; ")))
        }
    }
}

/// A spec variable's value as the type of the setting it sets.
fn spec_value(variable: &str, key: &str, value: &str) -> Result<toml::Value, ConfigError> {
    if key.ends_with("_ms") || key.ends_with("_concurrency") {
        let n: i64 = value.trim().parse().map_err(|_| {
            ConfigError::Invalid(format!("{variable} must be a whole number, got `{value}`"))
        })?;
        Ok(toml::Value::Integer(n))
    } else {
        Ok(toml::Value::String(value.to_owned()))
    }
}

#[cfg(test)]
// figment's Jail returns its large error type by design.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    #[test]
    fn defaults_load_and_validate() {
        let c = BotConfig::defaults();
        c.validate().unwrap();
        assert_eq!(c.poller.interval_ms, 30_000, "the spec's default");
        assert!(!c.ai.enabled(), "local mode by default");
        assert!(c.safety.wordlist.block_on_match);
    }

    #[test]
    fn spec_variables_override_the_file() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("bot.toml", "[poller]\ninterval_ms = 1000\n")?;
            jail.set_env("MENTION_POLL_INTERVAL_MS", "250");
            jail.set_env("WORKER_CONCURRENCY_SUMMARY", "7");
            let c = BotConfig::load(Some(Path::new("bot.toml"))).unwrap();
            assert_eq!(c.poller.interval_ms, 250);
            assert_eq!(c.workers.summary_concurrency, 7);
            jail.set_env("WORKER_CONCURRENCY_FACTCHECK", "many");
            let e = BotConfig::load(None).unwrap_err().to_string();
            assert!(e.contains("WORKER_CONCURRENCY_FACTCHECK"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("bot.toml", "[poller]\ninterval = 5\n")?;
            let e = BotConfig::load(Some(Path::new("bot.toml")))
                .unwrap_err()
                .to_string();
            assert!(e.contains("interval"), "{e}");
            jail.create_file("bot.toml", "[workers]\nworker_type = \"summary\"\n")?;
            let e = BotConfig::load(Some(Path::new("bot.toml")))
                .unwrap_err()
                .to_string();
            assert!(e.contains("Redis"), "{e}");
            jail.create_file(
                "bot.toml",
                "[workers]\nworker_type = \"summary\"\n[bus]\nkind = \"redis\"\n",
            )?;
            BotConfig::load(Some(Path::new("bot.toml"))).unwrap();
            jail.create_file(
                "bot.toml",
                "[bus]\nkind = \"redis\"\nclaim_idle_ms = 200\n[storage]\ndatabase_url = \"sqlite::memory:\"\n",
            )?;
            let e = BotConfig::load(Some(Path::new("bot.toml")))
                .unwrap_err()
                .to_string();
            assert!(e.contains("claim_idle_ms") && e.contains("memory"), "{e}");
            Ok(())
        });
    }

    /// Every secret setting set; the whole configuration logged (`Debug`, as a log line
    /// would) and printed (`--print-config`'s TOML): no secret in either.
    #[test]
    fn secrets_do_not_print() {
        let mut c = BotConfig::defaults();
        c.identity.mnemonic = ("abandon ".repeat(11) + "about").into();
        c.ai.api_key = "sk-secret".into();
        c.ai.fallbacks = vec![AiFallback {
            base_url: "http://127.0.0.1:1/v1".into(),
            api_key: "sk-fallback-secret".into(),
            model: "m".into(),
        }];
        c.search.api_key = "brave-secret".into();
        c.search.fallbacks = vec![SearchFallback {
            provider: "tavily".into(),
            base_url: String::new(),
            api_key: "tavily-secret".into(),
        }];
        c.homeserver.signup_token = "tok-secret".into();
        c.bus.redis_url = "redis://bot:redis-secret@127.0.0.1:6379/0".into();
        c.storage.database_url = "postgres://bot:pg-secret@127.0.0.1/bot".into();
        let logged = format!("{c:?} {c:#?}");
        let printed = toml::to_string_pretty(&c).unwrap();
        for shown in [&logged, &printed] {
            assert!(
                !shown.contains("abandon") && !shown.contains("secret"),
                "{shown}"
            );
            assert!(
                shown.contains("redis://bot:****@127.0.0.1:6379/0"),
                "{shown}"
            );
        }
        assert_eq!(c.ai.fallbacks[0].api_key.expose(), "sk-fallback-secret");
    }
}
