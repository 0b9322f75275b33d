//! CORS on the client API (both listeners), never on the admin API: preflights answered
//! before the rate limit and credentials, the headers on answers of every status (the
//! rate limiter's 429 included), a configured list of origins, and refusals.
//! (The same in a real browser: scripts/qa/test_cors_app.py.)

use homeserver_protocol::{ErrorCode, Keypair};
use reqwest::header::HeaderMap;
use reqwest::{Method, Response, StatusCode};

use crate::fixture::*;

const APP: &str = "https://app.example";

/// What a browser sends before a signed PUT with `Content-Digest` from `origin`.
async fn preflight(host: &TestHost, path: &str, origin: &str) -> Response {
    host.request(Method::OPTIONS, path)
        .header("Origin", origin)
        .header("Access-Control-Request-Method", "PUT")
        .header(
            "Access-Control-Request-Headers",
            "authorization,content-digest,pubky-host",
        )
        .send()
        .await
        .unwrap()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or_else(|| panic!("no {name} in {headers:?}"))
}

/// Items of a comma-separated header, lower-cased.
fn items(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .flat_map(|v| v.to_str().unwrap().split(','))
        .map(|item| item.trim().to_ascii_lowercase())
        .collect()
}

/// A cross-origin answer a page from `allowed` may read, with the headers it reads.
fn assert_readable(headers: &HeaderMap, allowed: &str) {
    assert_eq!(header(headers, "access-control-allow-origin"), allowed);
    let exposed = items(headers, "access-control-expose-headers");
    for name in [
        "etag",
        "last-modified",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "retry-after",
        "x-request-id",
    ] {
        assert!(exposed.contains(&name.to_owned()), "{name} in {exposed:?}");
    }
    assert!(items(headers, "vary").contains(&"origin".to_owned()));
    assert!(!headers.contains_key("access-control-allow-credentials"));
}

fn assert_no_cors(headers: &HeaderMap) {
    for name in [
        "access-control-allow-origin",
        "access-control-expose-headers",
        "access-control-allow-methods",
        "access-control-allow-headers",
    ] {
        assert!(!headers.contains_key(name), "{name} in {headers:?}");
    }
}

fn assert_preflight_allowed(r: &Response, allowed: &str) {
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let headers = r.headers();
    assert_eq!(header(headers, "access-control-allow-origin"), allowed);
    let methods = items(headers, "access-control-allow-methods");
    for method in ["get", "head", "put", "delete", "post", "options"] {
        assert!(
            methods.contains(&method.to_owned()),
            "{method} in {methods:?}"
        );
    }
    let allowed_headers = items(headers, "access-control-allow-headers");
    for name in [
        "authorization",
        "content-type",
        "content-digest",
        "pubky-host",
        "if-none-match",
        "last-event-id",
        "x-request-id",
    ] {
        assert!(
            allowed_headers.contains(&name.to_owned()),
            "{name} in {allowed_headers:?}"
        );
    }
    assert_eq!(header(headers, "access-control-max-age"), "7200");
    assert!(headers.contains_key("x-request-id"));
}

#[tokio::test]
async fn preflights_are_answered_before_the_rate_limit_and_credentials() {
    // One instance: rate limits are each instance's own, and the count below is one
    // bucket's.
    let host = TestHost::start_single_with(|c| {
        c.rate_limit.enabled = true;
        c.rate_limit.anonymous_per_minute = 2;
    })
    .await;
    // Any path, routed or not: a preflight never reaches a route, a limit or a key.
    for path in [
        "/pub/a/b",
        "/signup",
        "/events-stream",
        "/auth/session",
        "/nope",
    ] {
        for _ in 0..3 {
            let r = preflight(&host, path, APP).await;
            assert_preflight_allowed(&r, "*");
            assert!(r.bytes().await.unwrap().is_empty());
        }
    }
    // None of the 15 preflights used the address's bucket (2 a minute): both of these
    // pass, the next is refused, and the refusal is readable cross-origin too.
    for _ in 0..2 {
        let r = host
            .request(Method::GET, "/events/")
            .header("Origin", APP)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_readable(r.headers(), "*");
    }
    let r = host
        .request(Method::GET, "/events/")
        .header("Origin", APP)
        .send()
        .await
        .unwrap();
    assert_readable(r.headers(), "*");
    assert!(r.headers().contains_key("retry-after"));
    assert!(r.headers().contains_key("x-ratelimit-limit"));
    expect_error(r, 429, ErrorCode::RateLimitExceeded).await;
}

