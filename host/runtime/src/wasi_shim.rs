//! The WASI a guest sees: a zero-capability subset, implemented here instead of with
//! wasmtime-wasi.
//!
//! A wasm32-wasip2 std guest imports `wasi:cli` (environment, exit, stdio) and
//! `wasi:io/streams` even when it never uses them, and `wasi:random` when it uses a
//! `HashMap`. We answer them as an empty environment would: no variables, no
//! arguments, an empty stdin, and stdout/stderr that go to the host log (so a guest's
//! panic message is not lost). There is no filesystem, network or clock: a guest that
//! imports one fails to link when it is loaded.
//!
//! Why not wasmtime-wasi (its p2 implementation, now that calls are async and its async
//! bindings would run): its linker offers the whole of `wasi:cli`, including
//! `wasi:clocks`, `wasi:filesystem` and `wasi:sockets`, each answered at call time with
//! "no capability" (no preopens, no network). The sandbox's contract is stricter: a
//! guest that imports a clock, a file or a socket fails to *load*, so its author learns
//! it from `policy check`, not from a call failing in production; and a guest with no
//! clock answers from its request and config alone, which the public-decision cache
//! relies on. Taking wasmtime-wasi's interfaces one by one would leave the parts that
//! matter here written by hand anyway (stdout/stderr into the host log with a per-call
//! budget, `exit` as a typed trap, random with a bounded request size, the strict
//! harness's record of what a call used). This shim is about 450 lines, synchronous
//! (its calls never wait), and keeps cap-std and wasmtime-wasi's dependencies out of
//! the build.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::component::Resource;

use crate::bindings::wasi::wasi::cli::{
    environment, exit, stderr, stdin, stdout, terminal_input, terminal_output, terminal_stderr,
    terminal_stdin, terminal_stdout,
};
use crate::bindings::wasi::wasi::io::{error, poll, streams};
use crate::bindings::wasi::wasi::random::{insecure, insecure_seed, random};
use crate::sandbox::GuestState;
use crate::types::Slot;

/// Representation numbers of the stream resources we hand out.
const STDIN: u32 = 0;
const STDOUT: u32 = 1;
const STDERR: u32 = 2;
/// The one pollable: always ready.
const READY: u32 = 0;
/// How much a guest may ask `check-write` for at once.
const WRITE_BUDGET: u64 = 4096;
/// Longest log line kept; the rest of a longer line is cut.
const MAX_LINE: usize = 1024;
/// Log lines a guest may emit per call; beyond that its output is dropped (a guest
/// printing in a loop must not flood the host log).
const MAX_LINES_PER_CALL: u32 = 32;
/// Largest random buffer a guest may ask for in one call.
const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// Line-buffers a guest's stdout and stderr into `tracing` events.
#[derive(Debug)]
pub(crate) struct GuestLog {
    slot: Slot,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    lines_this_call: u32,
}

impl GuestLog {
    pub(crate) fn new(slot: Slot) -> Self {
        Self {
            slot,
            stdout: Vec::new(),
            stderr: Vec::new(),
            lines_this_call: 0,
        }
    }

    /// Starts a new call's line budget.
    pub(crate) fn new_call(&mut self) {
        self.lines_this_call = 0;
    }

    fn write(&mut self, stream: u32, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                self.emit(stream);
                continue;
            }
            let buffer = if stream == STDERR {
                &mut self.stderr
            } else {
                &mut self.stdout
            };
            if buffer.len() < MAX_LINE {
                buffer.push(b);
            }
        }
    }

    fn emit(&mut self, stream: u32) {
        let buffer = if stream == STDERR {
            &mut self.stderr
        } else {
            &mut self.stdout
        };
        let line = String::from_utf8_lossy(buffer).into_owned();
        buffer.clear();
        self.lines_this_call += 1;
        if self.lines_this_call > MAX_LINES_PER_CALL {
            return;
        }
        let slot = self.slot.name();
        if self.lines_this_call == MAX_LINES_PER_CALL {
            tracing::warn!(target: "homeserver_runtime::guest", slot, "guest output limit reached; dropping the rest of this call's output");
        } else if stream == STDERR {
            tracing::warn!(target: "homeserver_runtime::guest", slot, stream = "stderr", "{line}");
        } else {
            tracing::info!(target: "homeserver_runtime::guest", slot, stream = "stdout", "{line}");
        }
    }

    /// Emits what is left in the buffers (a last line without a newline, e.g. before a
    /// trap).
    pub(crate) fn flush(&mut self) {
        if !self.stdout.is_empty() {
            self.emit(STDOUT);
        }
        if !self.stderr.is_empty() {
            self.emit(STDERR);
        }
    }
}

/// A guest's random source: a BLAKE3 stream keyed by process-wide OS randomness and a
/// per-instance counter, so each instance gets its own unpredictable stream without a
/// system call per request.
pub(crate) struct GuestRandom(blake3::OutputReader);

