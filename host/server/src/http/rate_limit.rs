//! Per-minute rate limits (GCRA, governor): anonymous callers per client IP, signed
//! callers per public key, the signup-token check per IP on its own (always on). The
//! per-minute figure is also the burst. The admin server is never limited.
//!
//! A request uses its user's bucket only when its signature is proven before anything
//! else is done for it and its key signed up, and a session's own bucket only when the
//! session is valid (see `client_server::middleware`); everything else (no credentials,
//! bad ones, or a signed upload whose body must be read before its signature can be
//! checked) counts against the client IP. So nobody can spend another user's bucket
//! without that user's key.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;

use axum::http::HeaderMap;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::{Quota, RateLimiter};
use homeserver_protocol::clock::unix_secs as unix_now;

use crate::config::RateLimitConfig;

type Keyed<K> = RateLimiter<
    K,
    governor::state::keyed::DefaultKeyedStateStore<K>,
    DefaultClock,
    StateInformationMiddleware,
>;

/// Who a limit applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Caller {
    Ip(IpAddr),
    /// A signed-up user whose signature was checked (z-base-32 key).
    Key(String),
    /// A valid session, by the SHA-256 of its token: an app's session has a bucket of
    /// its own, so it cannot use up its owner's.
    Session([u8; 32]),
}

/// The outcome of a check, with what the `X-RateLimit-*` headers say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub limit: u32,
    pub remaining: u32,
    /// Unix seconds when the bucket is full again.
    pub reset: u64,
    /// Seconds to wait, when refused.
    pub retry_after: u64,
}

/// Which limit refused a request (the metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Anonymous,
    Authenticated,
    SignupTokenCheck,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Anonymous => "anonymous",
            Scope::Authenticated => "authenticated",
            Scope::SignupTokenCheck => "signup_token_check",
        }
    }
}

struct Limit<K: std::hash::Hash + Eq + Clone> {
    per_minute: u32,
    limiter: Keyed<K>,
}

impl<K: std::hash::Hash + Eq + Clone> Limit<K> {
    fn new(per_minute: u32) -> Self {
        let per_minute = per_minute.max(1);
        let quota = Quota::per_minute(NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN));
        Self {
            per_minute,
            limiter: RateLimiter::dashmap(quota).with_middleware::<StateInformationMiddleware>(),
        }
    }

    fn check(&self, key: &K) -> Decision {
        let now_unix = unix_now();
        let period = 60.0 / f64::from(self.per_minute);
        match self.limiter.check_key(key) {
            Ok(snapshot) => {
                let remaining = snapshot.remaining_burst_capacity();
                let missing = f64::from(self.per_minute - remaining.min(self.per_minute));
                Decision {
                    allowed: true,
                    limit: self.per_minute,
                    remaining,
                    reset: now_unix + (missing * period).ceil() as u64,
                    retry_after: 0,
                }
            }
            Err(not_until) => {
                let wait = not_until.wait_time_from(self.limiter.clock().now());
                let retry_after = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                Decision {
                    allowed: false,
                    limit: self.per_minute,
                    remaining: 0,
                    reset: now_unix + (f64::from(self.per_minute) * period).ceil() as u64,
                    retry_after: retry_after.max(1),
                }
            }
        }
    }

    fn retain_recent(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }
}

pub struct RateLimits {
    enabled: bool,
    anonymous: Limit<IpAddr>,
    authenticated: Limit<Caller>,
    token_check: Limit<IpAddr>,
    trusted_proxies: Vec<IpAddr>,
}

