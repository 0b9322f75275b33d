//! A stand-alone `policy` tool over the library functions behind the server's
//! `homeserver policy ...` subcommands, for trying a guest without a server:
//!
//! ```sh
//! cargo run -p homeserver-runtime --example policy -- check FILE.wasm --slot NAME
//! cargo run -p homeserver-runtime --example policy -- eval --slot NAME [--module FILE] [--policies DIR] < input.jsonl
//! cargo run -p homeserver-runtime --example policy -- install [DIR]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use homeserver_runtime::{Slot, check_module, eval_lines, install_defaults};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    match run(std::env::args().skip(1).collect()) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Vec<String>) -> Result<ExitCode, String> {
    let flag = |name: &str| -> Option<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let slot = || -> Result<Slot, String> {
        flag("--slot")
            .ok_or("--slot NAME is required")?
            .parse()
            .map_err(|e| format!("{e}"))
    };
    match args.first().map(String::as_str) {
        Some("check") => {
            let file = args.get(1).ok_or("check FILE --slot NAME")?;
            let report = check_module(&PathBuf::from(file), slot()?).map_err(|e| e.to_string())?;
            println!(
                "{file}: fits slot {} (blake3 {}, {} bytes, compiled in {:.0} ms)",
                report.slot, report.blake3, report.size_bytes, report.compile_ms
            );
            for case in report.failures() {
                println!(
                    "FAILED {}: input {} expected {} got {}",
                    case.name, case.input, case.expected, case.got
                );
            }
            let failed = report.failures().count();
            println!(
                "golden cases: {} passed, {failed} failed",
                report.cases.len() - failed
            );
            Ok(if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Some("eval") => {
            let module = flag("--module").map(PathBuf::from);
            let policies = flag("--policies").map_or_else(|| PathBuf::from("policies"), PathBuf::from);
            let summary = eval_lines(
                slot()?,
                module.as_deref(),
                &policies,
                std::io::stdin().lock(),
                std::io::stdout().lock(),
            )
            .map_err(|e| e.to_string())?;
            eprintln!(
                "{} lines, {} bad input, {} guest failures",
                summary.lines, summary.bad_input, summary.guest_failures
            );
            Ok(ExitCode::SUCCESS)
        }
        Some("install") => {
            let dir = args.get(1).map_or_else(|| PathBuf::from("policies"), PathBuf::from);
            let report = install_defaults(&dir, false).map_err(|e| e.to_string())?;
            for path in &report.written {
                println!("wrote {}", path.display());
            }
            for path in &report.kept {
                println!("kept  {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        _ => Err("usage: policy check FILE --slot NAME | eval --slot NAME [--module FILE] [--policies DIR] | install [DIR]".to_owned()),
    }
}
