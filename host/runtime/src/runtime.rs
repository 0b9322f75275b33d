//! [`PolicyRuntime`]: the slots, what serves each of them, hot swap, status and stats.
//!
//! Each slot holds an `ArcSwapOption<LoadedModule>`. A reload resolves the slot from
//! policies.toml, skips it when module and data are unchanged (same fingerprint),
//! otherwise compiles (or takes from the cache), checks the component against the
//! slot's world, test-calls it with a known input, and only then swaps it in. Any
//! failure leaves the old module serving and is kept for [`PolicyRuntime::status`].
//! Reloads run one at a time, off the request path (the watcher's thread, a SIGHUP
//! handler, an admin request); calls never wait for them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use futures_util::FutureExt;
use serde::Serialize;

use crate::cache::ModuleCache;
use crate::error::{GuestFailure, RuntimeError, TrapKind};
use crate::module::{LoadedModule, PoolOptions, ReadQuestion};
use crate::policies::{ModuleSource, Policies};
use crate::sandbox::{CallMode, Sandbox, SandboxLimits};
use crate::stats::{ModuleStats, SlotStats, StatsCell};
use crate::types::{AuthorizeRequest, Caller, Decision, Intent, Operation, SafetyVerdict, Slot};

/// How the runtime runs. `Default` gives the embedded-server defaults.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// The directory with policies.toml, the modules and their data.
    pub policies_dir: PathBuf,
    /// Where compiled modules are cached across restarts (e.g. `data/guest-cache`);
    /// `None` keeps them in memory only. Must be writable by the server alone: the
    /// cache holds native code.
    pub cache_dir: Option<PathBuf>,
    /// Wall-clock budget of one guest call (at least 50 ms; shorter values are raised).
    pub call_deadline: Duration,
    /// Linear memory a guest instance may use.
    pub memory_limit_bytes: usize,
    /// Calls after which a warm instance is retired, so guest state cannot grow
    /// without bound.
    pub instance_max_calls: u64,
    /// Warm instances kept per slot.
    pub instances_per_slot: usize,
    /// Guest instances alive at once across all slots (the pooling allocator's size;
    /// a call finding it exhausted fails with the slot's safe default).
    pub max_instances: u32,
    /// Quiet time after a change in the policies directory before the watcher reloads.
    pub watch_debounce: Duration,
    /// Calls of one slot running at once on the async path (`*_isolated`); more wait
    /// for one to end. A guest that loops holds its call's place until its deadline.
    pub guest_concurrency: usize,
    /// How long an async call waits for a place before it fails closed as `busy` (the
    /// slot's safe default).
    pub guest_wait: Duration,
    /// The share of the machine's cores guest calls on the async path may keep busy
    /// together (0 < share <= 1): past it, running calls sleep at their next epoch tick
    /// until the share allows them another. Requests that ask no guest keep the rest.
    pub guest_cpu_share: f64,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let max_instances = 256;
        Self {
            policies_dir: PathBuf::from("policies"),
            cache_dir: None,
            call_deadline: Duration::from_millis(100),
            memory_limit_bytes: crate::engine_config::DEFAULT_MEMORY_LIMIT_BYTES,
            instance_max_calls: 10_000,
            instances_per_slot: (2 * cores).max(2),
            max_instances,
            watch_debounce: Duration::from_millis(300),
            // Eight per core, within a quarter of the instance pool (each call holds an
            // instance; the slots share the pool).
            guest_concurrency: (8 * cores.max(2)).min(max_instances as usize / 4),
            guest_wait: Duration::from_secs(1),
            guest_cpu_share: DEFAULT_GUEST_CPU_SHARE,
        }
    }
}

/// What a reload did to one slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum ReloadOutcome {
    /// Module and data are the same as what is serving.
    Unchanged,
    /// A new module or new data now serves.
    Loaded {
        source: String,
        blake3: String,
        from_cache: bool,
    },
    /// The new module or data was refused; what served before still serves.
    Failed { error: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotReload {
    pub slot: Slot,
    #[serde(flatten)]
    pub outcome: ReloadOutcome,
}

/// What [`PolicyRuntime::reload`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReloadReport {
    pub slots: Vec<SlotReload>,
}

