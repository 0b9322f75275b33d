//! The `pk` tool: argument parsing ([`args`]), settings and profiles ([`config`]), key
//! handling ([`keys`]), the storage commands ([`storage`]), folder copies ([`transfer`]),
//! the event commands ([`events`]) and what is printed ([`output`]), on top of the
//! `pk_client` library.
//!
//! Exit codes: 0 success, 1 any failure (one line on stderr, `pk: <what>: <why>`, or with
//! `--json` one JSON object `{"error", "message", "status"}`), 2 a usage error (clap's
//! own).

mod args;
mod config;
mod events;
mod keys;
mod network;
mod output;
mod posts;
mod storage;
mod transfer;

use std::error::Error as _;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};
use pk_client::{ClientError, Keypair, PkClient, PublicKey, RetryNotice, RetryPolicy};

use args::{Cli, Command};
use config::{ConfigError, Given, Origin, Settings};
use output::Bars;

/// Runs the tool and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let matches = match Cli::command().try_get_matches() {
        Ok(matches) => matches,
        Err(e) => return usage_error(e),
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let json = cli.global.json;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            report(&CliError::io("cannot start the async runtime", e), json);
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli, &matches)) {
        Ok(()) => ExitCode::SUCCESS,
        // `pk get ... | head`: the reader went away; that is not our failure.
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            report(&e, json);
            ExitCode::FAILURE
        }
    }
}

/// clap's usage errors (exit code 2), as JSON when `--json` is on the command line;
/// help and version texts as clap prints them.
fn usage_error(e: clap::Error) -> ExitCode {
    let wants_json = std::env::args_os().any(|a| a == "--json");
    if wants_json && e.use_stderr() {
        let message = e.kind().to_string();
        let detail = e.to_string();
        let first = detail
            .lines()
            .next()
            .unwrap_or(&message)
            .trim_start_matches("error: ");
        eprintln!(
            "{}",
            serde_json::json!({"error": "usage", "message": first, "status": null})
        );
        return ExitCode::from(2);
    }
    e.exit()
}

fn report(error: &CliError, json: bool) {
    let line = error_line(error);
    if json {
        let status = match error {
            CliError::Client(e) => e.status().map(|s| s.as_u16()),
            _ => None,
        };
        eprintln!(
            "{}",
            serde_json::json!({"error": error.code(), "message": line, "status": status})
        );
    } else {
        eprintln!("pk: {line}");
    }
}

async fn run(cli: Cli, matches: &ArgMatches) -> Result<(), CliError> {
    let given = given(&cli, matches);
    let settings = config::resolve(&given, &config::Environment::current())?;
    let json = cli.global.json;
    let mut ctx = Context {
        target: network::Target::url(&settings.homeserver),
        settings,
        json,
        retry: RetryPolicy {
            max_retries: cli.global.retries,
            ..RetryPolicy::default()
        },
        bars: Bars {
            enabled: !json && !cli.global.no_progress && std::io::stderr().is_terminal(),
        },
    };
    if network::talks_to_a_homeserver(&cli.command) {
        // A key or `pkarr` instead of a URL: found on the DHT now, once.
        ctx.target = network::Target::resolve(&ctx, network::subject_of(&cli.command)).await?;
    }
    match cli.command {
        Command::Keygen { out, print, force } => keys::keygen(&ctx, out.as_deref(), print, force),
        Command::Pubkey => keys::pubkey(&ctx),
        Command::Config => keys::show_config(&ctx),
        Command::Whoami => storage::whoami(&ctx).await,
        Command::Signup { token, publish } => {
            storage::signup(&ctx, token.as_deref(), publish).await
        }
        Command::Session { capabilities, ttl } => storage::session(&ctx, &capabilities, ttl).await,
        Command::Put { path, file } => storage::put(&ctx, &path, &file).await,
        Command::Get {
            path,
            user,
            out,
            force,
        } => storage::get(&ctx, &path, user, out.as_deref(), force).await,
        Command::Stat { path, user } => storage::stat(&ctx, &path, user).await,
        Command::Ls(ls) => storage::ls(&ctx, ls).await,
        Command::Rm { path, recursive } => storage::rm(&ctx, &path, recursive).await,
        Command::Cp(args) => transfer::cp(&ctx, args).await,
        Command::Sync(args) => transfer::sync(&ctx, args).await,
        Command::Stream(args) => events::stream(&ctx, args).await,
        Command::Post { text, reply_to } => posts::post(&ctx, &text, reply_to.as_deref()).await,
        Command::Publish { homeserver_key } => network::publish(&ctx, homeserver_key).await,
        Command::Migrate {
            to,
            token,
            no_publish,
        } => network::migrate(&ctx, &to, token.as_deref(), !no_publish).await,
        Command::Replies { uri, user, wait } => posts::replies(&ctx, &uri, user, wait).await,
        Command::Events(args) => events::events(&ctx, args).await,
        Command::Completions { shell } => {
            let mut command = Cli::command();
            let mut out = std::io::stdout().lock();
            clap_complete::generate(shell, &mut command, "pk", &mut out);
            Ok(())
        }
    }
}

