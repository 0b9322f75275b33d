//! Load generator for the homeserver, and the raw-hyper baseline it is compared with.
//!
//! - [`cli`]: the `hs-load` command line (`baseline`, `run`, `fanout`) and the runtimes it
//!   builds.
//! - [`attack`]: hostile-client probes and the `kill -9` loop (`attack`, `crash-loop`).
//! - [`baseline`]: a bare hyper HTTP/1.1 server answering every request with a fixed body:
//!   the ceiling a homeserver on the same machine could reach.
//! - [`target`]: the `--url` guard: only plain-HTTP loopback servers are ever contacted.
//! - [`scenario`]: what each scenario sends (paths, bodies, signed headers) and its set-up.
//! - [`driver`]: the timed run: N keep-alive connections sending back to back.
//! - [`summary`]: latency percentiles and status counts, as a text line or JSON.
//! - [`fanout`]: the event fan-out benchmark: N live `/events-stream` subscribers, W
//!   writes at a fixed rate, delivery latency and exactly-once checks, idle memory.
//! - [`sse`]: the incremental Server-Sent Events parser the subscribers use.
//! - [`wrk`]: Lua scripts for `wrk`, the independent client of the benchmarks.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod attack;
pub mod baseline;
pub mod cli;
pub mod driver;
pub mod fanout;
pub mod scenario;
pub mod sse;
pub mod summary;
pub mod target;
pub mod wrk;