impl std::fmt::Debug for GuestRandom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GuestRandom")
    }
}

impl GuestRandom {
    pub(crate) fn new() -> Self {
        static KEY: OnceLock<[u8; 32]> = OnceLock::new();
        static INSTANCE: AtomicU64 = AtomicU64::new(0);
        let key = KEY.get_or_init(|| {
            let mut key = [0u8; 32];
            if let Err(e) = getrandom::fill(&mut key) {
                // Without OS randomness, fall back to what std's hasher seeds carry; the
                // stream then only serves HashMap seeding well, which is what guests use.
                tracing::warn!("no OS randomness for guests ({e}); using a weaker seed");
                let hashed = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), 0u8);
                key[..8].copy_from_slice(&hashed.to_le_bytes());
            }
            key
        });
        let mut hasher = blake3::Hasher::new_keyed(key);
        hasher.update(&INSTANCE.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        Self(hasher.finalize_xof())
    }

    fn bytes(&mut self, len: u64) -> wasmtime::Result<Vec<u8>> {
        if len > MAX_RANDOM_BYTES {
            wasmtime::bail!("guest asked for {len} random bytes (at most {MAX_RANDOM_BYTES})");
        }
        let mut out = vec![0u8; len as usize];
        self.0.fill(&mut out);
        Ok(out)
    }

    fn u64(&mut self) -> u64 {
        let mut out = [0u8; 8];
        self.0.fill(&mut out);
        u64::from_le_bytes(out)
    }
}

impl environment::Host for GuestState {
    fn get_environment(&mut self) -> Vec<(String, String)> {
        self.note("environment");
        Vec::new()
    }

    fn get_arguments(&mut self) -> Vec<String> {
        self.note("environment");
        Vec::new()
    }

    fn initial_cwd(&mut self) -> Option<String> {
        self.note("environment");
        None
    }
}

/// The error that ends a call whose guest called `exit` (told apart from other traps in
/// the slot's stats).
#[derive(Debug, thiserror::Error)]
#[error("guest called exit({0})")]
pub(crate) struct GuestExit(pub u8);

impl exit::Host for GuestState {
    fn exit(&mut self, status: Result<(), ()>) -> wasmtime::Result<()> {
        self.note("exit");
        Err(wasmtime::Error::new(GuestExit(u8::from(status.is_err()))))
    }

    fn exit_with_code(&mut self, status_code: u8) -> wasmtime::Result<()> {
        self.note("exit");
        Err(wasmtime::Error::new(GuestExit(status_code)))
    }
}

impl stdin::Host for GuestState {
    fn get_stdin(&mut self) -> Resource<streams::InputStream> {
        Resource::new_own(STDIN)
    }
}

impl stdout::Host for GuestState {
    fn get_stdout(&mut self) -> Resource<streams::OutputStream> {
        Resource::new_own(STDOUT)
    }
}

impl stderr::Host for GuestState {
    fn get_stderr(&mut self) -> Resource<streams::OutputStream> {
        Resource::new_own(STDERR)
    }
}

impl terminal_input::Host for GuestState {}

impl terminal_input::HostTerminalInput for GuestState {
    fn drop(&mut self, _rep: Resource<terminal_input::TerminalInput>) -> wasmtime::Result<()> {
        Ok(())
    }
}

impl terminal_output::Host for GuestState {}

impl terminal_output::HostTerminalOutput for GuestState {
    fn drop(&mut self, _rep: Resource<terminal_output::TerminalOutput>) -> wasmtime::Result<()> {
        Ok(())
    }
}

impl terminal_stdin::Host for GuestState {
    fn get_terminal_stdin(&mut self) -> Option<Resource<terminal_input::TerminalInput>> {
        None
    }
}

impl terminal_stdout::Host for GuestState {
    fn get_terminal_stdout(&mut self) -> Option<Resource<terminal_output::TerminalOutput>> {
        None
    }
}

impl terminal_stderr::Host for GuestState {
    fn get_terminal_stderr(&mut self) -> Option<Resource<terminal_output::TerminalOutput>> {
        None
    }
}

impl error::Host for GuestState {}

impl error::HostError for GuestState {
    fn to_debug_string(&mut self, _self_: Resource<error::Error>) -> String {
        // We never hand out an error resource; a guest cannot hold one.
        String::new()
    }

    fn drop(&mut self, _rep: Resource<error::Error>) -> wasmtime::Result<()> {
        Ok(())
    }
}

impl poll::Host for GuestState {
    fn poll(&mut self, in_: Vec<Resource<poll::Pollable>>) -> Vec<u32> {
        // Every pollable we hand out is always ready.
        (0..in_.len() as u32).collect()
    }
}

impl poll::HostPollable for GuestState {
    fn ready(&mut self, _self_: Resource<poll::Pollable>) -> bool {
        true
    }

