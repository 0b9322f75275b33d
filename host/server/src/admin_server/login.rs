//! Signing in to the admin web page: the password is exchanged once for a random
//! session token held in an `HttpOnly` cookie, so the page never keeps the password
//! (not in the URL, not in local storage). Sessions live in memory: a restart signs
//! everyone out, and each instance of a deployment has its own.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use cookie::{Cookie, SameSite};
use governor::clock::DefaultClock;
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use homeserver_protocol::ErrorCode;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::password_matches;
use crate::context::AppContext;
use crate::http::error::ApiError;
use crate::http::small_body::read_small_body;

/// Name of the session cookie.
pub const COOKIE: &str = "hs_admin";
/// The cookie goes only with admin API requests (browsers keep cookies per host, not
/// per port: other servers of this host see it only under this path).
const COOKIE_PATH: &str = "/admin/";
/// Header a cookie-authenticated request must carry. A page of another origin cannot
/// add it without a CORS preflight the admin server never grants, so a cookie alone
/// (sent by the browser with any cross-site form) never acts.
pub const CSRF_HEADER: &str = "x-homeserver-admin";
/// How long a sign-in lasts.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// At most this many live sessions; signing in past it ends the oldest.
const MAX_SESSIONS: usize = 64;
/// Wrong passwords an address may try per minute (a burst of as many, then one every
/// few seconds); past it every attempt is refused with 429 unheard.
const WRONG_PASSWORDS_PER_MINUTE: u32 = 10;

/// Live admin sessions, by the SHA-256 of their token (a memory dump shows no token),
/// and the password-guessing brake.
pub struct AdminLogins {
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

impl Default for AdminLogins {
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

/// The address a request came from (the admin listener is not behind a proxy).
pub fn peer_ip(request: &axum::extract::Request) -> IpAddr {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip())
}

impl AdminLogins {
    /// The refusal of an address that guessed wrong too often, given before its
    /// password is looked at.
    pub fn refusal(&self, ip: IpAddr) -> Option<Response> {
        let ip = brake_key(ip);
        let now = Instant::now();
        let mut refused = self.refused_until.lock().unwrap_or_else(|e| e.into_inner());
        refused.retain(|_, until| *until > now);
        match refused.get(&ip) {
            Some(until) => {
                let wait = until.duration_since(now).as_secs() + 1;
                let mut response = ApiError::new(
                    ErrorCode::RateLimitExceeded,
                    format!("too many wrong admin passwords from {ip}: try again in {wait} s"),
                )
                .into_response();
                if let Ok(value) = HeaderValue::from_str(&wait.to_string()) {
                    response.headers_mut().insert(header::RETRY_AFTER, value);
                }
                Some(response)
            }
            None => None,
        }
    }

    /// Counts a wrong password from `ip`; the guess that empties its bucket makes it
    /// refused until the bucket has room again (one guess every 60/N s).
    pub fn wrong_password(&self, ip: IpAddr) {
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

    fn start(&self) -> Result<String, ApiError> {
        let mut token = [0u8; 32];
        getrandom::fill(&mut token)
            .map_err(|e| ApiError::new(ErrorCode::ServerError, format!("RNG: {e}")))?;
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token);
        let now = Instant::now();
        let mut sessions = self.lock();
        sessions.retain(|_, expires| *expires > now);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions.iter().min_by_key(|(_, e)| **e).map(|(k, _)| *k)
        {
            sessions.remove(&oldest);
        }
        sessions.insert(digest(&token), now + SESSION_TTL);
        Ok(token)
    }

    /// Whether the request's cookie names a live session.
    pub fn is_signed_in(&self, headers: &HeaderMap) -> bool {
        let Some(token) = session_cookie(headers) else {
            return false;
        };
        let now = Instant::now();
        self.lock()
            .get(&digest(&token))
            .is_some_and(|expires| *expires > now)
    }

