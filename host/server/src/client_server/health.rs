//! The probes of load balancers and orchestrators, on the client and metrics listeners:
//! `GET /health` (the process serves) and `GET /ready` (it can do its work: see
//! [`crate::service::readiness`]). Neither needs credentials nor is rate limited, and
//! neither touches a store: `/ready` answers from the background check's last result.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use homeserver_protocol::{ErrorBody, ErrorCode};
use serde_json::json;

use crate::context::AppContext;
use crate::http::error::ApiError;

/// `GET /health`: 200 while the process serves requests.
pub async fn live() -> Response {
    Json(json!({ "status": "ok" })).into_response()
}

/// `GET /ready`: 200 when the stores answer and every guest slot the server calls is
/// served; otherwise 503 `service_unavailable` naming what is not.
pub async fn ready(State(app): State<Arc<AppContext>>) -> Response {
    let readiness = app.readiness.get();
    let problems = readiness.problems();
    if problems.is_empty() {
        return Json(json!({ "status": "ready" })).into_response();
    }
    let state = |ok: bool| if ok { "ok" } else { "down" };
    let slots: serde_json::Map<String, serde_json::Value> = crate::service::readiness::SERVER_SLOTS
        .iter()
        .map(|slot| {
            let serving = !readiness.slots_not_serving.contains(slot);
            let state = if serving { "serving" } else { "not_serving" };
            (slot.name().to_owned(), state.into())
        })
        .collect();
    ApiError(
        ErrorBody::new(
            ErrorCode::ServiceUnavailable,
            format!("not ready: {}", problems.join("; ")),
        )
        .with_details(json!({
            "metadata": state(readiness.backends.metadata.is_ok()),
            "blobs": state(readiness.backends.blobs.is_ok()),
            "policy_slots": slots,
        })),
    )
    .into_response()
}
