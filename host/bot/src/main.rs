//! `pkbot`: parse the command line, load the config, run.

use std::process::ExitCode;

use clap::Parser;
use pkbot::cli::Cli;
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
        let mut shown = config.clone();
        for secret in [
            &mut shown.identity.mnemonic,
            &mut shown.ai.api_key,
            &mut shown.search.api_key,
            &mut shown.homeserver.signup_token,
        ] {
            if !secret.is_empty() {
                *secret = "<set, not shown>".into();
            }
        }
        return match toml::to_string_pretty(&shown) {
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
            &config.identity.mnemonic,
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
