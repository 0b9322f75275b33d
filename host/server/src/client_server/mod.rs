//! The client-facing HTTP API: the router and its routes. Routes speak HTTP and call
//! services; [`error`] maps every service error to a status and JSON body.

pub mod account;
pub mod events;
pub mod health;
pub mod middleware;
pub mod pkarr;
pub mod session;
pub mod signup;
pub mod storage;

use std::sync::Arc;

use axum::Router;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use homeserver_protocol::ErrorCode;

use crate::context::AppContext;
use crate::http::cors::Cors;
use crate::http::error::ApiError;
use crate::http::request_id::{RequestIdLayer, RequestIds};
use middleware::Observed;
use tower::Layer;

pub type AppState = Arc<AppContext>;

/// What the client listeners serve: request ids and CORS around [`Observed`] (the rate
/// limit, request metrics and `Connection: close` on unread bodies) around the routes.
pub type ClientApi = RequestIds<Observed>;

pub fn router(app: AppState) -> ClientApi {
    // Loading the configuration refused a bad list already; one built in code that
    // slipped through allows no origin rather than every one.
    let cors = Cors::from_config(&app.config.http.cors_allowed_origins).unwrap_or_else(|e| {
        tracing::error!(error = %e, "http.cors_allowed_origins: allowing no origin");
        Cors::none()
    });
    let routes = Router::new()
        .route("/signup", post(signup::handle))
        .route("/account", get(account::show))
        .route("/info", get(pkarr::info))
        .route("/pkarr", axum::routing::put(pkarr::put))
        .route(
            "/auth/session",
            post(session::create)
                .get(session::show)
                .delete(session::revoke),
        )
        .route("/events/", get(events::feed))
        .route("/events-stream", get(events::stream))
        .route("/signup_tokens/{token}", get(signup::token_status))
        .route("/signup_tokens/", get(signup::missing_token))
        .route("/openapi.json", get(openapi))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(storage::handle)
        .with_state(app.clone());
    // `Observed` sends these paths here (`PROBE_PATHS`).
    let probes = Router::new()
        .route("/health", get(health::live))
        .route("/ready", get(health::ready))
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(app.clone());
    RequestIdLayer::with_cors(cors).layer(Observed::new(app, routes, probes))
}

/// The client API's OpenAPI 3.1 document (checked against the routes by
/// `tests/api/openapi.rs`).
pub const OPENAPI: &str = include_str!("../../openapi/client.json");

/// `GET /openapi.json`: the document, to generate clients from.
async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
        .into_response()
}

async fn method_not_allowed() -> Response {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "method not allowed on this endpoint",
    )
    .into_response()
}
