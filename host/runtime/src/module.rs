//! A loaded module: one slot's component, pre-instantiated (imports resolved and exports
//! type-checked against the slot's world once), with its config and a small pool of warm
//! instances. A call takes a warm instance (or instantiates a fresh one, ~30 µs instead
//! of ~1 µs), re-arms its deadline, calls, and puts it back unless it trapped or has
//! served `instance_max_calls` calls.
//!
//! Calls are async ([`CallMode::Async`]: they yield at epoch ticks, see `sandbox`); the
//! blocking API (`policy check`, `policy eval`, tests) runs the same call to its end on
//! the calling thread ([`CallMode::Blocking`]).
//!
//! Callers hold an `Arc<LoadedModule>` for the duration of a call, so a hot swap never
//! pulls a module out from under an in-flight call: the call finishes on the module it
//! started on, and the old module's instances go away with its last `Arc`.
//!
//! Versions: a component is checked against the current world (WIT 0.2.0) first, then
//! against the frozen 0.1.0 one; either way callers see the same plain types (this
//! module maps them). A 0.1.0 policy has no public caller: public reads are allowed
//! without asking it. A 0.2.0 policy's answers to reads (public, session and owner
//! callers alike) are cached per module (the WIT requires `authorize` to depend on its
//! request and config only), so a hot GET costs a cache lookup, not a guest call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime};

use wasmtime::Store;
use wasmtime::component::{Component, InstancePre};

use crate::bindings::capability_policy::exports::homeserver::guest::policy as wit_policy;
use crate::bindings::capability_policy::{CapabilityPolicy, CapabilityPolicyPre};
use crate::bindings::intent_classifier::exports::homeserver::guest::intent as wit_intent;
use crate::bindings::intent_classifier::{IntentClassifier, IntentClassifierPre};
use crate::bindings::safety_filter::{SafetyFilter, SafetyFilterPre};
use crate::bindings::v0_1;
use crate::error::GuestFailure;
use crate::policies::{ModuleSource, SlotConfig};
use crate::sandbox::{CallMode, GuestState, HostUse, Sandbox};
use crate::stats::{StatsCell, Tally};
use crate::types::{
    AuthorizeRequest, Caller, Decision, Intent, IntentAction, Method, Operation, Slot, TermMatch,
    WIT_VERSIONS,
};

/// Read decisions kept per loaded module, by their bytes (paths up to 1 KiB, a
/// session's capabilities and the guest's reasons, which callers choose and the guest
/// writes): at most 16 MiB.
const READ_DECISIONS_BYTES: u64 = 16 << 20;
/// The number of them the cache is sized for (short paths).
const READ_DECISIONS_EXPECTED: usize = 50_000;

/// Weighs a cached read decision by what it holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecisionBytes;

impl quick_cache::Weighter<ReadQuestion, Decision> for DecisionBytes {
    fn weight(&self, key: &ReadQuestion, value: &Decision) -> u64 {
        let capabilities: usize = match key.caller.as_ref() {
            Caller::Session { capabilities } => capabilities.iter().map(|c| c.len() + 24).sum(),
            Caller::Public | Caller::Owner => 0,
        };
        (key.user.len() + key.path.len() + capabilities + value.reason.len() + 64) as u64
    }
}

type ReadDecisions = quick_cache::sync::Cache<ReadQuestion, Decision, DecisionBytes>;

/// Numbers the modules as they are loaded (from 1), so an answer remembered outside
/// the module can say which module gave it.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

fn next_generation() -> u64 {
    GENERATIONS.fetch_add(1, Ordering::Relaxed)
}

fn read_decisions() -> ReadDecisions {
    quick_cache::sync::Cache::with_weighter(
        READ_DECISIONS_EXPECTED,
        READ_DECISIONS_BYTES,
        DecisionBytes,
    )
}

/// What is known about a loaded module, for status reports.
#[derive(Debug, Clone)]
pub(crate) struct ModuleInfo {
    pub source: ModuleSource,
    pub module_hash: blake3::Hash,
    pub fingerprint: blake3::Hash,
    pub loaded_at: SystemTime,
    pub from_cache: bool,
    /// The guest contract version the module was built for (one of [`WIT_VERSIONS`]).
    pub wit_version: &'static str,
}