#[tokio::test]
async fn answers_of_every_status_are_readable_cross_origin() {
    let host = TestHost::start_with(|c| {
        c.rate_limit.enabled = true;
        c.rate_limit.anonymous_per_minute = 1000;
        c.rate_limit.authenticated_per_minute = 1000;
    })
    .await;
    let alice = host.user().await;
    host.put(&alice, "/pub/a", b"abc").await;
    let public_get = |path: &str| {
        host.request(Method::GET, path)
            .header("Origin", APP)
            .header("Pubky-Host", alice.public_key().to_z32())
    };

    let r = public_get("/pub/a").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_readable(r.headers(), "*");
    assert!(r.headers().contains_key("x-ratelimit-limit"));
    let etag = header(r.headers(), "etag").to_owned();

    let r = public_get("/pub/a")
        .header("If-None-Match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    assert_readable(r.headers(), "*");

    // A signed write from a page (the signature is checked as for any client).
    let r = host
        .signed(&alice, Method::PUT, "/pub/from-a-page", b"v")
        .header("Origin", APP)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_readable(r.headers(), "*");

    let forged = host
        .request(Method::PUT, "/pub/a")
        .header("Origin", APP)
        .header(
            "Authorization",
            format!("Pk {}:AAAA:{}", alice.public_key(), now()),
        )
        .body("x")
        .send()
        .await
        .unwrap();
    assert_readable(forged.headers(), "*");
    expect_error(forged, 401, ErrorCode::InvalidSignature).await;

    let missing = public_get("/pub/none").send().await.unwrap();
    assert_readable(missing.headers(), "*");
    expect_error(missing, 404, ErrorCode::NotFound).await;

    let invalid = public_get("/pub/a%20b").send().await.unwrap();
    assert_readable(invalid.headers(), "*");
    expect_error(invalid, 400, ErrorCode::InvalidPath).await;

    // OPTIONS that is not a preflight (no Access-Control-Request-Method) is a request
    // like any other: 405, readable.
    let options = host
        .request(Method::OPTIONS, "/pub/a")
        .header("Origin", APP)
        .send()
        .await
        .unwrap();
    assert_readable(options.headers(), "*");
    expect_error(options, 405, ErrorCode::MethodNotAllowed).await;

    // The event stream and the probes too.
    let stream = host
        .request(
            Method::GET,
            &format!("/events-stream?user={}", alice.public_key()),
        )
        .header("Origin", APP)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    assert_readable(stream.headers(), "*");
    let health = host
        .request(Method::GET, "/health")
        .header("Origin", APP)
        .send()
        .await
        .unwrap();
    assert_readable(health.headers(), "*");

    // Without Origin (not a browser's cross-origin request): no CORS headers, but the
    // answer says it depends on Origin, so no cache hands it to a page.
    let r = host
        .request(Method::GET, "/pub/a")
        .header("Pubky-Host", alice.public_key().to_z32())
        .send()
        .await
        .unwrap();
    assert_no_cors(r.headers());
    assert!(items(r.headers(), "vary").contains(&"origin".to_owned()));
}

#[tokio::test]
async fn only_the_configured_origins_are_allowed() {
    let host = TestHost::start_with(|c| {
        // Written as operators might; compared as browsers send origins.
        c.http.cors_allowed_origins = vec![
            "HTTPS://App.Example:443/".into(),
            "http://127.0.0.1:8080".into(),
        ];
    })
    .await;
    for origin in [APP, "http://127.0.0.1:8080"] {
        assert_preflight_allowed(&preflight(&host, "/pub/a", origin).await, origin);
        let r = host
            .request(Method::GET, "/events/")
            .header("Origin", origin)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_readable(r.headers(), origin);
    }
    for origin in [
        "https://evil.example",
        "http://app.example",
        "https://app.example:8443",
        "https://sub.app.example",
        "null",
    ] {
        // The request itself is served (CORS is the browser's to enforce) but carries
        // nothing that lets a page read it.
        let r = host
            .request(Method::GET, "/events/")
            .header("Origin", origin)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_no_cors(r.headers());
        assert!(items(r.headers(), "vary").contains(&"origin".to_owned()));
        // Its preflight is refused, saying why.
        let refused = preflight(&host, "/pub/a", origin).await;
        assert_no_cors(refused.headers());
        let body = expect_error(refused, 403, ErrorCode::InsufficientPermissions).await;
        assert!(
            body.message.contains(origin) && body.message.contains("http.cors_allowed_origins"),
            "{}",
            body.message
        );
    }
}

#[tokio::test]
async fn an_empty_list_allows_no_origin() {
    let host = TestHost::start_with(|c| c.http.cors_allowed_origins = Vec::new()).await;
    let refused = preflight(&host, "/pub/a", APP).await;
    assert_no_cors(refused.headers());
    expect_error(refused, 403, ErrorCode::InsufficientPermissions).await;
    let r = host
        .request(Method::GET, "/events/")
        .header("Origin", APP)
        .send()
        .await
        .unwrap();
    assert_no_cors(r.headers());
}

#[tokio::test]
async fn the_admin_listener_never_answers_cors() {
    let host = TestHost::start().await;
    for path in ["/admin/stats", "/", "/admin/openapi.json"] {
        let r = host
            .admin_request(Method::OPTIONS, path)
            .header("Origin", APP)
            .header("Access-Control-Request-Method", "GET")
            .header("Access-Control-Request-Headers", "authorization")
            .send()
            .await
            .unwrap();
        assert_ne!(r.status(), StatusCode::NO_CONTENT, "{path}");
        assert_no_cors(r.headers());
    }
    let r = host
        .admin(Method::GET, "/admin/stats")
        .header("Origin", APP)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_no_cors(r.headers());
    assert!(!items(r.headers(), "vary").contains(&"origin".to_owned()));
}

#[tokio::test]
async fn the_raw_public_key_listener_answers_cors_too() {
    let host = TestHost::start_with(|c| c.tls.listen = Some("127.0.0.1:0".parse().unwrap())).await;
    let url = format!("https://{}", host.server().tls_addr().unwrap());
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(pk_client::tls::pinned_key_config(
            host.server().server_key(),
        ))
        .build()
        .unwrap();
    let r = client
        .request(Method::OPTIONS, format!("{url}/pub/a"))
        .header("Origin", APP)
        .header("Access-Control-Request-Method", "PUT")
        .send()
        .await
        .unwrap();
    assert_preflight_allowed(&r, "*");
    let owner = Keypair::random();
    let r = client
        .get(format!("{url}/pub/a"))
        .header("Origin", APP)
        .header("Pubky-Host", owner.public_key().to_z32())
        .send()
        .await
        .unwrap();
    assert_readable(r.headers(), "*");
}
