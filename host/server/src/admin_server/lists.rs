//! The admin API's lists: users (by key prefix), signup tokens, recent events. Each is
//! paged by a cursor (the last key or token of the previous page).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use homeserver_protocol::ErrorCode;
use homeserver_protocol::query::AdminListQuery;

use crate::context::AppContext;
use crate::http::error::ApiError;

const DEFAULT_PAGE: u32 = 100;
const DEFAULT_EVENTS: u32 = 50;

/// The query of a list, taking only the parameters in `allowed`.
fn parse(uri: &Uri, allowed: &[&str]) -> Result<AdminListQuery, ApiError> {
    AdminListQuery::parse(uri.query().unwrap_or(""), allowed)
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, e.to_string()))
}

/// `GET /admin/users?prefix=&cursor=&limit=`.
pub async fn users(State(app): State<Arc<AppContext>>, uri: Uri) -> Result<Response, ApiError> {
    let query = parse(&uri, &["prefix", "cursor", "limit"])?;
    let prefix = query.prefix.unwrap_or_default();
    let page = app
        .admin
        .users(
            &prefix,
            query.cursor.as_deref(),
            query.limit.unwrap_or(DEFAULT_PAGE),
        )
        .await?;
    Ok(Json(page).into_response())
}

/// `GET /admin/signup_tokens?cursor=&limit=`.
pub async fn signup_tokens(
    State(app): State<Arc<AppContext>>,
    uri: Uri,
) -> Result<Response, ApiError> {
    let query = parse(&uri, &["cursor", "limit"])?;
    let page = app
        .admin
        .signup_tokens(query.cursor.as_deref(), query.limit.unwrap_or(DEFAULT_PAGE))
        .await?;
    Ok(Json(page).into_response())
}

/// `GET /admin/events?limit=`: the newest events, newest first.
pub async fn events(State(app): State<Arc<AppContext>>, uri: Uri) -> Result<Response, ApiError> {
    let query = parse(&uri, &["limit"])?;
    let events = app
        .admin
        .recent_events(query.limit.unwrap_or(DEFAULT_EVENTS))
        .await?;
    Ok(Json(serde_json::json!({ "events": events })).into_response())
}
