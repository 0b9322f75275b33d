//! The admin API's lists: users (by key prefix), signup tokens, recent events. Each is
//! paged by a cursor (the last key or token of the previous page).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use homeserver_protocol::ErrorCode;
use homeserver_protocol::keys::is_z32_prefix;

use crate::context::AppContext;
use crate::http::error::ApiError;
use crate::http::extract::url_query_pairs;
use crate::service::admin::MAX_ADMIN_PAGE;

const DEFAULT_PAGE: u32 = 100;
const DEFAULT_EVENTS: u32 = 50;

/// The query of a list: `limit`, `cursor` and, for users, `prefix`.
#[derive(Debug, Default, PartialEq, Eq)]
struct ListQuery {
    limit: Option<u32>,
    cursor: Option<String>,
    prefix: Option<String>,
}

fn parse(uri: &Uri, allowed: &[&str]) -> Result<ListQuery, ApiError> {
    let mut query = ListQuery::default();
    for (key, value) in uri.query().map(url_query_pairs).into_iter().flatten() {
        if !allowed.contains(&key.as_str()) {
            return Err(bad(format!(
                "unknown query parameter `{key}` (allowed: {})",
                allowed.join(", ")
            )));
        }
        match key.as_str() {
            "limit" => {
                let limit = value
                    .parse::<u32>()
                    .ok()
                    .filter(|l| (1..=MAX_ADMIN_PAGE).contains(l))
                    .ok_or_else(|| {
                        bad(format!(
                            "limit must be an integer from 1 to {MAX_ADMIN_PAGE}, got `{value}`"
                        ))
                    })?;
                query.limit = Some(limit);
            }
            "cursor" => query.cursor = Some(value).filter(|v| !v.is_empty()),
            _ => query.prefix = Some(value),
        }
    }
    Ok(query)
}

fn bad(message: String) -> ApiError {
    ApiError::new(ErrorCode::BadRequest, message)
}

/// `GET /admin/users?prefix=&cursor=&limit=`.
pub async fn users(State(app): State<Arc<AppContext>>, uri: Uri) -> Result<Response, ApiError> {
    let query = parse(&uri, &["prefix", "cursor", "limit"])?;
    let prefix = query.prefix.unwrap_or_default();
    if !is_z32_prefix(&prefix) {
        return Err(bad(format!(
            "prefix must be the start of a z-base-32 public key (at most 52 of \
             `ybndrfg8ejkmcpqxot1uwisza345h769`), got `{prefix}`"
        )));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(text: &str) -> Uri {
        text.parse().unwrap()
    }

    #[test]
    fn limits_and_unknown_parameters_are_refused() {
        let all = ["prefix", "cursor", "limit"];
        assert!(parse(&uri("/admin/users?limit=0"), &all).is_err());
        assert!(parse(&uri("/admin/users?limit=1001"), &all).is_err());
        assert!(parse(&uri("/admin/users?limit=x"), &all).is_err());
        assert!(parse(&uri("/admin/events?cursor=a"), &["limit"]).is_err());
        assert_eq!(
            parse(&uri("/admin/users?limit=5&cursor=&prefix=yb"), &all).unwrap(),
            ListQuery {
                limit: Some(5),
                cursor: None,
                prefix: Some("yb".into())
            }
        );
    }
}
