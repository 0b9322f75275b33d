//! `homeserver fsck|export|import|migrate|backup|restore`: the operator's maintenance
//! tools, over `service::maintenance` and `service::backup`. They open the configured
//! stores directly (taking the local stores' locks, so a server running on the same
//! SQLite database or blob folder must be stopped first; shared stores need no lock;
//! `backup` alone takes none: it only reads, beside the running server) and show a
//! progress bar on a terminal.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::Command;
use crate::config::Config;
use crate::persistence::{self, BlobStore, LocalStorageLock};
use crate::service::backup::{self, DataPaths};
use crate::service::maintenance::{self, Progress, Stores};

/// Runs a maintenance command; exit code 2 on errors.
pub async fn run(config: Config, command: Command) -> ExitCode {
    match execute(config, command).await {
        Ok(code) => code,
        Err(message) => {
            eprintln!("homeserver: {message}");
            ExitCode::from(2)
        }
    }
}

/// The stores of `config`, locked when local.
async fn open(config: &Config) -> Result<(Stores, LocalStorageLock), String> {
    let storage = &config.storage;
    crate::local_paths::resolve_here(config).map_err(|e| e.to_string())?;
    let lock = persistence::lock_local_storage(&storage.database_url, &storage.blobs)
        .map_err(|e| e.to_string())?;
    let options = storage.backend_options();
    let metadata = persistence::open_metadata(&storage.database_url, &options)
        .await
        .map_err(|e| format!("{}: {e}", storage.database_url))?;
    let blobs = BlobStore::open(&storage.blobs, &config.s3, &options)
        .map_err(|e| format!("{}: {e}", storage.blobs))?;
    Ok((Stores { metadata, blobs }, lock))
}

/// A progress bar on stderr when it is a terminal (hidden otherwise).
struct Bar(ProgressBar);

impl Bar {
    fn new() -> Self {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        if !std::io::stderr().is_terminal() {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:20} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        Self(bar)
    }
}

impl Progress for Bar {
    fn set_total(&self, bytes: u64) {
        self.0.set_length(bytes);
    }
    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
    fn message(&self, text: &str) {
        self.0.set_message(text.to_owned());
    }
}