impl RateLimits {
    pub fn new(config: &RateLimitConfig) -> Self {
        Self {
            enabled: config.enabled,
            anonymous: Limit::new(config.anonymous_per_minute),
            authenticated: Limit::new(config.authenticated_per_minute),
            token_check: Limit::new(config.signup_token_check_per_minute),
            trusted_proxies: config.trusted_proxies.clone(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Checks (and counts) one request; None when limits are off.
    pub fn check(&self, caller: &Caller) -> Option<(Decision, Scope)> {
        if !self.enabled {
            return None;
        }
        Some(match caller {
            Caller::Ip(ip) => (self.anonymous.check(ip), Scope::Anonymous),
            Caller::Key(_) | Caller::Session(_) => {
                (self.authenticated.check(caller), Scope::Authenticated)
            }
        })
    }

    /// The signup-token check's own limit, on even when the others are off.
    pub fn check_token_lookup(&self, ip: IpAddr) -> Decision {
        self.token_check.check(&ip)
    }

    /// The client's address (see [`client_ip`]).
    pub fn client_ip(&self, peer: SocketAddr, headers: &HeaderMap) -> IpAddr {
        client_ip(&self.trusted_proxies, peer, headers)
    }

    /// Forgets buckets that are full again (bounded memory under many callers).
    pub fn retain_recent(&self) {
        self.anonymous.retain_recent();
        self.authenticated.retain_recent();
        self.token_check.retain_recent();
    }
}

/// The client's address: the peer, or, when the peer is one of the `trusted` proxies,
/// the last address in `X-Forwarded-For` that is not itself a trusted proxy. (The rate
/// limits and the access log both ask this.)
pub fn client_ip(trusted: &[IpAddr], peer: SocketAddr, headers: &HeaderMap) -> IpAddr {
    let peer = peer.ip();
    if !trusted.contains(&peer) {
        return peer;
    }
    let forwarded: Vec<IpAddr> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    forwarded
        .iter()
        .rev()
        .find(|ip| !trusted.contains(ip))
        .copied()
        .unwrap_or(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(per_minute: u32) -> RateLimitConfig {
        RateLimitConfig {
            enabled: true,
            anonymous_per_minute: per_minute,
            authenticated_per_minute: per_minute * 10,
            signup_token_check_per_minute: 2,
            trusted_proxies: vec!["10.0.0.1".parse().unwrap()],
        }
    }

    #[test]
    fn burst_then_refusal() {
        let limits = RateLimits::new(&config(3));
        let ip = Caller::Ip("1.2.3.4".parse().unwrap());
        for expected_remaining in [2, 1, 0] {
            let (d, scope) = limits.check(&ip).unwrap();
            assert!(d.allowed);
            assert_eq!(scope, Scope::Anonymous);
            assert_eq!((d.limit, d.remaining), (3, expected_remaining));
        }
        let (d, _) = limits.check(&ip).unwrap();
        assert!(!d.allowed);
        assert!((1..=20).contains(&d.retry_after), "{}", d.retry_after);
        // Another IP and a key have their own buckets.
        assert!(
            limits
                .check(&Caller::Ip("1.2.3.5".parse().unwrap()))
                .unwrap()
                .0
                .allowed
        );
        let (d, scope) = limits.check(&Caller::Key("k".into())).unwrap();
        assert!(d.allowed);
        assert_eq!((scope, d.limit), (Scope::Authenticated, 30));
        // A session's bucket is not its owner's.
        let key = Caller::Key("owner".into());
        for _ in 0..30 {
            assert!(limits.check(&key).unwrap().0.allowed);
        }
        assert!(!limits.check(&key).unwrap().0.allowed);
        let (d, _) = limits.check(&Caller::Session([7; 32])).unwrap();
        assert!(d.allowed);
    }

    #[test]
    fn disabled_limits_pass_but_token_check_stays() {
        let mut c = config(1);
        c.enabled = false;
        let limits = RateLimits::new(&c);
        assert!(
            limits
                .check(&Caller::Ip("1.1.1.1".parse().unwrap()))
                .is_none()
        );
        let ip = "1.1.1.1".parse().unwrap();
        assert!(limits.check_token_lookup(ip).allowed);
        assert!(limits.check_token_lookup(ip).allowed);
        assert!(!limits.check_token_lookup(ip).allowed);
    }

    #[test]
    fn forwarded_for_only_from_trusted_proxies() {
        let limits = RateLimits::new(&config(1));
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", "9.9.9.9, 10.0.0.1".parse().unwrap());
        let proxy: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        let stranger: SocketAddr = "8.8.8.8:5000".parse().unwrap();
        assert_eq!(
            limits.client_ip(proxy, &headers),
            "9.9.9.9".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            limits.client_ip(stranger, &headers),
            "8.8.8.8".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            limits.client_ip(proxy, &HeaderMap::new()),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
    }
}