/// The settings given on the command line or through clap's environment fallbacks, and
/// which of the two each came from.
fn given(cli: &Cli, matches: &ArgMatches) -> Given {
    let origin = |id: &str| match matches.value_source(id) {
        Some(ValueSource::EnvVariable) => Origin::Environment,
        _ => Origin::Flag,
    };
    Given {
        homeserver: cli
            .global
            .homeserver
            .clone()
            .map(|v| (v, origin("homeserver"))),
        key_file: cli.global.key_file.clone().map(|v| (v, origin("key_file"))),
        profile: cli.global.profile.clone().map(|v| (v, origin("profile"))),
    }
}

/// What every command may need: the settings, how to print, how to retry.
struct Context {
    settings: Settings,
    /// Where the homeserver is (resolved from a key on the DHT, if one was given).
    target: network::Target,
    json: bool,
    retry: RetryPolicy,
    bars: Bars,
}

impl Context {
    fn keypair(&self) -> Result<Keypair, CliError> {
        self.optional_keypair()?.ok_or(CliError::MissingKey)
    }

    /// The configured key, or `None` when none is configured. A configured key that
    /// cannot be read is an error.
    fn optional_keypair(&self) -> Result<Option<Keypair>, CliError> {
        keys::load(&self.settings.key)
    }

    /// A client of the configured homeserver acting as `keypair`, retrying as told and
    /// saying so on stderr.
    fn client(&self, keypair: Option<Keypair>) -> Result<PkClient, CliError> {
        self.client_of(&self.target, keypair)
    }

    /// A client of the homeserver `target` acting as `keypair`.
    fn client_of(
        &self,
        target: &network::Target,
        keypair: Option<Keypair>,
    ) -> Result<PkClient, CliError> {
        let json = self.json;
        let client = match target.pinned {
            Some(server) => PkClient::over_pinned_tls(&target.url, server, keypair)?,
            None => PkClient::new(&target.url, keypair)?,
        };
        Ok(client
            .with_retry_policy(self.retry)
            .on_retry(move |notice| retry_message(notice, json)))
    }

    /// A client acting as the configured key.
    fn signing_client(&self) -> Result<PkClient, CliError> {
        self.client(Some(self.keypair()?))
    }

    /// A client that signs when a key is configured (feeds, streams: no key needed).
    fn optionally_signing_client(&self) -> Result<PkClient, CliError> {
        self.client(self.optional_keypair()?)
    }

    /// A client for reading `user`'s public data (no key needed), or the caller's own
    /// data when `user` is `None`.
    fn reading_client(&self, user: Option<PublicKey>) -> Result<PkClient, CliError> {
        match user {
            // Use the key when one is configured (a read of one's own data via --user is
            // then signed), but do not require it.
            Some(_) => self.optionally_signing_client(),
            None => self.signing_client(),
        }
    }
}

/// Tells the user why nothing happens for a while.
fn retry_message(notice: &RetryNotice, json: bool) {
    let why = if notice.status.as_u16() == 429 {
        "is rate limiting this client (429)"
    } else {
        "is busy (503)"
    };
    let wait = format_wait(notice.wait);
    if json {
        eprintln!(
            "{}",
            serde_json::json!({"notice": "retry", "status": notice.status.as_u16(),
                "wait_secs": notice.wait.as_secs_f64(), "retry": notice.retry,
                "max_retries": notice.max_retries})
        );
    } else {
        eprintln!(
            "pk: the homeserver {why}; retrying in {wait} (retry {} of {})",
            notice.retry, notice.max_retries
        );
    }
}