/// Instance pool settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolOptions {
    /// Warm instances kept per loaded module.
    pub idle_max: usize,
    /// Calls after which an instance is retired.
    pub max_calls: u64,
}

#[derive(Clone)]
enum Pre {
    Policy(CapabilityPolicyPre<GuestState>),
    Safety(SafetyFilterPre<GuestState>),
    Intent(IntentClassifierPre<GuestState>),
    PolicyV01(v0_1::capability_policy::CapabilityPolicyPre<GuestState>),
    SafetyV01(v0_1::safety_filter::SafetyFilterPre<GuestState>),
    IntentV01(v0_1::intent_classifier::IntentClassifierPre<GuestState>),
}

enum Exports {
    Policy(CapabilityPolicy),
    Safety(SafetyFilter),
    Intent(IntentClassifier),
    PolicyV01(v0_1::capability_policy::CapabilityPolicy),
    SafetyV01(v0_1::safety_filter::SafetyFilter),
    IntentV01(v0_1::intent_classifier::IntentClassifier),
}

impl Pre {
    /// Type-checks the exports against the slot's world: the current version, else the
    /// frozen 0.1.0 one. The error is the current version's (what a new guest must fix).
    fn new(slot: Slot, pre: InstancePre<GuestState>) -> wasmtime::Result<(Self, &'static str)> {
        let [current, v0_1] = WIT_VERSIONS;
        let now = match slot {
            Slot::CapabilityPolicy => CapabilityPolicyPre::new(pre.clone()).map(Pre::Policy),
            Slot::SafetyFilter => SafetyFilterPre::new(pre.clone()).map(Pre::Safety),
            Slot::IntentClassifier => IntentClassifierPre::new(pre.clone()).map(Pre::Intent),
        };
        let error = match now {
            Ok(pre) => return Ok((pre, current)),
            Err(e) => e,
        };
        let old = match slot {
            Slot::CapabilityPolicy => {
                v0_1::capability_policy::CapabilityPolicyPre::new(pre).map(Pre::PolicyV01)
            }
            Slot::SafetyFilter => {
                v0_1::safety_filter::SafetyFilterPre::new(pre).map(Pre::SafetyV01)
            }
            Slot::IntentClassifier => {
                v0_1::intent_classifier::IntentClassifierPre::new(pre).map(Pre::IntentV01)
            }
        };
        old.map(|pre| (pre, v0_1)).map_err(|_| error)
    }

    async fn instantiate(&self, store: &mut Store<GuestState>) -> wasmtime::Result<Exports> {
        Ok(match self {
            Pre::Policy(pre) => Exports::Policy(pre.instantiate_async(&mut *store).await?),
            Pre::Safety(pre) => Exports::Safety(pre.instantiate_async(&mut *store).await?),
            Pre::Intent(pre) => Exports::Intent(pre.instantiate_async(&mut *store).await?),
            Pre::PolicyV01(pre) => Exports::PolicyV01(pre.instantiate_async(&mut *store).await?),
            Pre::SafetyV01(pre) => Exports::SafetyV01(pre.instantiate_async(&mut *store).await?),
            Pre::IntentV01(pre) => Exports::IntentV01(pre.instantiate_async(&mut *store).await?),
        })
    }

    /// Whether the module can answer about the public caller (0.2.0 and later).
    fn knows_public(&self) -> bool {
        matches!(self, Pre::Policy(_))
    }
}

/// The key of a cached read decision: everything of a read request the guest sees.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ReadQuestion {
    /// Boxed: the cache's table is sized for its expected entries up front, and most
    /// callers are the public (a key inline would cost ~2 MiB more per module).
    caller: Box<Caller>,
    user: String,
    path: String,
    method: Method,
    listing: bool,
}

/// [`ReadQuestion`] borrowed from a request (a lookup allocates nothing). Its derived
/// `Hash` hashes the same values in the same order as the owned key's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ReadQuestionRef<'a> {
    caller: &'a Caller,
    user: &'a str,
    path: &'a str,
    method: Method,
    listing: bool,
}

