//! Library side of the plugin-author commands `homeserver policy check FILE --slot NAME`
//! ([`check_module`]) and `homeserver policy eval --slot NAME [--module FILE]`
//! ([`eval_lines`]), and the golden cases both share with the tests.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use std::time::Duration;

use futures_executor::block_on;
use serde::Serialize;
use serde_json::{Value, json};

use crate::cache::ModuleCache;
use crate::error::RuntimeError;
use crate::module::{LoadedModule, PoolOptions};
use crate::policies::{Policies, SlotConfig, json_config_value};
use crate::runtime::{PolicyRuntime, RuntimeConfig};
use crate::sandbox::{CallMode, Sandbox, SandboxLimits};
use crate::stats::StatsCell;
use crate::types::{AuthorizeRequest, Intent, Slot};

/// The golden cases of each slot (`testdata/guests/<slot>/cases.jsonl`), compiled in so
/// `policy check` works without the repository.
fn golden_text(slot: Slot) -> &'static str {
    match slot {
        Slot::CapabilityPolicy => {
            include_str!("../../../testdata/guests/capability-policy/cases.jsonl")
        }
        Slot::SafetyFilter => include_str!("../../../testdata/guests/safety-filter/cases.jsonl"),
        Slot::IntentClassifier => {
            include_str!("../../../testdata/guests/intent-classifier/cases.jsonl")
        }
    }
}

/// One golden case: input, expected answer, config overrides; for `policy test`, the
/// host imports it may use and its budget of epoch ticks.
#[derive(Debug, Clone)]
pub struct GoldenCase {
    pub name: String,
    pub config: serde_json::Map<String, Value>,
    pub input: Value,
    pub expect: Value,
    /// The host imports the case declares (`policy test --strict` fails it when the
    /// guest uses another): `config` (implied when it declares config keys), `random`,
    /// `log`, `environment`, `stdin`, `exit`.
    pub imports: Option<Vec<String>>,
    /// The most 1 ms epoch ticks its call may run through (`policy test`).
    pub budget_ticks: Option<u64>,
}

/// The host imports a case may declare (see [`GoldenCase::imports`]).
pub const HOST_IMPORTS: [&str; 6] = ["config", "random", "log", "environment", "stdin", "exit"];

/// The fields a case line may have: a misspelt one is an error, not a silently ignored
/// expectation.
const CASE_FIELDS: [&str; 6] = [
    "name",
    "config",
    "input",
    "expect",
    "imports",
    "budget_ticks",
];

/// The golden cases of `slot`. Blank lines and lines starting with `#` are skipped.
pub fn golden_cases(slot: Slot) -> Vec<GoldenCase> {
    // The file is compiled in and tested; a bad line is a repository bug.
    parse_cases(golden_text(slot)).unwrap_or_else(|e| {
        tracing::error!("bad golden case for {slot}: {e}");
        Vec::new()
    })
}

/// Cases in the golden-case format (one JSON object a line: `name`, `config`, `input`,
/// `expect`; blank lines and `#` comments skipped), or the first bad line.
pub fn parse_cases(text: &str) -> Result<Vec<GoldenCase>, String> {
    let mut cases = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = n + 1;
        let mut case: Value = serde_json::from_str(line).map_err(|e| format!("line {at}: {e}"))?;
        let Some(fields) = case.as_object() else {
            return Err(format!("line {at}: a case is a JSON object"));
        };
        if let Some(unknown) = fields.keys().find(|k| !CASE_FIELDS.contains(&k.as_str())) {
            return Err(format!(
                "line {at}: unknown field `{unknown}` (a case has {})",
                CASE_FIELDS.join(", ")
            ));
        }
        if !case["input"].is_object() || !case["expect"].is_object() {
            return Err(format!(
                "line {at}: a case needs an `input` and an `expect` object"
            ));
        }
        let imports = match case.get("imports") {
            None | Some(Value::Null) => None,
            Some(Value::Array(names)) => Some(
                names
                    .iter()
                    .map(|name| match name.as_str() {
                        Some(name) if HOST_IMPORTS.contains(&name) => Ok(name.to_owned()),
                        _ => Err(format!(
                            "line {at}: `imports` names host imports: {} (not {name})",
                            HOST_IMPORTS.join(", ")
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(other) => {
                return Err(format!(
                    "line {at}: `imports` is a list of names, not {other}"
                ));
            }
        };
        let budget_ticks = match case.get("budget_ticks") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                format!("line {at}: `budget_ticks` is a whole number of 1 ms ticks, not {v}")
            })?),
        };
        if !matches!(
            case.get("config"),
            None | Some(Value::Null | Value::Object(_))
        ) {
            return Err(format!(
                "line {at}: `config` is an object of keys and values"
            ));
        }
        cases.push(GoldenCase {
            name: case["name"]
                .as_str()
                .map_or_else(|| format!("line {at}"), str::to_owned),
            config: case["config"].as_object().cloned().unwrap_or_default(),
            input: case["input"].take(),
            expect: case["expect"].take(),
            imports,
            budget_ticks,
        });
    }
    Ok(cases)
}

