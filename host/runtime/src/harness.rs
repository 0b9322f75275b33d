//! `homeserver policy test DIR`: the guest author's test harness. It runs every case
//! file of a folder through a module, each case on a fresh instance of it, and fails a
//! case whose answer differs from its `expect`, whose call ran through more epoch ticks
//! than its budget, or (strict mode) that used the host in a way it did not declare:
//!
//! - In strict mode the mock host's config is exactly the case's `config`: reading any
//!   other key fails the case (the guest sees it missing), as does using a host import
//!   (`random`, `log`, ...) the case's `imports` does not name. What a guest depends on
//!   is then written down next to what it answers.
//! - Otherwise the config is the slot's default (the built-in `policies/`) with the
//!   case's keys over it, as `policy check --cases` runs it, and imports are reported,
//!   not checked.
//!
//! Case files: `cases.jsonl` and `tests/*.jsonl` under DIR, or DIR itself when it is a
//! file; the format is `policy check`'s ([`crate::parse_cases`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::error::RuntimeError;
use crate::policies::{SlotConfig, json_config_value};
use crate::stats::StatsCell;
use crate::tools::{GoldenCase, ToolModule, case_passes, evaluate, parse_cases};
use crate::types::Slot;

/// How [`test_cases`] runs.
#[derive(Debug, Clone)]
pub struct TestOptions {
    /// The slot the module is for; `None`: the one whose world it fits.
    pub slot: Option<Slot>,
    /// Hold each case to the config keys and host imports it declares.
    pub strict: bool,
    /// The epoch-tick budget of a case that names none; `None`: no budget.
    pub budget_ticks: Option<u64>,
    /// Each call's deadline.
    pub call_deadline: Duration,
    /// A compiled-module cache folder (a big guest compiles for seconds).
    pub cache_dir: Option<PathBuf>,
}

/// One case's result.
#[derive(Debug, Clone, Serialize)]
pub struct TestOutcome {
    /// The case file and the case's name.
    pub file: PathBuf,
    pub name: String,
    pub passed: bool,
    /// Why it failed, one line each (empty when it passed).
    pub problems: Vec<String>,
    pub input: Value,
    pub expected: Value,
    pub got: Value,
    /// The call's time (a fresh instance's creation included), in microseconds.
    pub duration_us: f64,
    /// The 1 ms epoch ticks the call ran through, creating its instance included
    /// (sampled: a call of 0.3 ms sees 0 or 1).
    pub ticks: u64,
    /// The host imports the call used.
    pub imports: Vec<&'static str>,
    /// The config keys the guest read.
    pub config_read: Vec<String>,
}

/// What [`test_cases`] found.
#[derive(Debug, Clone, Serialize)]
pub struct TestReport {
    pub module: PathBuf,
    pub slot: Slot,
    pub wit_version: &'static str,
    pub blake3: String,
    pub strict: bool,
    pub passed: usize,
    pub failed: usize,
    pub cases: Vec<TestOutcome>,
}

/// The case files of `dir`: `cases.jsonl` and `tests/*.jsonl` (sorted), or `dir`
/// itself when it is a file.
pub fn case_files(dir: &Path) -> Result<Vec<PathBuf>, RuntimeError> {
    if dir.is_file() {
        return Ok(vec![dir.to_owned()]);
    }
    if !dir.is_dir() {
        return Err(RuntimeError::Cases {
            path: dir.to_owned(),
            message: "no such folder (give the guest's folder, with its cases.jsonl)".into(),
        });
    }
    let mut files = Vec::new();
    let top = dir.join("cases.jsonl");
    if top.is_file() {
        files.push(top);
    }
    let tests = dir.join("tests");
    if tests.is_dir() {
        let mut more: Vec<PathBuf> = std::fs::read_dir(&tests)
            .map_err(|e| RuntimeError::io(&tests, e))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl") && p.is_file())
            .collect();
        more.sort();
        files.extend(more);
    }
    if files.is_empty() {
        return Err(RuntimeError::Cases {
            path: dir.to_owned(),
            message: "no cases.jsonl and no tests/*.jsonl here".into(),
        });
    }
    Ok(files)
}

/// Runs the cases of `files` through `module` (see the module's header).
pub fn test_cases(
    module: &Path,
    files: &[PathBuf],
    options: &TestOptions,
) -> Result<TestReport, RuntimeError> {
    let mut suites = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|e| RuntimeError::io(file, e))?;
        let cases = parse_cases(&text).map_err(|message| RuntimeError::Cases {
            path: file.clone(),
            message,
        })?;
        suites.push((file.clone(), cases));
    }
    let loaded = ToolModule::load(
        module,
        options.slot,
        options.cache_dir.clone(),
        options.call_deadline,
    )?;
    let slot = loaded.module.slot;
    // Ticks at 1 ms from the first case on (the ticker slows down while no call runs).
    let _ticking = loaded.module.keep_ticking();
    let mut cases = Vec::new();
    for (file, suite) in suites {
        for case in suite {
            cases.push(run(&loaded, slot, &file, case, options));
        }
    }
    let failed = cases.iter().filter(|c| !c.passed).count();
    Ok(TestReport {
        module: module.to_owned(),
        slot,
        wit_version: loaded.module.info.wit_version,
        blake3: loaded.blake3,
        strict: options.strict,
        passed: cases.len() - failed,
        failed,
        cases,
    })
}

fn run(
    loaded: &ToolModule,
    slot: Slot,
    file: &Path,
    case: GoldenCase,
    options: &TestOptions,
) -> TestOutcome {
    let mut config = if options.strict {
        SlotConfig::default()
    } else {
        loaded.defaults.clone()
    };
    for (key, value) in &case.config {
        config.insert(key.clone(), json_config_value(value));
    }
    let module = loaded.module.recording(config);
    let stats = StatsCell::default();
    let got = evaluate(&module, &stats, slot, &case.input);
    let used = module.take_host_use().unwrap_or_default();
    let figures = stats.snapshot(slot);

    let mut problems = Vec::new();
    if got.get("error").is_some() {
        problems.push(format!("bad input: {}", got["error"]));
    } else if !case_passes(slot, &case.expect, &got) {
        problems.push(format!("expected {}, got {got}", case.expect));
    }
    let budget = case.budget_ticks.or(options.budget_ticks);
    if let Some(budget) = budget
        && figures.epoch_ticks > budget
    {
        problems.push(format!(
            "ran through {} epoch ticks (1 ms each), over its budget of {budget}",
            figures.epoch_ticks
        ));
    }
    if options.strict {
        for key in used
            .config_keys
            .iter()
            .filter(|k| !case.config.contains_key(*k))
        {
            problems.push(format!(
                "read config key `{key}`, which the case does not declare in `config` (strict)"
            ));
        }
        let declared = case.imports.clone().unwrap_or_default();
        let implied = !case.config.is_empty();
        for import in &used.imports {
            let allowed = declared.iter().any(|d| d == import) || (*import == "config" && implied);
            if !allowed {
                problems.push(format!(
                    "used the host import `{import}`, which the case does not declare in \
                     `imports` (strict)"
                ));
            }
        }
    }
    TestOutcome {
        file: file.to_owned(),
        name: case.name,
        passed: problems.is_empty(),
        problems,
        input: case.input,
        expected: case.expect,
        got,
        duration_us: figures.latency.sum_seconds * 1e6,
        ticks: figures.epoch_ticks,
        imports: used.imports.into_iter().collect(),
        config_read: used.config_keys.into_iter().collect(),
    }
}