impl quick_cache::Equivalent<ReadQuestion> for ReadQuestionRef<'_> {
    fn equivalent(&self, key: &ReadQuestion) -> bool {
        *self.caller == *key.caller
            && self.user == key.user
            && self.path == key.path
            && self.method == key.method
            && self.listing == key.listing
    }
}

impl<'a> ReadQuestionRef<'a> {
    /// The question a read asks (a write's answer may depend on its size: not cached).
    fn of(req: &'a AuthorizeRequest) -> Option<Self> {
        (req.operation == Operation::Read).then(|| Self {
            caller: &req.caller,
            user: &req.user,
            path: &req.path,
            method: req.method(),
            listing: req.listing(),
        })
    }

    fn owned(self) -> ReadQuestion {
        ReadQuestion {
            caller: Box::new(self.caller.clone()),
            user: self.user.to_owned(),
            path: self.path.to_owned(),
            method: self.method,
            listing: self.listing,
        }
    }
}

/// A call being made: dropped before it ended (its caller's future was dropped, e.g.
/// the client went away), it is counted as cancelled.
struct InFlight<'a> {
    tally: Tally<'a>,
    started: Instant,
    ended: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.tally.cancelled(self.started.elapsed());
        }
    }
}

struct Warm {
    store: Store<GuestState>,
    exports: Exports,
    calls: u64,
}

pub(crate) struct LoadedModule {
    pub slot: Slot,
    pub info: ModuleInfo,
    sandbox: Arc<Sandbox>,
    pre: Pre,
    config: Arc<SlotConfig>,
    pool: PoolOptions,
    idle: Mutex<Vec<Warm>>,
    /// Answers to reads (0.2.0 policies only); they go with the module.
    pub(crate) read_decisions: ReadDecisions,
    /// This module's number, unique in the process: answers given by one module stay
    /// right as long as it is the one loaded.
    pub(crate) generation: u64,
    /// Whether calls record what they ask of the host (`policy test`), into `last_use`.
    recording: bool,
    last_use: Mutex<Option<HostUse>>,
    /// This module's own figures in the runtime that serves it, set when it is swapped
    /// in (so its test call at load is not counted, and tools' calls are not either).
    figures: OnceLock<Arc<StatsCell>>,
}

impl LoadedModule {
    /// Links `component` against the sandbox and checks it against `slot`'s world.
    /// The error says what does not fit (an import the sandbox does not offer, a
    /// missing or differently typed export).
    pub(crate) fn new(
        sandbox: Arc<Sandbox>,
        slot: Slot,
        component: &Component,
        config: SlotConfig,
        info: ModuleInfo,
        pool: PoolOptions,
    ) -> Result<Self, String> {
        let instance_pre = sandbox
            .instance_pre(component)
            .map_err(|e| format!("{e:#}"))?;
        let (pre, wit_version) = Pre::new(slot, instance_pre).map_err(|e| {
            format!(
                "{e:#} (a guest for this slot must export {}, or the 0.1.0 version of it)",
                slot.interface()
            )
        })?;
        Ok(Self {
            slot,
            info: ModuleInfo {
                wit_version,
                ..info
            },
            sandbox,
            pre,
            config: Arc::new(config),
            pool,
            idle: Mutex::new(Vec::new()),
            read_decisions: read_decisions(),
            generation: next_generation(),
            recording: false,
            last_use: Mutex::new(None),
            figures: OnceLock::new(),
        })
    }

    /// The same module with other config values (golden cases with overrides).
    pub(crate) fn with_config(&self, config: SlotConfig) -> Self {
        Self {
            slot: self.slot,
            info: self.info.clone(),
            sandbox: Arc::clone(&self.sandbox),
            pre: self.pre.clone(),
            config: Arc::new(config),
            pool: self.pool,
            idle: Mutex::new(Vec::new()),
            read_decisions: read_decisions(),
            generation: next_generation(),
            recording: self.recording,
            last_use: Mutex::new(None),
            figures: OnceLock::new(),
        }
    }

    /// The same module with other config values, each call on a fresh instance and
    /// recording what it asks of the host (read with [`Self::take_host_use`]).
    pub(crate) fn recording(&self, config: SlotConfig) -> Self {
        Self {
            recording: true,
            pool: PoolOptions {
                idle_max: 0,
                ..self.pool
            },
            ..self.with_config(config)
        }
    }

