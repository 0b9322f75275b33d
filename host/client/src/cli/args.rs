//! The command line of `pk` (clap derive). Only shapes and help texts live here.

use std::path::PathBuf;

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
    fn usage_errors() {
        for args in [
            vec!["pk"],
            vec!["pk", "put", "/pub/a"],
            vec!["pk", "ls", "/pub/", "--limit", "0"],
            vec!["pk", "ls", "/pub/", "--limit", "1001"],
            vec!["pk", "get", "/pub/a", "--user", "not-a-key"],
            vec!["pk", "keygen", "--force"],
            vec!["pk", "frobnicate"],
        ] {
            let err = Cli::try_parse_from(&args).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{args:?}");
        }
    }
}