/// The result of one golden case.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    pub name: String,
    pub passed: bool,
    pub input: Value,
    pub expected: Value,
    pub got: Value,
    /// How long the guest call took, in microseconds (a fresh instance's creation
    /// included when the case needed one: the first case, and cases with a config).
    pub duration_us: f64,
    /// The most linear memory the instance had been given after the call, in bytes.
    pub memory_bytes: u64,
    /// The 1 ms epoch ticks the call ran through (0 for a call under a millisecond).
    pub ticks: u64,
}

/// What [`check_module`] found.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub slot: Slot,
    pub module: PathBuf,
    pub blake3: String,
    pub size_bytes: usize,
    pub compile_ms: f64,
    /// The guest contract version the module was built for.
    pub wit_version: &'static str,
    /// The slot's golden cases (how the built-in guest behaves). A 0.1.0 policy is not
    /// run on the cases of the public caller, which that contract did not have.
    pub cases: Vec<CaseResult>,
    /// The author's own cases (`policy check --cases`).
    pub own: Vec<CaseResult>,
}

impl CheckReport {
    /// True when every golden case passed.
    pub fn passed(&self) -> bool {
        self.cases.iter().all(|c| c.passed)
    }

    pub fn failures(&self) -> impl Iterator<Item = &CaseResult> {
        self.cases.iter().filter(|c| !c.passed)
    }

    /// The author's cases that failed.
    pub fn own_failures(&self) -> impl Iterator<Item = &CaseResult> {
        self.own.iter().filter(|c| !c.passed)
    }
}

/// How [`check_module_with`] runs a module.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The author's own cases (`policy check --cases`, see [`parse_cases`]).
    pub own: Vec<GoldenCase>,
    /// A module cache folder to take the compiled module from (and put it into): for
    /// big guests (a Python one compiles for seconds).
    pub cache_dir: Option<PathBuf>,
    /// Each call's deadline: the server's default (100 ms) unless told otherwise, so a
    /// module that passes here is not cut off when served. The first call of a big guest
    /// on a slow or busy machine, or under an unoptimized build of the host, may need
    /// more (`policy check --deadline-ms`).
    pub call_deadline: Duration,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self {
            own: Vec::new(),
            cache_dir: None,
            call_deadline: RuntimeConfig::default().call_deadline,
        }
    }
}

/// Validates a module for `slot` and runs the slot's golden cases through it, with the
/// default data (the compiled-in policies/). `Err` when the module cannot serve the
/// slot at all: unreadable, not a component, wrong world, or failing its test call.
/// Golden-case failures are in the report (a custom policy may differ on purpose).
pub fn check_module(path: &Path, slot: Slot) -> Result<CheckReport, RuntimeError> {
    check_module_with(path, slot, CheckOptions::default())
}

/// [`check_module`] with [`CheckOptions`]: the author's own cases, a module cache, the
/// call deadline.
pub fn check_module_with(
    path: &Path,
    slot: Slot,
    options: CheckOptions,
) -> Result<CheckReport, RuntimeError> {
    let CheckOptions {
        own,
        cache_dir,
        call_deadline,
    } = options;
    let ToolModule {
        module,
        defaults: defaults_config,
        blake3,
        size_bytes,
        compile_ms,
    } = ToolModule::load(path, Some(slot), cache_dir, call_deadline)?;

    let run = |case: GoldenCase| {
        let target = if case.config.is_empty() {
            None
        } else {
            let mut config = defaults_config.clone();
            for (key, value) in &case.config {
                config.insert(key.clone(), json_config_value(value));
            }
            Some(module.with_config(config))
        };
        run_case(target.as_ref().unwrap_or(&module), slot, case)
    };
    let wit_version = module.info.wit_version;
    let asks_public = wit_version != crate::types::WIT_VERSIONS[1];
    let cases = golden_cases(slot)
        .into_iter()
        .filter(|case| asks_public || case.input.get("caller") != Some(&"public".into()))
        .map(run)
        .collect();
    let own = own.into_iter().map(run).collect();
    Ok(CheckReport {
        slot,
        module: path.to_owned(),
        blake3,
        size_bytes,
        compile_ms,
        wit_version,
        cases,
        own,
    })
}