    fn end(&self, headers: &HeaderMap) {
        if let Some(token) = session_cookie(headers) {
            self.lock().remove(&digest(&token));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Instant>> {
        // A panic while holding the lock leaves a map that is still consistent.
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == COOKIE)
        .map(|c| c.value().to_owned())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignIn {
    password: String,
}

/// `POST /admin/session` `{"password"}` with `X-Homeserver-Admin: 1` (so no form of
/// another site can sign a browser in): 204 and the session cookie.
pub async fn sign_in(
    State((app, logins)): State<(Arc<AppContext>, Arc<AdminLogins>)>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, Response> {
    if headers.get(CSRF_HEADER).is_none_or(|v| v != "1") {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!("signing in needs the header `{CSRF_HEADER}: 1`"),
        )
        .into_response());
    }
    let body = read_small_body(body, app.storage.limits().body_idle_timeout, "sign-in")
        .await
        .map_err(IntoResponse::into_response)?;
    let request: SignIn = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            ErrorCode::BadRequest,
            format!("body must be {{\"password\": \"<admin.password>\"}}: {e}"),
        )
        .into_response()
    })?;
    if let Some(refused) = logins.refusal(peer.ip()) {
        return Err(refused);
    }
    if !password_matches(&app, &request.password) {
        tracing::warn!(peer = %peer.ip(), "admin sign-in with a wrong password");
        logins.wrong_password(peer.ip());
        return Err(
            ApiError::new(ErrorCode::InvalidSignature, "wrong admin password").into_response(),
        );
    }
    let token = logins.start().map_err(IntoResponse::into_response)?;
    let cookie = Cookie::build((COOKIE, token))
        .http_only(true)
        .same_site(SameSite::Strict)
        .path(COOKIE_PATH)
        .max_age(cookie::time::Duration::seconds(SESSION_TTL.as_secs() as i64))
        .build();
    Ok(with_cookie(cookie))
}

/// `DELETE /admin/session`: 204; the session ends and the browser drops the cookie.
pub async fn sign_out(
    State((_, logins)): State<(Arc<AppContext>, Arc<AdminLogins>)>,
    headers: HeaderMap,
) -> Response {
    logins.end(&headers);
    let mut cookie = Cookie::build((COOKIE, ""))
        .http_only(true)
        .same_site(SameSite::Strict)
        .path(COOKIE_PATH)
        .build();
    cookie.make_removal();
    with_cookie(cookie)
}

fn with_cookie(cookie: Cookie<'static>) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie.to_string()) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie_header(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn a_session_is_found_by_its_cookie_and_ends() {
        let logins = AdminLogins::default();
        let token = logins.start().unwrap();
        let headers = with_cookie_header(&format!("other=1; {COOKIE}={token}"));
        assert!(logins.is_signed_in(&headers));
        assert!(!logins.is_signed_in(&with_cookie_header(&format!("{COOKIE}=x{token}"))));
        assert!(!logins.is_signed_in(&HeaderMap::new()));
        logins.end(&headers);
        assert!(!logins.is_signed_in(&headers));
    }

    #[test]
    fn wrong_passwords_are_braked_per_address() {
        let logins = AdminLogins::default();
        let guesser: IpAddr = "192.0.2.1".parse().unwrap();
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        for _ in 0..WRONG_PASSWORDS_PER_MINUTE {
            assert!(logins.refusal(guesser).is_none());
            logins.wrong_password(guesser);
        }
        // Ten were heard; the next is refused before its password is looked at.
        let refused = logins.refusal(guesser).unwrap();
        assert_eq!(refused.status(), 429);
        assert!(refused.headers().contains_key(header::RETRY_AFTER));
        assert!(logins.refusal(other).is_none());
        // Another address of the same IPv6 /64 shares a bucket; another /64 does not.
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        for _ in 0..WRONG_PASSWORDS_PER_MINUTE {
            logins.wrong_password(v6);
        }
        assert!(logins.refusal("2001:db8::ffff".parse().unwrap()).is_some());
        assert!(logins.refusal("2001:db8:0:1::1".parse().unwrap()).is_none());
    }

    #[test]
    fn sessions_are_bounded() {
        let logins = AdminLogins::default();
        let first = logins.start().unwrap();
        for _ in 0..MAX_SESSIONS {
            logins.start().unwrap();
        }
        assert_eq!(logins.lock().len(), MAX_SESSIONS);
        assert!(!logins.is_signed_in(&with_cookie_header(&format!("{COOKIE}={first}"))));
    }
}
