//! A loaded module: one slot's component, pre-instantiated (imports resolved and exports
//! type-checked against the slot's world once), with its config and a small pool of warm
//! instances. A call takes a warm instance (or instantiates a fresh one, ~30 µs instead
//! of ~1 µs), re-arms its deadline, calls, and puts it back unless it trapped or has
//! served `instance_max_calls` calls.
//!
//! Callers hold an `Arc<LoadedModule>` for the duration of a call, so a hot swap never
//! pulls a module out from under an in-flight call: the call finishes on the module it
//! started on, and the old module's instances go away with its last `Arc`.

use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use wasmtime::Store;
use wasmtime::component::{Component, InstancePre};

use crate::bindings::capability_policy::exports::homeserver::guest::policy as wit_policy;
use crate::bindings::capability_policy::{CapabilityPolicy, CapabilityPolicyPre};
use crate::bindings::intent_classifier::exports::homeserver::guest::intent as wit_intent;
use crate::bindings::intent_classifier::{IntentClassifier, IntentClassifierPre};
use crate::bindings::safety_filter::{SafetyFilter, SafetyFilterPre};
use crate::error::GuestFailure;
use crate::policies::{ModuleSource, SlotConfig};
use crate::sandbox::{GuestState, Sandbox};
use crate::stats::StatsCell;
use crate::types::{
    AuthorizeRequest, Caller, Decision, Intent, IntentAction, Operation, Slot, TermMatch,
};

/// What is known about a loaded module, for status reports.
#[derive(Debug, Clone)]
pub(crate) struct ModuleInfo {
    pub source: ModuleSource,
    pub module_hash: blake3::Hash,
    pub fingerprint: blake3::Hash,
    pub loaded_at: SystemTime,
    pub from_cache: bool,
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
}

enum Exports {
    Policy(CapabilityPolicy),
    Safety(SafetyFilter),
    Intent(IntentClassifier),
}

impl Pre {
    /// Type-checks the exports against the slot's world.
    fn new(slot: Slot, pre: InstancePre<GuestState>) -> wasmtime::Result<Self> {
        Ok(match slot {
            Slot::CapabilityPolicy => Pre::Policy(CapabilityPolicyPre::new(pre)?),
            Slot::SafetyFilter => Pre::Safety(SafetyFilterPre::new(pre)?),
            Slot::IntentClassifier => Pre::Intent(IntentClassifierPre::new(pre)?),
        })
    }

    fn instantiate(&self, store: &mut Store<GuestState>) -> wasmtime::Result<Exports> {
        Ok(match self {
            Pre::Policy(pre) => Exports::Policy(pre.instantiate(&mut *store)?),
            Pre::Safety(pre) => Exports::Safety(pre.instantiate(&mut *store)?),
            Pre::Intent(pre) => Exports::Intent(pre.instantiate(&mut *store)?),
        })
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
        let pre = Pre::new(slot, instance_pre).map_err(|e| {
            format!(
                "{e:#} (a guest for this slot must export {})",
                slot.interface()
            )
        })?;
        Ok(Self {
            slot,
            info,
            sandbox,
            pre,
            config: Arc::new(config),
            pool,
            idle: Mutex::new(Vec::new()),
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
        }
    }

    /// Runs `call` on a warm or fresh instance and records it in `stats`.
    fn call<R>(
        &self,
        stats: &StatsCell,
        call: impl FnOnce(&Exports, &mut Store<GuestState>) -> wasmtime::Result<R>,
    ) -> Result<R, GuestFailure> {
        let started = Instant::now();
        let result = self.call_inner(stats, call);
        stats.record_call(started.elapsed(), result.as_ref().err());
        result
    }

    fn call_inner<R>(
        &self,
        stats: &StatsCell,
        call: impl FnOnce(&Exports, &mut Store<GuestState>) -> wasmtime::Result<R>,
    ) -> Result<R, GuestFailure> {
        let warm = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let mut warm = match warm {
            Some(mut warm) => {
                self.sandbox.arm(&mut warm.store);
                warm
            }
            None => {
                stats.record_instantiation();
                let mut store = self.sandbox.store(self.slot, Arc::clone(&self.config));
                let exports = self.pre.instantiate(&mut store).map_err(|e| {
                    match self.sandbox.failure(&mut store, &e) {
                        GuestFailure::Trap { message, .. } => GuestFailure::Instantiate {
                            slot: self.slot,
                            message,
                        },
                        other => other,
                    }
                })?;
                Warm {
                    store,
                    exports,
                    calls: 0,
                }
            }
        };
        match call(&warm.exports, &mut warm.store) {
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

    pub(crate) fn authorize(
        &self,
        stats: &StatsCell,
        req: &AuthorizeRequest,
    ) -> Result<Decision, GuestFailure> {
        let request = wit_policy::Request {
            operation: match req.operation {
                Operation::Read => wit_policy::Operation::Read,
                Operation::Write => wit_policy::Operation::Write,
            },
            path: req.path.clone(),
            caller: match &req.caller {
                Caller::Owner => wit_policy::Caller::Owner,
                Caller::Session { capabilities } => {
                    wit_policy::Caller::Session(capabilities.clone())
                }
            },
            user: req.user.clone(),
        };
        self.call(stats, |exports, store| match exports {
            Exports::Policy(guest) => guest
                .homeserver_guest_policy()
                .call_authorize(store, &request),
            _ => wasmtime::bail!("module loaded into the wrong slot"),
        })
        .map(|d| Decision {
            allow: d.allow,
            reason: d.reason,
        })
    }

    pub(crate) fn check_text(
        &self,
        stats: &StatsCell,
        text: &str,
    ) -> Result<(bool, Vec<TermMatch>), GuestFailure> {
        self.call(stats, |exports, store| match exports {
            Exports::Safety(guest) => guest.homeserver_guest_safety().call_check(store, text),
            _ => wasmtime::bail!("module loaded into the wrong slot"),
        })
        .map(|verdict| {
            let matches = verdict
                .matches
                .into_iter()
                .map(|m| TermMatch {
                    term: m.term,
                    list: m.list_name,
                })
                .collect();
            (verdict.blocked, matches)
        })
    }

    pub(crate) fn classify(&self, stats: &StatsCell, text: &str) -> Result<Intent, GuestFailure> {
        self.call(stats, |exports, store| match exports {
            Exports::Intent(guest) => guest.homeserver_guest_intent().call_classify(store, text),
            _ => wasmtime::bail!("module loaded into the wrong slot"),
        })
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
