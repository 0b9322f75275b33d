//! Crash points for the crash tests: with `PKBOT_FAILPOINT=<name>` in its environment,
//! the process aborts (as a `kill -9` would stop it) the first time it reaches the
//! point of that name. Unset, a point costs one read of a static.
//!
//! Points: `after-ingest` (mention recorded, not yet routed), `after-route` (decision
//! stored, action not yet requested), `after-action` (reply stored, not yet handed
//! on), `after-reserve` (reply reserved, not yet written), `after-publish` (reply
//! written to the homeserver, not yet marked published).

use std::sync::OnceLock;

/// Aborts the process if `PKBOT_FAILPOINT` names `point`.
pub fn hit(point: &str) {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| std::env::var("PKBOT_FAILPOINT").ok());
    if armed.as_deref() == Some(point) {
        eprintln!("pkbot: failpoint {point}: aborting");
        std::process::abort();
    }
}
