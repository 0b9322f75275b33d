//! The runtime's errors: [`RuntimeError`] for loading and tooling, [`GuestFailure`] for a
//! call that did not produce a guest answer (the caller then applies the slot's safe
//! default; the server answers 500 for the policy, never an allow).

use std::path::PathBuf;
use std::time::Duration;

use crate::types::Slot;

/// Loading, compiling, validating or configuring failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    PoliciesFile { path: PathBuf, message: String },
    #[error("setting up the wasm engine: {0}")]
    Engine(String),
    #[error("{module} is not a valid component: {message}")]
    Compile { module: String, message: String },
    #[error("{module} does not fit slot {slot}: {message}")]
    World {
        module: String,
        slot: Slot,
        message: String,
    },
    #[error("{module} failed its test call in slot {slot}: {failure}")]
    TestCall {
        module: String,
        slot: Slot,
        failure: GuestFailure,
    },
    #[error("no module for slot {slot}: {message}")]
    NoModule { slot: Slot, message: String },
    /// A module fits none of the slots' worlds (`policy test` without `--slot`).
    #[error("{module} fits no slot: {message}")]
    NoSlot { module: String, message: String },
    /// A case file that cannot be read or parsed (`policy test`).
    #[error("{path}: {message}")]
    Cases { path: PathBuf, message: String },
    #[error("watching {path}: {message}")]
    Watch { path: PathBuf, message: String },
    #[error("writing output: {0}")]
    Output(#[source] std::io::Error),
}

impl RuntimeError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}

/// A guest call that produced no answer. The runtime never turns one into an allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuestFailure {
    /// The slot has no loaded module (missing or broken at startup).
    #[error("slot {slot} has no module: {reason}")]
    Unavailable { slot: Slot, reason: String },
    /// A fresh instance could not be created (e.g. the instance pool is exhausted, or the
    /// guest trapped while initializing).
    #[error("slot {slot}: instantiating the guest failed: {message}")]
    Instantiate { slot: Slot, message: String },
    /// No place for the call came free in time (the async path: the slot's
    /// `guest_concurrency` calls are all running, e.g. a guest that loops until its
    /// deadline).
    #[error("slot {slot}: busy: {reason}")]
    Busy { slot: Slot, reason: String },
    /// The call ran past its wall-clock deadline.
    #[error("slot {slot}: the guest ran past its {} ms deadline", deadline.as_millis())]
    Timeout { slot: Slot, deadline: Duration },
    /// The guest tried to grow its memory past the cap.
    #[error("slot {slot}: the guest exceeded its memory limit of {limit_bytes} bytes")]
    MemoryLimit { slot: Slot, limit_bytes: usize },
    /// Any other trap: a panic, `unreachable`, a stack overflow, `exit`.
    #[error("slot {slot}: the guest trapped: {message}")]
    Trap {
        slot: Slot,
        message: String,
        kind: TrapKind,
    },
}

/// What kind of trap a call ended in (counted apart in the slot's stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrapKind {
    /// The guest panicked (`unreachable`: what a Rust panic with panic=abort becomes).
    Panic,
    /// The guest called WASI's `exit`.
    Exit,
    /// Anything else: a stack overflow, a memory access out of bounds, a failure of the
    /// host around the call.
    Other,
}

impl GuestFailure {
    pub fn slot(&self) -> Slot {
        match self {
            GuestFailure::Unavailable { slot, .. }
            | GuestFailure::Busy { slot, .. }
            | GuestFailure::Instantiate { slot, .. }
            | GuestFailure::Timeout { slot, .. }
            | GuestFailure::MemoryLimit { slot, .. }
            | GuestFailure::Trap { slot, .. } => *slot,
        }
    }

    /// A short label for metrics: `unavailable`, `busy`, `instantiate`, `timeout`,
    /// `memory`, `panic`, `exit`, `trap`.
    pub fn kind(&self) -> &'static str {
        match self {
            GuestFailure::Unavailable { .. } => "unavailable",
            GuestFailure::Busy { .. } => "busy",
            GuestFailure::Instantiate { .. } => "instantiate",
            GuestFailure::Timeout { .. } => "timeout",
            GuestFailure::MemoryLimit { .. } => "memory",
            GuestFailure::Trap { kind, .. } => match kind {
                TrapKind::Panic => "panic",
                TrapKind::Exit => "exit",
                TrapKind::Other => "trap",
            },
        }
    }
}
