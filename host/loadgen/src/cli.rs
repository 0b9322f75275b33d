//! The `hs-load` command line: `baseline` (serve) and `run` (measure), and the tokio
//! runtime each one runs on (`--threads` worker threads, default: all cores).

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use tokio::net::TcpListener;

use crate::driver::{self, RunConfig};
use crate::scenario::{Scenario, value_bytes};
use crate::target::Target;

#[derive(Debug, Parser)]
#[command(name = "hs-load", version, about = "Load generator for the homeserver")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve a fixed body to every request with bare hyper (the comparison baseline).
    Baseline(BaselineArgs),
    /// Load a server for a fixed time and print one summary line.
    Run(RunArgs),
}

#[derive(Debug, Args)]
pub struct BaselineArgs {
    /// Loopback address to listen on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Size of the response body.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(0..=(64 << 20)))]
    pub body_bytes: u32,
    /// Runtime worker threads (default: number of cores).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Server to load: http:// on 127.0.0.1, localhost or [::1] only.
    #[arg(long, value_parser = Target::parse)]
    pub url: Target,
    #[arg(long, value_enum)]
    pub scenario: Scenario,
    /// Concurrent keep-alive connections, each with one request in flight.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub connections: u16,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub duration: u32,
    /// Seconds of load before measuring starts.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=600))]
    pub warmup: u32,
    /// Runtime worker threads (default: number of cores).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Print the summary as a JSON object instead of a text line.
    #[arg(long)]
    pub json: bool,
}

pub fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Baseline(args) => baseline(args),
        Command::Run(args) => run(args),
    }
}

fn runtime(threads: Option<u16>) -> anyhow::Result<tokio::runtime::Runtime> {
    let threads = threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, NonZeroUsize::get),
        usize::from,
    );
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

fn baseline(args: BaselineArgs) -> anyhow::Result<()> {
    if !args.listen.ip().is_loopback() {
        bail!(
            "refusing to listen on {}: loopback addresses only",
            args.listen
        );
    }
    let body = value_bytes(args.body_bytes as usize);
    runtime(args.threads)?.block_on(async move {
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        eprintln!(
            "hs-load baseline: listening on {} ({} byte body)",
            listener.local_addr()?,
            body.len()
        );
        tokio::select! {
            () = crate::baseline::serve(listener, Bytes::clone(&body)) => {}
            signal = tokio::signal::ctrl_c() => signal.context("waiting for Ctrl-C")?,
        }
        Ok(())
    })
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = RunConfig {
        target: args.url,
        scenario: args.scenario,
        connections: usize::from(args.connections),
        warmup: Duration::from_secs(args.warmup.into()),
        duration: Duration::from_secs(args.duration.into()),
    };
    let summary = runtime(args.threads)?.block_on(driver::run(config))?;
    if args.json {
        println!("{}", summary.to_json());
    } else {
        println!("{}", summary.line());
    }
    if summary.successes() == 0 {
        bail!("no request succeeded in the measured window");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn run_arguments_parse_and_guard_the_url() {
        let cli = Cli::try_parse_from([
            "hs-load",
            "run",
            "--url",
            "http://localhost:6286",
            "--scenario",
            "public-get-1m",
            "--connections",
            "4",
            "--duration",
            "3",
            "--json",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run")
        };
        assert_eq!(args.scenario, Scenario::PublicGet1m);
        assert_eq!((args.connections, args.duration, args.warmup), (4, 3, 2));
        assert!(args.json);

        for bad in [
            ["--url", "http://192.168.1.1:80", "--scenario", "static"],
            ["--url", "http://127.0.0.1:80", "--scenario", "delete-all"],
        ] {
            let argv = ["hs-load", "run"].into_iter().chain(bad);
            assert!(Cli::try_parse_from(argv).is_err());
        }
        assert!(
            Cli::try_parse_from([
                "hs-load",
                "run",
                "--url",
                "http://127.0.0.1:1",
                "--scenario",
                "static",
                "--connections",
                "0",
            ])
            .is_err()
        );
    }

    #[test]
    fn baseline_refuses_public_addresses() {
        let error = baseline(BaselineArgs {
            listen: "0.0.0.0:0".parse().unwrap(),
            body_bytes: 1,
            threads: Some(1),
        })
        .unwrap_err();
        assert!(error.to_string().contains("loopback"));
    }
}
