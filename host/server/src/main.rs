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
        return homeserver::cli::policy::run(command);
    }
    let config = match Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("homeserver: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.print_config {
        // The effective settings; every secret among them serializes as `****`.
        match toml::to_string_pretty(&config) {
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
        return homeserver::cli::maintenance::run(config, command).await;
    }
    // Held to the end of main: dropping it writes the access lines still waiting.
    let _access_log = match init_logging(config.logging.format, config.logging.access) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("homeserver: starting the access log's writer: {e}");
            return ExitCode::FAILURE;
        }
    };
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

/// The log on stdout: the fmt layer for the server's own lines, and the access log's
/// layer for the `access` target (same shapes, written in batches by a thread of its
/// own: `homeserver::http::access_log::output`).
fn init_logging(
    format: LogFormat,
    access: bool,
) -> std::io::Result<homeserver::http::access_log::output::Guard> {
    use homeserver::http::access_log::{TARGET, output};
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::filter_fn;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let directives = std::env::var(EnvFilter::DEFAULT_ENV).unwrap_or_else(|_| "info".into());
    let mut filter = EnvFilter::try_new(&directives).unwrap_or_else(|_| EnvFilter::new("info"));
    // The access log is on or off by `logging.access`, not by the default level: a
    // `RUST_LOG=warn` that quiets the server still logs requests, unless it names the
    // target itself (`access=off`).
    if access && !directives.contains(TARGET) {
        filter = filter.add_directive(format!("{TARGET}=info").parse().expect("a valid directive"));
    }
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let not_access = filter_fn(|metadata| metadata.target() != TARGET);
    let fmt = tracing_subscriber::fmt::layer().with_ansi(ansi);
    let fmt = match format {
        LogFormat::Json => fmt.json().with_filter(not_access).boxed(),
        LogFormat::Text => fmt.with_filter(not_access).boxed(),
    };
    let (access, guard) = output::layer(format, std::io::stdout())?;
    // This process's request lines skip tracing's dispatch (the filter above still
    // decides whether there are any: `AccessLog::start`).
    access.take_lines_directly();
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(access)
        .init();
    Ok(guard)
}