/// A module file loaded the way the tools run it (`policy check`, `policy test`): the
/// one place that reads, compiles (or takes from a cache), checks against a slot's world
/// and test-calls a module outside a running server. Calls block the calling thread.
pub(crate) struct ToolModule {
    pub module: LoadedModule,
    /// The slot's config from the built-in policies (what a server serves by default).
    pub defaults: SlotConfig,
    pub blake3: String,
    pub size_bytes: usize,
    pub compile_ms: f64,
}

impl ToolModule {
    /// Loads `path` for `slot`, or for the one slot whose world it fits when `None`.
    pub(crate) fn load(
        path: &Path,
        slot: Option<Slot>,
        cache_dir: Option<PathBuf>,
        call_deadline: Duration,
    ) -> Result<Self, RuntimeError> {
        let defaults = RuntimeConfig::default();
        let sandbox = Sandbox::new(SandboxLimits {
            call_deadline,
            memory_limit_bytes: defaults.memory_limit_bytes,
            max_instances: 16,
            cpu_share: 1.0,
        })?;
        let name = path.display().to_string();
        let cache = ModuleCache::new(&sandbox, cache_dir);
        let pool = PoolOptions {
            idle_max: 1,
            max_calls: defaults.instance_max_calls,
        };
        let mut misfits = Vec::new();
        for slot in slot.map_or(Slot::ALL.to_vec(), |slot| vec![slot]) {
            let resolved = Policies::builtin().resolve(slot, Some(path))?;
            let defaults = resolved.config.clone();
            let (blake3, size_bytes) = (resolved.module_hash.to_hex(), resolved.bytes.len());
            match crate::loader::load(&sandbox, &cache, slot, resolved, pool) {
                Ok(loaded) => {
                    return Ok(Self {
                        module: loaded.module,
                        defaults,
                        blake3: blake3.to_string(),
                        size_bytes,
                        compile_ms: loaded.compile_ms,
                    });
                }
                Err(RuntimeError::World { message, .. }) => misfits.push((slot, message)),
                Err(e) => return Err(e),
            }
        }
        Err(match (slot, misfits.pop()) {
            (Some(slot), Some((_, message))) => RuntimeError::World {
                module: name,
                slot,
                message,
            },
            _ => RuntimeError::NoSlot {
                module: name,
                message: "it exports none of the slots' interfaces (capability-policy: \
                          homeserver:guest/policy, safety-filter: homeserver:guest/safety, \
                          intent-classifier: homeserver:guest/intent)"
                    .into(),
            },
        })
    }
}

fn run_case(module: &LoadedModule, slot: Slot, case: GoldenCase) -> CaseResult {
    let stats = StatsCell::default();
    let got = evaluate(module, &stats, slot, &case.input);
    let passed = case_passes(slot, &case.expect, &got);
    let figures = stats.snapshot(slot);
    CaseResult {
        name: case.name,
        passed,
        input: case.input,
        expected: case.expect,
        got,
        duration_us: figures.latency.sum_seconds * 1e6,
        memory_bytes: figures.memory_high_water_bytes,
        ticks: figures.epoch_ticks,
    }
}

/// Compares an answer with a golden expectation: `allow` for the policy; `blocked` and
/// the set of `terms` for the filter; `action` and the `matched` list for the
/// classifier. Fields the expectation leaves out are not compared.
pub(crate) fn case_passes(slot: Slot, expect: &Value, got: &Value) -> bool {
    match slot {
        Slot::CapabilityPolicy => got.get("failure").is_none() && got["allow"] == expect["allow"],
        Slot::SafetyFilter => {
            let terms = |v: &Value, key: &str| -> Option<Vec<String>> {
                let mut terms: Vec<String> = v
                    .get(key)?
                    .as_array()?
                    .iter()
                    .map(|t| {
                        t.get("term")
                            .unwrap_or(t)
                            .as_str()
                            .unwrap_or_default()
                            .to_owned()
                    })
                    .collect();
                terms.sort();
                Some(terms)
            };
            got.get("failure").is_none()
                && got["blocked"] == expect["blocked"]
                && (expect.get("terms").is_none()
                    || terms(expect, "terms") == terms(got, "matches"))
        }
        Slot::IntentClassifier => {
            got.get("failure").is_none()
                && got["action"] == expect["action"]
                && (expect.get("matched").is_none() || got["matched"] == expect["matched"])
        }
    }
}

