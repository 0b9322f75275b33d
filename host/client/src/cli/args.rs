//! The command line of `pk` (clap derive). Only shapes and help texts live here.

use std::path::PathBuf;
use std::str::FromStr;

use clap::{Args, Parser, Subcommand};
use pk_client::{DEFAULT_HOMESERVER, PublicKey};

#[derive(Debug, Parser)]
#[command(
    name = "pk",
    version,
    about = "Store and read data on a homeserver",
    after_help = "The secret key comes from --key-file / PK_SECRET_KEY_FILE (a file holding \
                  64 hex characters), or from PK_SECRET_KEY (the 64 hex characters)."
)]
pub struct Cli {
    /// Base URL of the homeserver.
    #[arg(
        long,
        global = true,
        env = "PK_HOMESERVER",
        default_value = DEFAULT_HOMESERVER,
        value_name = "URL"
    )]
    pub homeserver: String,

    /// File holding the secret key (64 hex characters); PK_SECRET_KEY is used otherwise.
    #[arg(long, global = true, env = "PK_SECRET_KEY_FILE", value_name = "FILE")]
    pub key_file: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a new key pair.
    ///
    /// With --out, writes the secret to FILE (mode 0600) and prints the public key;
    /// without, prints the secret on stdout and the public key on stderr.
    Keygen {
        /// Where to write the secret key.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Overwrite FILE if it exists.
        #[arg(long, requires = "out")]
        force: bool,
    },

    /// Print the public key of the configured secret key.
    Pubkey,

    /// Mint a session token limited to capabilities (prints the token on stdout and its
    /// expiry on stderr). Use it as `Authorization: Bearer <token>`.
    Session {
        /// A capability `<read|write|*>:<path prefix>`; repeatable.
        #[arg(long = "cap", value_name = "CAPABILITY", required = true)]
        capabilities: Vec<String>,
        /// Lifetime in seconds (60 to 2592000; the server's default is 3600).
        #[arg(long)]
        ttl: Option<u64>,
    },

    /// Register the configured key with the homeserver.
    Signup {
        /// Signup token, when the homeserver requires one (XXXX-XXXX-XXXX).
        #[arg(long, value_name = "TOKEN")]
        token: Option<String>,
    },

    /// Store a file (or standard input with `-`) at PATH.
    Put {
        /// Storage path, e.g. /pub/app/notes.txt.
        path: String,
        /// Local file to upload, or `-` for standard input.
        file: PathBuf,
    },

    /// Read the value at PATH (to standard output unless -o is given).
    Get {
        /// Storage path, e.g. /pub/app/notes.txt.
        path: String,
        /// Read this user's public data instead of your own (no key needed).
        #[arg(long, value_name = "Z32")]
        user: Option<PublicKey>,
        /// Write the value to FILE instead of standard output.
        #[arg(short, long, value_name = "FILE")]
        out: Option<PathBuf>,
    },

    /// List the entries under a directory path, one path per line.
    Ls(LsArgs),

    /// Delete the entry at PATH.
    Rm {
        /// Storage path, e.g. /pub/app/notes.txt.
        path: String,
    },

    /// Print the events of some users, one line per event as it arrives.
    ///
    /// Each line is `CURSOR PUT|DEL URL[ CONTENT_HASH]` (or the event as JSON with
    /// --json). Without --live the command ends after the history; with it, it waits for
    /// new events until interrupted. No key is needed unless a USER is `me`.
    Stream(StreamArgs),

    /// Print the feed of every user's events, oldest first, one line per event.
    ///
    /// Lines as for `pk stream`. Without --all one page is printed, and when the page is
    /// full the cursor to continue from goes to standard error.
    Events(EventsArgs),
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Directory path, e.g. /pub/app/ (a missing trailing `/` is added).
    pub path: String,
    /// Entries per page (1-1000; the server's default is 100).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: Option<u32>,
    /// Continue after this cursor (printed on stderr by the previous page).
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
    /// Descending order.
    #[arg(long)]
    pub reverse: bool,
    /// Immediate children only; sub-folders are shown as `name/`.
    #[arg(long)]
    pub shallow: bool,
    /// List this user's public data instead of your own (no key needed).
    #[arg(long, value_name = "Z32")]
    pub user: Option<PublicKey>,
    /// Follow cursors until the end of the listing.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct StreamArgs {
    /// Whose events: a public key (z32) or `me` for the configured key; append `:CURSOR`
    /// to start after that cursor.
    #[arg(required = true, value_name = "USER")]
    pub users: Vec<UserArg>,
    /// Keep the stream open after the history and print new events as they happen.
    #[arg(long)]
    pub live: bool,
    /// Newest first (not together with --live).
    #[arg(long)]
    pub reverse: bool,
    /// Stop after N events (the server accepts 1-65535).
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,
    /// Only events under this path prefix, e.g. /pub/app/.
    #[arg(long, value_name = "PREFIX")]
    pub path: Option<String>,
    /// Start after this cursor, for every USER that does not name its own.
    #[arg(long, value_name = "N")]
    pub cursor: Option<u64>,
    /// Print each event as a JSON object.
    #[arg(long)]
    pub json: bool,
}

