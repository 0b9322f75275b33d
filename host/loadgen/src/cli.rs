//! The `hs-load` command line: `baseline` (serve), `run` (measure) and `fanout` (event
//! delivery), and the tokio runtime each one runs on (`--threads` worker threads,
//! default: all cores).

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use tokio::net::TcpListener;

use crate::driver::{self, RunConfig};
use crate::fanout::{self, FanoutConfig};
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
    /// Open N live event-stream subscriptions, write at a fixed rate, and measure how
    /// fast (and whether exactly once) each event reaches each subscriber.
    Fanout(FanoutArgs),
    /// Replay the hostile-client probes (silent connections, idle HTTP/2, malformed
    /// heads, forged-signature lockout, forged uploads) against a running server; exits
    /// non-zero if any fails.
    Attack(AttackArgs),
    /// Start the homeserver binary, write concurrently, kill -9 it at a random moment,
    /// restart, and check every acknowledged write; N times.
    CrashLoop(CrashLoopArgs),
    /// Sign up on a server, store what a scenario reads, and print a Lua script that
    /// makes `wrk` send that scenario's requests (pre-signed PUTs for put-*).
    WrkScript(WrkScriptArgs),
}

#[derive(Debug, Args)]
pub struct WrkScriptArgs {
    /// Server to prepare: http:// on 127.0.0.1, localhost or [::1] only.
    #[arg(long, value_parser = Target::parse)]
    pub url: Target,
    #[arg(long, value_enum)]
    pub scenario: Scenario,
    /// PUTs to sign in advance (put-* only): more than wrk will send.
    #[arg(long, default_value_t = 100_000)]
    pub requests: usize,
    /// wrk's --threads (put-* splits the signed requests between them).
    #[arg(long, default_value_t = 2)]
    pub wrk_threads: usize,
}