    /// Keeps the epoch ticker at its running pace (1 ms) until dropped, so that the
    /// first call after a quiet spell is timed in ticks like the others.
    pub(crate) fn keep_ticking(&self) -> crate::sandbox::Running {
        self.sandbox.running()
    }

    /// What the last call asked of the host (a recording module only).
    pub(crate) fn take_host_use(&self) -> Option<HostUse> {
        self.last_use.lock().ok()?.take()
    }

    /// The answer to `req` known without calling the guest: a public read asked of a
    /// 0.1.0 policy (allowed: that contract had no public caller, and public data was
    /// readable by anyone), or one answered before. `None`: call [`Self::authorize`].
    pub(crate) fn known_decision(&self, req: &AuthorizeRequest) -> Option<Decision> {
        let question = ReadQuestionRef::of(req)?;
        if !self.pre.knows_public() {
            if req.caller != Caller::Public {
                // 0.1.0 made no promise that `authorize` is a function of its request.
                return None;
            }
            return Some(Decision {
                allow: true,
                reason: "public read (a 0.1.0 policy is not asked about public reads)".into(),
            });
        }
        self.read_decisions.get(&question)
    }

    /// From now on, this module's calls are counted in `figures` too (the runtime's
    /// cell for its hash). Set once: a module is swapped into one slot of one runtime.
    pub(crate) fn count_in(&self, figures: Arc<StatsCell>) {
        let first = self.figures.set(figures).is_ok();
        debug_assert!(first, "a module is swapped in once");
    }

    /// This module's own figures, once it is counted (see [`Self::count_in`]).
    pub(crate) fn figures(&self) -> Option<&StatsCell> {
        self.figures.get().map(Arc::as_ref)
    }

    /// Runs `call` on a warm or fresh instance and records it in `stats` (the slot's)
    /// and in the module's own figures.
    async fn call<R>(
        &self,
        stats: &StatsCell,
        mode: CallMode,
        call: impl AsyncFnOnce(&Exports, &mut Store<GuestState>) -> wasmtime::Result<R>,
    ) -> Result<R, GuestFailure> {
        let tally = Tally {
            slot: stats,
            module: self.figures(),
        };
        let mut in_flight = InFlight {
            tally,
            started: Instant::now(),
            ended: false,
        };
        let result = self.call_inner(tally, mode, call).await;
        in_flight.ended = true;
        tally.call(in_flight.started.elapsed(), result.as_ref().err());
        result
    }

    async fn call_inner<R>(
        &self,
        stats: Tally<'_>,
        mode: CallMode,
        call: impl AsyncFnOnce(&Exports, &mut Store<GuestState>) -> wasmtime::Result<R>,
    ) -> Result<R, GuestFailure> {
        let _running = self.sandbox.running();
        let warm = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let recording = self.recording;
        let mut warm = match warm {
            Some(mut warm) => {
                self.sandbox.arm(&mut warm.store, mode);
                warm
            }
            None => {
                stats.instantiation();
                let mut store = self.sandbox.store(self.slot, Arc::clone(&self.config));
                self.sandbox.arm(&mut store, mode);
                if recording {
                    store.data_mut().used = Some(HostUse::default());
                }
                let instantiated = self.pre.instantiate(&mut store).await;
                if recording
                    && instantiated.is_err()
                    && let Ok(mut last) = self.last_use.lock()
                {
                    *last = store.data_mut().used.take();
                }
                let exports =
                    instantiated.map_err(|e| match self.sandbox.failure(&mut store, &e) {
                        GuestFailure::Trap { message, .. } => GuestFailure::Instantiate {
                            slot: self.slot,
                            message,
                        },
                        other => other,
                    })?;
                Warm {
                    store,
                    exports,
                    calls: 0,
                }
            }
        };
        if recording && warm.store.data().used.is_none() {
            warm.store.data_mut().used = Some(HostUse::default());
        }
        let result = call(&warm.exports, &mut warm.store).await;
        if recording && let Ok(mut last) = self.last_use.lock() {
            *last = warm.store.data_mut().used.take();
        }
        let state = warm.store.data();
        stats.memory(state.limiter.memory_peak());
        stats.ticks(state.call.ticks, state.call.throttled());
        match result {
            Ok(value) => {
                warm.calls += 1;
                // Retired instances and those beyond the pool size are dropped.
                if warm.calls < self.pool.max_calls
                    && let Ok(mut idle) = self.idle.lock()
                    && idle.len() < self.pool.idle_max
                {
                    idle.push(warm);
                }
                Ok(value)
            }
            // A trapped instance is poisoned (wasmtime refuses to enter it again): it is
            // dropped here, and the next call gets a fresh one.
            Err(e) => Err(self.sandbox.failure(&mut warm.store, &e)),
        }
    }