/// One input through one slot, as the JSON `policy eval` prints. Bad input gives
/// `{"error": ..}`; a guest failure gives the safe default plus `"failure"`.
pub(crate) fn evaluate(
    module: &LoadedModule,
    stats: &StatsCell,
    slot: Slot,
    input: &Value,
) -> Value {
    match slot {
        Slot::CapabilityPolicy => match serde_json::from_value::<AuthorizeRequest>(input.clone()) {
            Ok(req) => match module.authorize_blocking(stats, &req) {
                Ok(decision) => json!({"allow": decision.allow, "reason": decision.reason}),
                Err(failure) => json!({"allow": false, "failure": failure.to_string()}),
            },
            Err(e) => json!({"error": format!("not an authorize request: {e}")}),
        },
        Slot::SafetyFilter | Slot::IntentClassifier => {
            let Some(text) = input.get("text").and_then(Value::as_str) else {
                return json!({"error": "expected {\"text\": \"...\"}"});
            };
            if slot == Slot::SafetyFilter {
                let checked = block_on(module.check_text(stats, text, CallMode::Blocking));
                let verdict = crate::types::SafetyVerdict::of(checked);
                serde_json::to_value(verdict).unwrap_or_else(|e| json!({"error": e.to_string()}))
            } else {
                let classified = block_on(module.classify(stats, text, CallMode::Blocking));
                let intent = classified.unwrap_or_else(Intent::Failed);
                serde_json::to_value(intent).unwrap_or_else(|e| json!({"error": e.to_string()}))
            }
        }
    }
}

/// What [`eval_lines`] processed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct EvalSummary {
    /// Input lines answered (blank and `#` lines are skipped).
    pub lines: u64,
    /// Lines that were not valid input.
    pub bad_input: u64,
    /// Lines on which the guest failed (answered with the safe default).
    pub guest_failures: u64,
}

/// Reads JSON lines from `reader`, asks `slot`'s guest, writes one JSON line per input
/// to `writer`. The guest is the one policies.toml in `policies_dir` names (or the
/// built-in one), or `module` when given; the data comes from `policies_dir`.
///
/// Input: `{"text": ".."}` for safety-filter and intent-classifier; an
/// [`AuthorizeRequest`] for capability-policy, e.g. `{"operation": "write", "path":
/// "/pub/app/x", "caller": {"session": {"capabilities": ["write:/pub/app/"]}}}`.
pub fn eval_lines(
    slot: Slot,
    module: Option<&Path>,
    policies_dir: &Path,
    reader: impl BufRead,
    mut writer: impl Write,
) -> Result<EvalSummary, RuntimeError> {
    let config = RuntimeConfig {
        policies_dir: policies_dir.to_owned(),
        instances_per_slot: 1,
        max_instances: 16,
        ..RuntimeConfig::default()
    };
    let runtime = PolicyRuntime::load_single(config, slot, module)?;
    let loaded = runtime.module(slot).ok_or_else(|| RuntimeError::NoModule {
        slot,
        message: "not loaded".to_owned(),
    })?;
    tracing::debug!(slot = %slot, source = ?runtime.source_of(slot), "evaluating");
    let stats = StatsCell::default();
    let mut summary = EvalSummary::default();
    for line in reader.lines() {
        let line = line.map_err(|e| RuntimeError::io("<input>", e))?;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        summary.lines += 1;
        let answer = match serde_json::from_str::<Value>(trimmed) {
            Ok(input) => evaluate(&loaded, &stats, slot, &input),
            Err(e) => json!({"error": format!("line {}: not JSON: {e}", summary.lines)}),
        };
        if answer.get("error").is_some() {
            summary.bad_input += 1;
        } else if answer.get("failure").is_some() {
            summary.guest_failures += 1;
        }
        writeln!(writer, "{answer}").map_err(RuntimeError::Output)?;
    }
    writer.flush().map_err(RuntimeError::Output)?;
    Ok(summary)
}
