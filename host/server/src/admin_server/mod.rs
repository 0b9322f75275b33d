//! The admin server: its own listener (keep it private), no rate limit. API calls
//! authenticate with `Authorization: Bearer <admin.password>` (compared in constant
//! time) or, from the admin web page, with the session cookie of a sign-in
//! ([`login`]). Operator actions live in `service::admin`; these files are only their
//! HTTP shape.

mod lists;
mod login;
mod page;

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use homeserver_protocol::{ErrorCode, PublicKey};
use serde::{Deserialize, Serialize};

use crate::context::AppContext;
use crate::http::error::ApiError;
use crate::http::extract::PathParam;
use crate::http::small_body::read_small_body;
use crate::service::admin::BackendHealth;
use crate::service::admin_sign_in::{AdminSignIn, Refusal};
pub use login::{COOKIE, CSRF_HEADER};
pub use page::OPENAPI;

type AdminState = Arc<AppContext>;

pub fn router(app: AdminState) -> Router {
    let logins = Arc::new(AdminSignIn::default());
    let api = Router::new()
        .route("/admin/stats", get(stats))
        .route("/admin/users", get(lists::users))
        .route(
            "/admin/users/{public_key}",
            get(user).delete(delete_account),
        )
        .route("/admin/users/{public_key}/disable", post(disable))
        .route("/admin/users/{public_key}/enable", post(enable))
        .route("/admin/users/{public_key}/quota", put(set_quota))
        .route(
            "/admin/signup_tokens",
            get(lists::signup_tokens).post(create_signup_token),
        )
        .route("/admin/events", get(lists::events))
        .route("/admin/policies", get(policies))
        .route("/admin/policies/reload", post(reload_policies))
        .route("/admin/pkarr", get(pkarr))
        .route("/admin/openapi.json", get(page::openapi))
        .route("/", get(page::index))
        .route("/admin.css", get(page::stylesheet))
        .route("/admin.js", get(page::script))
        .with_state(app.clone());
    let sessions = Router::new()
        .route(
            "/admin/session",
            post(login::sign_in).delete(login::sign_out),
        )
        .with_state((app.clone(), logins.clone()));
    let router = api
        .merge(sessions)
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such admin endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                "method not allowed on this endpoint",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            (app, logins),
            require_admin,
        ));
    crate::http::request_id::with_request_ids(router)
}

/// What anyone who reaches the admin listener may fetch: the page (it signs in by
/// itself), the API's description, and signing in and out.
fn is_open(method: &Method, path: &str) -> bool {
    match path {
        "/" | "/admin.css" | "/admin.js" | "/admin/openapi.json" => {
            method == Method::GET || method == Method::HEAD
        }
        "/admin/session" => true,
        _ => false,
    }
}

async fn require_admin(
    State((app, logins)): State<(AdminState, Arc<AdminSignIn>)>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(host) = foreign_host(&request, &app.config.admin.allowed_hosts) {
        return ApiError::new(
            ErrorCode::InsufficientPermissions,
            format!(
                "the admin server answers to IP addresses, localhost and admin.allowed_hosts, \
                 not `{host}`"
            ),
        )
        .into_response();
    }
    if is_open(request.method(), request.uri().path()) {
        return next.run(request).await;
    }
    let ip = login::peer_ip(&request);
    let headers = request.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let authorized = match bearer {
        Some(given) => match logins.check_password(ip, &app.config.admin.password, given) {
            Ok(()) => true,
            Err(refusal @ Refusal::Braked { .. }) => {
                return login::refused(refusal, "");
            }
            Err(Refusal::WrongPassword) => false,
        },
        None if login::is_signed_in(&logins, headers) => {
            if headers.get(CSRF_HEADER).is_none_or(|v| v != "1") {
                return ApiError::new(
                    ErrorCode::InsufficientPermissions,
                    format!("a request signed in by cookie must carry `{CSRF_HEADER}: 1`"),
                )
                .into_response();
            }
            true
        }
        None => false,
    };
    if authorized {
        return next.run(request).await;
    }
    // The code is the contract's 401 code; the message says what is wrong.
    let message = match bearer {
        None | Some("") => {
            "the admin API needs the admin password (Authorization: Bearer <admin.password>) \
             or a sign-in (POST /admin/session)"
        }
        Some(_) => "wrong admin password (Authorization: Bearer <admin.password>)",
    };
    ApiError::new(ErrorCode::InvalidSignature, message).into_response()
}

