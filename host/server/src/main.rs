//! `homeserver`: parse the command line, load the config, run.

use std::process::ExitCode;

use clap::Parser;
use homeserver::cli::{Cli, Command};
use homeserver::config::{Config, LogFormat};
use homeserver::{Homeserver, StartError};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Policy(command)) = cli.command {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(
                EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
            )
            .init();
        return homeserver::policy_cli::run(command);
    }
    let config = match Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("homeserver: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.print_config {
        // The effective settings, without the one secret among them.
        let mut shown = config.clone();
        if !shown.admin.password.is_empty() {
            shown.admin.password = "<set, not shown>".into();
        }
        match toml::to_string_pretty(&shown) {
            Ok(text) => {
                print!("{text}");
                return ExitCode::SUCCESS;
            }
            Err(e) => {
                eprintln!("homeserver: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(command) = cli.command {
        // fsck, export, import, migrate: warnings only, on stderr (stdout may carry an
        // archive or a report).
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(
                EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
            )
            .init();
        return homeserver::maintenance_cli::run(config, command).await;
    }
    init_logging(config.logging.format, config.logging.access);
    match Homeserver::start(config).await {
        Ok(server) => {
            server.run_until_signal().await;
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("homeserver: {e}");
            match e {
                // A configuration refused, like one that does not parse: exit code 2,
                // which the systemd unit does not restart in a loop.
                StartError::RelativePaths(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

fn init_logging(format: LogFormat, access: bool) {
    let directives = std::env::var(EnvFilter::DEFAULT_ENV).unwrap_or_else(|_| "info".into());
    let mut filter = EnvFilter::try_new(&directives).unwrap_or_else(|_| EnvFilter::new("info"));
    // The access log is on or off by `logging.access`, not by the default level: a
    // `RUST_LOG=warn` that quiets the server still logs requests, unless it names the
    // target itself (`access=off`).
    if access && !directives.contains(homeserver::access_log::TARGET) {
        filter = filter.add_directive(
            format!("{}=info", homeserver::access_log::TARGET)
                .parse()
                .expect("a valid directive"),
        );
    }
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
