//! The `homeserver` command line.

use std::path::PathBuf;

use clap::Parser;

/// A per-user data store over HTTP. With no arguments it runs the embedded default:
/// SQLite and blobs under ./data, policies from ./policies, signup open, HTTP on
/// 127.0.0.1:6286. Every config key can be overridden by an environment variable
/// HOMESERVER__<SECTION>__<KEY> (e.g. HOMESERVER__HTTP__LISTEN=0.0.0.0:6286).
#[derive(Debug, Parser)]
#[command(name = "homeserver", version)]
pub struct Cli {
    /// TOML config file; keys not in it keep their defaults.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Print the effective configuration (defaults, file and env merged) and exit.
    #[arg(long)]
    pub print_config: bool,
}