    /// The key under which the answer to `req` is cached: a read asked of a policy of
    /// the 0.2.0 contract (which requires its answers to depend on the request and
    /// config only).
    pub(crate) fn read_question(&self, req: &AuthorizeRequest) -> Option<ReadQuestion> {
        ReadQuestionRef::of(req)
            .filter(|_| self.pre.knows_public())
            .map(ReadQuestionRef::owned)
    }

    /// Decides `req`, blocking the thread: from the cache when it can, else by calling
    /// the guest (and caching a public answer).
    pub(crate) fn authorize_blocking(
        &self,
        stats: &StatsCell,
        req: &AuthorizeRequest,
    ) -> Result<Decision, GuestFailure> {
        if let Some(decision) = self.known_decision(req) {
            return Ok(decision);
        }
        let decision =
            futures_executor::block_on(self.authorize_uncached(stats, req, CallMode::Blocking))?;
        if let Some(question) = self.read_question(req) {
            self.read_decisions.insert(question, decision.clone());
        }
        Ok(decision)
    }

    /// Calls the guest about `req`, whatever the cache holds (the async path fills the
    /// cache itself, one call per question).
    pub(crate) async fn authorize_uncached(
        &self,
        stats: &StatsCell,
        req: &AuthorizeRequest,
        mode: CallMode,
    ) -> Result<Decision, GuestFailure> {
        match &self.pre {
            Pre::PolicyV01(_) => self.authorize_v0_1(stats, req, mode).await,
            _ => self.authorize_current(stats, req, mode).await,
        }
    }

    async fn authorize_current(
        &self,
        stats: &StatsCell,
        req: &AuthorizeRequest,
        mode: CallMode,
    ) -> Result<Decision, GuestFailure> {
        let request = wit_policy::Request {
            operation: match req.operation {
                Operation::Read => wit_policy::Operation::Read,
                Operation::Write => wit_policy::Operation::Write,
            },
            path: req.path.clone(),
            caller: match &req.caller {
                Caller::Public => wit_policy::Caller::Public,
                Caller::Owner => wit_policy::Caller::Owner,
                Caller::Session { capabilities } => {
                    wit_policy::Caller::Session(capabilities.clone())
                }
            },
            user: req.user.clone(),
            method: match req.method() {
                Method::Get => wit_policy::Method::Get,
                Method::Head => wit_policy::Method::Head,
                Method::Put => wit_policy::Method::Put,
                Method::Delete => wit_policy::Method::Delete,
            },
            listing: req.listing(),
            size: req.size,
        };
        self.call(stats, mode, async |exports, store| match exports {
            Exports::Policy(guest) => {
                guest
                    .homeserver_guest_policy()
                    .call_authorize(store, &request)
                    .await
            }
            _ => wasmtime::bail!("module loaded into the wrong slot"),
        })
        .await
        .map(|d| Decision {
            allow: d.allow,
            reason: d.reason,
        })
    }

