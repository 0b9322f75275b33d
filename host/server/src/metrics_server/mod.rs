//! The metrics server: its own listener, `GET /metrics` in the Prometheus text format,
//! and the probes `GET /health` and `GET /ready` (for orchestrators that probe a
//! private port). Gauges kept elsewhere (storage, users, subscribers) are read at
//! scrape time.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use homeserver_protocol::ErrorCode;

use crate::client_server::health;
use crate::context::AppContext;
use crate::http::error::ApiError;

pub fn router(app: Arc<AppContext>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health::live))
        .route("/ready", get(health::ready))
        .fallback(|| async {
            ApiError::new(
                ErrorCode::NotFound,
                "metrics are at /metrics (probes: /health, /ready)",
            )
        })
        .with_state(app)
}

async fn metrics(State(app): State<Arc<AppContext>>) -> Response {
    match app.admin.stats().await {
        Ok(stats) => {
            app.metrics
                .storage_bytes
                .set(i64::try_from(stats.total_storage).unwrap_or(i64::MAX));
            app.metrics
                .users
                .set(i64::try_from(stats.users).unwrap_or(i64::MAX));
        }
        Err(e) => tracing::warn!(error = %e, "metrics: could not read storage stats"),
    }
    match app.admin.active_sessions().await {
        Ok(n) => app
            .metrics
            .active_sessions
            .set(i64::try_from(n).unwrap_or(i64::MAX)),
        Err(e) => tracing::warn!(error = %e, "metrics: could not count sessions"),
    }
    app.metrics
        .stream_subscribers
        .set(i64::try_from(app.events.subscribers()).unwrap_or(i64::MAX));
    app.metrics
        .unproven_upload_bytes
        .set(i64::try_from(app.storage.unproven_upload_bytes()).unwrap_or(i64::MAX));
    let pkarr = app.pkarr.get();
    app.metrics
        .pkarr_last_success
        .set(pkarr.last_success_at.unwrap_or(0));
    app.metrics
        .pkarr_failing
        .set(i64::from(pkarr.last_error.is_some()));
    app.metrics
        .pkarr_users_published
        .set(i64::try_from(pkarr.users_published).unwrap_or(i64::MAX));
    match app.metrics.render() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "rendering metrics");
            ApiError::new(ErrorCode::ServerError, "internal server error").into_response()
        }
    }
}
