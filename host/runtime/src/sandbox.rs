//! The sandbox, configured in this one place: the wasmtime engine (pooling allocator,
//! falling back to on-demand allocation when its address-space reservation fails),
//! the epoch ticker behind every call's wall-clock deadline, the memory cap, the linker
//! (the `config` import and the WASI shim, nothing else), and the classification of a
//! failed call into a [`GuestFailure`].

use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{Component, HasSelf, InstancePre, Linker};
use wasmtime::{Config, Engine, ResourceLimiter, Store, StoreLimits, StoreLimitsBuilder, Trap};

use crate::bindings;
use crate::error::{GuestFailure, RuntimeError, TrapKind};
use crate::policies::SlotConfig;
use crate::types::Slot;
use crate::wasi_shim::{GuestExit, GuestLog, GuestRandom};

/// How often the ticker advances the engine's epoch. A deadline is a number of ticks,
/// so it is precise to about one tick.
const EPOCH_TICK: Duration = Duration::from_millis(5);
/// The shortest deadline accepted. Shorter ones trapped legitimate calls on a loaded
/// 2-core machine (measured: a 10 ms deadline lost 2 calls in 200k).
pub const MIN_CALL_DEADLINE: Duration = Duration::from_millis(50);
/// Wasm pages are 64 KiB; memory limits are rounded up to whole pages.
const WASM_PAGE: usize = 64 * 1024;
/// Table elements a guest may grow to (Rust guests use a few hundred).
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// Sandbox limits.
#[derive(Debug, Clone)]
pub(crate) struct SandboxLimits {
    pub call_deadline: Duration,
    pub memory_limit_bytes: usize,
    /// Capacity of the pooling allocator: guest instances alive at once across slots.
    pub max_instances: u32,
}

/// What a guest's store carries: its slot, its config, its limits, its log and its
/// random source. Implements the host side of the WIT imports.
#[derive(Debug)]
pub(crate) struct GuestState {
    pub slot: Slot,
    pub config: Arc<SlotConfig>,
    pub limiter: GuestLimiter,
    pub log: GuestLog,
    pub random: GuestRandom,
}

impl bindings::guest_config::Host for GuestState {
    fn get(&mut self, key: String) -> Option<String> {
        self.config.get(&key).map(str::to_owned)
    }

    fn keys(&mut self) -> Vec<String> {
        self.config.keys().map(str::to_owned).collect()
    }
}

/// [`StoreLimits`] (with `trap_on_grow_failure`), remembering whether the memory cap
/// was hit so a failed call can be reported as a memory overrun, not a generic trap.
#[derive(Debug)]
pub(crate) struct GuestLimiter {
    limits: StoreLimits,
    memory_hit: bool,
    /// The largest memory the instance was allowed, in bytes (its high-water mark).
    memory_peak: usize,
}

impl GuestLimiter {
    pub(crate) fn memory_peak(&self) -> usize {
        self.memory_peak
    }
}

/// The 0.1.0 `config` import: the same two functions.
impl bindings::v0_1::guest_config::Host for GuestState {
    fn get(&mut self, key: String) -> Option<String> {
        bindings::guest_config::Host::get(self, key)
    }

    fn keys(&mut self) -> Vec<String> {
        bindings::guest_config::Host::keys(self)
    }
}

impl ResourceLimiter for GuestLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let verdict = self.limits.memory_growing(current, desired, maximum);
        if matches!(verdict, Ok(true)) {
            self.memory_peak = self.memory_peak.max(desired);
        } else {
            self.memory_hit = true;
        }
        verdict
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.limits.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

/// The engine and linker shared by every slot.
pub(crate) struct Sandbox {
    engine: Engine,
    linker: Linker<GuestState>,
    limits: SandboxLimits,
    deadline_ticks: u64,
    pooling: bool,
}

