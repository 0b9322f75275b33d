//! The wasmtime engine configuration, in a file of its own because two builds use it:
//! the sandbox at run time, and build.rs, which precompiles the built-in guests for it
//! (`#[path]`-included there, so it may use nothing but `wasmtime`). A compiled guest
//! only loads into an engine whose compiler settings match the one that compiled it,
//! so both must come from this one function.

use wasmtime::{Config, InstanceAllocationStrategy, PoolingAllocationConfig};

/// Guard region after each linear memory (lets compiled code skip some bounds checks).
pub(crate) const MEMORY_GUARD: u64 = 2 << 20;

/// The default memory cap of a guest instance (`policies.memory_limit_mb`). The
/// built-in guests are precompiled for it: another cap changes the compiled code's
/// bounds checks, and the guests are then compiled when the server starts.
pub(crate) const DEFAULT_MEMORY_LIMIT_BYTES: usize = 32 << 20;

/// The engine settings for guests whose memory is capped at `memory_limit_bytes`, with
/// a pooling allocator of `max_instances` instances when `pooling` (else on-demand).
pub(crate) fn engine_config(
    memory_limit_bytes: usize,
    max_instances: u32,
    pooling: bool,
) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    // Reserve only what the memory cap allows instead of 4 GiB per memory: the guard
    // region no longer elides every bounds check, which costs little for these small
    // guests and lets the pool hold hundreds of instances.
    config.memory_reservation(memory_limit_bytes as u64);
    config.memory_reservation_for_growth(0);
    config.memory_guard_size(MEMORY_GUARD);
    if pooling {
        let instances = max_instances.max(8);
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(instances);
        // A wasm32-wasip2 component holds a few core instances (the module, shims).
        pool.total_core_instances(instances * 8);
        pool.total_memories(instances * 2);
        pool.total_tables(instances * 4);
        // An async call runs on a fiber stack of the pool's (2 MiB each, reserved up
        // front), and a store keeps its last one for its next call: one per instance.
        pool.total_stacks(instances);
        pool.max_memory_size(memory_limit_bytes);
        // Keeping a little memory resident per slot avoids page faults on reuse.
        pool.linear_memory_keep_resident(128 * 1024);
        pool.table_keep_resident(16 * 1024);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}
