//! `GET /account`: the caller's own account (usage, quota, value size limit), for a
//! signed request or a session. What `pk whoami` shows.

use axum::Json;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::http::error::ApiError;
use crate::http::extract::request_info;

pub async fn show(State(app): State<AppState>, request: Request) -> Response {
    let result = async move {
        let (parts, _body) = request.into_parts();
        let info = request_info(&parts)?;
        let holder = app
            .access
            .account_holder(&info.credentials, &info.signed_target())
            .await?;
        let account = app.storage.account(&holder).await?;
        Ok::<_, ApiError>(Json(account).into_response())
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}
