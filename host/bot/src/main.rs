//! `pkbot`: parse the command line, load the config, run.

use std::process::ExitCode;

use clap::Parser;
use pkbot::cli::{Cli, Command, DlqAction, StuckStatus};
use pkbot::{Bot, BotConfig, identity, logging};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match BotConfig::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pkbot: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.print_config {
        // Every secret setting serializes as `****` (URLs with their passwords hidden).
        return match toml::to_string_pretty(&config) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("pkbot: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if cli.pubkey {
        return match identity::load_or_create(
            config.identity.mnemonic.expose(),
            &config.identity.mnemonic_file,
        ) {
            Ok((key, _)) => {
                println!("{}", key.public_key());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("pkbot: {e}");
                ExitCode::from(2)
            }
        };
    }
    match cli.command {
        Some(Command::Dlq { action }) => return dlq(&config, action).await,
        Some(Command::Redrive {
            status,
            older_than,
            limit,
            json,
        }) => return redrive(&config, status, &older_than, limit, json).await,
        None => {}
    }
    logging::init(config.logging.format);
    match Bot::start(config).await {
        Ok(bot) => {
            bot.run_until_signal().await;
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            eprintln!("pkbot: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `pkbot dlq ...`.
async fn dlq(config: &BotConfig, action: DlqAction) -> ExitCode {
    let letters = match pkbot::dlq::DeadLetters::open(config).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("pkbot: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match action {
        DlqAction::List { json } => letters.list().await.map(|list| {
            for letter in &list {
                if json {
                    println!("{}", serde_json::to_string(letter).unwrap_or_default());
                } else {
                    println!(
                        "{}  {}  deliveries={}  mention={}\n    reason: {}",
                        letter.id,
                        letter.stream,
                        letter.deliveries,
                        letter.mention_id().unwrap_or_else(|| "-".into()),
                        letter.reason
                    );
                }
            }
            if list.is_empty() && !json {
                eprintln!("no dead letters");
            }
        }),
        DlqAction::Replay { id } => letters.replay(id.as_deref()).await.map(|done| {
            for letter in &done {
                println!("replayed {} onto {}", letter.id, letter.stream);
            }
            if done.is_empty() {
                eprintln!("nothing to replay");
            }
        }),
    };
    letters.close().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pkbot: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `pkbot redrive ...`.
async fn redrive(
    config: &BotConfig,
    status: StuckStatus,
    older_than: &str,
    limit: u32,
    json: bool,
) -> ExitCode {
    let older_than = match pkbot::redrive::parse_age(older_than) {
        Ok(age) => age,
        Err(e) => {
            eprintln!("pkbot: {e}");
            return ExitCode::from(2);
        }
    };
    let handles = match pkbot::dlq::DeadLetters::open(config).await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("pkbot: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(bus) = handles.redis() else {
        eprintln!(
            "pkbot: redrive is for the Redis bus; with the in-process bus the running bot \
             drives unfinished mentions again every workers.redrive_interval_secs"
        );
        handles.close().await;
        return ExitCode::from(2);
    };
    let status = match status {
        StuckStatus::Pending => pkbot::store::MentionStatus::Pending,
        StuckStatus::Processing => pkbot::store::MentionStatus::Processing,
    };
    let result = pkbot::redrive::redrive(handles.store(), bus, status, older_than, limit).await;
    handles.close().await;
    match result {
        Ok(sent) => {
            for one in &sent {
                if json {
                    println!("{}", serde_json::to_string(one).unwrap_or_default());
                } else {
                    println!(
                        "re-sent {} ({}) onto {}",
                        one.mention_id, one.status, one.stream
                    );
                }
            }
            if sent.is_empty() && !json {
                eprintln!("nothing stuck");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pkbot: {e}");
            ExitCode::FAILURE
        }
    }
}
