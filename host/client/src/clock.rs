//! Timestamps for signed requests.
//!
//! The server refuses a write (POST, PUT, DELETE) whose signature it has already seen.
//! Ed25519 signatures are deterministic, so two identical writes signed in the same
//! second carry the same signature: the second would be refused as a replay. The
//! [`RequestClock`] therefore never goes backwards, and gives an identical write a later
//! timestamp than the last one it handed out for the same request.
//!
//! It does *not* bump the clock for every write (the simpler `max(now, last + 1)`):
//! that would run ahead of real time by one second per write, and a client making a few
//! hundred writes a second (the bot, a load generator) would soon be outside the
//! server's 300 s clock-skew window. Here only repeats of the same request move the
//! clock forward, so the lead over real time is bounded by how often one identical
//! write is repeated within a second.
//!
//! Reads (GET, HEAD) are exempt from replay checks and simply use the current time.

use std::collections::HashSet;
use std::sync::Mutex;

use homeserver_protocol::BodyHash;
use sha2::{Digest, Sha256};

/// Current Unix time in seconds (0 if the system clock is before 1970).
pub use homeserver_protocol::clock::unix_secs as unix_now;

/// Hands out timestamps for signed writes; one per client instance.
#[derive(Debug)]
pub struct RequestClock {
    now: fn() -> u64,
    state: Mutex<ClockState>,
}

#[derive(Debug, Default)]
struct ClockState {
    /// The latest timestamp handed out.
    second: u64,
    /// Digests of the writes signed with `second`.
    used: HashSet<[u8; 32]>,
}

impl Default for RequestClock {
    fn default() -> Self {
        Self::with_source(unix_now)
    }
}

impl RequestClock {
    /// A clock reading time from `now` (tests pass a fake).
    pub fn with_source(now: fn() -> u64) -> Self {
        Self {
            now,
            state: Mutex::new(ClockState::default()),
        }
    }

    /// Timestamp for a read: the current time.
    pub fn read_timestamp(&self) -> u64 {
        (self.now)()
    }

    /// Timestamp for a write of `method target` with body `body_hash`: never earlier than
    /// any timestamp handed out before, and later than the one given to the last
    /// identical write.
    pub fn write_timestamp(&self, method: &str, target: &str, body_hash: &BodyHash) -> u64 {
        let digest: [u8; 32] = Sha256::new()
            .chain_update(method.to_ascii_uppercase())
            .chain_update(b":")
            .chain_update(target)
            .chain_update(b":")
            .chain_update(body_hash.0)
            .finalize()
            .into();
        let now = (self.now)();
        // A poisoned lock only means another thread panicked mid-update; the state is a
        // number and a set, both still usable.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if now > state.second {
            state.second = now;
            state.used.clear();
        }
        if state.used.contains(&digest) {
            state.second += 1;
            state.used.clear();
        }
        state.used.insert(digest);
        state.second
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    static FAKE_NOW: AtomicU64 = AtomicU64::new(1_000);

    fn fake_now() -> u64 {
        FAKE_NOW.load(Ordering::SeqCst)
    }

    fn hash(b: &[u8]) -> BodyHash {
        BodyHash::of(b)
    }

    // One test drives the shared fake clock, so the steps cannot interleave.
    #[test]
    fn timestamps_never_repeat_an_identical_write_and_never_go_back() {
        FAKE_NOW.store(1_000, Ordering::SeqCst);
        let clock = RequestClock::with_source(fake_now);

        // Identical writes in one second: strictly increasing.
        let a = clock.write_timestamp("PUT", "/pub/a", &hash(b"x"));
        let b = clock.write_timestamp("PUT", "/pub/a", &hash(b"x"));
        let c = clock.write_timestamp("put", "/pub/a", &hash(b"x"));
        assert_eq!((a, b, c), (1_000, 1_001, 1_002));

        // Different writes do not push the clock further ahead.
        let d = clock.write_timestamp("PUT", "/pub/b", &hash(b"x"));
        let e = clock.write_timestamp("PUT", "/pub/a", &hash(b"y"));
        let f = clock.write_timestamp("DELETE", "/pub/a", &BodyHash::empty());
        assert_eq!((d, e, f), (1_002, 1_002, 1_002));

        // Real time behind the clock: never go backwards.
        FAKE_NOW.store(1_001, Ordering::SeqCst);
        assert_eq!(clock.write_timestamp("PUT", "/pub/c", &hash(b"x")), 1_002);
        // ...and a repeat of an earlier write still gets a fresh timestamp.
        assert_eq!(clock.write_timestamp("PUT", "/pub/a", &hash(b"x")), 1_003);

        // Real time catches up: follow it.
        FAKE_NOW.store(2_000, Ordering::SeqCst);
        assert_eq!(clock.write_timestamp("PUT", "/pub/a", &hash(b"x")), 2_000);
        assert_eq!(clock.read_timestamp(), 2_000);

        // A burst of many distinct writes stays at the current second.
        for i in 0..1_000 {
            let target = format!("/pub/burst/{i}");
            assert_eq!(clock.write_timestamp("PUT", &target, &hash(b"x")), 2_000);
        }

        // Monotonic under arbitrary interleavings.
        let mut last = 0;
        for i in 0..100u64 {
            FAKE_NOW.store(2_000 + (i * 7) % 5, Ordering::SeqCst);
            let t = clock.write_timestamp("PUT", &format!("/pub/{}", i % 3), &hash(b"z"));
            assert!(t >= last, "{t} < {last}");
            last = t;
        }
    }

    #[test]
    fn real_clock_is_sane() {
        let clock = RequestClock::default();
        let t1 = clock.write_timestamp("PUT", "/pub/x", &BodyHash::empty());
        let t2 = clock.write_timestamp("PUT", "/pub/x", &BodyHash::empty());
        assert!(t2 > t1);
        assert!(t1 > 1_600_000_000);
    }
}