/// A `USER[:CURSOR]` argument of `pk stream`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserArg {
    pub user: UserRef,
    pub cursor: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserRef {
    /// The configured key.
    Me,
    Key(PublicKey),
}

impl FromStr for UserArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // `:` is not in the z32 alphabet, so the split is unambiguous.
        let (user, cursor) = match s.split_once(':') {
            Some((user, cursor)) => {
                let cursor = cursor
                    .parse()
                    .map_err(|_| format!("cursor `{cursor}` is not an unsigned integer"))?;
                (user, Some(cursor))
            }
            None => (s, None),
        };
        let user = if user == "me" {
            UserRef::Me
        } else {
            UserRef::Key(user.parse().map_err(|e| format!("{e}"))?)
        };
        Ok(Self { user, cursor })
    }
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Events after this cursor (from the previous page); 0 is the beginning.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub cursor: u64,
    /// Events per page (1-1000; the server's default is 100).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: Option<u32>,
    /// Follow cursors until the end of the feed.
    #[arg(long)]
    pub all: bool,
    /// Print each event as a JSON object.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_ls_flags() {
        let key = pk_client::Keypair::from_seed(&[3; 32]).public_key();
        let cli = Cli::try_parse_from([
            "pk",
            "ls",
            "/pub/a/",
            "--limit",
            "5",
            "--cursor",
            "abc",
            "--reverse",
            "--shallow",
            "--all",
            "--user",
            &key.to_z32(),
        ])
        .unwrap();
        let Command::Ls(ls) = cli.command else {
            panic!("not ls");
        };
        assert_eq!(ls.limit, Some(5));
        assert_eq!(ls.cursor.as_deref(), Some("abc"));
        assert!(ls.reverse && ls.shallow && ls.all);
        assert_eq!(ls.user, Some(key));
    }

    #[test]
    fn parses_stream_users_and_flags() {
        let key = pk_client::Keypair::from_seed(&[3; 32]).public_key();
        let with_cursor = format!("{key}:42");
        let cli = Cli::try_parse_from([
            "pk",
            "stream",
            "me",
            &with_cursor,
            "me:0",
            "--live",
            "--path",
            "/pub/a/",
            "--limit",
            "0",
            "--cursor",
            "7",
            "--json",
        ])
        .unwrap();
        let Command::Stream(stream) = cli.command else {
            panic!("not stream");
        };
        assert_eq!(
            stream.users,
            [
                UserArg {
                    user: UserRef::Me,
                    cursor: None
                },
                UserArg {
                    user: UserRef::Key(key),
                    cursor: Some(42)
                },
                UserArg {
                    user: UserRef::Me,
                    cursor: Some(0)
                },
            ]
        );
        assert!(stream.live && stream.json && !stream.reverse);
        assert_eq!(stream.path.as_deref(), Some("/pub/a/"));
        // Range checks on the limit are the server's (its message is shown).
        assert_eq!(stream.limit, Some(0));
        assert_eq!(stream.cursor, Some(7));

        let cli = Cli::try_parse_from(["pk", "events", "--cursor", "5", "--all"]).unwrap();
        let Command::Events(events) = cli.command else {
            panic!("not events");
        };
        assert_eq!((events.cursor, events.limit), (5, None));
        assert!(events.all && !events.json);
    }

    #[test]
    fn usage_errors() {
        for args in [
            vec!["pk"],
            vec!["pk", "put", "/pub/a"],
            vec!["pk", "ls", "/pub/", "--limit", "0"],
            vec!["pk", "ls", "/pub/", "--limit", "1001"],
            vec!["pk", "get", "/pub/a", "--user", "not-a-key"],
            vec!["pk", "keygen", "--force"],
            vec!["pk", "frobnicate"],
            vec!["pk", "stream"],
            vec!["pk", "stream", "nope"],
            vec!["pk", "stream", "me:x"],
            vec!["pk", "stream", "me:-1"],
            vec!["pk", "stream", "me", "--cursor", "-1"],
            vec!["pk", "events", "--limit", "0"],
            vec!["pk", "events", "--limit", "1001"],
            vec!["pk", "events", "--cursor", "x"],
        ] {
            let err = Cli::try_parse_from(&args).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{args:?}");
        }
    }
}
