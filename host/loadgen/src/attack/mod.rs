//! `hs-load attack` and `hs-load crash-loop`: the hostile client that found the faults
//! of the hardening work, kept as a tool so they cannot come back unnoticed.
//!
//! - [`probes`]: silent connections, idle HTTP/2, malformed heads, forged-signature
//!   lockout and forged uploads, one address holding busy connections, and event streams
//!   opened and dropped round after round (memory must level off), against a running
//!   server.
//! - [`crash_loop`]: `kill -9` of the real binary under concurrent writes, N times, with
//!   every acknowledged write checked after each restart.

pub mod crash_loop;
pub mod probes;
