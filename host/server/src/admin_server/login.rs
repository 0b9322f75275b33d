//! Signing in to the admin web page over HTTP: the session cookie (`HttpOnly`, so the
//! page never keeps the password: not in the URL, not in local storage), the header
//! that keeps other sites from using it, and the answers of the brake. The sessions and
//! the brake themselves are the service's (`service/admin_sign_in.rs`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cookie::{Cookie, SameSite};
use homeserver_protocol::ErrorCode;
use serde::Deserialize;

use crate::context::AppContext;
use crate::http::error::ApiError;
use crate::http::small_body::read_small_body;
use crate::service::admin_sign_in::{AdminSignIn, Refusal, SESSION_TTL};

/// Name of the session cookie.
pub const COOKIE: &str = "hs_admin";
/// The cookie goes only with admin API requests (browsers keep cookies per host, not
/// per port: other servers of this host see it only under this path).
const COOKIE_PATH: &str = "/admin/";
/// Header a cookie-authenticated request must carry. A page of another origin cannot
/// add it without a CORS preflight the admin server never grants, so a cookie alone
/// (sent by the browser with any cross-site form) never acts.
pub const CSRF_HEADER: &str = "x-homeserver-admin";

/// The address a request came from (the admin listener is not behind a proxy).
pub fn peer_ip(request: &axum::extract::Request) -> IpAddr {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip())
}

/// The session token the request's cookie carries.
pub fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == COOKIE)
        .map(|c| c.value().to_owned())
}

/// Whether the request's cookie names a live session.
pub fn is_signed_in(logins: &AdminSignIn, headers: &HeaderMap) -> bool {
    session_cookie(headers).is_some_and(|token| logins.is_signed_in(&token))
}

/// The answer to a password that was not accepted: 429 with `Retry-After` while the
/// address is braked, else 401 with `wrong`.
pub fn refused(refusal: Refusal, wrong: &str) -> Response {
    match refusal {
        Refusal::Braked { ip, wait } => {
            let wait = wait.as_secs() + 1;
            let mut response = ApiError::new(
                ErrorCode::RateLimitExceeded,
                format!("too many wrong admin passwords from {ip}: try again in {wait} s"),
            )
            .into_response();
            if let Ok(value) = HeaderValue::from_str(&wait.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            response
        }
        Refusal::WrongPassword => {
            ApiError::new(ErrorCode::InvalidSignature, wrong.to_owned()).into_response()
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignIn {
    password: String,
}

/// `POST /admin/session` `{"password"}` with `X-Homeserver-Admin: 1` (so no form of
/// another site can sign a browser in): 204 and the session cookie.
pub async fn sign_in(
    State((app, logins)): State<(Arc<AppContext>, Arc<AdminSignIn>)>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, Response> {
    if headers.get(CSRF_HEADER).is_none_or(|v| v != "1") {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!("signing in needs the header `{CSRF_HEADER}: 1`"),
        )
        .into_response());
    }
    let body = read_small_body(body, app.storage.limits().body_idle_timeout, "sign-in")
        .await
        .map_err(IntoResponse::into_response)?;
    let request: SignIn = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            ErrorCode::BadRequest,
            format!("body must be {{\"password\": \"<admin.password>\"}}: {e}"),
        )
        .into_response()
    })?;
    if let Err(refusal) =
        logins.check_password(peer.ip(), &app.config.admin.password, &request.password)
    {
        if refusal == Refusal::WrongPassword {
            tracing::warn!(peer = %peer.ip(), "admin sign-in with a wrong password");
        }
        return Err(refused(refusal, "wrong admin password"));
    }
    let token = logins
        .start()
        .map_err(|e| ApiError::from(e).into_response())?;
    let cookie = Cookie::build((COOKIE, token))
        .http_only(true)
        .same_site(SameSite::Strict)
        .path(COOKIE_PATH)
        .max_age(cookie::time::Duration::seconds(
            i64::try_from(SESSION_TTL.as_secs()).unwrap_or(i64::MAX),
        ))
        .build();
    Ok(with_cookie(cookie))
}

/// `DELETE /admin/session`: 204; the session ends and the browser drops the cookie.
pub async fn sign_out(
    State((_, logins)): State<(Arc<AppContext>, Arc<AdminSignIn>)>,
    headers: HeaderMap,
) -> Response {
    if let Some(token) = session_cookie(&headers) {
        logins.end(&token);
    }
    let mut cookie = Cookie::build((COOKIE, ""))
        .http_only(true)
        .same_site(SameSite::Strict)
        .path(COOKIE_PATH)
        .build();
    cookie.make_removal();
    with_cookie(cookie)
}

fn with_cookie(cookie: Cookie<'static>) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie.to_string()) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie_header(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn a_session_is_found_by_its_cookie() {
        let logins = AdminSignIn::default();
        let token = logins.start().unwrap();
        let headers = with_cookie_header(&format!("other=1; {COOKIE}={token}"));
        assert!(is_signed_in(&logins, &headers));
        assert!(!is_signed_in(
            &logins,
            &with_cookie_header(&format!("{COOKIE}=x{token}"))
        ));
        assert!(!is_signed_in(&logins, &HeaderMap::new()));
    }

    #[test]
    fn a_braked_address_gets_429_with_retry_after() {
        let refusal = Refusal::Braked {
            ip: "192.0.2.1".parse().unwrap(),
            wait: std::time::Duration::from_millis(5500),
        };
        let response = refused(refusal, "wrong");
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()[header::RETRY_AFTER], "6");
        assert_eq!(refused(Refusal::WrongPassword, "wrong").status(), 401);
    }
}
