//! The one module loader: compile (or take from the cache, or the build's precompiled
//! copy of a built-in guest), check against the slot's world, and test-call. The
//! runtime loads every slot through it, and so do the tools (`policy check`, `policy
//! eval`, `policy test`), so a module they accept is one the server accepts.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use crate::cache::ModuleCache;
use crate::error::RuntimeError;
use crate::module::{LoadedModule, ModuleInfo, PoolOptions};
use crate::policies::{ModuleSource, ResolvedSlot};
use crate::runtime::test_call;
use crate::sandbox::Sandbox;
use crate::types::Slot;

/// A module that passed every check, and how long compiling it took (0 from a cache).
pub(crate) struct Loaded {
    pub module: LoadedModule,
    pub compile_ms: f64,
}

/// Loads `resolved` into `slot`. `Err(RuntimeError::World)` when it does not fit the
/// slot's world (the tools then try the next slot).
pub(crate) fn load(
    sandbox: &Arc<Sandbox>,
    cache: &ModuleCache,
    slot: Slot,
    resolved: ResolvedSlot,
    pool: PoolOptions,
) -> Result<Loaded, RuntimeError> {
    let name = resolved.source.to_string();
    let precompiled = match resolved.source {
        ModuleSource::Builtin => crate::builtin::precompiled(slot),
        ModuleSource::File(_) => None,
    };
    let started = Instant::now();
    let (component, from_cache) = cache
        .get_or_compile(sandbox, &resolved.bytes, &resolved.module_hash, precompiled)
        .map_err(|e| RuntimeError::Compile {
            module: name.clone(),
            message: format!("{e:#}"),
        })?;
    let compile_ms = started.elapsed().as_secs_f64() * 1e3;
    let info = ModuleInfo {
        source: resolved.source,
        module_hash: resolved.module_hash,
        fingerprint: resolved.fingerprint,
        loaded_at: SystemTime::now(),
        from_cache,
        // Set by `LoadedModule::new` from what the component exports.
        wit_version: crate::types::WIT_VERSIONS[0],
    };
    let module = LoadedModule::new(
        Arc::clone(sandbox),
        slot,
        &component,
        resolved.config,
        info,
        pool,
    )
    .map_err(|message| RuntimeError::World {
        module: name.clone(),
        slot,
        message,
    })?;
    test_call(&module).map_err(|failure| RuntimeError::TestCall {
        module: name,
        slot,
        failure,
    })?;
    Ok(Loaded { module, compile_ms })
}