fn format_wait(wait: Duration) -> String {
    if wait.subsec_millis() == 0 {
        format!("{} s", wait.as_secs())
    } else {
        format!("{:.1} s", wait.as_secs_f64())
    }
}

/// Everything a command can fail with.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Client(#[from] ClientError),

    #[error(transparent)]
    Config(#[from] ConfigError),

    #[error(
        "no secret key configured: create one with `pk keygen` (saved to {}), or pass \
         --key-file FILE, or set PK_SECRET_KEY_FILE=FILE or PK_SECRET_KEY=<64 hex chars>",
        keygen_hint()
    )]
    MissingKey,

    #[error("invalid secret key in {origin}")]
    BadKey {
        origin: String,
        #[source]
        source: pk_client::protocol::keys::SecretKeyError,
    },

    #[error("{} already exists; pass --force to overwrite it", path.display())]
    Exists { path: PathBuf },

    #[error(
        "{path} is not text ({size}); write it to a file with -o FILE, pipe it to another \
         program, or pass --force to print it to the terminal anyway"
    )]
    BinaryToTerminal { path: String, size: String },

    /// A request `pk` cannot make sense of (beyond what clap checks).
    #[error("{0}")]
    Usage(String),

    /// Nothing at the path (when the server's answer has no message of its own).
    #[error("{0}")]
    NotFound(String),

    /// A migration whose copy does not match its source (values changed meanwhile);
    /// running it again finishes it.
    #[error("{0}")]
    Incomplete(String),

    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

/// Where `pk keygen` would save the key, for the hint of [`CliError::MissingKey`].
fn keygen_hint() -> String {
    config::config_file_path(&config::Environment::current())
        .and_then(|f| f.parent().map(|d| d.join("keys").join("<profile>.key")))
        .map_or_else(
            || "the config folder".to_owned(),
            |p| p.display().to_string(),
        )
}

impl CliError {
    fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        CliError::Io {
            context: context.into(),
            source,
        }
    }

    fn is_broken_pipe(&self) -> bool {
        let io = match self {
            CliError::Io { source, .. } => source,
            CliError::Client(ClientError::Io { source, .. }) => source,
            _ => return false,
        };
        io.kind() == std::io::ErrorKind::BrokenPipe
    }

    /// A stable code for `--json` errors: the API's error code when the server sent
    /// one, otherwise what kind of failure it was.
    fn code(&self) -> String {
        match self {
            CliError::Client(e) => match e {
                ClientError::Api { body, .. } => body.error.as_str().to_owned(),
                ClientError::UnexpectedStatus { status, .. } => format!("http_{}", status.as_u16()),
                ClientError::Unreachable { .. } => "unreachable".into(),
                ClientError::Transport(_) => "transport".into(),
                ClientError::InvalidResponse(_)
                | ClientError::InvalidEvent { .. }
                | ClientError::StreamFailed { .. } => "invalid_response".into(),
                ClientError::Io { .. } => "io".into(),
                ClientError::InvalidPath { .. } | ClientError::PathKind { .. } => {
                    "invalid_path".into()
                }
                ClientError::InvalidBaseUrl { .. } => "invalid_homeserver".into(),
                ClientError::MissingKey => "missing_key".into(),
                ClientError::HashMismatch { .. } => "hash_mismatch".into(),
                ClientError::DestinationExists { .. } => "exists".into(),
                ClientError::Resolve(_) => "resolve".into(),
            },
            CliError::Config(_) => "config".into(),
            CliError::MissingKey => "missing_key".into(),
            CliError::BadKey { .. } => "invalid_key".into(),
            CliError::Exists { .. } => "exists".into(),
            CliError::BinaryToTerminal { .. } => "binary_value".into(),
            CliError::Usage(_) => "usage".into(),
            CliError::NotFound(_) => "not_found".into(),
            CliError::Incomplete(_) => "incomplete".into(),
            CliError::Io { .. } => "io".into(),
        }
    }
}

