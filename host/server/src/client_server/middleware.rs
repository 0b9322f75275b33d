//! What wraps every client request: the rate limit (which answers first, before any
//! other check), the `X-RateLimit-*` headers, and request metrics.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use homeserver_protocol::ErrorCode;

use super::AppState;
use super::error::ApiError;
use super::extract::credentials;
use crate::rate_limit::{Caller, Decision};
use crate::service::auth::{Credentials, check_fresh};

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

    let limited = if request.uri().path().starts_with(SIGNUP_TOKENS_PREFIX) {
        Some((app.rate_limits.check_token_lookup(ip), "signup_token_check"))
    } else {
        app.rate_limits
            .check(&caller(request.headers(), ip))
            .map(|(d, scope)| (d, scope.as_str()))
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
            if response.status() == StatusCode::UNAUTHORIZED {
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

/// A well-formed, fresh signature selects its key's bucket (the signature itself is
/// checked later; a failure is then charged to the IP as well).
fn caller(headers: &HeaderMap, ip: IpAddr) -> Caller {
    match credentials(headers) {
        Ok(Credentials::Signed(header)) if check_fresh(&header).is_ok() => {
            Caller::Key(header.public_key.to_z32())
        }
        Ok(Credentials::Session(token)) => Caller::Key(format!("session:{token}")),
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