#[derive(Debug, Args)]
pub struct AttackArgs {
    /// Server to attack: http:// on 127.0.0.1, localhost or [::1] only. It must have
    /// open signup.
    #[arg(long, value_parser = Target::parse)]
    pub url: Target,
    /// The server's http.header_read_timeout_secs.
    #[arg(long, default_value_t = 10)]
    pub header_timeout_secs: u64,
    /// Silent TCP connections to open at once.
    #[arg(long, default_value_t = 2000)]
    pub silent: usize,
    /// HTTP/2 connections that send a preface and settings (some a partial HEADERS),
    /// then nothing.
    #[arg(long, default_value_t = 200)]
    pub h2_idle: usize,
    /// Forged writes in a victim's name.
    #[arg(long, default_value_t = 60)]
    pub forged: usize,
    /// Forged 5 MiB uploads without Content-Digest, all at once.
    #[arg(long, default_value_t = 20)]
    pub forged_uploads: usize,
    /// The server's data folder: checked to grow by less than 1 MiB during forged uploads.
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Connections one address holds busy with unfinished uploads (above the server's
    /// http.max_connections_per_ip) while another address must be served.
    #[arg(long, default_value_t = 300)]
    pub busy: usize,
    /// Rounds of event streams opened and dropped while the server's memory is watched
    /// (needs --server-pid).
    #[arg(long, default_value_t = 60)]
    pub stream_rounds: usize,
    /// Event streams per round, 25 per loopback address.
    #[arg(long, default_value_t = 400)]
    pub streams_per_round: usize,
    /// The server's process id, to read its resident memory from /proc.
    #[arg(long)]
    pub server_pid: Option<u32>,
}

#[derive(Debug, Args)]
pub struct CrashLoopArgs {
    /// The homeserver binary to start (and kill).
    #[arg(long)]
    pub homeserver: std::path::PathBuf,
    /// kill -9 cycles.
    #[arg(long, default_value_t = 20)]
    pub cycles: u32,
    /// Concurrent writers.
    #[arg(long, default_value_t = 8)]
    pub writers: usize,
    /// Largest value a writer PUTs (sizes vary from 0 up to it).
    #[arg(long, default_value_t = 256 * 1024)]
    pub max_value_bytes: usize,
    /// Data folder (kept when given; a temporary one is removed after a passing run).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
    /// Seed of the writers' choices (paths, sizes, when to kill), to repeat a run.
    #[arg(long)]
    pub seed: Option<u64>,
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
    /// More instances of the same deployment (sharing its stores) to spread the
    /// connections over, round-robin; set-up runs against --url.
    #[arg(long = "also-url", value_parser = Target::parse)]
    pub also_urls: Vec<Target>,
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

#[derive(Debug, Args)]
pub struct FanoutArgs {
    /// Server to load: http:// on 127.0.0.1, localhost or [::1] only.
    #[arg(long, value_parser = Target::parse)]
    pub url: Target,
    /// Live subscriptions, one connection each (0: measure the writes alone).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub subscribers: u32,
    /// Signed PUTs to make, each to a new path.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub writes: u32,
    /// Writes per second (open loop: due times do not wait for answers).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub rate: u32,
    /// Writer users; subscriber i follows user i % users, write j goes to user j % users.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub users: u32,
    /// Subscriptions opened per second.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub connect_rate: u32,
    /// Connections the writes are spread over (a write waits only when all are busy).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub writer_connections: u16,
    /// Size of each written value.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(0..=(1 << 20)))]
    pub value_bytes: u32,
    /// The server's process id: report its memory per idle subscriber (from /proc).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// The server's metrics listener (loopback): wait until it counts the subscriptions.
    #[arg(long, value_parser = Target::parse)]
    pub metrics_url: Option<Target>,
    /// Seconds after which the run stops and reports what it has.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u32).range(1..=86_400))]
    pub timeout: u32,
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
        Command::Fanout(args) => fanout(args),
        Command::Attack(args) => attack(args),
        Command::CrashLoop(args) => crash_loop(args),
        Command::WrkScript(args) => wrk_script(args),
    }
}

fn wrk_script(args: WrkScriptArgs) -> anyhow::Result<()> {
    let script = crate::wrk::WrkScript {
        url: args.url,
        scenario: args.scenario,
        requests: args.requests,
        wrk_threads: args.wrk_threads.max(1),
    };
    print!("{}", runtime(Some(1))?.block_on(script.build())?);
    Ok(())
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
        also: args.also_urls,
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

/// File descriptors a fan-out run needs beyond one per subscription (writers, metrics,
/// the runtime, stdio).
const SPARE_FDS: u64 = 64;

/// Raises this process's soft limit on open files to its hard limit; returns the soft
/// limit in force afterwards (None where it cannot be read).
fn raise_nofile_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
        if soft < hard
            && let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
        {
            eprintln!("hs-load: cannot raise the open-file limit to {hard}: {error}");
            return Some(soft);
        }
        Some(hard.max(soft))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

fn fanout(args: FanoutArgs) -> anyhow::Result<()> {
    let limit = raise_nofile_limit();
    let needed = u64::from(args.subscribers) + u64::from(args.writer_connections) + SPARE_FDS;
    if let Some(limit) = limit
        && limit < needed
    {
        bail!(
            "{} subscribers need about {needed} open files, the limit is {limit} \
             (raise the hard limit, e.g. `ulimit -Hn`, as root)",
            args.subscribers
        );
    }
    let config = FanoutConfig {
        target: args.url,
        metrics: args.metrics_url,
        subscribers: args.subscribers as usize,
        users: args.users as usize,
        writes: args.writes as usize,
        rate: f64::from(args.rate),
        connect_rate: f64::from(args.connect_rate),
        writer_connections: usize::from(args.writer_connections),
        value_bytes: args.value_bytes as usize,
        server_pid: args.server_pid,
        timeout: Duration::from_secs(args.timeout.into()),
    };
    let summary = runtime(args.threads)?.block_on(fanout::run(config))?;
    if args.json {
        println!("{}", summary.to_json());
    } else {
        println!("{}", summary.line());
    }
    if !summary.clean() {
        bail!(
            "the run was not clean: {} errors, {} missing, {} duplicates, {} out of order, \
             {} unexpected, {}/{} writes committed, {}/{} subscriptions{}",
            summary.errors(),
            summary.check.missing,
            summary.check.duplicates,
            summary.check.out_of_order,
            summary.check.unexpected,
            summary.writes_ok,
            summary.writes,
            summary.opened,
            summary.subscribers,
            if summary.timed_out { ", timed out" } else { "" },
        );
    }
    Ok(())
}

fn attack(args: AttackArgs) -> anyhow::Result<()> {
    let limit = raise_nofile_limit();
    let needed =
        (args.silent + args.h2_idle).max(args.busy + args.streams_per_round) as u64 + SPARE_FDS;
    if let Some(limit) = limit
        && limit < needed
    {
        bail!("{needed} open files needed, the limit is {limit}");
    }
    let config = crate::attack::probes::ProbeConfig {
        target: args.url,
        header_timeout: Duration::from_secs(args.header_timeout_secs),
        silent: args.silent,
        h2_idle: args.h2_idle,
        forged: args.forged,
        forged_uploads: args.forged_uploads,
        data_dir: args.data_dir,
        busy: args.busy,
        stream_rounds: args.stream_rounds,
        streams_per_round: args.streams_per_round,
        server_pid: args.server_pid,
    };
    let findings = runtime(None)?.block_on(crate::attack::probes::run_all(&config));
    let mut failed = 0;
    for f in &findings {
        println!(
            "{} {}: {}",
            if f.passed { "PASS" } else { "FAIL" },
            f.probe,
            f.detail
        );
        failed += usize::from(!f.passed);
    }
    if failed > 0 {
        bail!("{failed} of {} probes failed", findings.len());
    }
    Ok(())
}

fn crash_loop(args: CrashLoopArgs) -> anyhow::Result<()> {
    use crate::attack::crash_loop::{self, CrashLoopConfig};
    let keep = args.dir.is_some();
    let dir = args.dir.unwrap_or_else(crash_loop::default_dir);
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("hs-load crash-loop: seed {seed}, data in {}", dir.display());
    // The server runs in the data folder: a relative binary path must not move with it.
    let homeserver = std::fs::canonicalize(&args.homeserver)
        .with_context(|| format!("finding {}", args.homeserver.display()))?;
    let config = CrashLoopConfig {
        homeserver,
        dir: dir.clone(),
        cycles: args.cycles,
        writers: args.writers,
        max_value_bytes: args.max_value_bytes,
        seed,
    };
    let report = runtime(None)?.block_on(crash_loop::run(config))?;
    println!("{}", report.line());
    if !keep {
        crash_loop::remove_dir(&dir);
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
    fn fanout_arguments_parse_and_guard_the_urls() {
        let cli = Cli::try_parse_from([
            "hs-load",
            "fanout",
            "--url",
            "http://127.0.0.1:6286",
            "--subscribers",
            "0",
            "--writes",
            "10",
            "--rate",
            "5",
            "--metrics-url",
            "http://localhost:6289",
            "--server-pid",
            "42",
        ])
        .unwrap();
        let Command::Fanout(args) = cli.command else {
            panic!("expected fanout")
        };
        assert_eq!((args.subscribers, args.writes, args.rate), (0, 10, 5));
        assert_eq!(
            (args.users, args.connect_rate, args.timeout),
            (1, 2000, 120)
        );
        assert_eq!(args.server_pid, Some(42));
        assert_eq!(
            args.metrics_url.unwrap().addr,
            "127.0.0.1:6289".parse().unwrap()
        );
        assert!(!args.json);

        for bad in [
            ["--url", "http://10.0.0.1:80", "--subscribers", "1"],
            [
                "--metrics-url",
                "http://example.com:1",
                "--subscribers",
                "1",
            ],
            ["--users", "0", "--subscribers", "1"],
            ["--rate", "0", "--subscribers", "1"],
        ] {
            let argv = ["hs-load", "fanout", "--url", "http://127.0.0.1:1"]
                .into_iter()
                .chain(bad);
            assert!(Cli::try_parse_from(argv).is_err());
        }
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
