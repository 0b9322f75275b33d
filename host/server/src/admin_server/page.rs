//! The admin web page (plain HTML, CSS and JavaScript compiled into the binary: no build
//! step, nothing fetched from elsewhere, so it works offline) and the admin API's
//! OpenAPI document. Neither needs the password: the page signs in by itself.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("page/index.html");
const ADMIN_CSS: &str = include_str!("page/admin.css");
const ADMIN_JS: &str = include_str!("page/admin.js");
/// The admin API's OpenAPI 3.1 document (checked against the routes by
/// `tests/api/openapi.rs`).
pub const OPENAPI: &str = include_str!("../../openapi/admin.json");

/// Everything on the page comes from this server; no inline script or style runs.
const CSP: &str = "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// For working on the page: serve its files from this folder (read at each request)
/// instead of the copies compiled in, so an edit shows on reload without a rebuild.
const PAGE_DIR_ENV: &str = "HOMESERVER_ADMIN_PAGE_DIR";

pub async fn index() -> Response {
    asset("text/html; charset=utf-8", "index.html", INDEX_HTML).await
}

pub async fn stylesheet() -> Response {
    asset("text/css; charset=utf-8", "admin.css", ADMIN_CSS).await
}

pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", "admin.js", ADMIN_JS).await
}

pub async fn openapi() -> Response {
    with_headers("application/json", OPENAPI.into_response())
}

async fn asset(content_type: &'static str, name: &str, built_in: &'static str) -> Response {
    let body = match std::env::var_os(PAGE_DIR_ENV) {
        Some(dir) => match tokio::fs::read_to_string(std::path::Path::new(&dir).join(name)).await {
            Ok(text) => text.into_response(),
            Err(e) => {
                tracing::warn!(file = name, error = %e, "{PAGE_DIR_ENV}: serving the built-in copy");
                built_in.into_response()
            }
        },
        None => built_in.into_response(),
    };
    with_headers(content_type, body)
}

fn with_headers(content_type: &'static str, mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // A new binary serves a new page: never keep an old one.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
