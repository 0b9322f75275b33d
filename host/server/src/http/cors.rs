//! CORS for the client API (the plain and the raw-public-key TLS listeners; never the
//! admin listener): which origins may call it (`http.cors_allowed_origins`), the answer
//! to a preflight, and the headers that let a page read a cross-origin answer.
//!
//! No credentials mode: requests authenticate with signatures and bearer tokens that a
//! page sends explicitly, never with cookies, so a page can do nothing cross-origin that
//! a script outside any browser could not, and `*` is a safe default. A preflight
//! (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is answered here, before
//! the rate limit, the credentials and the routes: a browser sends it without the
//! request's `Authorization`, so it must neither fail auth nor use up a bucket. An
//! origin that is not allowed gets no CORS headers at all, and its preflight a 403 that
//! says why.
//!
//! The request-id layer ([`crate::http::request_id`]), the outermost layer of the client
//! router, applies it: one place that sees every answer, the rate limiter's 429 and every
//! error included, and no layer of its own (each `Router::layer` costs every request a
//! route clone and a boxed future; docs/BENCHMARKS.md "CORS").

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use homeserver_protocol::ErrorCode;

use crate::http::error::ApiError;

/// Request headers the API reads, allowed on cross-origin requests.
const ALLOW_HEADERS: HeaderValue = HeaderValue::from_static(
    "Authorization, Content-Type, Content-Digest, Pubky-Host, If-None-Match, Last-Event-ID, X-Request-Id",
);
/// Response headers a client reads, beyond the CORS-safelisted ones.
const EXPOSE_HEADERS: HeaderValue = HeaderValue::from_static(
    "ETag, Last-Modified, X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset, Retry-After, X-Request-Id",
);
const ALLOW_METHODS: HeaderValue =
    HeaderValue::from_static("GET, HEAD, PUT, DELETE, POST, OPTIONS");
/// Seconds a browser may reuse a preflight's answer: two hours, Chromium's own cap
/// (Firefox's is a day), so a page pays one preflight per endpoint and method per two
/// hours rather than one per request.
const MAX_AGE: HeaderValue = HeaderValue::from_static("7200");
const ANY_ORIGIN: HeaderValue = HeaderValue::from_static("*");
const VARY_ORIGIN: HeaderValue = HeaderValue::from_static("Origin");

/// A setting of `http.cors_allowed_origins` that is not an origin.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CorsConfigError {
    #[error("`*` allows every origin: list it alone, or list origins without it")]
    StarWithOthers,
    #[error(
        "`{0}` is not an origin: write scheme://host[:port] with http or https, no path, query or user"
    )]
    NotAnOrigin(String),
}

/// The CORS rules of the client API; see the module's documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    origins: Origins,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Origins {
    Any,
    /// Serialized origins as browsers send them (lower-case, no default port); empty
    /// allows none.
    Listed(Vec<HeaderValue>),
}

/// What a request gets from [`Cors::admit`].
#[derive(Debug)]
pub enum Admission {
    /// A preflight: this is its whole answer; the request goes no further.
    Preflight(Response),
    /// Any other request: the `Access-Control-Allow-Origin` its answer carries, if any
    /// (none without `Origin`, or for an origin that is not allowed).
    Pass(Option<HeaderValue>),
}

impl Cors {
    /// The rules of `http.cors_allowed_origins`: `["*"]` (every origin), a list of
    /// origins, or `[]` (none).
    pub fn from_config(origins: &[String]) -> Result<Self, CorsConfigError> {
        if origins.iter().any(|o| o == "*") {
            return match origins.len() {
                1 => Ok(Self {
                    origins: Origins::Any,
                }),
                _ => Err(CorsConfigError::StarWithOthers),
            };
        }
        origins
            .iter()
            .map(|o| serialized_origin(o).ok_or_else(|| CorsConfigError::NotAnOrigin(o.clone())))
            .collect::<Result<_, _>>()
            .map(|listed| Self {
                origins: Origins::Listed(listed),
            })
    }

