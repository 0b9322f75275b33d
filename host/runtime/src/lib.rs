//! The homeserver's Wasm guest runtime.
//!
//! Three slots — the capability policy (asked on every request to a space), the safety
//! filter and the intent classifier (both used by the bot) — are each served by a
//! WebAssembly component written against `wit/guest.wit`. [`PolicyRuntime`] loads them
//! from the policies directory (`policies.toml` names module and data per slot; the
//! default guests are compiled in), runs them sandboxed (memory cap, wall-clock
//! deadline per call, no filesystem, network, clock or environment), reuses warm
//! instances, and swaps a changed module or data set in without a restart. A guest
//! failure never becomes an answer: the policy yields [`GuestFailure`] (the server
//! answers 500), the filter blocks, the classifier says ambiguous.
//!
//! Map of the crate:
//! - `runtime`: [`PolicyRuntime`], slots, reload, status, stats.
//! - `module`: a loaded module and its instance pool.
//! - `sandbox`: engine, limits, deadlines and yields, the guests' share of the cores,
//!   linker — all sandbox settings. Calls are async (they yield at epoch ticks); the
//!   blocking methods (`authorize`, `check_text`, `classify`) are for tools and tests.
//! - `bindings`: every `bindgen!`; `wasi_shim`: the WASI subset guests get.
//! - `policies`: policies.toml; `builtin`: compiled-in guests and data.
//! - `cache`: compiled-module cache; `watch`: the directory watcher.
//! - `loader`: the one module loader (compile, world, test call), for the runtime and
//!   the tools alike.
//! - `tools`: `policy check` / `policy eval` and the golden cases; `harness`: `policy
//!   test`, the authors' harness.
//!
//! ```no_run
//! use std::sync::Arc;
//! use homeserver_runtime::{AuthorizeRequest, Caller, Operation, PolicyRuntime, RuntimeConfig};
//!
//! let runtime = Arc::new(PolicyRuntime::load(RuntimeConfig::default())?);
//! let _watch = runtime.watch()?;
//! let decision = runtime.authorize(&AuthorizeRequest::new(
//!     Operation::Write,
//!     "/pub/app/post",
//!     Caller::Session { capabilities: vec!["write:/pub/app/".into()] },
//!     "8pinxxgqs41n4aididenw5apqp1urfmzdztr8jt4abrkdn435ewo".into(),
//! ));
//! assert!(decision.is_ok_and(|d| d.allow));
//! # Ok::<(), homeserver_runtime::RuntimeError>(())
//! ```

mod bindings;
mod budget;
mod builtin;
mod cache;
mod engine_config;
mod error;
mod harness;
mod loader;
#[cfg(feature = "prometheus")]
pub mod metrics;
mod module;
mod policies;
mod runtime;
mod sandbox;
mod stats;
mod tools;
mod types;
mod wasi_shim;
mod watch;

pub use builtin::{InstallReport, install_defaults, module as builtin_module, module_file_name};
pub use error::{GuestFailure, RuntimeError, TrapKind};
pub use harness::{TestOptions, TestOutcome, TestReport, case_files, test_cases};
pub use policies::{ModuleSource, POLICIES_FILE};
pub use runtime::{
    DEFAULT_GUEST_CPU_SHARE, MODULES_KEPT, PolicyRuntime, ReloadOutcome, ReloadReport,
    RuntimeConfig, SlotReload, SlotStatus,
};
pub use sandbox::MIN_CALL_DEADLINE;
pub use stats::{FailureCounts, LATENCY_BUCKETS, LatencyHistogram, ModuleStats, SlotStats};
pub use tools::{
    CaseResult, CheckOptions, CheckReport, EvalSummary, GoldenCase, HOST_IMPORTS, check_module,
    check_module_with, eval_lines, golden_cases, parse_cases,
};
pub use types::{
    AuthorizeRequest, Caller, Decision, Intent, IntentAction, Method, Operation, SafetyVerdict,
    Slot, TermMatch, UnknownSlot, WIT_VERSIONS,
};
pub use watch::WatchHandle;