impl ReloadReport {
    /// True when no slot failed.
    pub fn is_ok(&self) -> bool {
        !self
            .slots
            .iter()
            .any(|s| matches!(s.outcome, ReloadOutcome::Failed { .. }))
    }

    pub fn outcome(&self, slot: Slot) -> Option<&ReloadOutcome> {
        self.slots
            .iter()
            .find(|s| s.slot == slot)
            .map(|s| &s.outcome)
    }
}

/// One line for logs: `capability-policy: unchanged; safety-filter: loaded ...`.
impl std::fmt::Display for ReloadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, slot) in self.slots.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: ", slot.slot)?;
            match &slot.outcome {
                ReloadOutcome::Unchanged => f.write_str("unchanged")?,
                ReloadOutcome::Loaded {
                    source,
                    blake3,
                    from_cache,
                } => write!(
                    f,
                    "loaded {source} (blake3 {}{})",
                    blake3.get(..16).unwrap_or(blake3),
                    if *from_cache { ", from cache" } else { "" }
                )?,
                ReloadOutcome::Failed { error } => write!(f, "FAILED, {error}")?,
            }
        }
        Ok(())
    }
}

/// The state of one slot, for `GET /admin/policies` and logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotStatus {
    pub slot: Slot,
    /// True when a module serves the slot; false means every call gets the safe default.
    pub serving: bool,
    /// The module file, or `builtin`.
    pub source: Option<String>,
    /// BLAKE3 of the module bytes, hex.
    pub blake3: Option<String>,
    /// When the serving module (or its data) was loaded, Unix seconds.
    pub loaded_at: Option<u64>,
    /// Whether its compilation came from the cache.
    pub from_cache: Option<bool>,
    /// The guest contract version the module was built for (`0.2.0`, or `0.1.0`: then
    /// the policy is not asked about public reads).
    pub wit_version: Option<&'static str>,
    /// The last failed load (cleared by a successful or unchanged reload).
    pub last_error: Option<String>,
    pub last_error_at: Option<u64>,
    /// What a failed call yields: deny, block or ambiguous.
    pub safe_default: &'static str,
}

/// Modules whose figures a slot keeps (the serving one and those before it); the
/// oldest swapped-in beyond it is forgotten (its series leave `/metrics`). The admin
/// API's schema says so too (`maxItems` of `modules` in openapi/admin.json; the server's
/// `admin_api` tests check it against this constant).
pub const MODULES_KEPT: usize = 8;

/// One module's figures in a slot, kept across swaps (see [`ModuleStats`]).
struct ModuleFigures {
    hash: blake3::Hash,
    source: String,
    loaded_at: SystemTime,
    stats: Arc<StatsCell>,
}

#[derive(Debug, Default)]
struct SlotHealth {
    last_error: Option<String>,
    last_error_at: Option<SystemTime>,
}

struct SlotCell {
    slot: Slot,
    current: ArcSwapOption<LoadedModule>,
    health: Mutex<SlotHealth>,
    stats: StatsCell,
    /// Places for the slot's async calls (`guest_concurrency`).
    calls: tokio::sync::Semaphore,
    /// The modules it served, the last swapped in first (at most [`MODULES_KEPT`]).
    modules: Mutex<Vec<ModuleFigures>>,
}

impl SlotCell {
    fn new(slot: Slot, concurrency: usize) -> Self {
        Self {
            slot,
            current: ArcSwapOption::empty(),
            health: Mutex::new(SlotHealth::default()),
            stats: StatsCell::default(),
            calls: tokio::sync::Semaphore::new(concurrency),
            modules: Mutex::new(Vec::new()),
        }
    }

    /// Swaps `module` in, counting its calls in the figures of its hash (those of an
    /// earlier load of the same module carry on).
    fn swap_in(&self, module: Arc<LoadedModule>) {
        // The swap happens under the lock `module_stats` reads under, so a reader never
        // sees the new module listed but another one serving.
        let mut modules = self.modules.lock();
        if let Ok(modules) = modules.as_mut() {
            let hash = module.info.module_hash;
            let mut figures = match modules.iter().position(|m| m.hash == hash) {
                Some(i) => modules.remove(i),
                None => ModuleFigures {
                    hash,
                    source: String::new(),
                    loaded_at: SystemTime::now(),
                    stats: Arc::default(),
                },
            };
            figures.source = module.info.source.to_string();
            figures.loaded_at = module.info.loaded_at;
            figures.stats.record_reload(true);
            module.count_in(Arc::clone(&figures.stats));
            modules.insert(0, figures);
            modules.truncate(MODULES_KEPT);
        }
        self.current.store(Some(module));
        drop(modules);
        self.stats.record_reload(true);
    }

