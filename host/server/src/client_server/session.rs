//! `POST /auth/session` (signed: mint a session), `GET /auth/session` (Bearer: show it),
//! `DELETE /auth/session` (Bearer: revoke it, 204).

use axum::Json;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use homeserver_protocol::ErrorCode;

use super::AppState;
use crate::http::error::ApiError;
use crate::http::extract::request_info;
use crate::http::small_body::read_small_body;
use crate::service::auth::Credentials;
use crate::service::sessions::SessionInfo;

pub async fn create(State(app): State<AppState>, request: Request) -> Response {
    into_response(create_session(app, request).await)
}

async fn create_session(app: AppState, request: Request) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let info = request_info(&parts)?;
    let Credentials::Signed(header) = &info.credentials else {
        return Err(ApiError::new(
            ErrorCode::InvalidSignature,
            "a session is minted by a signed request (Authorization: Pk ...), not by a session",
        ));
    };
    let body = read_small_body(
        body,
        app.storage.limits().body_idle_timeout,
        "session request",
    )
    .await?;
    let created = app
        .access
        .sessions()
        .create(header, &info.signed_target(), &body)
        .await?;
    Ok(Json(created).into_response())
}

fn bearer(request: &Request) -> Result<String, ApiError> {
    match crate::http::extract::credentials_of(request.extensions(), request.headers())? {
        Credentials::Session(token) => Ok(token),
        _ => Err(ApiError::new(
            ErrorCode::InvalidSignature,
            "this endpoint needs Authorization: Bearer <session token>",
        )),
    }
}

pub async fn show(State(app): State<AppState>, request: Request) -> Response {
    let token = bearer(&request);
    let result = async move {
        let session = app.access.sessions().resolve(&token?).await?;
        Ok(Json(SessionInfo::from(&session)).into_response())
    }
    .await;
    into_response(result)
}

pub async fn revoke(State(app): State<AppState>, request: Request) -> Response {
    let token = bearer(&request);
    let result = async move {
        app.access.sessions().revoke(&token?).await?;
        Ok(StatusCode::NO_CONTENT.into_response())
    }
    .await;
    into_response(result)
}

fn into_response(result: Result<Response, ApiError>) -> Response {
    result.unwrap_or_else(IntoResponse::into_response)
}
