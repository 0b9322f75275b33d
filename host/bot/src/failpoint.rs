//! Crash points for the crash tests: with `PKBOT_FAILPOINT=<name>` in its environment,
//! the process aborts (as a `kill -9` would stop it) the first time it reaches the
//! point of that name. Unset, a point costs one read of a static.
//!
//! Points: `after-ingest` (mention recorded, not yet routed), `after-route` (decision
//! stored, action not yet requested), `after-action` (reply stored, not yet handed
//! on), `after-reserve` (reply reserved, not yet written), `after-publish` (reply
//! written to the homeserver, not yet marked published).
//!
//! `PKBOT_FAILPOINT=skip:<name>` instead skips the step after the point once, and the
//! process goes on: `skip:hand-on` records a mention without handing it on (what a
//! leader that died right there leaves, with this process still running);
//! `skip:stop-on-lease-loss` keeps a leader's stages running after it lost its lease
//! (what only the fence then stops).
//!
//! `PKBOT_FAILPOINT=jitter:<name>` makes every pass of the point wait a random 0 to
//! 50 ms (what a busy database or guest does now and then): `jitter:route`, before the
//! router decides, shows whether mentions are still decided in the order they came in.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var("PKBOT_FAILPOINT").ok())
        .as_deref()
}

/// Aborts the process if `PKBOT_FAILPOINT` names `point`.
pub fn hit(point: &str) {
    if armed() == Some(point) {
        eprintln!("pkbot: failpoint {point}: aborting");
        std::process::abort();
    }
}

/// True the first time it is reached when `PKBOT_FAILPOINT` is `skip:<point>`.
pub fn skip(point: &str) -> bool {
    static SKIPPED: AtomicBool = AtomicBool::new(false);
    armed().and_then(|a| a.strip_prefix("skip:")) == Some(point)
        && !SKIPPED.swap(true, Ordering::SeqCst)
}

/// Waits a random 0 to 50 ms when `PKBOT_FAILPOINT` is `jitter:<point>`.
pub async fn jitter(point: &str) {
    if armed().and_then(|a| a.strip_prefix("jitter:")) == Some(point) {
        let mut byte = [0u8; 1];
        let _ = getrandom::fill(&mut byte);
        let millis = u64::from(byte[0]) * 50 / 255;
        tokio::time::sleep(std::time::Duration::from_millis(millis)).await;
    }
}
