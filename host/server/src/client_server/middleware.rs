//! What wraps every client request: the rate limit (which answers first, before any
//! other check), the `X-RateLimit-*` headers, and request metrics.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use homeserver_protocol::{BodyHash, ErrorCode};

use super::AppState;
use super::error::ApiError;
use super::extract::{credentials, target_of};
use crate::rate_limit::{Caller, Decision};
use crate::service::auth::{Credentials, check_fresh};
use crate::service::now_secs;

/// The path of the signup-token check, which has its own limit.
const SIGNUP_TOKENS_PREFIX: &str = "/signup_tokens/";

pub async fn observe_and_limit(
    State(app): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
        .unwrap_or_else(|| SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
    let ip = app.rate_limits.client_ip(peer, request.headers());

    let mut keyed = false;
    let limited = if request.uri().path().starts_with(SIGNUP_TOKENS_PREFIX) {
        Some((app.rate_limits.check_token_lookup(ip), "signup_token_check"))
    } else if app.rate_limits.enabled() {
        // Taken out first: a borrowed request cannot be held across an await.
        let credentials = credentials(request.headers());
        let target = target_of(request.uri());
        let caller = caller(&app, credentials, request.method().clone(), target, ip).await;
        keyed = matches!(caller, Caller::Key(_));
        app.rate_limits
            .check(&caller)
            .map(|(d, scope)| (d, scope.as_str()))
    } else {
        None
    };

    let response = match limited {
        Some((decision, scope)) if !decision.allowed => {
            app.metrics.observe_rate_limited(scope);
            let mut response = ApiError::new(
                ErrorCode::RateLimitExceeded,
                format!("rate limit exceeded: retry in {} s", decision.retry_after),
            )
            .into_response();
            rate_headers(response.headers_mut(), &decision);
            if let Ok(v) = HeaderValue::from_str(&decision.retry_after.to_string()) {
                response.headers_mut().insert("retry-after", v);
            }
            response
        }
        _ => {
            let mut response = next.run(request).await;
            // A key's bucket was used on the key's word (a PUT's signature is checked
            // after the body): when it was false, charge the IP too.
            if keyed && response.status() == StatusCode::UNAUTHORIZED {
                app.rate_limits.charge_failed_auth(ip);
            }
            if let Some((decision, _)) = limited {
                rate_headers(response.headers_mut(), &decision);
            }
            response
        }
    };
    app.metrics.observe_request(
        method.as_str(),
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// Which bucket a request uses: its user's, when its credentials prove a signed-up user
/// (a bodiless signed request is verified here; a PUT's or POST's signature covers a body
/// not read yet, so a fresh, well-formed one is taken at its word and a failure is
/// charged to the IP as well); otherwise its IP's. Keys are free to make, so an unknown
/// key never gets a bucket of its own.
async fn caller(
    app: &AppState,
    credentials: Result<Credentials, ApiError>,
    method: Method,
    target: String,
    ip: IpAddr,
) -> Caller {
    let user = match credentials {
        Ok(Credentials::Signed(header)) if check_fresh(&header).is_ok() => {
            let bodiless = matches!(method, Method::GET | Method::HEAD | Method::DELETE);
            let verified = !bodiless
                || header
                    .verify(
                        method.as_str(),
                        &target,
                        &BodyHash::empty(),
                        u64::try_from(now_secs()).unwrap_or(0),
                    )
                    .is_ok();
            verified.then(|| header.public_key.to_z32())
        }
        Ok(Credentials::Session(token)) => app
            .access
            .sessions()
            .resolve(&token)
            .await
            .ok()
            .map(|s| s.user),
        _ => None,
    };
    match user {
        Some(user) if app.known_user(&user).await => Caller::Key(user),
        _ => Caller::Ip(ip),
    }
}

fn rate_headers(headers: &mut HeaderMap, d: &Decision) {
    for (name, value) in [
        ("x-ratelimit-limit", d.limit as u64),
        ("x-ratelimit-remaining", d.remaining as u64),
        ("x-ratelimit-reset", d.reset),
    ] {
        headers.insert(name, HeaderValue::from(value));
    }
}
