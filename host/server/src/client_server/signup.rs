//! `POST /signup[?signup_token=T]`: a signed request registers its signer.

use axum::Json;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use homeserver_protocol::{BodyHash, ErrorCode};

use super::AppState;
use crate::http::error::ApiError;
use crate::http::extract::{request_info, url_query_pairs};
use crate::http::small_body::read_small_body;
use crate::service::auth::Credentials;

pub async fn handle(State(app): State<AppState>, request: Request) -> Response {
    match sign_up(app, request).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn sign_up(app: AppState, request: Request) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let info = request_info(&parts)?;
    let Credentials::Signed(header) = &info.credentials else {
        return Err(ApiError::new(
            ErrorCode::InvalidSignature,
            "signup needs a signed request (Authorization: Pk ...)",
        ));
    };
    let body = read_small_body(body, app.storage.limits().body_idle_timeout, "signup").await?;
    let token = parts.uri.query().and_then(|q| {
        url_query_pairs(q)
            .find(|(k, _)| k == "signup_token")
            .map(|(_, v)| v)
    });
    let signup = app
        .signup
        .sign_up(
            header,
            &info.signed_target(),
            &BodyHash::of(&body),
            token.as_deref(),
        )
        .await?;
    let status = if signup.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(signup.result)).into_response())
}

/// `GET /signup_tokens/{token}`: whether a token is valid or used.
pub async fn token_status(
    State(app): State<AppState>,
    crate::http::extract::PathParam(token): crate::http::extract::PathParam,
) -> Response {
    match app.signup.token_status(&token).await {
        Ok(status) => Json(status).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// `GET /signup_tokens/` without a token.
pub async fn missing_token() -> Response {
    ApiError::new(
        ErrorCode::BadRequest,
        "missing signup token: GET /signup_tokens/XXXX-XXXX-XXXX",
    )
    .into_response()
}