impl Sandbox {
    pub(crate) fn new(limits: SandboxLimits) -> Result<Arc<Self>, RuntimeError> {
        let mut limits = limits;
        if limits.call_deadline < MIN_CALL_DEADLINE {
            tracing::warn!(
                requested_ms = limits.call_deadline.as_millis() as u64,
                "guest call deadline raised to the minimum of {} ms",
                MIN_CALL_DEADLINE.as_millis()
            );
            limits.call_deadline = MIN_CALL_DEADLINE;
        }
        limits.memory_limit_bytes =
            limits.memory_limit_bytes.max(WASM_PAGE).div_ceil(WASM_PAGE) * WASM_PAGE;

        let (engine, pooling) = match Engine::new(&engine_config(&limits, true)) {
            Ok(engine) => (engine, true),
            Err(e) => {
                // The pool reserves address space up front (one slot per memory); a
                // restricted address space (ulimit -v, some containers) refuses it.
                tracing::warn!("pooling allocator unavailable ({e:#}); using on-demand allocation");
                let engine = Engine::new(&engine_config(&limits, false))
                    .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
                (engine, false)
            }
        };
        let linker = linker(&engine).map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        // Without a ticker no deadline fires and a looping guest would hang its caller.
        start_epoch_ticker(&engine)
            .map_err(|e| RuntimeError::Engine(format!("starting the epoch ticker: {e}")))?;
        // One extra tick: the first may come right after arming.
        let deadline_ticks = limits
            .call_deadline
            .as_nanos()
            .div_ceil(EPOCH_TICK.as_nanos()) as u64
            + 1;
        Ok(Arc::new(Self {
            engine,
            linker,
            limits,
            deadline_ticks,
            pooling,
        }))
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(crate) fn uses_pooling(&self) -> bool {
        self.pooling
    }

    /// Compiles a component (Cranelift; ~90 ms for a 50 KB guest).
    pub(crate) fn compile(&self, bytes: &[u8]) -> wasmtime::Result<Component> {
        Component::new(&self.engine, bytes)
    }

    /// Resolves the component's imports against what the sandbox offers. Fails when
    /// the guest imports anything else (a filesystem, sockets, another world's API).
    pub(crate) fn instance_pre(
        &self,
        component: &Component,
    ) -> wasmtime::Result<InstancePre<GuestState>> {
        self.linker.instantiate_pre(component)
    }

    /// A fresh store for one guest instance, with limits and a trapping deadline.
    pub(crate) fn store(&self, slot: Slot, config: Arc<SlotConfig>) -> Store<GuestState> {
        let limits = StoreLimitsBuilder::new()
            .memory_size(self.limits.memory_limit_bytes)
            .table_elements(MAX_TABLE_ELEMENTS)
            .trap_on_grow_failure(true)
            .build();
        let state = GuestState {
            slot,
            config,
            limiter: GuestLimiter {
                limits,
                memory_hit: false,
                memory_peak: 0,
            },
            log: GuestLog::new(slot),
            random: GuestRandom::new(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limiter);
        store.epoch_deadline_trap();
        self.arm(&mut store);
        store
    }

    /// Re-arms the deadline (and the guest's log budget) before a call.
    pub(crate) fn arm(&self, store: &mut Store<GuestState>) {
        store.set_epoch_deadline(self.deadline_ticks);
        store.data_mut().log.new_call();
    }

    /// Turns the error of a failed call into a [`GuestFailure`].
    pub(crate) fn failure(
        &self,
        store: &mut Store<GuestState>,
        error: &wasmtime::Error,
    ) -> GuestFailure {
        let state = store.data_mut();
        state.log.flush();
        let slot = state.slot;
        if state.limiter.memory_hit {
            return GuestFailure::MemoryLimit {
                slot,
                limit_bytes: self.limits.memory_limit_bytes,
            };
        }
        let kind = match error.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => {
                return GuestFailure::Timeout {
                    slot,
                    deadline: self.limits.call_deadline,
                };
            }
            Some(Trap::UnreachableCodeReached) => TrapKind::Panic,
            _ if error.downcast_ref::<GuestExit>().is_some() => TrapKind::Exit,
            _ => TrapKind::Other,
        };
        GuestFailure::Trap {
            slot,
            message: format!("{error:#}"),
            kind,
        }
    }
}

fn engine_config(limits: &SandboxLimits, pooling: bool) -> Config {
    crate::engine_config::engine_config(limits.memory_limit_bytes, limits.max_instances, pooling)
}

fn linker(engine: &Engine) -> wasmtime::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    bindings::guest_config::add_to_linker::<GuestState, HasSelf<GuestState>>(
        &mut linker,
        |state| state,
    )?;
    bindings::v0_1::guest_config::add_to_linker::<GuestState, HasSelf<GuestState>>(
        &mut linker,
        |state| state,
    )?;
    bindings::wasi::Sandbox::add_to_linker::<GuestState, HasSelf<GuestState>>(
        &mut linker,
        |state| state,
    )?;
    Ok(linker)
}

/// Advances the engine's epoch every [`EPOCH_TICK`] until the engine is dropped.
fn start_epoch_ticker(engine: &Engine) -> std::io::Result<()> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wasm-epoch".to_owned())
        .spawn(move || {
            loop {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            }
        })
        .map(drop)
}
