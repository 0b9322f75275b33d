//! What wraps every client request: its credentials classified once (read by everything
//! after), the rate limit (which answers first, before any other check), the
//! `X-RateLimit-*` headers, request metrics, and `Connection: close` on an answer given
//! before the request's body was read ([`crate::http::unread_body`]).
//!
//! Storage paths (`/pub/...`, `/private/...`) go straight to their handler
//! ([`storage::serve`]); the router answers the rest.
//!
//! One tower service around the routes ([`Observed`]) rather than axum middleware added
//! with `Router::layer`: each such layer wraps every route in one more boxed service,
//! and a request clones the whole nest at each level on its way in (13 allocations of
//! a public GET's 66 were those clones; docs/BENCHMARKS.md "One service around the
//! client routes").

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use homeserver_protocol::ErrorCode;
use tower::{Service, ServiceExt};

use super::{AppState, storage};
use crate::http::error::ApiError;
use crate::http::extract::{Classified, ClientIp, classify};
use crate::http::rate_limit::{Caller, Decision};
use crate::http::unread_body;
use crate::service::auth::Credentials;

/// The path of the signup-token check, which has its own limit.
const SIGNUP_TOKENS_PREFIX: &str = "/signup_tokens/";

/// The client routes with what wraps them; the probes (`/health`, `/ready`) pass
/// around the rate limit and the request metrics: a balancer probing every 100 ms must
/// neither be refused nor drown the latency histograms.
#[derive(Clone)]
pub struct Observed {
    app: AppState,
    routes: Router,
    probes: Router,
}

impl Observed {
    /// `routes` and `probes` with their state given (`Router<()>`).
    pub fn new(app: AppState, routes: Router, probes: Router) -> Self {
        Self {
            app,
            routes,
            probes,
        }
    }
}

/// The probes' paths, routed by [`Observed`] to its `probes`.
pub const PROBE_PATHS: [&str; 2] = ["/health", "/ready"];

impl Service<Request> for Observed {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Both are routers, always ready; each request takes a clone of one.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        if PROBE_PATHS.contains(&request.uri().path()) {
            return Box::pin(self.probes.clone().oneshot(request));
        }
        let (app, routes) = (self.app.clone(), self.routes.clone());
        let head = request.method() == Method::HEAD;
        Box::pin(async move {
            let (request, watch) = unread_body::watch(request);
            let mut response = observe_and_limit(app, request, routes).await;
            if head {
                // axum strips a HEAD answer's body inside its routes only; the 429 is
                // made here, and hyper's HTTP/2 would send its body (a protocol error
                // on a HEAD stream).
                without_body(&mut response);
            }
            if let Some(watch) = watch {
                watch.close_if_unread(&mut response);
            }
            Ok(response)
        })
    }
}

async fn observe_and_limit(app: AppState, mut request: Request, routes: Router) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    // The access log may have worked it out already.
    let ip = match request.extensions().get::<ClientIp>() {
        Some(ip) => ip.0,
        None => {
            let peer = request
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0)
                .unwrap_or_else(|| SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
            let ip = app.rate_limits.client_ip(peer, request.headers());
            request.extensions_mut().insert(ClientIp(ip));
            ip
        }
    };

    // The credentials, classified once for everything after this layer.
    let (mut parts, body) = request.into_parts();
    let classified = classify(&parts);
    let limited = if parts.uri.path().starts_with(SIGNUP_TOKENS_PREFIX) {
        Some((app.rate_limits.check_token_lookup(ip), "signup_token_check"))
    } else if app.rate_limits.enabled() {
        let caller = caller(&app, &classified, ip).await;
        app.rate_limits
            .check(&caller)
            .map(|(d, scope)| (d, scope.as_str()))
    } else {
        None
    };
    parts.extensions.insert(classified);
    let request = Request::from_parts(parts, body);

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
            let mut response = if storage::is_storage_path(request.uri().path()) {
                storage::serve(app.clone(), request).await
            } else {
                match routes.oneshot(request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                }
            };
            if let Some((decision, _)) = limited {
                rate_headers(response.headers_mut(), &decision);
            }
            response
        }
    };
    app.metrics
        .observe_request(method.as_str(), response.status(), started.elapsed());
    response
}

/// Which bucket a request uses: its user's, when its signature was proven up front (a
/// bodiless request, or one whose body's SHA-256 is declared in `Content-Digest`: see
/// [`classify`]) and the user signed up; a valid session's own; otherwise its IP's. A
/// signed upload without a declared digest cannot be proven before its body is read, so
/// it counts against the IP: charging the named key on the header's word would let
/// anyone use up another user's bucket. Keys are free to make, so an unknown key never
/// gets a bucket of its own.
async fn caller(app: &AppState, classified: &Classified, ip: IpAddr) -> Caller {
    match &classified.0 {
        Ok(Credentials::Signed(signed)) if signed.is_proven() => {
            let user = signed.public_key.to_z32();
            if app.known_user(&user).await {
                return Caller::Key(user);
            }
        }
        Ok(Credentials::Session(token)) => {
            if let Ok(session) = app.access.sessions().resolve(token).await {
                return Caller::Session(session.token_hash);
            }
        }
        _ => {}
    }
    Caller::Ip(ip)
}

/// Drops a HEAD answer's body, keeping the `Content-Length` a GET would have had. An
/// answer the routes stripped already is left as axum made it.
fn without_body(response: &mut Response) {
    if http_body::Body::is_end_stream(response.body()) {
        return;
    }
    if !response.headers().contains_key(header::CONTENT_LENGTH)
        && let Some(length) = http_body::Body::size_hint(response.body()).exact()
    {
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    *response.body_mut() = Body::empty();
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
