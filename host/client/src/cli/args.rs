//! The command line of `pk` (clap derive). Only shapes and help texts live here.

use std::path::PathBuf;
use std::str::FromStr;

use clap::{Args, Parser, Subcommand};
use homeserver_protocol::query::{MAX_FEED_LIMIT, MAX_LIST_LIMIT};
use pk_client::PublicKey;

#[derive(Debug, Parser)]
#[command(
    name = "pk",
    version,
    about = "Store and read data on a homeserver",
    after_help = "Settings come from, in rising order: built-in defaults, the config file \
                  (~/.config/pk/config.toml, or PK_CONFIG; see `pk config`), the environment \
                  (PK_HOMESERVER, PK_SECRET_KEY_FILE, PK_SECRET_KEY, PK_PROFILE), then flags.\n\
                  The secret key is a file holding 64 hex characters (`pk keygen` writes one \
                  to ~/.config/pk/keys/<profile>.key), or PK_SECRET_KEY itself."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,

    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Homeserver: a URL (`host:port` alone means http://host:port); or its public key
    /// (z32), found on the mainline DHT and reached over TLS that accepts only that key;
    /// or `pkarr`: the homeserver the user's own pkarr record names (with --user, that
    /// user's) [default: http://127.0.0.1:6286, or the profile's `homeserver`]. DHT
    /// bootstrap nodes: PK_PKARR_BOOTSTRAP (host:port, comma separated).
    #[arg(
        long,
        global = true,
        env = "PK_HOMESERVER",
        value_name = "URL|KEY|pkarr"
    )]
    pub homeserver: Option<String>,

    /// File holding the secret key (64 hex characters) [default: the profile's
    /// `key_file`, or ~/.config/pk/keys/<profile>.key].
    #[arg(long, global = true, env = "PK_SECRET_KEY_FILE", value_name = "FILE")]
    pub key_file: Option<PathBuf>,

    /// Profile of the config file to use [default: the file's `profile`, or `default`].
    #[arg(long, global = true, env = "PK_PROFILE", value_name = "NAME")]
    pub profile: Option<String>,

    /// Machine-readable output: JSON on standard output (one object, or one per line
    /// for event commands), errors as one JSON object on standard error.
    #[arg(long, global = true)]
    pub json: bool,

    /// How often to retry a request the homeserver turned away for load (429, 503),
    /// after the wait it asks for (at most 60 s); 0 never retries.
    #[arg(
        long,
        global = true,
        env = "PK_RETRIES",
        value_name = "N",
        default_value_t = 5
    )]
    pub retries: u32,

    /// No progress bars (they are shown only on a terminal, for values of 1 MiB or more).
    #[arg(long, global = true)]
    pub no_progress: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a new key pair and save the secret key.
    ///
    /// Without --out, the secret goes where pk will look for it: the profile's key file
    /// (--key-file / PK_SECRET_KEY_FILE, or the profile's `key_file`), else
    /// ~/.config/pk/keys/<profile>.key; mode 0600. An existing key is never replaced
    /// unless --force is given. Prints the public key.
    Keygen {
        /// Where to write the secret key.
        #[arg(long, value_name = "FILE", conflicts_with = "print")]
        out: Option<PathBuf>,
        /// Print the secret on standard output (public key on standard error) instead of
        /// saving it.
        #[arg(long)]
        print: bool,
        /// Replace an existing key file.
        #[arg(long, conflicts_with = "print")]
        force: bool,
    },

    /// Print the public key of the configured secret key.
    Pubkey,

    /// Show who you are on the homeserver: key, account, usage and quota.
    Whoami,

    /// Show the effective settings (homeserver, profile, key) and where each comes from.
    Config,

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

    /// Register the configured key with the homeserver (safe to repeat).
    Signup {
        /// Signup token, when the homeserver requires one (XXXX-XXXX-XXXX, any case).
        #[arg(long, value_name = "TOKEN")]
        token: Option<String>,
        /// Also make this your home: hand the homeserver your pkarr record naming it
        /// (it keeps it on the DHT), as `pk publish` does. Leave it out when signing up
        /// on a second homeserver.
        #[arg(long)]
        publish: bool,
    },

    /// Store a file (or standard input with `-`) at PATH.
    Put {
        /// Storage path, e.g. /pub/app/notes.txt.
        path: String,
        /// Local file to upload, or `-` for standard input.
        file: PathBuf,
    },

    /// Read the value at PATH (to standard output unless -o is given).
    ///
    /// The value is checked against its content hash. To a terminal, a value that is
    /// not text is refused (use -o, a pipe, or --force).
    Get {
        /// Storage path, e.g. /pub/app/notes.txt.
        path: String,
        /// Read this user's public data instead of your own (no key needed).
        #[arg(long, value_name = "Z32")]
        user: Option<PublicKey>,
        /// Write the value to FILE instead of standard output (never replacing an
        /// existing file without --force).
        #[arg(short, long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Replace an existing FILE; print a binary value to a terminal.
        #[arg(long)]
        force: bool,
    },

    /// Show an entry's size, content hash and update time, without reading it.
    Stat {
        /// Storage path, e.g. /pub/app/notes.txt.
        path: String,
        /// This user's public data instead of your own (no key needed).
        #[arg(long, value_name = "Z32")]
        user: Option<PublicKey>,
    },

    /// List the entries under a directory path, one path per line.
    Ls(LsArgs),

    /// Delete the entry at PATH (with -r, everything under it).
    Rm {
        /// Storage path, e.g. /pub/app/notes.txt (or /pub/app/ with -r).
        path: String,
        /// Delete every entry under PATH/ (and PATH itself, when it is an entry).
        #[arg(short, long)]
        recursive: bool,
    },

    /// Copy a file or, with -r, a folder between this machine and the homeserver.
    ///
    /// Homeserver paths start with /pub/ (or /private/); anything else is local (write
    /// ./pub/... for a local folder named pub). Files whose content hash already matches
    /// are skipped; downloads are checked against their hash before they replace a file.
    Cp(CopyArgs),

    /// Make a folder match another, between this machine and the homeserver.
    ///
    /// Like `cp -r`: only new and changed files (by content hash) are sent; with
    /// --delete, files the source does not have are removed from the destination.
    Sync(SyncArgs),

    /// Print the events of some users, one line per event as it arrives.
    ///
    /// Each line is `CURSOR PUT|DEL URL[ CONTENT_HASH]` (or the event as JSON with
    /// --json). Without --live the command ends after the history; with it, it waits for
    /// new events until interrupted. No key is needed unless a USER is `me`; when one is
    /// configured the request is signed (it then counts against the key's rate limit).
    Stream(StreamArgs),

    /// Print the feed of every user's events, oldest first, one line per event.
    ///
    /// Lines as for `pk stream`. Without --all one page is printed, and when the page is
    /// full the cursor to continue from goes to standard error. Signed when a key is
    /// configured.
    Events(EventsArgs),

    /// Publish your pkarr record: your homeserver is the one whose key it names. It goes
    /// on the mainline DHT and to the homeserver, which republishes it while you are
    /// offline. (`pk signup` hands it to the homeserver too.)
    Publish {
        /// The homeserver to name, by its public key [default: the one you use].
        #[arg(long, value_name = "Z32")]
        homeserver_key: Option<PublicKey>,
    },

    /// Move all your data to another homeserver: every value is copied and checked by
    /// its hash (values already there are skipped, so an interrupted move just runs
    /// again), then your pkarr record names the new homeserver. The old homeserver keeps
    /// the data until you delete it.
    Migrate {
        /// The new homeserver: a URL, or its public key (found on the DHT).
        #[arg(long, value_name = "URL|KEY")]
        to: String,
        /// Signup token for the new homeserver, when it requires one.
        #[arg(long, value_name = "TOKEN")]
        token: Option<String>,
        /// Do not publish the record naming the new homeserver.
        #[arg(long)]
        no_publish: bool,
    },

    /// Publish a pubky.app post (a short one) and print its pubky:// URI.
    Post {
        /// The text (at most 2000 characters).
        text: String,
        /// Make it a reply to this post (pubky://<key>/pub/pubky.app/posts/<id>).
        #[arg(long, value_name = "URI")]
        reply_to: Option<String>,
    },

    /// Print USER's pubky.app posts that reply to URI, oldest first.
    Replies {
        /// The post replied to (pubky://<key>/pub/pubky.app/posts/<id>).
        uri: String,
        /// Whose replies to look for (no key needed).
        #[arg(long, value_name = "Z32")]
        user: PublicKey,
        /// Wait up to this many seconds for a first reply (0: look once).
        #[arg(long, value_name = "SECONDS", default_value_t = 0)]
        wait: u64,
    },

    /// Print a shell completion script: `pk completions bash > ~/.local/share/bash-completion/completions/pk`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Directory path, e.g. /pub/app/ (a missing trailing `/` is added).
    pub path: String,
    /// Long format: size in bytes, last update (UTC) and path.
    #[arg(short, long)]
    pub long: bool,
    /// Entries per page (1-1000; the server's default is 100).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LIST_LIMIT)))]
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
pub struct CopyArgs {
    /// Where from: a local file or folder, or a homeserver path.
    pub source: String,
    /// Where to: a homeserver path or a local file or folder.
    pub destination: String,
    /// Copy a folder and everything in it.
    #[arg(short, long)]
    pub recursive: bool,
    /// Replace a local file that exists with other content (a single-file copy; -r
    /// always brings changed files up to date).
    #[arg(long)]
    pub force: bool,
    /// Download this user's public data instead of your own (no key needed).
    #[arg(long, value_name = "Z32")]
    pub user: Option<PublicKey>,
    /// Show what would be copied without doing it.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct SyncArgs {
    /// The folder to copy from: local, or a homeserver path like /pub/site/.
    pub source: String,
    /// The folder to bring up to date: a homeserver path, or local.
    pub destination: String,
    /// Also delete what the destination has and the source does not.
    #[arg(long)]
    pub delete: bool,
    /// Show what would change without doing it.
    #[arg(long)]
    pub dry_run: bool,
    /// Download this user's public data instead of your own (no key needed).
    #[arg(long, value_name = "Z32")]
    pub user: Option<PublicKey>,
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
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_FEED_LIMIT)))]
    pub limit: Option<u32>,
    /// Follow cursors until the end of the feed.
    #[arg(long)]
    pub all: bool,
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
        assert!(stream.live && !stream.reverse);
        assert!(
            cli.global.json,
            "--json after the subcommand is the global flag"
        );
        assert_eq!(stream.path.as_deref(), Some("/pub/a/"));
        // Range checks on the limit are the server's (its message is shown).
        assert_eq!(stream.limit, Some(0));
        assert_eq!(stream.cursor, Some(7));

        let cli = Cli::try_parse_from(["pk", "events", "--cursor", "5", "--all"]).unwrap();
        assert!(!cli.global.json);
        let Command::Events(events) = cli.command else {
            panic!("not events");
        };
        assert_eq!((events.cursor, events.limit), (5, None));
        assert!(events.all);
    }

    #[test]
    fn parses_the_new_commands() {
        let cli = Cli::try_parse_from(["pk", "ls", "-l", "/pub/a/"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Ls(LsArgs { long: true, .. })
        ));
        let cli = Cli::try_parse_from(["pk", "rm", "-r", "/pub/a/"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Rm {
                recursive: true,
                ..
            }
        ));
        let cli = Cli::try_parse_from(["pk", "cp", "-r", "./site", "/pub/site/"]).unwrap();
        let Command::Cp(cp) = cli.command else {
            panic!("not cp");
        };
        assert!(cp.recursive && !cp.force && !cp.dry_run);
        assert_eq!(
            (cp.source.as_str(), cp.destination.as_str()),
            ("./site", "/pub/site/")
        );
        let cli =
            Cli::try_parse_from(["pk", "sync", "/pub/s/", "out", "--delete", "--dry-run"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Sync(SyncArgs {
                delete: true,
                dry_run: true,
                ..
            })
        ));
        let cli = Cli::try_parse_from([
            "pk",
            "get",
            "/pub/a",
            "-o",
            "a",
            "--force",
            "--profile",
            "work",
            "--retries",
            "0",
            "--no-progress",
        ])
        .unwrap();
        assert!(matches!(cli.command, Command::Get { force: true, .. }));
        assert_eq!(cli.global.profile.as_deref(), Some("work"));
        assert_eq!(cli.global.retries, 0);
        assert!(cli.global.no_progress);
        let cli = Cli::try_parse_from(["pk", "completions", "zsh"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Completions {
                shell: clap_complete::Shell::Zsh
            }
        ));
    }

    #[test]
    fn usage_errors() {
        for args in [
            vec!["pk"],
            vec!["pk", "put", "/pub/a"],
            vec!["pk", "ls", "/pub/", "--limit", "0"],
            vec!["pk", "ls", "/pub/", "--limit", "1001"],
            vec!["pk", "get", "/pub/a", "--user", "not-a-key"],
            vec!["pk", "keygen", "--print", "--force"],
            vec!["pk", "keygen", "--print", "--out", "x.key"],
            vec!["pk", "completions", "tcsh"],
            vec!["pk", "cp", "/pub/a"],
            vec!["pk", "sync", "a"],
            vec!["pk", "--retries", "-1", "pubkey"],
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
