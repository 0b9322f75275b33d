//! Who may use the admin API: the admin password, checked in constant time behind a
//! brake on wrong guesses per address, and the sign-in sessions the admin page holds
//! (the password is exchanged once for a random token, which the admin server keeps in
//! an `HttpOnly` cookie). Sessions live in memory: a restart signs everyone out, and
//! each instance of a deployment has its own. The cookie, the CSRF header and the
//! answers are the admin server's (`admin_server/login.rs`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use governor::clock::DefaultClock;
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use homeserver_protocol::secret::Secret;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::ServiceError;

/// How long a sign-in lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// At most this many live sessions; signing in past it ends the oldest.
const MAX_SESSIONS: usize = 64;
/// Wrong passwords an address may try per minute (a burst of as many, then one every
/// few seconds); past it every attempt is refused unheard.
const WRONG_PASSWORDS_PER_MINUTE: u32 = 10;

/// Why a password was not accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The address guessed wrong too often: refused before its password is looked at,
    /// for this long.
    Braked { ip: IpAddr, wait: Duration },
    /// Not the admin password (counted against the address).
    WrongPassword,
}

/// Live admin sessions, by the SHA-256 of their token (a memory dump shows no token),
/// and the password-guessing brake.
pub struct AdminSignIn {
    sessions: Mutex<HashMap<[u8; 32], Instant>>,
    wrong_passwords: RateLimiter<
        IpAddr,
        DefaultKeyedStateStore<IpAddr>,
        DefaultClock,
        StateInformationMiddleware,
    >,
    /// Wrong passwords so far (to prune the limiter now and then).
    guesses: AtomicU64,
    /// Addresses that used up their wrong guesses, until when.
    refused_until: Mutex<HashMap<IpAddr, Instant>>,
}

impl Default for AdminSignIn {
    fn default() -> Self {
        let per_minute = NonZeroU32::new(WRONG_PASSWORDS_PER_MINUTE).unwrap_or(NonZeroU32::MIN);
        Self {
            sessions: Mutex::default(),
            wrong_passwords: RateLimiter::keyed(Quota::per_minute(per_minute))
                .with_middleware::<StateInformationMiddleware>(),
            guesses: AtomicU64::new(0),
            refused_until: Mutex::default(),
        }
    }
}

/// Whose guesses count together: an IPv4 address, or an IPv6 /64 (what one customer of
/// a provider usually holds, so changing the low bits does not buy more guesses).
fn brake_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
    }
}