    /// Rules that allow no origin.
    pub fn none() -> Self {
        Self {
            origins: Origins::Listed(Vec::new()),
        }
    }

    /// Sorts a request: a preflight gets its answer here, any other request the
    /// `Access-Control-Allow-Origin` its answer will carry.
    pub fn admit(&self, method: &Method, headers: &HeaderMap) -> Admission {
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Admission::Pass(None);
        };
        let allowed = self.allow_origin(origin);
        if method == Method::OPTIONS && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        {
            return Admission::Preflight(match allowed {
                Some(allow) => preflight_answer(allow),
                None => refusal(origin),
            });
        }
        Admission::Pass(allowed)
    }

    fn allow_origin(&self, origin: &HeaderValue) -> Option<HeaderValue> {
        match &self.origins {
            Origins::Any => Some(ANY_ORIGIN),
            Origins::Listed(listed) => listed.iter().find(|o| *o == origin).cloned(),
        }
    }
}

/// Adds the CORS headers to an answer: `Vary: Origin` always (the answer depends on
/// whether and which `Origin` was sent, so a cache must not hand one to another), and
/// for an allowed origin the origin and the headers a page may read.
pub fn decorate(headers: &mut HeaderMap, allow_origin: Option<HeaderValue>) {
    headers.append(header::VARY, VARY_ORIGIN);
    if let Some(allow) = allow_origin {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, EXPOSE_HEADERS);
    }
}

/// 204 with what every request of the API may use: the answer does not depend on the
/// method or headers asked for, so a browser checks them against these lists itself.
fn preflight_answer(allow_origin: HeaderValue) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow_origin);
    headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, ALLOW_METHODS);
    headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, ALLOW_HEADERS);
    headers.insert(header::ACCESS_CONTROL_MAX_AGE, MAX_AGE);
    headers.insert(header::VARY, VARY_ORIGIN);
    response
}

/// 403 for a preflight from an origin that is not allowed: no CORS headers, so the
/// browser refuses the request; the body says why to whoever looks.
fn refusal(origin: &HeaderValue) -> Response {
    let shown = String::from_utf8_lossy(origin.as_bytes());
    let mut response = ApiError::new(
        ErrorCode::InsufficientPermissions,
        format!(
            "origin {shown} may not call this API from a browser (not in http.cors_allowed_origins)"
        ),
    )
    .into_response();
    response.headers_mut().insert(header::VARY, VARY_ORIGIN);
    response
}

