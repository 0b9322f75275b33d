//! The `pk` tool: argument parsing ([`args`]), key handling ([`keys`]), the storage
//! commands ([`storage`]) and the event commands ([`events`]), on top of the `pk_client`
//! library.
//!
//! Exit codes: 0 success, 1 any failure (one line on stderr, `pk: <what>: <why>`), 2 a
//! usage error (clap's own).

mod args;
mod events;
mod keys;
mod storage;

use std::error::Error as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use pk_client::{ClientError, Keypair, PkClient, PublicKey};

use args::{Cli, Command};

/// Runs the tool and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pk: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        // `pk get ... | head`: the reader went away; that is not our failure.
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pk: {}", error_line(&e));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), CliError> {
    let ctx = Context {
        homeserver: cli.homeserver,
        key_file: cli.key_file,
    };
    match cli.command {
        Command::Keygen { out, force } => keys::keygen(out.as_deref(), force),
        Command::Pubkey => keys::pubkey(&ctx),
        Command::Signup { token } => storage::signup(&ctx, token.as_deref()).await,
        Command::Session { capabilities, ttl } => storage::session(&ctx, &capabilities, ttl).await,
        Command::Put { path, file } => storage::put(&ctx, &path, &file).await,
        Command::Get { path, user, out } => storage::get(&ctx, &path, user, out.as_deref()).await,
        Command::Ls(ls) => storage::ls(&ctx, ls).await,
        Command::Rm { path } => storage::rm(&ctx, &path).await,
        Command::Stream(args) => events::stream(&ctx, args).await,
        Command::Events(args) => events::events(&ctx, args).await,
    }
}

/// What every command may need: where the homeserver is and where the key comes from.
struct Context {
    homeserver: String,
    key_file: Option<PathBuf>,
}

impl Context {
    fn keypair(&self) -> Result<Keypair, CliError> {
        keys::load(self.key_file.as_deref())
    }

    /// A client acting as the configured key.
    fn signing_client(&self) -> Result<PkClient, CliError> {
        Ok(PkClient::new(&self.homeserver, Some(self.keypair()?))?)
    }

    /// A client for reading `user`'s public data (no key needed), or the caller's own
    /// data when `user` is `None`.
    fn reading_client(&self, user: Option<PublicKey>) -> Result<PkClient, CliError> {
        match user {
            Some(_) => {
                // Use the key when one is configured (a read of one's own data via
                // --user is then signed), but do not require it.
                let keypair = keys::load(self.key_file.as_deref()).ok();
                Ok(PkClient::new(&self.homeserver, keypair)?)
            }
            None => self.signing_client(),
        }
    }
}

/// Everything a command can fail with.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Client(#[from] ClientError),

    #[error(
        "no secret key configured: pass --key-file FILE, or set PK_SECRET_KEY_FILE=FILE or \
         PK_SECRET_KEY=<64 hex chars> (create one with `pk keygen --out FILE`)"
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

    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
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
}

/// The error and its causes on one line: `what: why: deeper why`.
fn error_line(error: &CliError) -> String {
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
    fn missing_key_says_how_to_provide_one() {
        let line = error_line(&CliError::MissingKey);
        for hint in [
            "--key-file",
            "PK_SECRET_KEY_FILE",
            "PK_SECRET_KEY",
            "pk keygen",
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