/// The request's `Host` when it names this server by a name it was not told to answer
/// to. A browser sends the name of the page's origin: a site that made its own name
/// point at this machine (DNS rebinding) would be same-origin with the admin page, and
/// could add any header; it cannot make the browser send an IP address instead.
fn foreign_host(request: &Request, allowed: &[String]) -> Option<String> {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<axum::http::uri::Authority>().ok())?;
    let name = host.host().trim_start_matches('[').trim_end_matches(']');
    let ok = name.parse::<std::net::IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name));
    (!ok).then(|| host.host().to_owned())
}

/// The `{public_key}` of a user route, parsed: a malformed key is a JSON 400.
struct UserKey(PublicKey);

impl<S: Send + Sync> FromRequestParts<S> for UserKey {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let PathParam(text) = PathParam::from_request_parts(parts, state).await?;
        text.parse()
            .map(UserKey)
            .map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("invalid public key: {e}")))
    }
}

/// Answer to `GET /admin/stats`. It answers even when a backing store is down (that is
/// when an operator looks): `users` and `total_storage` are then null, and `backends`
/// says which store is down and why.
#[derive(Debug, Serialize, Deserialize)]
pub struct Stats {
    pub users: Option<u64>,
    pub total_storage: Option<u64>,
    pub requests_per_minute: u64,
    pub uptime_seconds: u64,
    pub backends: BackendHealth,
}

async fn stats(State(app): State<AdminState>) -> Json<Stats> {
    let (stats, backends) = tokio::join!(app.admin.stats(), app.admin.backend_health());
    let stats = stats.ok();
    Json(Stats {
        users: stats.map(|s| s.users),
        total_storage: stats.map(|s| s.total_storage),
        requests_per_minute: app.metrics.requests_last_minute(),
        uptime_seconds: app.metrics.uptime().as_secs(),
        backends,
    })
}

async fn user(State(app): State<AdminState>, UserKey(key): UserKey) -> Result<Response, ApiError> {
    let info = app.admin.user(&key).await?;
    Ok(Json(info).into_response())
}

async fn disable(
    State(app): State<AdminState>,
    UserKey(key): UserKey,
) -> Result<Response, ApiError> {
    let info = app.admin.set_disabled(&key, true).await?;
    Ok(Json(info).into_response())
}

async fn enable(
    State(app): State<AdminState>,
    UserKey(key): UserKey,
) -> Result<Response, ApiError> {
    let info = app.admin.set_disabled(&key, false).await?;
    Ok(Json(info).into_response())
}

/// Body of `PUT /admin/users/{key}/quota`: bytes, 0 = unlimited, null = the default.
/// The field is required: an empty object must not reset a quota by accident.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaRequest {
    #[serde(deserialize_with = "required_nullable")]
    quota_bytes: Option<u64>,
}

/// A field that must be present but may be `null`.
fn required_nullable<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<u64>::deserialize(d)
}

async fn set_quota(
    State(app): State<AdminState>,
    UserKey(key): UserKey,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let body = read_small_body(body, app.storage.limits().body_idle_timeout, "quota").await?;
    let request: QuotaRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            ErrorCode::BadRequest,
            format!("body must be {{\"quota_bytes\": <bytes or null>}}: {e}"),
        )
    })?;
    let info = app.admin.set_quota(&key, request.quota_bytes).await?;
    Ok(Json(info).into_response())
}

async fn delete_account(
    State(app): State<AdminState>,
    UserKey(key): UserKey,
) -> Result<Response, ApiError> {
    let deleted = app.admin.delete_account(&key).await?;
    app.forget_user(&deleted.public_key);
    Ok(Json(deleted).into_response())
}

async fn create_signup_token(State(app): State<AdminState>) -> Result<Response, ApiError> {
    let token = app.admin.create_signup_token().await?;
    Ok(Json(serde_json::json!({ "token": token })).into_response())
}

/// A slot's state as the admin API shows it: with the process that calls it.
#[derive(Serialize)]
struct SlotView {
    #[serde(flatten)]
    status: homeserver_runtime::SlotStatus,
    /// `homeserver` (this process asks it) or `pkbot` (loaded here, asked only by the
    /// bot, from its own `policies.dir`).
    called_by: &'static str,
    /// What this process's calls into the slot cost since it started.
    calls: Option<CallsView>,
    /// The same per module this process swapped into the slot (the serving one and up
    /// to `MODULES_KEPT - 1` before it), the last swapped in first.
    modules: Vec<ModuleView>,
}

/// One module's figures: what its calls cost since it was first swapped in.
#[derive(Serialize)]
struct ModuleView {
    blake3: String,
    source: String,
    /// When it was last swapped in (Unix seconds).
    loaded_at: u64,
    /// Whether it serves the slot now.
    serving: bool,
    /// The times it was swapped in.
    loads: u64,
    calls: CallsView,
}

