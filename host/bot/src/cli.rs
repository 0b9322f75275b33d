//! The command line of `pkbot`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// The mention bot: answers posts that mention it with a thread summary or a
/// fact-check. With no config it runs in local mode against a homeserver on
/// 127.0.0.1:6286, with its data under ./data.
#[derive(Debug, Parser)]
#[command(name = "pkbot", version)]
pub struct Cli {
    /// A TOML config file (defaults: host/bot/config.default.toml; every key can also be
    /// set with PKBOT__SECTION__KEY, and the spec's MENTION_POLL_INTERVAL_MS,
    /// WORKER_CONCURRENCY_SUMMARY, WORKER_CONCURRENCY_FACTCHECK, WORKER_TYPE and
    /// BOT_MNEMONIC).
    #[arg(long, short, env = "PKBOT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration (secrets hidden) and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Print the bot's public key (from its mnemonic; made if missing) and exit.
    #[arg(long)]
    pub pubkey: bool,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The dead letters: messages no stage could process (docs/bot.md "Dead letters").
    Dlq {
        #[command(subcommand)]
        action: DlqAction,
    },
    /// Sends again mentions stuck in a state (after Redis lost its data): each goes on
    /// from where it stands, and one whose message is still on a stream is left alone
    /// (docs/bot.md "Redis losing its data"). Redis bus only.
    Redrive {
        /// The state they are stuck in.
        #[arg(long, value_enum)]
        status: StuckStatus,
        /// How long at least since their state last changed: 90s, 10m, 2h, 1d.
        #[arg(long, default_value = "10m")]
        older_than: String,
        /// At most this many.
        #[arg(long, default_value_t = 10_000)]
        limit: u32,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
}

/// States a stuck mention can be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StuckStatus {
    Pending,
    Processing,
}

#[derive(Debug, Subcommand)]
pub enum DlqAction {
    /// List them, oldest first.
    List {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Put one (by its id) or every one back on its stream, once the cause is fixed.
    Replay {
        /// The id `dlq list` shows; without it, every dead letter.
        id: Option<String>,
    },
}