/// The error and its causes on one line: `what: why: deeper why`.
fn error_line(error: &CliError) -> String {
    match error {
        CliError::Client(ClientError::Unreachable { refused: true, .. }) => {
            return format!(
                "{error}; is the homeserver running? Start it with `homeserver`, or point \
                 pk at yours with --homeserver URL, PK_HOMESERVER or a profile (`pk config`)"
            );
        }
        CliError::Client(ClientError::DestinationExists { path }) => {
            return format!(
                "{} already exists; pass --force to overwrite it",
                path.display()
            );
        }
        _ => {}
    }
    let mut line = error.to_string();
    // `#[error(transparent)]` forwards both display and `source()` to the wrapped error.
    let mut source = error.source();
    let mut last = line.clone();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.is_empty() && !last.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        last = text;
        source = cause.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use pk_client::protocol::{ErrorBody, ErrorCode, PathError};
    use reqwest::StatusCode;

    use super::*;

    #[test]
    fn api_error_line() {
        let e = CliError::from(ClientError::Api {
            status: StatusCode::NOT_FOUND,
            body: ErrorBody::new(ErrorCode::NotFound, "no entry at /pub/x"),
        });
        assert_eq!(error_line(&e), "not_found (404): no entry at /pub/x");
    }

    #[test]
    fn causes_are_joined_once() {
        let e = CliError::from(ClientError::InvalidPath {
            path: "/etc/x".into(),
            source: PathError::Root,
        });
        assert_eq!(
            error_line(&e),
            "invalid path \"/etc/x\": path must start with /pub/ or /private/"
        );
        let e = CliError::io(
            "cannot read in.bin",
            std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory"),
        );
        assert_eq!(
            error_line(&e),
            "cannot read in.bin: No such file or directory"
        );
    }

    #[test]
    fn unreachable_server_gets_a_hint() {
        let refused = CliError::from(ClientError::Unreachable {
            url: "http://127.0.0.1:1".into(),
            reason: "Connection refused (os error 111)".into(),
            refused: true,
        });
        let line = error_line(&refused);
        assert!(
            line.starts_with(
                "cannot connect to the homeserver at http://127.0.0.1:1: Connection refused"
            ),
            "{line}"
        );
        for hint in ["running", "--homeserver", "PK_HOMESERVER"] {
            assert!(line.contains(hint), "{line}");
        }
        assert_eq!(refused.code(), "unreachable");
        // Another connection failure (a TLS refusal, say) is shown as it is.
        let other = CliError::from(ClientError::Unreachable {
            url: "https://x".into(),
            reason: "the server presented the wrong key".into(),
            refused: false,
        });
        assert!(!error_line(&other).contains("running"));
    }

    #[test]
    fn json_error_codes() {
        let api = CliError::from(ClientError::Api {
            status: StatusCode::TOO_MANY_REQUESTS,
            body: ErrorBody::new(ErrorCode::RateLimitExceeded, "slow down"),
        });
        assert_eq!(api.code(), "rate_limit_exceeded");
        assert_eq!(CliError::MissingKey.code(), "missing_key");
        let exists = CliError::from(ClientError::DestinationExists {
            path: "out.bin".into(),
        });
        assert_eq!(exists.code(), "exists");
        assert_eq!(
            error_line(&exists),
            "out.bin already exists; pass --force to overwrite it"
        );
    }

    #[test]
    fn missing_key_says_how_to_provide_one() {
        let line = error_line(&CliError::MissingKey);
        for hint in [
            "--key-file",
            "PK_SECRET_KEY_FILE",
            "PK_SECRET_KEY",
            "pk keygen",
            ".key",
        ] {
            assert!(line.contains(hint), "{line}");
        }
    }

    #[test]
    fn broken_pipe_is_recognised() {
        let pipe = || std::io::Error::new(std::io::ErrorKind::BrokenPipe, "pipe");
        assert!(CliError::io("x", pipe()).is_broken_pipe());
        assert!(
            CliError::from(ClientError::Io {
                context: "x".into(),
                source: pipe()
            })
            .is_broken_pipe()
        );
        assert!(!CliError::MissingKey.is_broken_pipe());
    }
}