impl From<homeserver_runtime::ModuleStats> for ModuleView {
    fn from(m: homeserver_runtime::ModuleStats) -> Self {
        Self {
            blake3: m.blake3,
            source: m.source,
            loaded_at: m.loaded_at,
            serving: m.serving,
            loads: m.stats.reloads,
            calls: m.stats.into(),
        }
    }
}

/// A slot's call figures for the admin API (its `/metrics` series, summed up).
#[derive(Serialize)]
struct CallsView {
    /// Calls made, failed or not.
    count: u64,
    /// Calls whose caller stopped waiting before they ended (a client gone); in `count`.
    cancelled: u64,
    /// Failed calls (each gave the safe default), by reason: unavailable, busy,
    /// instantiate, timeout, memory, panic, exit, trap.
    failures: homeserver_runtime::FailureCounts,
    /// Fresh instances created (the other calls reused one).
    instantiations: u64,
    mean_ms: Option<f64>,
    /// The bucket bound the median and the 99th percentile call fall under, in ms
    /// (null without calls, or when slower than the last bound).
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    /// Calls per latency bucket: `le_ms` its upper bound (null: slower than the last).
    latency: Vec<LatencyBucket>,
    /// The most linear memory an instance of the slot was given, in bytes.
    memory_high_water_bytes: u64,
    /// The slot's guest CPU time, estimated: the 1 ms epoch ticks at which a call was
    /// running.
    cpu_ms: u64,
    /// Time its calls slept because guest calls had used up `policies.guest_cpu_share`.
    throttled_ms: f64,
}

#[derive(Serialize)]
struct LatencyBucket {
    le_ms: Option<f64>,
    calls: u64,
}

impl From<homeserver_runtime::SlotStats> for CallsView {
    fn from(s: homeserver_runtime::SlotStats) -> Self {
        let ms = |seconds: f64| seconds * 1e3;
        let latency = &s.latency;
        let bounds = homeserver_runtime::LATENCY_BUCKETS
            .iter()
            .map(|&b| Some(ms(b)))
            .chain(std::iter::once(None));
        Self {
            count: s.calls,
            cancelled: s.cancelled,
            failures: s.failures,
            instantiations: s.instantiations,
            mean_ms: (latency.count > 0).then(|| ms(latency.sum_seconds) / latency.count as f64),
            p50_ms: latency.quantile_bound(0.5).map(ms),
            p99_ms: latency.quantile_bound(0.99).map(ms),
            latency: bounds
                .zip(&latency.counts)
                .map(|(le_ms, &calls)| LatencyBucket { le_ms, calls })
                .collect(),
            memory_high_water_bytes: s.memory_high_water_bytes,
            cpu_ms: s.epoch_ticks,
            throttled_ms: ms(s.throttled_seconds),
        }
    }
}

fn slot_views(app: &AppContext) -> Vec<SlotView> {
    let mut stats = app.policy.stats();
    let mut modules = app.policy.module_stats();
    app.policy
        .status()
        .into_iter()
        .map(|status| {
            let calls = stats
                .iter()
                .position(|s| s.slot == status.slot)
                .map(|i| stats.swap_remove(i).into());
            let modules = modules
                .iter()
                .position(|(slot, _)| *slot == status.slot)
                .map(|i| modules.swap_remove(i).1)
                .unwrap_or_default();
            SlotView {
                called_by: crate::service::readiness::caller_of(status.slot),
                calls,
                modules: modules.into_iter().map(ModuleView::from).collect(),
                status,
            }
        })
        .collect()
}

/// `GET /admin/policies`: each slot's module, BLAKE3, load time, last error, and which
/// process calls it.
async fn policies(State(app): State<AdminState>) -> Response {
    Json(serde_json::json!({ "slots": slot_views(&app) })).into_response()
}

/// `GET /admin/pkarr`: what the DHT publisher did last.
async fn pkarr(State(app): State<AdminState>) -> Response {
    Json(app.pkarr.get()).into_response()
}

/// `POST /admin/policies/reload`: reload now; what failed keeps serving the old module.
async fn reload_policies(State(app): State<AdminState>) -> Result<Response, ApiError> {
    let policy = app.policy.clone();
    let report = tokio::task::spawn_blocking(move || policy.reload())
        .await
        .map_err(|e| ApiError::new(ErrorCode::ServerError, format!("reload failed: {e}")))?;
    tracing::info!(ok = report.is_ok(), "policies reloaded (admin API)");
    Ok(Json(serde_json::json!({
        "ok": report.is_ok(),
        "slots": report.slots,
        "status": slot_views(&app),
    }))
    .into_response())
}