    /// Each kept module's figures, the last swapped in first.
    fn module_stats(&self) -> Vec<ModuleStats> {
        let Ok(modules) = self.modules.lock() else {
            return Vec::new();
        };
        let serving = self.current.load().as_ref().map(|m| m.info.module_hash);
        modules
            .iter()
            .map(|m| ModuleStats {
                blake3: m.hash.to_hex().to_string(),
                source: m.source.clone(),
                loaded_at: unix_seconds(m.loaded_at),
                serving: serving == Some(m.hash),
                stats: m.stats.snapshot(self.slot),
            })
            .collect()
    }

    fn unavailable(&self) -> GuestFailure {
        let reason = self
            .health
            .lock()
            .ok()
            .and_then(|h| h.last_error.clone())
            .unwrap_or_else(|| "not loaded".to_owned());
        let failure = GuestFailure::Unavailable {
            slot: self.slot,
            reason,
        };
        self.stats.record_call(Duration::ZERO, Some(&failure));
        failure
    }

    fn set_error(&self, error: Option<String>) {
        if let Ok(mut health) = self.health.lock() {
            health.last_error_at = error.as_ref().map(|_| SystemTime::now());
            health.last_error = error;
        }
    }
}

/// The guest runtime. `Send + Sync`; share it in an `Arc`.
pub struct PolicyRuntime {
    config: RuntimeConfig,
    sandbox: Arc<Sandbox>,
    cache: ModuleCache,
    slots: [SlotCell; 3],
    /// Limits loading to one slot (`policy eval`).
    only: Option<Slot>,
    /// Replaces the configured module of `only` (`policy eval --module`).
    module_override: Option<PathBuf>,
    reload_lock: Mutex<()>,
}

/// The default of [`RuntimeConfig::guest_cpu_share`]: a quarter of the cores, so that on
/// a small machine a guest that loops on every call it is asked leaves requests that do
/// not ask it most of the machine (docs/BENCHMARKS.md, "Guests on async calls").
pub const DEFAULT_GUEST_CPU_SHARE: f64 = 0.25;

impl std::fmt::Debug for PolicyRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyRuntime")
            .field("policies_dir", &self.config.policies_dir)
            .field("pooling_allocator", &self.sandbox.uses_pooling())
            .finish_non_exhaustive()
    }
}