    /// A 0.1.0 policy: the request without the 0.2.0 details. (Public reads never get
    /// here: see [`Self::known_decision`].)
    async fn authorize_v0_1(
        &self,
        stats: &StatsCell,
        req: &AuthorizeRequest,
        mode: CallMode,
    ) -> Result<Decision, GuestFailure> {
        use v0_1::capability_policy::exports::homeserver::guest::policy as old;
        let caller = match &req.caller {
            Caller::Owner => old::Caller::Owner,
            Caller::Session { capabilities } => old::Caller::Session(capabilities.clone()),
            Caller::Public => {
                return Ok(Decision {
                    allow: false,
                    reason: "the public cannot write".into(),
                });
            }
        };
        let request = old::Request {
            operation: match req.operation {
                Operation::Read => old::Operation::Read,
                Operation::Write => old::Operation::Write,
            },
            path: req.path.clone(),
            caller,
            user: req.user.clone(),
        };
        self.call(stats, mode, async |exports, store| match exports {
            Exports::PolicyV01(guest) => {
                guest
                    .homeserver_guest_policy()
                    .call_authorize(store, &request)
                    .await
            }
            _ => wasmtime::bail!("module loaded into the wrong slot"),
        })
        .await
        .map(|d| Decision {
            allow: d.allow,
            reason: d.reason,
        })
    }

    pub(crate) async fn check_text(
        &self,
        stats: &StatsCell,
        text: &str,
        mode: CallMode,
    ) -> Result<(bool, Vec<TermMatch>), GuestFailure> {
        self.call(stats, mode, async |exports, store| match exports {
            Exports::Safety(guest) => {
                let safety = guest.homeserver_guest_safety();
                let verdict = safety.call_check(store, text).await?;
                let matches = verdict.matches.into_iter().map(|m| (m.term, m.list_name));
                Ok((verdict.blocked, matches.collect::<Vec<_>>()))
            }
            // 0.1.0: the same record under the old package name.
            Exports::SafetyV01(guest) => {
                let safety = guest.homeserver_guest_safety();
                let verdict = safety.call_check(store, text).await?;
                let matches = verdict.matches.into_iter().map(|m| (m.term, m.list_name));
                Ok((verdict.blocked, matches.collect::<Vec<_>>()))
            }
            _ => wasmtime::bail!("module loaded into the wrong slot"),
        })
        .await
        .map(|(blocked, matches)| {
            let matches = matches
                .into_iter()
                .map(|(term, list)| TermMatch { term, list })
                .collect();
            (blocked, matches)
        })
    }

    pub(crate) async fn classify(
        &self,
        stats: &StatsCell,
        text: &str,
        mode: CallMode,
    ) -> Result<Intent, GuestFailure> {
        self.call(stats, mode, async |exports, store| match exports {
            Exports::Intent(guest) => {
                let intent = guest.homeserver_guest_intent();
                intent.call_classify(store, text).await
            }
            Exports::IntentV01(guest) => {
                let intent = guest.homeserver_guest_intent();
                intent
                    .call_classify(store, text)
                    .await
                    .map(intent_from_v0_1)
            }
            _ => wasmtime::bail!("module loaded into the wrong slot"),
        })
        .await
        .map(|outcome| match outcome {
            wit_intent::Outcome::Classified(c) => Intent::Action {
                action: match c.action {
                    wit_intent::Action::Summary => IntentAction::Summary,
                    wit_intent::Action::Factcheck => IntentAction::Factcheck,
                },
                // A guest bug must not produce a confidence outside 0..=1 (or NaN).
                confidence: if c.confidence.is_finite() {
                    c.confidence.clamp(0.0, 1.0)
                } else {
                    0.0
                },
                matched: c.matched,
            },
            wit_intent::Outcome::Ambiguous(matched) => Intent::Ambiguous { matched },
        })
    }
}

/// A 0.1.0 classifier's answer as the current type (the same shape).
fn intent_from_v0_1(
    outcome: v0_1::intent_classifier::exports::homeserver::guest::intent::Outcome,
) -> wit_intent::Outcome {
    use v0_1::intent_classifier::exports::homeserver::guest::intent as old;
    match outcome {
        old::Outcome::Classified(c) => {
            wit_intent::Outcome::Classified(wit_intent::Classification {
                action: match c.action {
                    old::Action::Summary => wit_intent::Action::Summary,
                    old::Action::Factcheck => wit_intent::Action::Factcheck,
                },
                confidence: c.confidence,
                matched: c.matched,
            })
        }
        old::Outcome::Ambiguous(matched) => wit_intent::Outcome::Ambiguous(matched),
    }
}