    fn block(&mut self, _self_: Resource<poll::Pollable>) {}

    fn drop(&mut self, _rep: Resource<poll::Pollable>) -> wasmtime::Result<()> {
        Ok(())
    }
}

impl streams::Host for GuestState {}

impl streams::HostInputStream for GuestState {
    fn read(
        &mut self,
        _self_: Resource<streams::InputStream>,
        _len: u64,
    ) -> Result<Vec<u8>, streams::StreamError> {
        self.note("stdin");
        Err(streams::StreamError::Closed)
    }

    fn blocking_read(
        &mut self,
        _self_: Resource<streams::InputStream>,
        _len: u64,
    ) -> Result<Vec<u8>, streams::StreamError> {
        self.note("stdin");
        Err(streams::StreamError::Closed)
    }

    fn skip(
        &mut self,
        _self_: Resource<streams::InputStream>,
        _len: u64,
    ) -> Result<u64, streams::StreamError> {
        Err(streams::StreamError::Closed)
    }

    fn blocking_skip(
        &mut self,
        _self_: Resource<streams::InputStream>,
        _len: u64,
    ) -> Result<u64, streams::StreamError> {
        Err(streams::StreamError::Closed)
    }

    fn subscribe(&mut self, _self_: Resource<streams::InputStream>) -> Resource<poll::Pollable> {
        Resource::new_own(READY)
    }

    fn drop(&mut self, _rep: Resource<streams::InputStream>) -> wasmtime::Result<()> {
        Ok(())
    }
}

impl streams::HostOutputStream for GuestState {
    fn check_write(
        &mut self,
        _self_: Resource<streams::OutputStream>,
    ) -> Result<u64, streams::StreamError> {
        Ok(WRITE_BUDGET)
    }

    fn write(
        &mut self,
        self_: Resource<streams::OutputStream>,
        contents: Vec<u8>,
    ) -> Result<(), streams::StreamError> {
        self.note("log");
        self.log.write(self_.rep(), &contents);
        Ok(())
    }

    fn blocking_write_and_flush(
        &mut self,
        self_: Resource<streams::OutputStream>,
        contents: Vec<u8>,
    ) -> Result<(), streams::StreamError> {
        self.note("log");
        self.log.write(self_.rep(), &contents);
        Ok(())
    }

    fn flush(
        &mut self,
        _self_: Resource<streams::OutputStream>,
    ) -> Result<(), streams::StreamError> {
        Ok(())
    }

    fn blocking_flush(
        &mut self,
        _self_: Resource<streams::OutputStream>,
    ) -> Result<(), streams::StreamError> {
        Ok(())
    }

    fn subscribe(&mut self, _self_: Resource<streams::OutputStream>) -> Resource<poll::Pollable> {
        Resource::new_own(READY)
    }

    fn write_zeroes(
        &mut self,
        _self_: Resource<streams::OutputStream>,
        _len: u64,
    ) -> Result<(), streams::StreamError> {
        Ok(())
    }

    fn blocking_write_zeroes_and_flush(
        &mut self,
        _self_: Resource<streams::OutputStream>,
        _len: u64,
    ) -> Result<(), streams::StreamError> {
        Ok(())
    }

    fn splice(
        &mut self,
        _self_: Resource<streams::OutputStream>,
        _src: Resource<streams::InputStream>,
        _len: u64,
    ) -> Result<u64, streams::StreamError> {
        Err(streams::StreamError::Closed)
    }

    fn blocking_splice(
        &mut self,
        _self_: Resource<streams::OutputStream>,
        _src: Resource<streams::InputStream>,
        _len: u64,
    ) -> Result<u64, streams::StreamError> {
        Err(streams::StreamError::Closed)
    }

    fn drop(&mut self, _rep: Resource<streams::OutputStream>) -> wasmtime::Result<()> {
        Ok(())
    }
}

impl random::Host for GuestState {
    fn get_random_bytes(&mut self, len: u64) -> wasmtime::Result<Vec<u8>> {
        self.note("random");
        self.random.bytes(len)
    }

    fn get_random_u64(&mut self) -> wasmtime::Result<u64> {
        self.note("random");
        Ok(self.random.u64())
    }
}

impl insecure::Host for GuestState {
    fn get_insecure_random_bytes(&mut self, len: u64) -> wasmtime::Result<Vec<u8>> {
        self.note("random");
        self.random.bytes(len)
    }

    fn get_insecure_random_u64(&mut self) -> wasmtime::Result<u64> {
        self.note("random");
        Ok(self.random.u64())
    }
}

impl insecure_seed::Host for GuestState {
    fn insecure_seed(&mut self) -> wasmtime::Result<(u64, u64)> {
        self.note("random");
        Ok((self.random.u64(), self.random.u64()))
    }
}