fn index(slot: Slot) -> usize {
    match slot {
        Slot::CapabilityPolicy => 0,
        Slot::SafetyFilter => 1,
        Slot::IntentClassifier => 2,
    }
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl PolicyRuntime {
    /// Sets up the sandbox and loads every slot. Fails only when the engine cannot be
    /// set up: a missing or broken module leaves its slot on the safe default, with the
    /// reason in [`status`](Self::status) and the log.
    pub fn load(config: RuntimeConfig) -> Result<Self, RuntimeError> {
        let runtime = Self::new(config, None, None)?;
        runtime.reload();
        Ok(runtime)
    }

    fn new(
        config: RuntimeConfig,
        only: Option<Slot>,
        module_override: Option<PathBuf>,
    ) -> Result<Self, RuntimeError> {
        let sandbox = Sandbox::new(SandboxLimits {
            call_deadline: config.call_deadline,
            memory_limit_bytes: config.memory_limit_bytes,
            max_instances: config.max_instances,
            cpu_share: config.guest_cpu_share,
        })?;
        let cache = ModuleCache::new(&sandbox, config.cache_dir.clone());
        let concurrency = config.guest_concurrency.max(1);
        Ok(Self {
            slots: Slot::ALL.map(|slot| SlotCell::new(slot, concurrency)),
            config,
            sandbox,
            cache,
            only,
            module_override,
            reload_lock: Mutex::new(()),
        })
    }

    /// A runtime serving only `slot`, failing when it cannot be loaded (for tools).
    pub(crate) fn load_single(
        config: RuntimeConfig,
        slot: Slot,
        module: Option<&Path>,
    ) -> Result<Self, RuntimeError> {
        let runtime = Self::new(config, Some(slot), module.map(Path::to_owned))?;
        let policies = Policies::read(&runtime.config.policies_dir)?;
        let loaded = runtime.load_slot(slot, &policies)?;
        runtime.slots[index(slot)].current.store(Some(loaded));
        Ok(runtime)
    }

    /// The configuration the runtime was loaded with.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// Asks the capability policy. `Err` means the guest failed (trap, timeout, memory,
    /// no module): the server must answer 500 `server_error`, never allow.
    pub fn authorize(&self, req: &AuthorizeRequest) -> Result<Decision, GuestFailure> {
        let cell = &self.slots[index(Slot::CapabilityPolicy)];
        match cell.current.load_full() {
            Some(module) => module.authorize_blocking(&cell.stats, req),
            None => Err(cell.unavailable()),
        }
    }

    /// Checks a text with the safety filter. On a guest failure the verdict is
    /// `blocked` with `failure` set.
    pub fn check_text(&self, text: &str) -> SafetyVerdict {
        let cell = &self.slots[index(Slot::SafetyFilter)];
        let result = match cell.current.load_full() {
            Some(module) => {
                futures_executor::block_on(module.check_text(&cell.stats, text, CallMode::Blocking))
            }
            None => Err(cell.unavailable()),
        };
        SafetyVerdict::of(result)
    }

    /// Classifies a mention's intent. On a guest failure: [`Intent::Failed`], which
    /// counts as ambiguous.
    pub fn classify(&self, text: &str) -> Intent {
        let cell = &self.slots[index(Slot::IntentClassifier)];
        let result = match cell.current.load_full() {
            Some(module) => {
                futures_executor::block_on(module.classify(&cell.stats, text, CallMode::Blocking))
            }
            None => Err(cell.unavailable()),
        };
        result.unwrap_or_else(Intent::Failed)
    }

    /// Runs a guest call on the caller's task, in one of the slot's `guest_concurrency`
    /// places: it waits at most `guest_wait` for one (then the slot's failure, `busy`,
    /// which callers treat as its safe default). The call yields at every epoch tick it
    /// runs through and is held to `guest_cpu_share` (see `sandbox`), so a guest that
    /// loops holds its place until its deadline but never an async worker: requests
    /// that do not ask it go on beside it.
    async fn isolated<R>(
        &self,
        slot: Slot,
        call: impl Future<Output = Result<R, GuestFailure>>,
    ) -> Result<R, GuestFailure> {
        let places = &self.slots[index(slot)].calls;
        let _place = match places.try_acquire() {
            Ok(place) => place,
            Err(_) => match tokio::time::timeout(self.config.guest_wait, places.acquire()).await {
                Ok(Ok(place)) => place,
                _ => return Err(self.busy(slot)),
            },
        };
        // A host panic during the call fails this call only, as a trap.
        std::panic::AssertUnwindSafe(call)
            .catch_unwind()
            .await
            .unwrap_or_else(|_| {
                Err(GuestFailure::Trap {
                    slot,
                    message: "the host panicked during the guest call".into(),
                    kind: TrapKind::Other,
                })
            })
    }

    /// The `busy` failure of `slot`, counted.
    fn busy(&self, slot: Slot) -> GuestFailure {
        let failure = GuestFailure::Busy {
            slot,
            reason: format!(
                "all {} of its calls are running and none ended within {} ms (is a guest \
                 looping?)",
                self.config.guest_concurrency.max(1),
                self.config.guest_wait.as_millis(),
            ),
        };
        let cell = &self.slots[index(slot)];
        cell.stats
            .record_call(self.config.guest_wait, Some(&failure));
        // The module being called so much that no place came free: its figures too.
        if let Some(module) = cell.current.load().as_ref()
            && let Some(figures) = module.figures()
        {
            figures.record_call(self.config.guest_wait, Some(&failure));
        }
        failure
    }

    /// [`authorize`](Self::authorize) on the async runtime (see `isolated`). A read
    /// answered before (or a public one asked of a 0.1.0 policy) is answered here,
    /// without a guest call and without a copy of the request (most reads are).
    pub async fn authorize_isolated(
        self: &Arc<Self>,
        req: &AuthorizeRequest,
    ) -> Result<Decision, GuestFailure> {
        if let Some(known) = self.known_decision(req) {
            return Ok(known);
        }
        let mut decisions = self.authorize_many_isolated(vec![req.clone()]).await?;
        decisions.pop().ok_or_else(|| GuestFailure::Trap {
            slot: Slot::CapabilityPolicy,
            message: "no decision came back".into(),
            kind: TrapKind::Other,
        })
    }

    /// The capability policy's answer to `req` when it is known without calling the
    /// guest (answered before, or a public read of a 0.1.0 policy).
    fn known_decision(&self, req: &AuthorizeRequest) -> Option<Decision> {
        self.module(Slot::CapabilityPolicy)?.known_decision(req)
    }

    /// Which capability-policy module answers now (0: none is loaded). Its public
    /// answers hold while this number stays; a swap or a reload changes it. Callers
    /// that remember public answers (the event hub, once per event for every
    /// subscriber) keep them with this number.
    pub fn public_answers_generation(&self) -> u64 {
        self.module(Slot::CapabilityPolicy)
            .map_or(0, |m| m.generation)
    }

    /// Asks about several requests (the entries of a public listing's page, the events
    /// of a stream's batch) in one of the slot's places, one call after the other; the
    /// answers are in the requests' order. Those answered before are not asked again, and a public question is put
    /// to the guest once however many ask it at the same moment (a new path's event
    /// reaches every subscriber of a stream together): the first asker holds the
    /// cache's placeholder, the others wait for its answer. Placeholders are taken in
    /// the questions' order, so two askers never wait on each other.
    pub async fn authorize_many_isolated(
        self: &Arc<Self>,
        requests: Vec<AuthorizeRequest>,
    ) -> Result<Vec<Decision>, GuestFailure> {
        let module = self.module(Slot::CapabilityPolicy);
        let answers: Vec<Option<Decision>> = requests
            .iter()
            .map(|req| module.as_ref().and_then(|m| m.known_decision(req)))
            .collect();
        if answers.iter().all(Option::is_some) {
            return Ok(answers.into_iter().flatten().collect());
        }
        // Boxed: the guest call's future is several KiB, and every future that awaits
        // this one (a request's whole chain of handlers) would carry that size and copy
        // it at each level even when the answer was known (docs/BENCHMARKS.md
        // "Smaller request futures").
        Box::pin(self.ask_unanswered(module, requests, answers)).await
    }

    /// The rest of [`authorize_many_isolated`](Self::authorize_many_isolated): what no
    /// cached answer covered, asked of the guest (or of the first asker of a question).
    async fn ask_unanswered(
        self: &Arc<Self>,
        module: Option<Arc<LoadedModule>>,
        requests: Vec<AuthorizeRequest>,
        mut answers: Vec<Option<Decision>>,
    ) -> Result<Vec<Decision>, GuestFailure> {
        let mut placeholders = Vec::new();
        if let Some(module) = &module {
            let mut open: BTreeMap<ReadQuestion, Vec<usize>> = BTreeMap::new();
            for (i, req) in requests.iter().enumerate() {
                if answers[i].is_none()
                    && let Some(question) = module.read_question(req)
                {
                    open.entry(question).or_default().push(i);
                }
            }
            for (question, asked_by) in open {
                match module
                    .read_decisions
                    .get_value_or_guard_async(&question)
                    .await
                {
                    Ok(decision) => {
                        for i in asked_by {
                            answers[i] = Some(decision.clone());
                        }
                    }
                    Err(placeholder) => placeholders.push((asked_by, placeholder)),
                }
            }
        }
        let pending: Vec<(usize, AuthorizeRequest)> = requests
            .into_iter()
            .enumerate()
            .filter(|(i, _)| answers[*i].is_none())
            .collect();
        if !pending.is_empty() {
            let cell = &self.slots[index(Slot::CapabilityPolicy)];
            let decided = self
                .isolated(Slot::CapabilityPolicy, async {
                    let Some(module) = cell.current.load_full() else {
                        return Err(cell.unavailable());
                    };
                    let mut decided = Vec::with_capacity(pending.len());
                    for (i, req) in pending {
                        let decision = module
                            .authorize_uncached(&cell.stats, &req, CallMode::Async)
                            .await?;
                        decided.push((i, decision));
                    }
                    Ok(decided)
                })
                .await?;
            for (i, decision) in decided {
                answers[i] = Some(decision);
            }
        }
        for (asked_by, placeholder) in placeholders {
            if let Some(decision) = asked_by.first().and_then(|&i| answers[i].clone()) {
                // Err: the module was swapped meanwhile and someone answered already.
                let _ = placeholder.insert(decision);
            }
        }
        answers
            .into_iter()
            .map(|a| {
                a.ok_or_else(|| GuestFailure::Trap {
                    slot: Slot::CapabilityPolicy,
                    message: "a question went unanswered".into(),
                    kind: TrapKind::Other,
                })
            })
            .collect()
    }

    /// [`check_text`](Self::check_text) on the async runtime (see `isolated`).
    pub async fn check_text_isolated(self: &Arc<Self>, text: String) -> SafetyVerdict {
        let cell = &self.slots[index(Slot::SafetyFilter)];
        let result = self
            .isolated(Slot::SafetyFilter, async {
                match cell.current.load_full() {
                    Some(module) => module.check_text(&cell.stats, &text, CallMode::Async).await,
                    None => Err(cell.unavailable()),
                }
            })
            .await;
        SafetyVerdict::of(result)
    }

    /// [`classify`](Self::classify) on the async runtime (see `isolated`).
    pub async fn classify_isolated(self: &Arc<Self>, text: String) -> Intent {
        let cell = &self.slots[index(Slot::IntentClassifier)];
        self.isolated(Slot::IntentClassifier, async {
            match cell.current.load_full() {
                Some(module) => module.classify(&cell.stats, &text, CallMode::Async).await,
                None => Err(cell.unavailable()),
            }
        })
        .await
        .unwrap_or_else(Intent::Failed)
    }

    /// Re-reads the policies directory and swaps in every slot whose module or data
    /// changed and passes its checks. Blocks while another reload runs.
    pub fn reload(&self) -> ReloadReport {
        let _one_at_a_time = self
            .reload_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let policies = Policies::read(&self.config.policies_dir);
        let mut report = ReloadReport { slots: Vec::new() };
        for cell in &self.slots {
            if self.only.is_some_and(|only| only != cell.slot) {
                continue;
            }
            let outcome = match &policies {
                Ok(policies) => self.reload_slot(cell, policies),
                Err(e) => Err(e.to_string()),
            };
            let outcome = match outcome {
                Ok(outcome) => {
                    cell.set_error(None);
                    outcome
                }
                Err(error) => {
                    match cell.current.load().as_ref() {
                        Some(serving) => tracing::error!(
                            slot = %cell.slot,
                            serving = %serving.info.source,
                            "guest not reloaded, the module loaded before keeps serving: {error}"
                        ),
                        None => tracing::error!(
                            slot = %cell.slot,
                            safe_default = cell.slot.safe_default(),
                            "guest not loaded, and no module serves this slot (every call gets \
                             the safe default): {error}"
                        ),
                    }
                    cell.stats.record_reload(false);
                    cell.set_error(Some(error.clone()));
                    ReloadOutcome::Failed { error }
                }
            };
            report.slots.push(SlotReload {
                slot: cell.slot,
                outcome,
            });
        }
        report
    }

    fn reload_slot(&self, cell: &SlotCell, policies: &Policies) -> Result<ReloadOutcome, String> {
        let module_override = self
            .module_override
            .as_deref()
            .filter(|_| self.only == Some(cell.slot));
        let resolved = policies
            .resolve(cell.slot, module_override)
            .map_err(|e| e.to_string())?;
        if let Some(current) = cell.current.load_full()
            && current.info.fingerprint == resolved.fingerprint
        {
            return Ok(ReloadOutcome::Unchanged);
        }
        let loaded = self
            .load_resolved(cell.slot, resolved)
            .map_err(|e| e.to_string())?;
        let outcome = ReloadOutcome::Loaded {
            source: loaded.info.source.to_string(),
            blake3: loaded.info.module_hash.to_hex().to_string(),
            from_cache: loaded.info.from_cache,
        };
        tracing::info!(
            slot = %cell.slot,
            source = %loaded.info.source,
            blake3 = %loaded.info.module_hash.to_hex(),
            from_cache = loaded.info.from_cache,
            "guest loaded"
        );
        cell.swap_in(loaded);
        Ok(outcome)
    }

    fn load_slot(
        &self,
        slot: Slot,
        policies: &Policies,
    ) -> Result<Arc<LoadedModule>, RuntimeError> {
        let module_override = self
            .module_override
            .as_deref()
            .filter(|_| self.only == Some(slot));
        let resolved = policies.resolve(slot, module_override)?;
        self.load_resolved(slot, resolved)
    }

    /// Compile (or fetch from the cache), check against the world, test-call.
    fn load_resolved(
        &self,
        slot: Slot,
        resolved: crate::policies::ResolvedSlot,
    ) -> Result<Arc<LoadedModule>, RuntimeError> {
        let pool = PoolOptions {
            idle_max: self.config.instances_per_slot.max(1),
            max_calls: self.config.instance_max_calls.max(1),
        };
        crate::loader::load(&self.sandbox, &self.cache, slot, resolved, pool)
            .map(|loaded| Arc::new(loaded.module))
    }

    /// Every slot's state.
    pub fn status(&self) -> Vec<SlotStatus> {
        self.slots
            .iter()
            .map(|cell| {
                let current = cell.current.load_full();
                let (last_error, last_error_at) = cell
                    .health
                    .lock()
                    .map(|h| (h.last_error.clone(), h.last_error_at.map(unix_seconds)))
                    .unwrap_or_default();
                SlotStatus {
                    slot: cell.slot,
                    serving: current.is_some(),
                    source: current.as_ref().map(|m| m.info.source.to_string()),
                    blake3: current
                        .as_ref()
                        .map(|m| m.info.module_hash.to_hex().to_string()),
                    loaded_at: current.as_ref().map(|m| unix_seconds(m.info.loaded_at)),
                    from_cache: current.as_ref().map(|m| m.info.from_cache),
                    wit_version: current.as_ref().map(|m| m.info.wit_version),
                    last_error,
                    last_error_at,
                    safe_default: cell.slot.safe_default(),
                }
            })
            .collect()
    }

    /// Every slot's call counters and latency histogram.
    pub fn stats(&self) -> Vec<SlotStats> {
        self.slots
            .iter()
            .map(|cell| cell.stats.snapshot(cell.slot))
            .collect()
    }

    /// The figures of each module every slot served (at most [`MODULES_KEPT`] per slot),
    /// by slot, the last swapped in first.
    pub fn module_stats(&self) -> Vec<(Slot, Vec<ModuleStats>)> {
        self.slots
            .iter()
            .map(|cell| (cell.slot, cell.module_stats()))
            .collect()
    }

    /// Whether the sandbox got the pooling allocator (else on-demand allocation).
    pub fn uses_pooling_allocator(&self) -> bool {
        self.sandbox.uses_pooling()
    }

    pub(crate) fn module(&self, slot: Slot) -> Option<Arc<LoadedModule>> {
        self.slots[index(slot)].current.load_full()
    }

    pub(crate) fn source_of(&self, slot: Slot) -> Option<ModuleSource> {
        self.module(slot).map(|m| m.info.source.clone())
    }
}

/// Calls a freshly loaded module once with a known input: it must answer (any answer)
/// within its deadline. This also warms its instance pool.
pub(crate) fn test_call(module: &LoadedModule) -> Result<(), GuestFailure> {
    let stats = StatsCell::default();
    let mode = CallMode::Blocking;
    futures_executor::block_on(async {
        match module.slot {
            Slot::CapabilityPolicy => {
                let req =
                    AuthorizeRequest::new(Operation::Read, "/pub/", Caller::Owner, String::new());
                module
                    .authorize_uncached(&stats, &req, mode)
                    .await
                    .map(drop)
            }
            Slot::SafetyFilter => module
                .check_text(&stats, "hello world", mode)
                .await
                .map(drop),
            Slot::IntentClassifier => module.classify(&stats, "tl;dr", mode).await.map(drop),
        }
    })
}
