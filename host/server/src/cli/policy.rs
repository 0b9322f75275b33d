//! `homeserver policy check|test|eval|install|new`: the plugin author's tools, over
//! the runtime's library functions.

use std::process::ExitCode;

use std::path::{Path, PathBuf};

use homeserver_runtime::{
    CheckOptions, GuestFailure, RuntimeError, Slot, TestOptions, TestReport, case_files,
    check_module_with, eval_lines, install_defaults, parse_cases, test_cases,
};

use crate::cli::PolicyCommand;
use crate::cli::policy_template::Lang;

pub fn run(command: PolicyCommand) -> ExitCode {
    match execute(command) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("homeserver policy: {message}");
            ExitCode::from(2)
        }
    }
}

/// `policy check --report`: a line per case, its result, call time, epoch ticks (1 ms
/// each) and memory.
fn print_cases(which: &str, cases: &[homeserver_runtime::CaseResult]) {
    for case in cases {
        println!(
            "{which:6} {:4} {:>9.1} µs {:>4} ticks {:>8.1} KiB  {}",
            if case.passed { "ok" } else { "FAIL" },
            case.duration_us,
            case.ticks,
            case.memory_bytes as f64 / 1024.0,
            case.name
        );
    }
}

/// The module `policy test DIR` runs when not told: the one .wasm in DIR (a Python
/// guest's build), else the one in DIR/target/wasm32-wasip2/release (a Rust guest's).
fn find_module(dir: &Path) -> Result<PathBuf, String> {
    let wasm_in = |folder: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(folder)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == "wasm") && p.is_file())
                    .collect()
            })
            .unwrap_or_default()
    };
    for folder in [dir.to_owned(), dir.join("target/wasm32-wasip2/release")] {
        match &wasm_in(&folder)[..] {
            [] => continue,
            [one] => return Ok(one.clone()),
            several => {
                return Err(format!(
                    "{} holds {} modules: name the one to test with --module FILE",
                    folder.display(),
                    several.len()
                ));
            }
        }
    }
    Err(format!(
        "no module in {} or its target/wasm32-wasip2/release: build the guest first \
         (cargo build --release --target wasm32-wasip2, or ./build.sh) or name it with \
         --module FILE",
        dir.display()
    ))
}

/// `policy test`'s text report: a line per case, why a failed one failed, a summary.
fn print_test_report(report: &TestReport, dir: &Path) {
    println!(
        "{}: slot {} (WIT {}, blake3 {}){}",
        report.module.display(),
        report.slot,
        report.wit_version,
        report.blake3.get(..16).unwrap_or(&report.blake3),
        if report.strict { ", strict" } else { "" }
    );
    for case in &report.cases {
        let file = match case.file.strip_prefix(dir) {
            Ok(inside) if !inside.as_os_str().is_empty() => inside,
            _ => &case.file,
        };
        println!(
            "{:4} {:>9.1} µs {:>4} ticks  {}: {}",
            if case.passed { "ok" } else { "FAIL" },
            case.duration_us,
            case.ticks,
            file.display(),
            case.name
        );
        for problem in &case.problems {
            println!("       {problem}");
        }
    }
    println!("{} passed, {} failed", report.passed, report.failed);
}

fn slot(name: &str) -> Result<Slot, String> {
    name.parse().map_err(|e| format!("{e}"))
}

fn execute(command: PolicyCommand) -> Result<ExitCode, String> {
    match command {
        PolicyCommand::Check {
            file,
            slot: name,
            cases,
            deadline_ms,
            report: print_report,
            cache_dir,
        } => {
            let own = match &cases {
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                    parse_cases(&text).map_err(|e| format!("{}: {e}", path.display()))?
                }
                None => Vec::new(),
            };
            let options = CheckOptions {
                own,
                call_deadline: std::time::Duration::from_millis(deadline_ms),
                cache_dir,
            };
            let report = check_module_with(&file, slot(&name)?, options).map_err(|e| match e {
                RuntimeError::TestCall {
                    failure: GuestFailure::Timeout { .. },
                    ..
                } => format!(
                    "{e} (--deadline-ms {deadline_ms} here; a slow first call on a busy \
                     machine may need more)"
                ),
                e => e.to_string(),
            })?;
            println!(
                "{}: fits slot {} (WIT {}, blake3 {}, {} bytes, compiled in {:.0} ms)",
                file.display(),
                report.slot,
                report.wit_version,
                report.blake3,
                report.size_bytes,
                report.compile_ms
            );
            if print_report {
                print_cases("golden", &report.cases);
                print_cases("yours", &report.own);
            }
            for case in report.failures() {
                println!(
                    "FAILED {}: input {} expected {} got {}",
                    case.name, case.input, case.expected, case.got
                );
            }
            let failed = report.failures().count();
            println!(
                "golden cases of {}: {} passed, {failed} failed{}",
                report.slot,
                report.cases.len() - failed,
                if cases.is_some() && failed > 0 {
                    " (how the built-in guest behaves; yours may differ on purpose)"
                } else {
                    ""
                }
            );
            let Some(path) = &cases else {
                return Ok(if report.passed() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                });
            };
            for case in report.own_failures() {
                println!(
                    "FAILED (yours) {}: input {} expected {} got {}",
                    case.name, case.input, case.expected, case.got
                );
            }
            let own_failed = report.own_failures().count();
            println!(
                "your cases ({}): {} passed, {own_failed} failed",
                path.display(),
                report.own.len() - own_failed
            );
            Ok(if own_failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        PolicyCommand::Test {
            dir,
            module,
            slot: name,
            strict,
            budget_ticks,
            deadline_ms,
            json,
            cache_dir,
        } => {
            let module = match module {
                Some(module) => module,
                // DIR may be one case file: the module is then beside it.
                None if dir.is_file() => {
                    let beside = dir.parent().filter(|p| !p.as_os_str().is_empty());
                    find_module(beside.unwrap_or(Path::new(".")))?
                }
                None => find_module(&dir)?,
            };
            let options = TestOptions {
                slot: name.as_deref().map(slot).transpose()?,
                strict,
                budget_ticks,
                call_deadline: std::time::Duration::from_millis(deadline_ms),
                cache_dir,
            };
            let files = case_files(&dir).map_err(|e| e.to_string())?;
            let report = test_cases(&module, &files, &options).map_err(|e| e.to_string())?;
            if json {
                let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
                println!("{text}");
            } else {
                print_test_report(&report, &dir);
            }
            Ok(if report.failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        PolicyCommand::Eval {
            slot: name,
            module,
            policies,
        } => {
            let summary = eval_lines(
                slot(&name)?,
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
        PolicyCommand::New {
            slot: name,
            lang,
            dir,
        } => {
            let made = crate::cli::policy_template::new_guest(slot(&name)?, lang, &dir)?;
            for path in &made.files {
                println!("wrote {}", path.display());
            }
            let build = match lang {
                Lang::Rust => "cargo build --release --target wasm32-wasip2",
                Lang::Python | Lang::Javascript => "./build.sh",
            };
            println!(
                "\nnext: cd {} && {build} && \
                 homeserver policy check {} --slot {name} --cases cases.jsonl",
                made.dir.display(),
                made.module.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Install { dir, force } => {
            let report = install_defaults(&dir, force).map_err(|e| e.to_string())?;
            for path in &report.written {
                println!("wrote {}", path.display());
            }
            for path in &report.kept {
                println!("kept  {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