async fn execute(config: Config, command: Command) -> Result<ExitCode, String> {
    match command {
        Command::Fsck {
            repair,
            min_orphan_age,
            json,
        } => {
            let (stores, _lock) = open(&config).await?;
            let bar = Bar::new();
            let report = maintenance::fsck(
                &stores,
                repair,
                min_orphan_age.map_or_else(|| config.orphan_min_age(), Duration::from_secs),
                &bar,
            )
            .await
            .map_err(|e| e.to_string())?;
            bar.0.finish_and_clear();
            if json {
                let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
                println!("{text}");
            } else {
                print_fsck(&report);
            }
            Ok(if report.is_clean() || report.repaired.is_some() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Export { user, out } => {
            let key = user
                .parse()
                .map_err(|e| format!("--user {user}: not a public key: {e}"))?;
            let (stores, _lock) = open(&config).await?;
            let bar: Arc<dyn Progress> = Arc::new(Bar::new());
            let to_stdout = out.as_deref().is_none_or(|p| p == Path::new("-"));
            if to_stdout && std::io::stdout().is_terminal() {
                return Err("refusing to write an archive to a terminal: use --out FILE".into());
            }
            let out: Box<dyn Write + Send> = match out.as_deref() {
                None => Box::new(std::io::stdout()),
                Some(p) if p == Path::new("-") => Box::new(std::io::stdout()),
                Some(path) => Box::new(std::io::BufWriter::new(
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(path)
                        .map_err(|e| format!("{}: {e}", path.display()))?,
                )),
            };
            let summary = maintenance::export_user(&stores, &key, out, bar)
                .await
                .map_err(|e| e.to_string())?;
            eprintln!(
                "exported {}: {} values, {} bytes",
                summary.user, summary.entries, summary.bytes
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Import { file } => {
            let (stores, _lock) = open(&config).await?;
            let bar: Arc<dyn Progress> = Arc::new(Bar::new());
            let input: Box<dyn std::io::Read + Send> = match file.as_deref() {
                None => Box::new(std::io::stdin()),
                Some(p) if p == Path::new("-") => Box::new(std::io::stdin()),
                Some(path) => Box::new(std::io::BufReader::new(
                    std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?,
                )),
            };
            let summary = maintenance::import_archive(
                &stores,
                input,
                config.storage.quota_bytes,
                config.storage.inline_max_bytes,
                bar,
            )
            .await
            .map_err(|e| e.to_string())?;
            eprintln!(
                "imported {}: {} values, {} bytes",
                summary.user, summary.entries, summary.bytes
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate { to } => {
            let target = Config::load_file_only(&to).map_err(|e| e.to_string())?;
            if target.storage.database_url == config.storage.database_url
                && target.storage.blobs == config.storage.blobs
            {
                return Err("--to names the same stores as the source".into());
            }
            // The server key and the policies go too: checked before any data moves.
            let carry = backup::plan_carry(
                &config.keys.secret_key_file,
                &config.policies.dir,
                &target.keys.secret_key_file,
                &target.policies.dir,
            )
            .map_err(|e| e.to_string())?;
            let (from, _from_lock) = open(&config).await?;
            let (into, _into_lock) = open(&target).await?;
            eprintln!(
                "copying {} + {} to {} + {}",
                config.storage.database_url,
                config.storage.blobs,
                target.storage.database_url,
                target.storage.blobs
            );
            let bar = Bar::new();
            let summary = maintenance::migrate(&from, &into, &bar)
                .await
                .map_err(|e| format!("{e} (run the same command again to resume)"))?;
            bar.0.finish_and_clear();
            eprintln!(
                "copied {} users, {} values ({} bytes; {} already there), {} events, {} \
                 signup tokens, {} sessions, {} pkarr records",
                summary.users,
                summary.entries,
                summary.bytes,
                summary.blobs_skipped,
                summary.events,
                summary.signup_tokens,
                summary.sessions,
                summary.pkarr_records
            );
            // Verify: the target holds what the source does, entry by entry.
            let checked = maintenance::verify_copy(&from, &into)
                .await
                .map_err(|e| format!("{e} (run the same command again to copy what is missing)"))?;
            backup::carry(&carry).map_err(|e| e.to_string())?;
            match &carry.copy_key {
                Some((_, to)) => eprintln!("copied the server key to {}", to.display()),
                None => eprintln!("the target has the server key already"),
            }
            if let Some((_, to)) = &carry.copy_policies {
                eprintln!("copied the policies folder to {}", to.display());
            }
            eprintln!(
                "verified: {} users, {} entries ({} bytes) with their values, the event \
                 log up to cursor {} and {} pkarr records match on both; point the servers at \
                 {} and start them",
                checked.users,
                checked.entries,
                checked.bytes,
                checked.latest_cursor,
                checked.pkarr_records,
                to.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Backup { dir } => {
            let paths = DataPaths::of(&config).map_err(|e| e.to_string())?;
            // No lock: the server may run (the snapshot and the links only read).
            let bar = Bar::new();
            let summary = backup::backup(&paths, &dir, config.storage.blob_grace_secs, &bar)
                .await
                .map_err(|e| e.to_string())?;
            bar.0.finish_and_clear();
            eprintln!(
                "backed up {} values ({} bytes; {} hard-linked), {} files and the database                  (schema version {}) into {}",
                summary.values.count,
                summary.values.bytes,
                summary.linked,
                summary.files,
                summary.schema_version,
                dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Restore { dir } => {
            let paths = DataPaths::of(&config).map_err(|e| e.to_string())?;
            // No server may start on the target meanwhile.
            let _lock = persistence::lock_local_storage(
                &config.storage.database_url,
                &config.storage.blobs,
            )
            .map_err(|e| e.to_string())?;
            let bar = Bar::new();
            let summary = backup::restore(&dir, &paths, &bar)
                .await
                .map_err(|e| e.to_string())?;
            bar.0.finish_and_clear();
            eprintln!(
                "restored {} values ({} bytes; {} hard-linked), {} files and the database                  (schema version {}) from {}; start the server",
                summary.values.count,
                summary.values.bytes,
                summary.linked,
                summary.files,
                summary.schema_version,
                dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy(_) => Err("not a maintenance command".into()),
    }
}

fn print_fsck(report: &maintenance::FsckReport) {
    println!(
        "{} users, {} entries ({} bytes, {} of them small values kept in their rows), {} \
         stored values ({} replaced or deleted, kept for storage.blob_grace_secs)",
        report.users,
        report.entries,
        report.bytes,
        report.inline_values,
        report.blobs,
        report.retired_blobs
    );
    for m in &report.missing_blobs {
        println!("MISSING VALUE  {}{} (blob {})", m.user, m.path, m.blob_key);
    }
    for d in &report.damaged_values {
        println!(
            "DAMAGED VALUE  {}{} (kept in its row: its size or hash is not the entry's; \
             --repair leaves it)",
            d.user, d.path
        );
    }
    for key in &report.orphan_blobs {
        println!("ORPHAN VALUE   {key}");
    }
    for u in &report.usage_mismatches {
        println!(
            "USAGE          {}: recorded {} bytes, entries sum to {}",
            u.user, u.recorded, u.actual
        );
    }
    if report.is_clean() {
        println!("clean");
    }
    if let Some(r) = &report.repaired {
        println!(
            "repaired: {} entries removed, {} orphan values deleted, {} usages corrected",
            r.entries_removed, r.orphans_deleted, r.usages_corrected
        );
    } else if !report.is_clean() {
        println!("run `homeserver fsck --repair` to fix these");
    }
}
