//! Sessions: minting, every validation rule of docs/API.md, the capability rules as the
//! policy guest applies them, expiry, revocation, and hot-swapping the policy of a
//! running server.

use std::time::Duration;

use homeserver_protocol::{ErrorCode, Keypair};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::fixture::*;

async fn session(
    host: &TestHost,
    key: &Keypair,
    capabilities: &[&str],
    ttl: Option<u64>,
) -> reqwest::Response {
    let mut body = json!({ "capabilities": capabilities });
    if let Some(ttl) = ttl {
        body["ttl"] = json!(ttl);
    }
    let body = serde_json::to_vec(&body).unwrap();
    host.signed(key, Method::POST, "/auth/session", &body)
        .send()
        .await
        .unwrap()
}

async fn token(host: &TestHost, key: &Keypair, capabilities: &[&str]) -> String {
    let r = session(host, key, capabilities, None).await;
    let body: Value = expect_ok_json(r).await;
    body["token"].as_str().unwrap().to_owned()
}

fn bearer(host: &TestHost, token: &str, method: Method, path: &str) -> reqwest::RequestBuilder {
    host.request(method, path).bearer_auth(token)
}

#[tokio::test]
async fn mint_show_revoke() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let before = now() as i64;
    let r = session(&host, &alice, &["read:/pub/", "write:/pub/app/"], Some(600)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    let token = body["token"].as_str().unwrap().to_owned();
    // 32 random bytes, base64url without padding.
    assert_eq!(token.len(), 43);
    assert!(
        token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    );
    let expires_at = body["expires_at"].as_i64().unwrap();
    assert!((before + 600..=before + 602).contains(&expires_at));

    let shown: Value = expect_ok_json(
        bearer(&host, &token, Method::GET, "/auth/session")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(shown["public_key"], alice.public_key().to_z32());
    assert_eq!(
        shown["capabilities"],
        json!(["read:/pub/", "write:/pub/app/"])
    );
    assert_eq!(shown["expires_at"], expires_at);

    let r = bearer(&host, &token, Method::DELETE, "/auth/session")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    expect_error(
        bearer(&host, &token, Method::GET, "/auth/session")
            .send()
            .await
            .unwrap(),
        401,
        ErrorCode::InvalidSignature,
    )
    .await;
    expect_error(
        bearer(&host, &token, Method::GET, "/pub/x")
            .send()
            .await
            .unwrap(),
        401,
        ErrorCode::InvalidSignature,
    )
    .await;

    // The token is stored only as its SHA-256.
    let token2 = crate::sessions::token(&host, &alice, &["read:/pub/"]).await;
    let stored = crate::backend::fetch_bytes(
        &host.server().context().config.storage.database_url,
        "SELECT token_hash FROM sessions",
    )
    .await;
    use sha2::Digest;
    let hash = sha2::Sha256::digest(token2.as_bytes()).to_vec();
    assert!(stored.contains(&hash));
    assert!(!stored.iter().any(|h| h == token2.as_bytes()));
}

#[tokio::test]
async fn minting_rules() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    // Default ttl 3600.
    let body: Value = expect_ok_json(session(&host, &alice, &["read:/pub/"], None).await).await;
    let exp = body["expires_at"].as_i64().unwrap();
    assert!((now() as i64 + 3598..=now() as i64 + 3601).contains(&exp));
    // Bounds of ttl.
    assert_eq!(session(&host, &alice, &[], Some(60)).await.status(), 200);
    assert_eq!(
        session(&host, &alice, &[], Some(2_592_000)).await.status(),
        200
    );
    for ttl in [59, 2_592_001, 0] {
        expect_error(
            session(&host, &alice, &["read:/pub/"], Some(ttl)).await,
            400,
            ErrorCode::BadRequest,
        )
        .await;
    }
    // At most 32 capabilities.
    let caps: Vec<String> = (0..33).map(|i| format!("read:/pub/{i}/")).collect();
    let caps_ref: Vec<&str> = caps.iter().map(String::as_str).collect();
    expect_error(
        session(&host, &alice, &caps_ref, None).await,
        400,
        ErrorCode::BadRequest,
    )
    .await;
    assert_eq!(
        session(&host, &alice, &caps_ref[..32], None).await.status(),
        200
    );
    // Malformed capabilities and bodies.
    for cap in [
        "admin:/pub/",
        "read:/etc/",
        "read",
        "read:/pub//x",
        "write:pub/",
    ] {
        expect_error(
            session(&host, &alice, &[cap], None).await,
            400,
            ErrorCode::BadRequest,
        )
        .await;
    }
    let r = host
        .signed(&alice, Method::POST, "/auth/session", b"not json")
        .send()
        .await
        .unwrap();
    expect_error(r, 400, ErrorCode::BadRequest).await;
    // Only a signed request mints; a session cannot.
    let t = token(&host, &alice, &["*:/pub/"]).await;
    let r = bearer(&host, &t, Method::POST, "/auth/session")
        .body(r#"{"capabilities":[]}"#)
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
    let r = host
        .request(Method::POST, "/auth/session")
        .body(r#"{"capabilities":[]}"#)
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
    // A key that never signed up.
    expect_error(
        session(&host, &Keypair::random(), &["read:/pub/"], None).await,
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;
    // Tampered body.
    let header = homeserver_protocol::AuthHeader::sign(
        &alice,
        "POST",
        "/auth/session",
        now(),
        &homeserver_protocol::BodyHash::of(br#"{"capabilities":["read:/pub/"]}"#),
    );
    let r = host
        .request(Method::POST, "/auth/session")
        .header("Authorization", header.to_header_value())
        .body(r#"{"capabilities":["*:/pub/"]}"#)
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
}

#[tokio::test]
async fn capabilities_decide_what_a_session_may_do() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    host.put(&alice, "/pub/app/a", b"a").await;
    host.put(&alice, "/pub/other/b", b"b").await;
    host.put(&alice, "/pub/exact", b"e").await;

    let rw_app = token(&host, &alice, &["write:/pub/app/", "read:/pub/app/"]).await;
    // Write inside the prefix, read back, delete.
    let r = bearer(&host, &rw_app, Method::PUT, "/pub/app/new")
        .body("n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = bearer(&host, &rw_app, Method::GET, "/pub/app/new")
        .send()
        .await
        .unwrap();
    assert_eq!(r.bytes().await.unwrap(), "n");
    let r = bearer(&host, &rw_app, Method::GET, "/pub/app/")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "listing inside the prefix");
    assert_eq!(
        bearer(&host, &rw_app, Method::DELETE, "/pub/app/new")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // Outside the prefix: 403 for read, write, listing; a lookalike prefix too.
    for (method, path) in [
        (Method::GET, "/pub/other/b"),
        (Method::PUT, "/pub/other/x"),
        (Method::DELETE, "/pub/other/b"),
        (Method::GET, "/pub/"),
        (Method::PUT, "/pub/application"),
    ] {
        let r = bearer(&host, &rw_app, method.clone(), path)
            .body("x")
            .send()
            .await
            .unwrap();
        expect_error(r, 403, ErrorCode::InsufficientPermissions).await;
    }

    // Read-only session: reads yes, writes no.
    let ro = token(&host, &alice, &["read:/pub/"]).await;
    assert_eq!(
        bearer(&host, &ro, Method::GET, "/pub/other/b")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        bearer(&host, &ro, Method::HEAD, "/pub/other/b")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    expect_error(
        bearer(&host, &ro, Method::PUT, "/pub/other/b")
            .body("x")
            .send()
            .await
            .unwrap(),
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;

    // Exact path capability covers only that path.
    let exact = token(&host, &alice, &["*:/pub/exact"]).await;
    assert_eq!(
        bearer(&host, &exact, Method::GET, "/pub/exact")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        bearer(&host, &exact, Method::PUT, "/pub/exact")
            .body("E")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    expect_error(
        bearer(&host, &exact, Method::GET, "/pub/exact/more")
            .send()
            .await
            .unwrap(),
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;
    expect_error(
        bearer(&host, &exact, Method::GET, "/pub/exactly")
            .send()
            .await
            .unwrap(),
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;

    // No capabilities: nothing.
    let none = token(&host, &alice, &[]).await;
    expect_error(
        bearer(&host, &none, Method::GET, "/pub/app/a")
            .send()
            .await
            .unwrap(),
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;

    // A session naming another user's host is a public read of that user.
    let bob = host.user().await;
    host.put(&bob, "/pub/bobs", b"bob").await;
    let r = bearer(&host, &none, Method::GET, "/pub/bobs")
        .header("Pubky-Host", bob.public_key().to_z32())
        .send()
        .await
        .unwrap();
    assert_eq!(r.bytes().await.unwrap(), "bob");
    // ...but never a write there.
    let r = bearer(&host, &rw_app, Method::PUT, "/pub/app/z")
        .header("Pubky-Host", bob.public_key().to_z32())
        .body("z")
        .send()
        .await
        .unwrap();
    expect_error(r, 403, ErrorCode::InsufficientPermissions).await;

    // Session writes count against quota and produce events like signed ones.
    let feed: homeserver_protocol::event::EventPage = expect_ok_json(
        host.request(Method::GET, "/events/?limit=1000")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(feed.events.iter().any(|e| e.url.ends_with("/pub/app/new")));
}

#[tokio::test]
async fn expired_sessions_answer_expired_session() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let t = token(&host, &alice, &["*:/pub/"]).await;
    // Age the session in the database (ttl has a 60 s minimum).
    crate::backend::execute_with_i64(
        &host.server().context().config.storage.database_url,
        "UPDATE sessions SET expires_at = ?",
        now() as i64 - 1,
    )
    .await;
    let e = expect_error(
        bearer(&host, &t, Method::GET, "/pub/")
            .send()
            .await
            .unwrap(),
        401,
        ErrorCode::ExpiredSession,
    )
    .await;
    assert!(e.message.contains("expired"));
    expect_error(
        bearer(&host, &t, Method::PUT, "/pub/x")
            .body("x")
            .send()
            .await
            .unwrap(),
        401,
        ErrorCode::ExpiredSession,
    )
    .await;
    expect_error(
        bearer(&host, &t, Method::GET, "/auth/session")
            .send()
            .await
            .unwrap(),
        401,
        ErrorCode::ExpiredSession,
    )
    .await;
    // An unknown token is invalid_signature.
    expect_error(
        bearer(&host, "nope", Method::GET, "/pub/")
            .send()
            .await
            .unwrap(),
        401,
        ErrorCode::InvalidSignature,
    )
    .await;
}

#[tokio::test]
async fn account_deletion_revokes_sessions_and_metrics_count_them() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let t = token(&host, &alice, &["*:/pub/"]).await;
    let addr = host.server().metrics_addr().unwrap();
    let text = host
        .http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("hs_active_sessions 1"), "{text}");
    assert!(
        text.contains("hs_guest_calls_total{slot=\"capability-policy\"}"),
        "{text}"
    );
    let r = host
        .admin(
            Method::DELETE,
            &format!("/admin/users/{}", alice.public_key()),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    expect_error(
        bearer(&host, &t, Method::GET, "/pub/")
            .send()
            .await
            .unwrap(),
        401,
        ErrorCode::InvalidSignature,
    )
    .await;
}

/// An operator drops a deny-all policy into the policies folder of a running server and
/// reloads: every request after the reload is denied (owners too), none fails otherwise,
/// no restart; a broken module keeps the old one and reports why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hot_swap_policy_in_a_running_server() {
    let host = std::sync::Arc::new(TestHost::start_single_with(|_| {}).await);
    let alice = host.user().await;
    host.put(&alice, "/pub/x", b"x").await;
    let policies = host.dir.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();

    // Load in the background while swapping.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loader = {
        let host = host.clone();
        let alice = alice.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                statuses.push(host.get(&alice, "/pub/x").await.status().as_u16());
            }
            statuses
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A broken module first: refused, the old policy keeps serving.
    std::fs::write(policies.join("broken.wasm"), b"\0asm garbage").unwrap();
    std::fs::write(
        policies.join("policies.toml"),
        "[capability-policy]\nmodule = \"broken.wasm\"\n",
    )
    .unwrap();
    let report: Value = expect_ok_json(
        host.admin(Method::POST, "/admin/policies/reload")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(report["ok"], false, "{report}");
    assert_eq!(
        host.get(&alice, "/pub/x").await.status(),
        200,
        "old policy still serves"
    );
    let status: Value = expect_ok_json(
        host.admin(Method::GET, "/admin/policies")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let slot = status["slots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["slot"] == "capability-policy")
        .unwrap()
        .clone();
    assert!(slot["last_error"].is_string(), "{slot}");
    assert!(
        slot["blake3"].is_string() && slot["loaded_at"].is_u64(),
        "{slot}"
    );

    // Now the deny-all guest (built from guests/deny-all by the runtime's build script).
    let deny_all = test_guest("deny_all");
    std::fs::copy(&deny_all, policies.join("deny_all.wasm")).unwrap();
    std::fs::write(
        policies.join("policies.toml"),
        "[capability-policy]\nmodule = \"deny_all.wasm\"\n",
    )
    .unwrap();
    let report: Value = expect_ok_json(
        host.admin(Method::POST, "/admin/policies/reload")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(report["ok"], true, "{report}");
    // Every request after the swap is denied.
    for _ in 0..20 {
        expect_error(
            host.get(&alice, "/pub/x").await,
            403,
            ErrorCode::InsufficientPermissions,
        )
        .await;
    }
    expect_error(
        host.put(&alice, "/pub/y", b"y").await,
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let statuses = loader.await.unwrap();
    assert!(statuses.len() > 10);
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 403),
        "no request failed otherwise: {statuses:?}"
    );
    // Once denied, never allowed again.
    let first_denied = statuses.iter().position(|s| *s == 403);
    if let Some(i) = first_denied {
        assert!(statuses[i..].iter().all(|s| *s == 403), "{statuses:?}");
    }
}

/// An operator edits policies.toml of a running server: the watcher reloads it and the
/// next requests follow it; here a read-only prefix that binds owners too.
#[tokio::test]
async fn watcher_applies_an_edited_policy_to_owners() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    let config = test_config(dir.path());
    let host = TestHost::start_in(dir, config).await;
    let alice = host.user().await;
    assert_eq!(host.put(&alice, "/pub/archive/1", b"a").await.status(), 200);

    std::fs::write(
        policies.join("policies.toml"),
        "[capability-policy.config]\nread-only-prefixes = [\"/pub/archive/\"]\n",
    )
    .unwrap();
    // The watcher debounces (300 ms) then reloads.
    let mut denied = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = host
            .put(&alice, &format!("/pub/archive/{}", now()), b"b")
            .await;
        if r.status() == 403 {
            denied = true;
            break;
        }
    }
    assert!(denied, "the edited policy was not applied");
    assert_eq!(
        host.get(&alice, "/pub/archive/1").await.status(),
        200,
        "reads still allowed"
    );
    assert_eq!(host.put(&alice, "/pub/elsewhere", b"c").await.status(), 200);
}

#[tokio::test]
async fn session_permission_comes_before_size() {
    let host = TestHost::start_with(|c| c.storage.max_value_bytes = 10).await;
    let alice = host.user().await;
    let t = token(&host, &alice, &["write:/pub/app/"]).await;
    // Outside the capability and too large: 403 (permission) before 413 (size).
    let r = bearer(&host, &t, Method::PUT, "/pub/other")
        .body(vec![0u8; 100])
        .send()
        .await
        .unwrap();
    expect_error(r, 403, ErrorCode::InsufficientPermissions).await;
    let r = bearer(&host, &t, Method::PUT, "/pub/app/x")
        .body(vec![0u8; 100])
        .send()
        .await
        .unwrap();
    expect_error(r, 413, ErrorCode::PayloadTooLarge).await;
    // A failed token is an error even when the read names a host.
    let r = bearer(&host, "unknown", Method::GET, "/pub/app/x")
        .header("Pubky-Host", alice.public_key().to_z32())
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
}

/// Sessions are cached after their first use; deleting the account ends them at once.
#[tokio::test]
async fn a_cached_session_ends_with_its_account() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let t = token(&host, &alice, &["*:/pub/"]).await;
    assert_eq!(host.put(&alice, "/pub/x", b"1").await.status(), 200);
    for _ in 0..2 {
        let r = bearer(&host, &t, Method::GET, "/pub/x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = host
        .admin(
            Method::DELETE,
            &format!("/admin/users/{}", alice.public_key()),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    expect_error(
        bearer(&host, &t, Method::GET, "/pub/x")
            .send()
            .await
            .unwrap(),
        401,
        ErrorCode::InvalidSignature,
    )
    .await;
}
