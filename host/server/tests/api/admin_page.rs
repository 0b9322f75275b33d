//! The admin API behind the admin web page: its lists (users by key prefix, signup
//! tokens, recent events) and signing in with a cookie instead of the password. The page
//! itself is driven in a real browser by `scripts/browser-test`.

use homeserver::config::SignupMode;
use homeserver_protocol::{ErrorCode, Keypair};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::fixture::*;

#[tokio::test]
async fn users_are_listed_by_key_prefix_in_pages() {
    let host = TestHost::start().await;
    let mut keys = Vec::new();
    for _ in 0..3 {
        keys.push(host.user().await.public_key().to_z32());
    }
    keys.sort();

    let first = host.admin_json(Method::GET, "/admin/users?limit=2").await;
    let listed = |page: &Value| -> Vec<String> {
        page["users"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["public_key"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(listed(&first), keys[..2]);
    assert_eq!(first["has_more"], true);
    assert_eq!(first["cursor"], keys[1].as_str());
    assert_eq!(first["users"][0]["storage_used"], 0);
    assert_eq!(first["users"][0]["disabled"], false);
    let second = host
        .admin_json(
            Method::GET,
            &format!("/admin/users?limit=2&cursor={}", keys[1]),
        )
        .await;
    assert_eq!(listed(&second), keys[2..]);
    assert_eq!(second["has_more"], false);

    // A prefix finds the keys that start with it; a whole key finds that user alone.
    let prefix = &keys[2][..4];
    let found = host
        .admin_json(Method::GET, &format!("/admin/users?prefix={prefix}"))
        .await;
    let found = listed(&found);
    assert!(found.contains(&keys[2]), "{found:?}");
    assert!(found.iter().all(|k| k.starts_with(prefix)), "{found:?}");
    let exact = host
        .admin_json(Method::GET, &format!("/admin/users?prefix={}", keys[0]))
        .await;
    assert_eq!(listed(&exact), keys[..1]);
    // A cursor before a whole key still finds it; at or after it, nothing is left.
    let before = host
        .admin_json(
            Method::GET,
            &format!("/admin/users?prefix={}&cursor=1", keys[1]),
        )
        .await;
    assert_eq!(listed(&before), keys[1..2]);
    let after = host
        .admin_json(
            Method::GET,
            &format!("/admin/users?prefix={}&cursor={}", keys[1], keys[1]),
        )
        .await;
    assert_eq!(after["users"], serde_json::json!([]));
    // A prefix with a cursor inside its range pages on from the cursor.
    let shared = &keys[2][..1];
    let from_cursor = host
        .admin_json(
            Method::GET,
            &format!("/admin/users?prefix={shared}&cursor={}", keys[2]),
        )
        .await;
    assert!(
        listed(&from_cursor)
            .iter()
            .all(|k| k > &keys[2] && k.starts_with(shared))
    );
    let none = host
        .admin_json(Method::GET, "/admin/users?prefix=yyyyyyyyyy")
        .await;
    assert_eq!(none["users"], serde_json::json!([]));
    assert_eq!(none["cursor"], Value::Null);

    for bad in ["prefix=L0", "limit=0", "limit=1001", "sort=name"] {
        let body = host
            .admin_json(Method::GET, &format!("/admin/users?{bad}"))
            .await;
        assert_eq!(body["error"], "bad_request", "{bad}: {body}");
    }
}

#[tokio::test]
async fn signup_tokens_are_listed_valid_then_used() {
    let host = TestHost::start_with(|c| c.signup.mode = SignupMode::Token).await;
    let token = host.admin_json(Method::POST, "/admin/signup_tokens").await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let other = host.admin_json(Method::POST, "/admin/signup_tokens").await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let status_of = |page: &Value, token: &str| -> Value {
        page["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["token"] == token)
            .cloned()
            .unwrap_or(Value::Null)
    };
    let page = host.admin_json(Method::GET, "/admin/signup_tokens").await;
    assert_eq!(status_of(&page, &token)["status"], "valid");
    assert_eq!(status_of(&page, &token)["used_by"], Value::Null);

    let key = Keypair::random();
    let r = host
        .signed(
            &key,
            Method::POST,
            &format!("/signup?signup_token={token}"),
            b"",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let page = host.admin_json(Method::GET, "/admin/signup_tokens").await;
    let used = status_of(&page, &token);
    assert_eq!(used["status"], "used");
    assert_eq!(used["used_by"], key.public_key().to_z32().as_str());
    assert!(used["used_at"].as_str().unwrap().ends_with('Z'), "{used}");
    assert_eq!(status_of(&page, &other)["status"], "valid");

    // Paging: one at a time, in token order, ending with has_more false.
    let first = host
        .admin_json(Method::GET, "/admin/signup_tokens?limit=1")
        .await;
    assert_eq!(first["has_more"], true);
    let cursor = first["cursor"].as_str().unwrap();
    let second = host
        .admin_json(
            Method::GET,
            &format!("/admin/signup_tokens?limit=1&cursor={cursor}"),
        )
        .await;
    assert_eq!(second["has_more"], false);
    let mut both = [token, other];
    both.sort();
    assert_eq!(first["tokens"][0]["token"], both[0].as_str());
    assert_eq!(second["tokens"][0]["token"], both[1].as_str());
}

#[tokio::test]
async fn recent_events_come_newest_first() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    assert_eq!(host.put(&alice, "/pub/one", b"1").await.status(), 200);
    assert_eq!(host.put(&alice, "/pub/two", b"2").await.status(), 200);
    assert_eq!(host.delete(&alice, "/pub/one").await.status(), 200);
    let events = host.admin_json(Method::GET, "/admin/events?limit=2").await;
    let events = events["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    let z32 = alice.public_key().to_z32();
    assert_eq!(events[0]["type"], "DEL");
    assert_eq!(events[0]["url"], format!("pk://{z32}/pub/one"));
    assert_eq!(events[1]["type"], "PUT");
    assert_eq!(events[1]["url"], format!("pk://{z32}/pub/two"));
    assert!(events[0]["cursor"].as_u64() > events[1]["cursor"].as_u64());
    assert!(events[1]["content_hash"].is_string());
    assert!(events[0]["created_at"].as_str().unwrap().ends_with('Z'));
}

#[tokio::test]
async fn the_page_signs_in_with_a_cookie_not_the_password() {
    let host = TestHost::start().await;
    let admin = host.server().admin_addr().unwrap();
    let url = |path: &str| format!("http://{admin}{path}");

    // The page and the API description need no password.
    let page = host.http.get(url("/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'self'"), "{csp}");
    assert!(page.text().await.unwrap().contains("admin.js"));
    for asset in ["/admin.js", "/admin.css", "/admin/openapi.json"] {
        assert_eq!(
            host.http.get(url(asset)).send().await.unwrap().status(),
            200
        );
    }

    let sign_in = |password: &str| {
        host.http
            .post(url("/admin/session"))
            .header("x-homeserver-admin", "1")
            .json(&serde_json::json!({ "password": password }))
            .send()
    };
    // Without the header (a form posted by another site): refused, nothing set.
    let from_a_form = host
        .http
        .post(url("/admin/session"))
        .json(&serde_json::json!({ "password": ADMIN_PASSWORD }))
        .send()
        .await
        .unwrap();
    assert!(from_a_form.headers().get("set-cookie").is_none());
    expect_error(from_a_form, 400, ErrorCode::BadRequest).await;
    expect_error(
        sign_in("nope").await.unwrap(),
        401,
        ErrorCode::InvalidSignature,
    )
    .await;
    let bad_body = host
        .http
        .post(url("/admin/session"))
        .header("x-homeserver-admin", "1")
        .body("password=x")
        .send()
        .await
        .unwrap();
    expect_error(bad_body, 400, ErrorCode::BadRequest).await;

    let signed_in = sign_in(ADMIN_PASSWORD).await.unwrap();
    assert_eq!(signed_in.status(), 204);
    let set_cookie = signed_in.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(set_cookie.contains("HttpOnly"), "{set_cookie}");
    assert!(set_cookie.contains("SameSite=Strict"), "{set_cookie}");
    assert!(!set_cookie.contains(ADMIN_PASSWORD), "{set_cookie}");
    let cookie = set_cookie.split(';').next().unwrap().to_owned();

    let stats = |cookie: &str, csrf: bool| {
        let mut request = host.http.get(url("/admin/stats")).header("cookie", cookie);
        if csrf {
            request = request.header("x-homeserver-admin", "1");
        }
        request.send()
    };
    assert_eq!(stats(&cookie, true).await.unwrap().status(), 200);
    // The cookie alone (what a cross-site form would send) does not act.
    expect_error(
        stats(&cookie, false).await.unwrap(),
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;
    expect_error(
        stats("hs_admin=forged", true).await.unwrap(),
        401,
        ErrorCode::InvalidSignature,
    )
    .await;

    let signed_out = host
        .http
        .delete(url("/admin/session"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(signed_out.status(), 204);
    assert!(
        signed_out.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    expect_error(
        stats(&cookie, true).await.unwrap(),
        401,
        ErrorCode::InvalidSignature,
    )
    .await;
}

#[tokio::test]
async fn password_guessing_is_braked() {
    let host = TestHost::start_single_with(|_| {}).await;
    let admin = host.server().admin_addr().unwrap();
    let stats = format!("http://{admin}/admin/stats");
    let mut statuses = Vec::new();
    for _ in 0..12 {
        let r = host
            .http
            .get(&stats)
            .bearer_auth("guess")
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses[..10], [401; 10]);
    assert_eq!(statuses[10..], [429; 2], "{statuses:?}");
    // Refused unheard: even the right password waits until the brake lets go.
    let r = host
        .http
        .get(&stats)
        .bearer_auth(ADMIN_PASSWORD)
        .send()
        .await
        .unwrap();
    assert!(r.headers().contains_key("retry-after"));
    expect_error(r, 429, ErrorCode::RateLimitExceeded).await;
}

/// Found by schemathesis (`scripts/fuzz-api`): a path parameter that is not UTF-8 and an
/// oversized admin body were answered by the framework in plain text, not the JSON
/// error every other refusal uses.
#[tokio::test]
async fn malformed_parameters_and_oversized_bodies_get_json_errors() {
    let host = TestHost::start_with(|c| c.signup.mode = SignupMode::Token).await;
    let r = host
        .request(Method::GET, "/signup_tokens/%FF")
        .send()
        .await
        .unwrap();
    expect_error(r, 400, ErrorCode::BadRequest).await;

    let admin = host.server().admin_addr().unwrap();
    let url = |path: &str| format!("http://{admin}{path}");
    for (method, path) in [
        (Method::GET, "/admin/users/%FF"),
        (Method::POST, "/admin/users/%FF/enable"),
        (Method::POST, "/admin/users/%FF/disable"),
        (Method::DELETE, "/admin/users/%FF"),
        (Method::PUT, "/admin/users/%FF/quota"),
    ] {
        let r = host
            .http
            .request(method, url(path))
            .bearer_auth(ADMIN_PASSWORD)
            .send()
            .await
            .unwrap();
        expect_error(r, 400, ErrorCode::BadRequest).await;
    }

    let alice = host.admin_json(Method::POST, "/admin/signup_tokens").await;
    let key = Keypair::random();
    let token = alice["token"].as_str().unwrap();
    host.signed(
        &key,
        Method::POST,
        &format!("/signup?signup_token={token}"),
        b"",
    )
    .send()
    .await
    .unwrap();
    let big = vec![b' '; 3 << 20];
    let r = host
        .http
        .put(url(&format!("/admin/users/{}/quota", key.public_key())))
        .bearer_auth(ADMIN_PASSWORD)
        .body(big.clone())
        .send()
        .await
        .unwrap();
    expect_error(r, 413, ErrorCode::PayloadTooLarge).await;
    let r = host
        .http
        .post(url("/admin/session"))
        .header("x-homeserver-admin", "1")
        .body(big)
        .send()
        .await
        .unwrap();
    expect_error(r, 413, ErrorCode::PayloadTooLarge).await;
}

/// DNS rebinding: a page whose own name was made to point at this machine sends that
/// name as `Host`; the admin server refuses it (and answers IP addresses, localhost and
/// `admin.allowed_hosts`).
#[tokio::test]
async fn the_admin_server_answers_only_to_its_own_names() {
    let host = TestHost::start_with(|c| c.admin.allowed_hosts = vec!["admin.example".into()]).await;
    let admin = host.server().admin_addr().unwrap();
    let stats = |name: &str| {
        host.http
            .get(format!("http://{admin}/admin/stats"))
            .header("host", name.to_owned())
            .bearer_auth(ADMIN_PASSWORD)
            .send()
    };
    for good in [
        format!("{admin}"),
        "localhost:6288".into(),
        "[::1]:6288".into(),
        "admin.example".into(),
    ] {
        assert_eq!(stats(&good).await.unwrap().status(), 200, "{good}");
    }
    let r = stats("evil.example:6288").await.unwrap();
    expect_error(r, 403, ErrorCode::InsufficientPermissions).await;
    let page = host
        .http
        .get(format!("http://{admin}/"))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 403);
}
