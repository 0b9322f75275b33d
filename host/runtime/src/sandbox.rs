//! The sandbox, configured in this one place: the wasmtime engine (pooling allocator,
//! falling back to on-demand allocation when its address-space reservation fails),
//! the epoch ticker behind every call's wall-clock deadline and its yields, the guests'
//! share of the cores, the memory cap, the linker (the `config` import and the WASI
//! shim, nothing else), and the classification of a failed call into a
//! [`GuestFailure`].
//!
//! A call runs on the caller's async task (wasmtime's async calls: the guest runs on a
//! fiber). At every epoch tick it is still running, the store's callback decides: past
//! its deadline, trap; else yield to the async runtime, so other requests on the same
//! worker go first; and when guest calls have used up their share of the cores
//! ([`CpuBudget`]), sleep until the share allows another tick. A call of a few
//! microseconds rarely sees a tick; a guest that loops sees one every millisecond.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use wasmtime::component::{Component, HasSelf, InstancePre, Linker};
use wasmtime::{
    Config, Engine, ResourceLimiter, Store, StoreContextMut, StoreLimits, StoreLimitsBuilder, Trap,
    UpdateDeadline,
};

use crate::bindings;
use crate::budget::CpuBudget;
use crate::error::{GuestFailure, RuntimeError, TrapKind};
use crate::policies::SlotConfig;
use crate::types::Slot;
use crate::wasi_shim::{GuestExit, GuestLog, GuestRandom};

/// How often the ticker advances the engine's epoch while calls run: how long a running
/// guest keeps its worker before it yields, the precision of its deadline, and the unit
/// in which its share of the cores is counted.
const EPOCH_TICK: Duration = Duration::from_millis(1);
/// How often it ticks while no call runs: 1,000 wake-ups a second cost an idle server
/// ~2% of a core (measured); a call that starts meanwhile sees its first tick at most
/// this late (its deadline is at least 50 ms).
const IDLE_TICK: Duration = Duration::from_millis(10);
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
    /// The share of the machine's cores guest calls may keep busy (0 < share <= 1).
    pub cpu_share: f64,
}

/// How the current call is run, set when it starts ([`Sandbox::arm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallMode {
    /// On an async task: the call yields at every tick and is held to the share.
    Async,
    /// Blocking its thread (tools, tests): runs to its deadline without yielding.
    Blocking,
}

/// The current call's clock: its deadline and the ticks it has run.
#[derive(Debug)]
pub(crate) struct CallClock {
    mode: CallMode,
    deadline: Instant,
    /// Epoch ticks the call was seen running (≈ its CPU time in ms; see [`CpuBudget`]
    /// for how a long call is over-counted).
    pub(crate) ticks: u64,
    /// Time the call slept waiting for the guests' share of the cores, in ns (written
    /// by the waiting future, which cannot reach the store).
    slept: Arc<AtomicU64>,
}

impl CallClock {
    fn new(mode: CallMode, deadline: Instant) -> Self {
        Self {
            mode,
            deadline,
            ticks: 0,
            slept: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Time the call slept waiting for the guests' share of the cores.
    pub(crate) fn throttled(&self) -> Duration {
        Duration::from_nanos(self.slept.load(Ordering::Relaxed))
    }
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
    pub call: CallClock,
    budget: Arc<CpuBudget>,
    /// What the call asked of the host, when recorded (`policy test`'s strict mode).
    pub used: Option<HostUse>,
}

/// The host imports a call used and the config keys it read: what `policy test
/// --strict` holds a case to. Import names: `config`, `random`, `log` (stdout or
/// stderr), `environment` (variables, arguments, working directory), `stdin`, `exit`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HostUse {
    pub imports: std::collections::BTreeSet<&'static str>,
    pub config_keys: std::collections::BTreeSet<String>,
}

impl GuestState {
    /// Notes that the call used `import` (when recording).
    pub(crate) fn note(&mut self, import: &'static str) {
        if let Some(used) = &mut self.used {
            used.imports.insert(import);
        }
    }
}

impl bindings::guest_config::Host for GuestState {
    fn get(&mut self, key: String) -> Option<String> {
        let value = self.config.get(&key).map(str::to_owned);
        if let Some(used) = &mut self.used {
            used.imports.insert("config");
            used.config_keys.insert(key);
        }
        value
    }

    fn keys(&mut self) -> Vec<String> {
        self.note("config");
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
    budget: Arc<CpuBudget>,
    /// Calls running now (instantiations included).
    running: Arc<AtomicU64>,
    pooling: bool,
}

/// A running call, counted (see [`Sandbox::running`]).
pub(crate) struct Running(Arc<AtomicU64>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
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
        let running = Arc::new(AtomicU64::new(0));
        start_epoch_ticker(&engine, Arc::clone(&running))
            .map_err(|e| RuntimeError::Engine(format!("starting the epoch ticker: {e}")))?;
        Ok(Arc::new(Self {
            engine,
            linker,
            budget: Arc::new(CpuBudget::new(limits.cpu_share, EPOCH_TICK)),
            running,
            limits,
            pooling,
        }))
    }

    /// Counts a call as running until the guard drops (the ticker ticks every
    /// [`EPOCH_TICK`] while one does, else every [`IDLE_TICK`]).
    pub(crate) fn running(&self) -> Running {
        self.running.fetch_add(1, Ordering::Relaxed);
        Running(Arc::clone(&self.running))
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
            call: CallClock::new(CallMode::Blocking, Instant::now()),
            budget: Arc::clone(&self.budget),
            used: None,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limiter);
        store.epoch_deadline_callback(at_tick);
        self.arm(&mut store, CallMode::Blocking);
        store
    }

    /// Re-arms the deadline (and the guest's log budget) before a call.
    pub(crate) fn arm(&self, store: &mut Store<GuestState>, mode: CallMode) {
        store.set_epoch_deadline(1);
        let state = store.data_mut();
        state.call = CallClock::new(mode, Instant::now() + self.limits.call_deadline);
        state.log.new_call();
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

/// The epoch callback: a running call reached a tick. Past its deadline it traps (as
/// [`Trap::Interrupt`], a timeout); a blocking call goes on; an async call pays for the
/// tick it ran from the share and yields, or sleeps until the share allows a tick and
/// pays then (never past its deadline: it then traps at the next tick).
fn at_tick(mut store: StoreContextMut<'_, GuestState>) -> wasmtime::Result<UpdateDeadline> {
    let call = &mut store.data_mut().call;
    let now = Instant::now();
    if now >= call.deadline {
        return Ok(UpdateDeadline::Interrupt);
    }
    call.ticks += 1;
    if call.mode == CallMode::Blocking {
        return Ok(UpdateDeadline::Continue(1));
    }
    let state = store.data();
    if state.budget.try_pay_tick() {
        return Ok(UpdateDeadline::Yield(1));
    }
    let wait =
        Arc::clone(&state.budget).pay_tick(state.call.deadline, Arc::clone(&state.call.slept));
    Ok(UpdateDeadline::YieldCustom(1, Box::pin(wait)))
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

/// Advances the engine's epoch every [`EPOCH_TICK`] while calls run (every [`IDLE_TICK`]
/// otherwise) until the engine is dropped.
fn start_epoch_ticker(engine: &Engine, running: Arc<AtomicU64>) -> std::io::Result<()> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wasm-epoch".to_owned())
        .spawn(move || {
            loop {
                let busy = running.load(Ordering::Relaxed) > 0;
                std::thread::sleep(if busy { EPOCH_TICK } else { IDLE_TICK });
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            }
        })
        .map(drop)
}