/// Constant-time comparison of SHA-256 digests: the time taken says nothing about the
/// password, not even its length.
fn password_matches(expected: &Secret, given: &str) -> bool {
    let expected = Sha256::digest(expected.expose().as_bytes());
    let given = Sha256::digest(given.as_bytes());
    bool::from(expected.ct_eq(&given))
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl AdminSignIn {
    /// Checks `given` against the admin password for a request from `ip`: refused
    /// unheard while the address is braked; a wrong password counts against it.
    pub fn check_password(
        &self,
        ip: IpAddr,
        expected: &Secret,
        given: &str,
    ) -> Result<(), Refusal> {
        if let Some(wait) = self.braked(ip) {
            return Err(Refusal::Braked {
                ip: brake_key(ip),
                wait,
            });
        }
        if password_matches(expected, given) {
            return Ok(());
        }
        self.wrong_password(ip);
        Err(Refusal::WrongPassword)
    }

    /// How long an address that guessed wrong too often must still wait.
    fn braked(&self, ip: IpAddr) -> Option<Duration> {
        let ip = brake_key(ip);
        let now = Instant::now();
        let mut refused = self.refused_until.lock().unwrap_or_else(|e| e.into_inner());
        refused.retain(|_, until| *until > now);
        refused.get(&ip).map(|until| until.duration_since(now))
    }

    /// Counts a wrong password from `ip`; the guess that empties its bucket makes it
    /// refused until the bucket has room again (one guess every 60/N s).
    fn wrong_password(&self, ip: IpAddr) {
        let ip = brake_key(ip);
        let empty = match self.wrong_passwords.check_key(&ip) {
            Ok(snapshot) => snapshot.remaining_burst_capacity() == 0,
            Err(_) => true,
        };
        if empty {
            let wait = Duration::from_secs(60) / WRONG_PASSWORDS_PER_MINUTE;
            self.refused_until
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(ip, Instant::now() + wait);
        }
        // Forgetting addresses whose buckets are full again scans them all: now and then.
        if self.guesses.fetch_add(1, Ordering::Relaxed) % 64 == 63 {
            self.wrong_passwords.retain_recent();
        }
    }

    /// Starts a session (after the password was accepted): its token.
    pub fn start(&self) -> Result<String, ServiceError> {
        let mut token = [0u8; 32];
        getrandom::fill(&mut token).map_err(|e| ServiceError::Internal(format!("RNG: {e}")))?;
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token);
        let now = Instant::now();
        let mut sessions = self.sessions();
        sessions.retain(|_, expires| *expires > now);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions.iter().min_by_key(|(_, e)| **e).map(|(k, _)| *k)
        {
            sessions.remove(&oldest);
        }
        sessions.insert(digest(&token), now + SESSION_TTL);
        Ok(token)
    }

    /// Whether `token` names a live session.
    pub fn is_signed_in(&self, token: &str) -> bool {
        let now = Instant::now();
        self.sessions()
            .get(&digest(token))
            .is_some_and(|expires| *expires > now)
    }

    /// Ends the session `token` names, if any.
    pub fn end(&self, token: &str) {
        self.sessions().remove(&digest(token));
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Instant>> {
        // A panic while holding the lock leaves a map that is still consistent.
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_by_its_token_and_ends() {
        let logins = AdminSignIn::default();
        let token = logins.start().unwrap();
        assert!(logins.is_signed_in(&token));
        assert!(!logins.is_signed_in(&format!("x{token}")));
        assert!(!logins.is_signed_in(""));
        logins.end(&token);
        assert!(!logins.is_signed_in(&token));
    }

    #[test]
    fn wrong_passwords_are_braked_per_address() {
        let logins = AdminSignIn::default();
        let password = Secret::from("right".to_owned());
        let guesser: IpAddr = "192.0.2.1".parse().unwrap();
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        for _ in 0..WRONG_PASSWORDS_PER_MINUTE {
            assert_eq!(
                logins.check_password(guesser, &password, "wrong"),
                Err(Refusal::WrongPassword)
            );
        }
        // Ten were heard; the next is refused before its password is looked at, even
        // the right one.
        assert!(matches!(
            logins.check_password(guesser, &password, "right"),
            Err(Refusal::Braked { wait, .. }) if wait <= Duration::from_secs(6)
        ));
        assert_eq!(logins.check_password(other, &password, "right"), Ok(()));
        // Another address of the same IPv6 /64 shares a bucket; another /64 does not.
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        for _ in 0..WRONG_PASSWORDS_PER_MINUTE {
            let _ = logins.check_password(v6, &password, "wrong");
        }
        let same_64 = "2001:db8::ffff".parse().unwrap();
        assert!(matches!(
            logins.check_password(same_64, &password, "right"),
            Err(Refusal::Braked { .. })
        ));
        let next_64 = "2001:db8:0:1::1".parse().unwrap();
        assert_eq!(logins.check_password(next_64, &password, "right"), Ok(()));
    }

    #[test]
    fn sessions_are_bounded() {
        let logins = AdminSignIn::default();
        let first = logins.start().unwrap();
        for _ in 0..MAX_SESSIONS {
            logins.start().unwrap();
        }
        assert_eq!(logins.sessions().len(), MAX_SESSIONS);
        assert!(!logins.is_signed_in(&first));
    }
}