/// `text` as a browser serializes an origin (`https://app.example`, `http://127.0.0.1:8080`),
/// or `None` when it is not an http(s) origin.
fn serialized_origin(text: &str) -> Option<HeaderValue> {
    let url = url::Url::parse(text).ok()?;
    // The parser makes a path of `/` out of none, so `https://app.example/` is accepted
    // too; any other path is refused.
    let plain = matches!(url.scheme(), "http" | "https")
        // Browsers never send a wildcard; `https://*.example` would match nothing.
        && !text.contains('*')
        && url.host().is_some()
        && url.username().is_empty()
        && url.password().is_none()
        && url.path() == "/"
        && url.query().is_none()
        && url.fragment().is_none();
    if !plain {
        return None;
    }
    HeaderValue::from_str(&url.origin().ascii_serialization()).ok()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;

    fn rules(origins: &[&str]) -> Result<Cors, CorsConfigError> {
        Cors::from_config(&origins.iter().map(|o| o.to_string()).collect::<Vec<_>>())
    }

    fn origins(cors: &Cors) -> Vec<&str> {
        match &cors.origins {
            Origins::Any => vec!["*"],
            Origins::Listed(listed) => listed.iter().map(|o| o.to_str().unwrap()).collect(),
        }
    }

    #[test]
    fn settings_read_as_browsers_write_origins() {
        assert_eq!(origins(&rules(&["*"]).unwrap()), ["*"]);
        assert!(origins(&rules(&[]).unwrap()).is_empty());
        let listed = rules(&[
            "https://app.example",
            "HTTPS://App.Example:443/",
            "http://127.0.0.1:8080",
            "http://localhost:80",
            "https://bücher.example",
        ])
        .unwrap();
        assert_eq!(
            origins(&listed),
            [
                "https://app.example",
                "https://app.example",
                "http://127.0.0.1:8080",
                "http://localhost",
                "https://xn--bcher-kva.example"
            ]
        );
    }

    #[test]
    fn settings_that_are_not_origins_are_refused() {
        assert_eq!(
            rules(&["*", "https://app.example"]),
            Err(CorsConfigError::StarWithOthers)
        );
        for bad in [
            "app.example",
            "https://app.example/path",
            "https://app.example/?q=1",
            "https://user@app.example",
            "ftp://app.example",
            "null",
            "",
            "https://*.example",
        ] {
            assert_eq!(
                rules(&[bad]),
                Err(CorsConfigError::NotAnOrigin(bad.to_owned())),
                "{bad:?}"
            );
        }
    }

    fn request(method: Method, origin: Option<&str>, preflight: bool) -> Request<Body> {
        let mut builder = Request::builder().method(method).uri("/x");
        if let Some(origin) = origin {
            builder = builder.header(header::ORIGIN, origin);
        }
        if preflight {
            builder = builder.header(header::ACCESS_CONTROL_REQUEST_METHOD, "PUT");
        }
        builder.body(Body::empty()).unwrap()
    }

    /// The layer as the client API uses it: a preflight never reaches the handler;
    /// every other request does, and its answer carries what its origin allows.
    #[tokio::test]
    async fn the_request_id_layer_applies_the_rules() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let router = Router::new()
            .route(
                "/x",
                axum::routing::any(move || {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async { StatusCode::IM_A_TEAPOT }
                }),
            )
            .layer(crate::http::request_id::RequestIdLayer::with_cors(
                rules(&["https://app.example"]).unwrap(),
            ));
        let call = |request| router.clone().oneshot(request);

        let answer = call(request(Method::OPTIONS, Some("https://app.example"), true))
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::NO_CONTENT);
        assert_eq!(
            answer.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://app.example"
        );
        assert!(
            answer
                .headers()
                .contains_key(crate::http::request_id::REQUEST_ID_HEADER)
        );
        let refused = call(request(Method::OPTIONS, Some("https://evil.example"), true))
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        assert!(
            !refused
                .headers()
                .contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN)
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "preflights stop in the layer"
        );

        let allowed = call(request(Method::PUT, Some("https://app.example"), false))
            .await
            .unwrap();
        assert_eq!(allowed.status(), StatusCode::IM_A_TEAPOT);
        assert_eq!(
            allowed.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://app.example"
        );
        assert_eq!(
            allowed.headers()[header::ACCESS_CONTROL_EXPOSE_HEADERS],
            EXPOSE_HEADERS
        );
        assert_eq!(allowed.headers()[header::VARY], "Origin");
        // OPTIONS without Access-Control-Request-Method is no preflight.
        let options = call(request(Method::OPTIONS, Some("https://app.example"), false))
            .await
            .unwrap();
        assert_eq!(options.status(), StatusCode::IM_A_TEAPOT);
        for origin in [Some("https://evil.example"), None] {
            let plain = call(request(Method::GET, origin, false)).await.unwrap();
            assert_eq!(plain.status(), StatusCode::IM_A_TEAPOT);
            assert!(
                !plain
                    .headers()
                    .contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN)
            );
            assert_eq!(plain.headers()[header::VARY], "Origin");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    /// Without rules (the admin API) the layer adds nothing and answers no preflight.
    #[tokio::test]
    async fn without_rules_nothing_is_added() {
        let router = crate::http::request_id::with_request_ids(
            Router::new().route("/x", axum::routing::any(|| async { StatusCode::OK })),
        );
        let answer = router
            .oneshot(request(Method::OPTIONS, Some("https://app.example"), true))
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        assert!(
            !answer
                .headers()
                .contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN)
        );
        assert!(!answer.headers().contains_key(header::VARY));
    }
}
