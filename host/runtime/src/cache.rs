//! Compiled-module cache: a component compiles in ~90 ms but loads from its serialized
//! form in ~0.2 ms. Keyed by BLAKE3 of the module bytes and of the engine (wasmtime
//! version and the compiler settings that make artifacts compatible), kept in memory
//! for swaps within a process and, with a cache directory, on disk for restarts. The
//! built-in guests also come precompiled in the binary (build.rs), used when they
//! match this engine, so even a first start on a new machine compiles nothing.

use std::collections::HashMap;
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use wasmtime::component::Component;

use crate::builtin::write_atomically;
use crate::sandbox::Sandbox;

/// Compiled components kept in memory: enough for the three slots and a few swaps.
const MEMORY_ENTRIES: usize = 16;
/// The wasmtime release series the artifacts come from (also checked by wasmtime).
const WASMTIME_SERIES: &str = "wasmtime-48";

/// Feeds `std::hash::Hash` output (the engine's compatibility hash) into BLAKE3.
struct Blake3Hasher(blake3::Hasher);

impl Hasher for Blake3Hasher {
    fn finish(&self) -> u64 {
        0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

#[derive(Debug)]
pub(crate) struct ModuleCache {
    dir: Option<PathBuf>,
    engine_key: blake3::Hash,
    memory: Mutex<HashMap<blake3::Hash, Component>>,
}

impl ModuleCache {
    pub(crate) fn new(sandbox: &Sandbox, dir: Option<PathBuf>) -> Self {
        let mut hasher = Blake3Hasher(blake3::Hasher::new());
        hasher.write(WASMTIME_SERIES.as_bytes());
        std::hash::Hash::hash(
            &sandbox.engine().precompile_compatibility_hash(),
            &mut hasher,
        );
        if let Some(dir) = &dir
            && let Err(e) = std::fs::create_dir_all(dir)
        {
            tracing::warn!(dir = %dir.display(), "cannot create the module cache directory: {e}");
        }
        Self {
            dir,
            engine_key: hasher.0.finalize(),
            memory: Mutex::new(HashMap::new()),
        }
    }

    /// The compiled form of the module with hash `module_hash`: from memory, from the
    /// artifact `precompiled` with the binary (a built-in guest), from disk, or freshly
    /// compiled (and then stored). The flag tells whether compilation was skipped.
    pub(crate) fn get_or_compile(
        &self,
        sandbox: &Sandbox,
        bytes: &[u8],
        module_hash: &blake3::Hash,
        precompiled: Option<&'static [u8]>,
    ) -> wasmtime::Result<(Component, bool)> {
        let key = self.key(module_hash);
        if let Some(component) = self.memory.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok((component, true));
        }
        if let Some(component) = precompiled.and_then(|artifact| load_builtin(sandbox, artifact)) {
            self.remember(key, &component);
            return Ok((component, true));
        }
        let file = self
            .dir
            .as_ref()
            .map(|dir| dir.join(format!("{}.cwasm", key.to_hex())));
        if let Some(component) = file.as_deref().and_then(|file| load(sandbox, file)) {
            self.remember(key, &component);
            return Ok((component, true));
        }
        let component = sandbox.compile(bytes)?;
        if let Some(file) = &file {
            match component.serialize() {
                Ok(artifact) => {
                    if let Err(e) = write_atomically(file, &artifact) {
                        tracing::warn!("cannot write the module cache: {e}");
                    }
                }
                Err(e) => tracing::warn!("cannot serialize a compiled module: {e:#}"),
            }
        }
        self.remember(key, &component);
        Ok((component, false))
    }

    fn key(&self, module_hash: &blake3::Hash) -> blake3::Hash {
        let mut hasher = blake3::Hasher::new();
        hasher.update(self.engine_key.as_bytes());
        hasher.update(module_hash.as_bytes());
        hasher.finalize()
    }

    fn remember(&self, key: blake3::Hash, component: &Component) {
        if let Ok(mut memory) = self.memory.lock() {
            if memory.len() >= MEMORY_ENTRIES {
                // Rarely reached (three slots); dropping everything is simpler than LRU
                // and only costs recompiling from the disk cache.
                memory.clear();
            }
            memory.insert(key, component.clone());
        }
    }
}

/// Loads a built-in guest compiled by build.rs; `None` (and a compile) when this engine
/// is not the one it was compiled for.
#[allow(unsafe_code)]
fn load_builtin(sandbox: &Sandbox, artifact: &'static [u8]) -> Option<Component> {
    // SAFETY: `Component::deserialize` runs the native code in `artifact`, so it must be
    // an artifact wasmtime produced. It is: build.rs made it with this same wasmtime
    // (`Engine::precompile_component`) from the built-in guest's bytes, and it is
    // compiled into this binary (`include_bytes!`), so nothing outside the build can
    // change it. Wasmtime checks its header against this engine's version, compiler
    // settings and CPU features and refuses a mismatch, answered below by compiling.
    match unsafe { Component::deserialize(sandbox.engine(), artifact) } {
        Ok(component) => Some(component),
        Err(e) => {
            tracing::info!(
                "the precompiled built-in guest does not fit this engine (compiling it): {e:#}"
            );
            None
        }
    }
}

/// Loads a serialized component; `None` (and a recompile) when it is missing or stale.
#[allow(unsafe_code)]
fn load(sandbox: &Sandbox, file: &Path) -> Option<Component> {
    let bytes = std::fs::read(file).ok()?;
    // SAFETY: `Component::deserialize` runs the native code in `bytes`, so they must be
    // an artifact wasmtime produced. They are: the file is named by a hash of the
    // module and of this engine's configuration, written by `get_or_compile` above via
    // a rename (never seen half-written), in a directory the operator gives the server
    // alone (docs/guests.md: it must not be writable by anyone else). Wasmtime also
    // checks the artifact's header against the engine and refuses a mismatch.
    match unsafe { Component::deserialize(sandbox.engine(), &bytes) } {
        Ok(component) => Some(component),
        Err(e) => {
            tracing::warn!(file = %file.display(), "ignoring a stale module cache entry: {e:#}");
            None
        }
    }
}
