//! Operations: the admin API (no, wrong and right credentials), signup tokens (incl. a
//! race for one token), disabled users, account deletion, metrics, rate limits and slow
//! clients.

use std::sync::Arc;
use std::time::Duration;

use homeserver_protocol::event::{EventKind, EventPage};
use homeserver_protocol::wire::SignupTokenStatus;
use homeserver_protocol::{ErrorCode, Keypair};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::fixture::*;

fn admin(host: &TestHost, method: Method, path: &str) -> reqwest::RequestBuilder {
    let addr = host.server().admin_addr().expect("admin server on");
    host.http.request(method, format!("http://{addr}{path}"))
}

fn admin_ok(host: &TestHost, method: Method, path: &str) -> reqwest::RequestBuilder {
    admin(host, method, path).bearer_auth(ADMIN_PASSWORD)
}

#[tokio::test]
async fn admin_endpoints_need_the_password() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let user_path = format!("/admin/users/{}", alice.public_key());
    let endpoints = [
        (Method::GET, "/admin/stats".to_owned()),
        (Method::GET, user_path.clone()),
        (Method::POST, format!("{user_path}/disable")),
        (Method::POST, format!("{user_path}/enable")),
        (Method::PUT, format!("{user_path}/quota")),
        (Method::DELETE, user_path.clone()),
        (Method::POST, "/admin/signup_tokens".to_owned()),
    ];
    for (method, path) in &endpoints {
        expect_error(
            admin(&host, method.clone(), path).send().await.unwrap(),
            401,
            ErrorCode::InvalidSignature,
        )
        .await;
        expect_error(
            admin(&host, method.clone(), path)
                .bearer_auth("wrong")
                .send()
                .await
                .unwrap(),
            401,
            ErrorCode::InvalidSignature,
        )
        .await;
    }
    // Right password.
    let stats: Value = expect_ok_json(
        admin_ok(&host, Method::GET, "/admin/stats")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(stats["users"], 1);
    assert!(stats["uptime_seconds"].is_u64());
    assert!(stats["requests_per_minute"].as_u64().unwrap() >= 1);

    host.put(&alice, "/pub/x", &[0; 123]).await;
    let info: Value = expect_ok_json(
        admin_ok(&host, Method::GET, &user_path)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(info["public_key"], alice.public_key().to_z32());
    assert_eq!(info["storage_used"], 123);
    assert_eq!(info["storage_quota"], 100 * 1024 * 1024);
    assert!(info["created_at"].is_i64() && info["last_activity"].is_i64());

    let stats: Value = expect_ok_json(
        admin_ok(&host, Method::GET, "/admin/stats")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(stats["total_storage"], 123);

    // Unknown user 404, bad key 400, unknown endpoint 404.
    let stranger = format!("/admin/users/{}", Keypair::random().public_key());
    expect_error(
        admin_ok(&host, Method::GET, &stranger)
            .send()
            .await
            .unwrap(),
        404,
        ErrorCode::NotFound,
    )
    .await;
    expect_error(
        admin_ok(&host, Method::GET, "/admin/users/nope")
            .send()
            .await
            .unwrap(),
        400,
        ErrorCode::BadRequest,
    )
    .await;
    expect_error(
        admin_ok(&host, Method::GET, "/admin/nothing")
            .send()
            .await
            .unwrap(),
        404,
        ErrorCode::NotFound,
    )
    .await;
}

#[tokio::test]
async fn admin_off_without_password() {
    let host = TestHost::start_with(|c| c.admin.password = String::new()).await;
    assert!(host.server().admin_addr().is_none());
}

#[tokio::test]
async fn quota_override_and_disable() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let user_path = format!("/admin/users/{}", alice.public_key());
    let info: Value = expect_ok_json(
        admin_ok(&host, Method::PUT, &format!("{user_path}/quota"))
            .body(r#"{"quota_bytes": 10}"#)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(info["storage_quota"], 10);
    expect_error(
        host.put(&alice, "/pub/a", &[0; 11]).await,
        507,
        ErrorCode::StorageQuotaExceeded,
    )
    .await;
    expect_error(
        admin_ok(&host, Method::PUT, &format!("{user_path}/quota"))
            .body("nope")
            .send()
            .await
            .unwrap(),
        400,
        ErrorCode::BadRequest,
    )
    .await;
    let info: Value = expect_ok_json(
        admin_ok(&host, Method::PUT, &format!("{user_path}/quota"))
            .body(r#"{"quota_bytes": null}"#)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(info["storage_quota"], 100 * 1024 * 1024);
    // The refused request's signature was spent: sign the retry a second later.
    let retry = host
        .signed_at(&alice, Method::PUT, "/pub/a", &[0; 11], now() + 1)
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), 200);

    // Disabled: writes 403, reads still work; enabled again: writes work.
    let info: Value = expect_ok_json(
        admin_ok(&host, Method::POST, &format!("{user_path}/disable"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(info["disabled"], true);
    let e = expect_error(
        host.put(&alice, "/pub/b", b"x").await,
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;
    assert!(e.message.contains("disabled"));
    expect_error(
        host.delete(&alice, "/pub/a").await,
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;
    assert_eq!(host.get(&alice, "/pub/a").await.status(), 200);
    expect_ok_json::<Value>(
        admin_ok(&host, Method::POST, &format!("{user_path}/enable"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    // The refused write's signature is spent; a new one goes through.
    let r = host
        .signed_at(&alice, Method::PUT, "/pub/b", b"x", now() + 2)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn account_deletion_removes_everything_and_shows_in_the_feed() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let bob = host.user().await;
    for i in 0..25 {
        host.put(&alice, &format!("/pub/posts/{i:02}"), b"post")
            .await;
    }
    host.put(&bob, "/pub/keep", b"bob's").await;
    let before: EventPage = expect_ok_json(
        host.request(Method::GET, "/events/?limit=1000")
            .send()
            .await
            .unwrap(),
    )
    .await;

    let deleted: Value = expect_ok_json(
        admin_ok(
            &host,
            Method::DELETE,
            &format!("/admin/users/{}", alice.public_key()),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(deleted["entries_deleted"], 25);

    let after: EventPage = expect_ok_json(
        host.request(
            Method::GET,
            &format!("/events/?cursor={}&limit=1000", before.cursor),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(after.events.len(), 25);
    assert!(after.events.iter().all(|e| e.kind == EventKind::Del));
    assert!(after.events.iter().all(|e| {
        e.url
            .starts_with(&format!("pk://{}/pub/posts/", alice.public_key()))
    }));

    // Gone: entries, the user (writes need a new signup), and the blobs.
    expect_error(
        host.public_get(&alice, "/pub/posts/00").await,
        404,
        ErrorCode::NotFound,
    )
    .await;
    expect_error(
        host.put(&alice, "/pub/x", b"x").await,
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;
    expect_error(
        admin_ok(
            &host,
            Method::GET,
            &format!("/admin/users/{}", alice.public_key()),
        )
        .send()
        .await
        .unwrap(),
        404,
        ErrorCode::NotFound,
    )
    .await;
    let dir = host
        .dir
        .path()
        .join("blobs")
        .join(alice.public_key().to_z32());
    eventually(
        "the deleted user's blobs are removed",
        Duration::from_secs(10),
        || {
            let left = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
            async move { left == 0 }
        },
    )
    .await;
    // Bob is untouched.
    assert_eq!(
        host.public_get(&bob, "/pub/keep")
            .await
            .bytes()
            .await
            .unwrap(),
        "bob's"
    );
    expect_error(
        admin_ok(
            &host,
            Method::DELETE,
            &format!("/admin/users/{}", alice.public_key()),
        )
        .send()
        .await
        .unwrap(),
        404,
        ErrorCode::NotFound,
    )
    .await;
}

async fn new_token(host: &TestHost) -> String {
    let body: Value = expect_ok_json(
        admin_ok(host, Method::POST, "/admin/signup_tokens")
            .send()
            .await
            .unwrap(),
    )
    .await;
    body["token"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn signup_tokens_end_to_end() {
    let host =
        TestHost::start_with(|c| c.signup.mode = homeserver::config::SignupMode::Token).await;
    let token = new_token(&host).await;
    assert!(
        homeserver_protocol::wire::is_signup_token(&token),
        "{token}"
    );

    let status: SignupTokenStatus = expect_ok_json(
        host.request(Method::GET, &format!("/signup_tokens/{token}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status.status, "valid");
    assert!(
        status.created_at.ends_with('Z') && status.created_at.contains('T'),
        "{}",
        status.created_at
    );

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
    let status: SignupTokenStatus = expect_ok_json(
        host.request(Method::GET, &format!("/signup_tokens/{token}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status.status, "used");

    // A used token cannot sign up someone else.
    let other = Keypair::random();
    let r = host
        .signed(
            &other,
            Method::POST,
            &format!("/signup?signup_token={token}"),
            b"",
        )
        .send()
        .await
        .unwrap();
    let e = expect_error(r, 403, ErrorCode::InsufficientPermissions).await;
    assert!(e.message.contains("used"));

    expect_error(
        host.request(Method::GET, "/signup_tokens/nonsense")
            .send()
            .await
            .unwrap(),
        400,
        ErrorCode::BadRequest,
    )
    .await;
    expect_error(
        host.request(Method::GET, "/signup_tokens/AAAA-BBBB-CCCC")
            .send()
            .await
            .unwrap(),
        404,
        ErrorCode::NotFound,
    )
    .await;
}

#[tokio::test]
async fn signup_token_check_is_400_in_open_mode() {
    let host = TestHost::start().await;
    expect_error(
        host.request(Method::GET, "/signup_tokens/AAAA-BBBB-CCCC")
            .send()
            .await
            .unwrap(),
        400,
        ErrorCode::BadRequest,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_signups_racing_for_one_token_one_wins() {
    let host = Arc::new(
        TestHost::start_with(|c| c.signup.mode = homeserver::config::SignupMode::Token).await,
    );
    for _ in 0..5 {
        let token = new_token(&host).await;
        let racers: Vec<_> = (0..8)
            .map(|_| {
                let host = host.clone();
                let token = token.clone();
                tokio::spawn(async move {
                    let key = Keypair::random();
                    host.signed(
                        &key,
                        Method::POST,
                        &format!("/signup?signup_token={token}"),
                        b"",
                    )
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
                })
            })
            .collect();
        let mut statuses = Vec::new();
        for r in racers {
            statuses.push(r.await.unwrap());
        }
        assert_eq!(
            statuses.iter().filter(|s| **s == 201).count(),
            1,
            "{statuses:?}"
        );
        assert_eq!(
            statuses.iter().filter(|s| **s == 403).count(),
            7,
            "{statuses:?}"
        );
    }
}

#[tokio::test]
async fn signup_token_check_has_its_own_limit() {
    // Even with the general limits off, 10 checks a minute per IP.
    let host =
        TestHost::start_single_with(|c| c.signup.mode = homeserver::config::SignupMode::Token)
            .await;
    for _ in 0..10 {
        let r = host
            .request(Method::GET, "/signup_tokens/AAAA-BBBB-CCCC")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
    }
    let r = host
        .request(Method::GET, "/signup_tokens/AAAA-BBBB-CCCC")
        .send()
        .await
        .unwrap();
    assert!(r.headers().contains_key("retry-after"));
    expect_error(r, 429, ErrorCode::RateLimitExceeded).await;
}

#[tokio::test]
async fn rate_limits_headers_429_and_recovery() {
    let host = TestHost::start_single_with(|c| {
        c.rate_limit.enabled = true;
        c.rate_limit.anonymous_per_minute = 120; // burst 120, one more every 0.5 s
        c.rate_limit.authenticated_per_minute = 5;
    })
    .await;
    let alice = host.user().await; // signed up from the IP's bucket: not a user yet
    // Authenticated: 5 per key per minute.
    for expected in [4, 3, 2, 1, 0] {
        let r = host.get(&alice, "/pub/").await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-ratelimit-limit"], "5");
        assert_eq!(
            r.headers()["x-ratelimit-remaining"],
            expected.to_string().as_str()
        );
        let reset: u64 = r.headers()["x-ratelimit-reset"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            reset >= now() && reset <= now() + 61,
            "reset is a timestamp"
        );
    }
    let r = host.get(&alice, "/pub/").await;
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=12).contains(&retry), "{retry}");
    let e = expect_error(r, 429, ErrorCode::RateLimitExceeded).await;
    assert!(e.message.contains("retry"));
    // 429 comes before everything else, even a bad path.
    expect_error(
        host.get(&alice, "/pub//bad").await,
        429,
        ErrorCode::RateLimitExceeded,
    )
    .await;
    // Another key is not affected.
    let bob = Keypair::random();
    assert_eq!(host.get(&bob, "/pub/").await.status(), 200);

    // Anonymous: exhaust the burst, then recover after one replenish period.
    let mut refused = None;
    for _ in 0..200 {
        let r = host.public_get(&alice, "/pub/").await;
        if r.status() == 429 {
            refused = Some(r);
            break;
        }
    }
    let r = refused.expect("anonymous limit reached");
    assert!(r.headers().contains_key("retry-after"));
    // Recovered after one replenish period (a second): polled, a refused request
    // takes no token.
    eventually(
        "recovered after the window",
        Duration::from_secs(10),
        || async { host.public_get(&alice, "/pub/").await.status() == 200 },
    )
    .await;
}

#[tokio::test]
async fn bad_credentials_count_against_the_ip() {
    let host = TestHost::start_single_with(|c| {
        c.rate_limit.enabled = true;
        c.rate_limit.anonymous_per_minute = 3;
    })
    .await;
    // Forged signatures of random keys: each is charged to the IP too.
    for _ in 0..3 {
        let key = Keypair::random();
        let header = homeserver_protocol::AuthHeader::sign(
            &key,
            "GET",
            "/pub/other",
            now(),
            &homeserver_protocol::BodyHash::empty(),
        );
        let r = host
            .request(Method::GET, "/pub/")
            .header("Authorization", header.to_header_value())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
    }
    let r = host
        .request(Method::GET, "/pub/")
        .header("Pubky-Host", Keypair::random().public_key().to_z32())
        .send()
        .await
        .unwrap();
    expect_error(r, 429, ErrorCode::RateLimitExceeded).await;
}

#[tokio::test]
async fn metrics_series() {
    let host = TestHost::start_single_with(|_| {}).await;
    let alice = host.user().await;
    host.put(&alice, "/pub/m", &[1; 77]).await;
    host.get(&alice, "/pub/missing").await;
    let addr = host.server().metrics_addr().unwrap();
    let r = host
        .http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = r.text().await.unwrap();
    for needle in [
        "hs_requests_total{method=\"PUT\",status=\"200\"} 1",
        "hs_requests_total{method=\"GET\",status=\"404\"} 1",
        "hs_requests_total{method=\"POST\",status=\"201\"} 1",
        "hs_storage_bytes 77",
        "hs_active_sessions 0",
        "hs_users 1",
        "hs_event_stream_subscribers 0",
        "hs_request_duration_seconds_bucket{method=\"PUT\"",
    ] {
        assert!(text.contains(needle), "missing {needle} in:\n{text}");
    }
    // promtool, when installed (CI installs it): the output must lint clean.
    match std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(mut child) => {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool check metrics failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "promtool missing in CI: {e}"
            );
            eprintln!(
                "SKIPPED promtool lint: promtool not installed ({e}); apt-get install prometheus"
            );
        }
    }
}

/// A client that opens a connection and trickles its headers cannot hold it forever,
/// and meanwhile everyone else is served.
#[tokio::test]
async fn slow_clients_are_cut_off_and_do_not_block_others() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = TestHost::start_with(|c| {
        c.http.header_read_timeout_secs = 1;
        c.http.body_idle_timeout_secs = 1;
    })
    .await;
    let alice = host.user().await;
    let addr = host.server().http_addr();

    // 1. Headers never finished.
    let mut stalled_headers = tokio::net::TcpStream::connect(addr).await.unwrap();
    stalled_headers
        .write_all(b"GET /pub/ HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // 2. A PUT whose body stops halfway.
    let body = vec![1u8; 1000];
    let header = homeserver_protocol::AuthHeader::sign(
        &alice,
        "PUT",
        "/pub/slow",
        now(),
        &homeserver_protocol::BodyHash::of(&body),
    );
    let mut stalled_body = tokio::net::TcpStream::connect(addr).await.unwrap();
    stalled_body
        .write_all(format!("PUT /pub/slow HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Length: 1000\r\n\r\n", header.to_header_value()).as_bytes())
        .await
        .unwrap();
    stalled_body.write_all(&body[..500]).await.unwrap();

    // Others are served meanwhile.
    for i in 0..20 {
        assert_eq!(
            host.put(&alice, &format!("/pub/fast/{i}"), b"x")
                .await
                .status(),
            200
        );
    }

    // Both stalled connections are closed by the server within a few seconds.
    for (name, mut stream) in [("headers", stalled_headers), ("body", stalled_body)] {
        let mut answer = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
        assert!(
            read.is_ok(),
            "stalled {name} connection still open after 10 s"
        );
        let text = String::from_utf8_lossy(&answer);
        if name == "body" {
            assert!(text.starts_with("HTTP/1.1 400"), "{text}");
            assert!(text.contains("sent nothing"), "{text}");
        }
    }
    expect_error(
        host.get(&alice, "/pub/slow").await,
        404,
        ErrorCode::NotFound,
    )
    .await;
}

#[tokio::test]
async fn random_credentials_do_not_escape_the_ip_limit() {
    let host = TestHost::start_single_with(|c| {
        c.rate_limit.enabled = true;
        c.rate_limit.anonymous_per_minute = 5;
    })
    .await;
    let alice = Keypair::random();
    let mut statuses = Vec::new();
    for i in 0..8 {
        // A fresh, validly signed key every time, and a random bearer token: neither is
        // a signed-up user, so both count against the IP.
        let stranger = Keypair::random();
        let r = if i % 2 == 0 {
            host.signed(&stranger, Method::GET, "/pub/x", b"")
        } else {
            host.request(Method::GET, "/pub/x")
                .bearer_auth("random-token")
        };
        let r = r
            .header("Pubky-Host", alice.public_key().to_z32())
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    assert!(statuses.contains(&429), "{statuses:?}");
}

#[tokio::test]
async fn a_refused_signed_write_cannot_be_replayed_later() {
    let host = TestHost::start_with(|c| c.storage.quota_bytes = 100).await;
    let alice = host.user().await;
    host.put(&alice, "/pub/fill", &[0; 80]).await;
    let ts = now();
    // Over quota: refused.
    let r = host
        .signed_at(&alice, Method::PUT, "/pub/profile", &[1; 50], ts)
        .send()
        .await
        .unwrap();
    expect_error(r, 507, ErrorCode::StorageQuotaExceeded).await;
    // Space is freed; the same signed request sent again must not go through now.
    assert_eq!(host.delete(&alice, "/pub/fill").await.status(), 200);
    let r = host
        .signed_at(&alice, Method::PUT, "/pub/profile", &[1; 50], ts)
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
}

#[tokio::test]
async fn signup_token_check_without_a_token_is_400() {
    let host =
        TestHost::start_with(|c| c.signup.mode = homeserver::config::SignupMode::Token).await;
    expect_error(
        host.request(Method::GET, "/signup_tokens/")
            .send()
            .await
            .unwrap(),
        400,
        ErrorCode::BadRequest,
    )
    .await;
}
