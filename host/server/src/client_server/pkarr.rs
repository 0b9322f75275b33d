//! `PUT /pkarr` (signed): the caller's own pkarr record, for the server to republish;
//! `GET /info`: the server's public key (what its pkarr record is signed with and its
//! raw-public-key TLS listener presents).

use axum::Json;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use homeserver_protocol::ErrorCode;
use serde_json::json;

use super::AppState;
use crate::http::error::ApiError;
use crate::http::extract::request_info;
use crate::http::small_body::read_small_body;
use crate::service::auth::Credentials;

pub async fn put(State(app): State<AppState>, request: Request) -> Response {
    match store(app, request).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn store(app: AppState, request: Request) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let info = request_info(&parts)?;
    let Credentials::Signed(header) = &info.credentials else {
        return Err(ApiError::new(
            ErrorCode::InvalidSignature,
            "a record is stored by a request signed with its own key (Authorization: Pk ...)",
        ));
    };
    let body =
        read_small_body(body, app.storage.limits().body_idle_timeout, "pkarr record").await?;
    let stored = app
        .identity
        .store_packet(header, &info.signed_target(), &body)
        .await?;
    Ok(Json(json!({ "stored": stored })).into_response())
}

pub async fn info(State(app): State<AppState>) -> Response {
    Json(json!({
        "public_key": app.server_key.public_key().to_z32(),
        "version": env!("CARGO_PKG_VERSION"),
        // The build's git commit (build.rs), "unknown" outside a checkout.
        "commit": env!("HOMESERVER_COMMIT"),
    }))
    .into_response()
}
