//! The `homeserver` command line: the arguments and subcommands (here), the plugin
//! author's tools ([`policy`], [`policy_template`]) and the operator's maintenance tools
//! ([`maintenance`]); `main.rs` only parses and dispatches.

pub mod maintenance;
pub mod policy;
pub mod policy_template;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// A per-user data store over HTTP. With no arguments it runs the embedded default:
/// SQLite and blobs under ./data, policies from ./policies (built-in guests for slots
/// without a module there), signup open, HTTP on 127.0.0.1:6286. Every config key can be
/// overridden by an environment variable HOMESERVER__<SECTION>__<KEY> (e.g.
/// HOMESERVER__HTTP__LISTEN=0.0.0.0:6286).
#[derive(Debug, Parser)]
#[command(name = "homeserver", version)]
pub struct Cli {
    /// TOML config file; keys not in it keep their defaults.
    #[arg(long, short, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,

    /// Print the effective configuration (defaults, file and env merged) and exit.
    #[arg(long)]
    pub print_config: bool,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Work with Wasm guests (see docs/guests.md).
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Check the stores against each other: entries whose value is missing, values no
    /// entry references, usage that disagrees with the entries. Exit code 0 when clean
    /// (or repaired), 1 when something was found and not repaired.
    Fsck {
        /// Fix what was found: remove entries whose value is lost (with a DEL event),
        /// delete unreferenced values, correct usage.
        #[arg(long)]
        repair: bool,
        /// Only values unreferenced for this many seconds count as orphans (younger ones
        /// may be uploads in flight on a running server). Default: what the server's
        /// own sweep waits, the larger of 600 and http.upload_timeout_secs + 2 x
        /// storage.timeout_secs + 60.
        #[arg(long, value_name = "SECONDS")]
        min_orphan_age: Option<u64>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write one user's data as an archive (tar; format in docs/deploy.md) to FILE or
    /// stdout.
    Export {
        /// The user's public key (z-base-32).
        #[arg(long)]
        user: String,
        /// The archive to write ("-" or nothing: stdout). An existing file is refused.
        #[arg(long, short, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Store the values of an archive made by `export` (from FILE or stdin) as its user,
    /// each checked against its hash; signs the user up when needed.
    Import {
        /// The archive ("-" or nothing: stdin).
        file: Option<PathBuf>,
    },
    /// Back the embedded store (SQLite + blob folder) up into DIR, while the server runs:
    /// a consistent database snapshot, the values it points at (hard links where the file
    /// system allows), the server key, the policies folder and a manifest with hashes.
    /// Must finish within storage.blob_grace_secs. PostgreSQL + S3: docs/deploy.md.
    Backup {
        /// A new (or empty) folder.
        dir: PathBuf,
    },
    /// Restore a backup made by `backup` into the --config's data paths, which must be
    /// empty (stop the server first). Every file and value is checked against the
    /// manifest and the database before anything is written.
    Restore {
        /// The backup folder.
        dir: PathBuf,
    },
    /// Copy this deployment (the --config's stores) to the stores another config file
    /// names, e.g. from SQLite + disk to PostgreSQL + S3: users, values, entries, the
    /// event log with its cursors, signup tokens, sessions, pkarr records, and the server
    /// key and policies folder (to the target's keys.secret_key_file and policies.dir;
    /// refused when the target has another key there). Stop the servers first. An
    /// interrupted copy resumes where it stopped when run again.
    Migrate {
        /// The target's config file: its [storage], [s3], [keys] and [policies] are
        /// used. HOMESERVER__* variables do not apply to it (they are the source's); its
        /// secrets come from the file or its *_file settings, and S3 also reads the
        /// standard AWS_* variables.
        #[arg(long, value_name = "FILE")]
        to: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Check a module against its slot's world and run the slot's golden cases (and
    /// yours, with --cases). Exit code 0 when it fits and the cases pass: yours when
    /// given (the built-in ones are then reported only: a guest may differ on purpose),
    /// else the slot's.
    Check {
        /// The .wasm component.
        file: PathBuf,
        /// capability-policy, safety-filter or intent-classifier.
        #[arg(long)]
        slot: String,
        /// Your own cases (one JSON object a line: name, config, input, expect), e.g.
        /// the cases.jsonl `policy new` wrote.
        #[arg(long, value_name = "FILE")]
        cases: Option<PathBuf>,
        /// Each guest call's deadline in ms (the server's default, 100, unless given):
        /// the first call of a big guest on a busy machine may need more. A module that
        /// needs more to serve needs `policies.call_deadline_ms` raised as much.
        #[arg(long, value_name = "MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(50..=600_000))]
        deadline_ms: u64,
        /// Print every case with its result, the time its guest call took and the
        /// instance's memory after it (the first case, and any with a config of its
        /// own, include creating an instance).
        #[arg(long)]
        report: bool,
        /// A folder to keep compiled modules in (and take them from): a big guest (Python,
        /// JavaScript) compiles for tens of seconds once, then loads from it in ms.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
    /// Test a guest with the case files of its folder (cases.jsonl and tests/*.jsonl),
    /// each case on a fresh instance. Exit code 0 when every case passes, 1 when one
    /// fails, 2 when the module or a case file cannot be used.
    Test {
        /// The guest's folder (or one case file).
        dir: PathBuf,
        /// The .wasm component; default: the one .wasm in DIR, or in
        /// DIR/target/wasm32-wasip2/release (what `policy new`'s build makes).
        #[arg(long, value_name = "FILE")]
        module: Option<PathBuf>,
        /// capability-policy, safety-filter or intent-classifier; default: the slot
        /// whose world the module fits.
        #[arg(long)]
        slot: Option<String>,
        /// Hold every case to what it declares: the guest sees only the case's
        /// `config` keys (reading another fails the case) and may use only the host
        /// imports the case's `imports` names (config, random, log, environment, stdin,
        /// exit; config is implied by declared keys).
        #[arg(long)]
        strict: bool,
        /// The most 1 ms epoch ticks a case's call may run through, for cases that
        /// set no `budget_ticks` of their own.
        #[arg(long, value_name = "TICKS")]
        budget_ticks: Option<u64>,
        /// Each guest call's deadline in ms.
        #[arg(long, value_name = "MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(50..=600_000))]
        deadline_ms: u64,
        /// Print the report as one JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// A folder to keep compiled modules in (and take them from): a big guest (Python,
        /// JavaScript) compiles for tens of seconds once, then loads from it in ms.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
    /// Start a new guest: write a ready crate for SLOT into DIR (Cargo.toml, the WIT,
    /// a working src/lib.rs, cases.jsonl, a README with the build → check → reload loop).
    New {
        #[arg(long)]
        slot: String,
        /// The guest's language: rust (any slot), javascript (capability-policy; built
        /// with componentize-js) or python (capability-policy; built
        /// with componentize-py).
        #[arg(long, value_enum, default_value = "rust")]
        lang: crate::cli::policy_template::Lang,
        /// A new (or empty) folder; its name names the crate.
        dir: PathBuf,
    },
    /// Evaluate JSON lines from stdin with a slot's guest; answers as JSON lines on
    /// stdout (e.g. {"text": "..."} for safety-filter and intent-classifier).
    Eval {
        #[arg(long)]
        slot: String,
        /// A module to use instead of what the policies folder configures.
        #[arg(long, value_name = "FILE")]
        module: Option<PathBuf>,
        /// The policies folder (its data: wordlists, keyword tables).
        #[arg(long, value_name = "DIR", default_value = "policies")]
        policies: PathBuf,
    },
    /// Write the built-in guests and their data into a policies folder (existing files
    /// are kept unless --force).
    Install {
        #[arg(default_value = "policies")]
        dir: PathBuf,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
}
