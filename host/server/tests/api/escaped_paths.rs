//! `%2F` in storage paths: generated clients escape a path parameter's slashes, so the
//! server reads `%2F` (either case) as `/` and no other escape. The signature covers the
//! target as sent; everything after it (capabilities, quotas, events, listings, ETags)
//! sees the one canonical path.

use homeserver_protocol::event::{EventKind, EventPage};
use homeserver_protocol::wire::{AccountInfo, DeleteResult, ListResult, PutResult};
use homeserver_protocol::{AuthHeader, BodyHash, ErrorCode, Keypair};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::fixture::*;

async fn events(host: &TestHost) -> EventPage {
    expect_ok_json(host.request(Method::GET, "/events/").send().await.unwrap()).await
}

#[tokio::test]
async fn escaped_and_plain_slashes_name_one_entry() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let url = format!("pk://{}/pub/a/b", alice.public_key());

    // Written escaped, read plain: one entry under its canonical path.
    let put: PutResult = expect_ok_json(host.put(&alice, "/pub/a%2Fb", b"one").await).await;
    assert_eq!(put.path, "/pub/a/b");
    let plain = host.get(&alice, "/pub/a/b").await;
    assert_eq!(plain.status(), StatusCode::OK);
    let etag = plain.headers()["etag"].clone();
    assert_eq!(plain.bytes().await.unwrap(), "one");
    let page = events(&host).await;
    assert_eq!(page.events.len(), 1);
    assert_eq!(page.events[0].kind, EventKind::Put);
    assert_eq!(page.events[0].url, url);

    // Both spellings (and both cases) answer the same value and ETag, 304 included.
    for spelling in ["/pub/a%2Fb", "/pub/a%2fb"] {
        let r = host.get(&alice, spelling).await;
        assert_eq!(r.status(), StatusCode::OK, "{spelling}");
        assert_eq!(r.headers()["etag"], etag);
        let r = host
            .signed(&alice, Method::GET, spelling, b"")
            .header("If-None-Match", &etag)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_MODIFIED, "{spelling}");
        let public = host.public_get(&alice, spelling).await;
        assert_eq!(public.bytes().await.unwrap(), "one");
    }

    // Written plain over the escaped write: an overwrite, counted once in the quota.
    expect_ok_json::<PutResult>(host.put(&alice, "/pub/a/b", b"two!").await).await;
    let r = host.get(&alice, "/pub/a%2fb").await;
    assert_eq!(r.bytes().await.unwrap(), "two!");
    let account: AccountInfo = expect_ok_json(
        host.signed(&alice, Method::GET, "/account", b"")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(account.used_bytes, 4);

    // Listings, plain or escaped, show the one entry under its canonical path.
    for listing in ["/pub/", "/pub/a/", "/pub/a%2F"] {
        let page: ListResult = expect_ok_json(host.get(&alice, listing).await).await;
        let paths: Vec<_> = page.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/pub/a/b"], "{listing}");
    }

    // Deleted escaped: gone under both spellings; every event names the canonical url.
    let deleted: DeleteResult = expect_ok_json(host.delete(&alice, "/pub/a%2Fb").await).await;
    assert_eq!(deleted.path, "/pub/a/b");
    expect_error(host.get(&alice, "/pub/a/b").await, 404, ErrorCode::NotFound).await;
    let page = events(&host).await;
    let seen: Vec<_> = page
        .events
        .iter()
        .map(|e| (e.kind, e.url.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (EventKind::Put, url.as_str()),
            (EventKind::Put, url.as_str()),
            (EventKind::Del, url.as_str())
        ]
    );
}

#[tokio::test]
async fn no_other_escape_is_read() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    for path in [
        "/pub/a%2Eb",
        "/pub/a%2e",
        "/pub/a%20b",
        "/pub/a%25",
        "/pub/a%2",
        "/pub/a%",
        "/pub/%61",
        "/pub/a%2F%2Fb",
        "/pub/a%2F..%2Fb",
        "/pub/a%2F.",
        "/pub/a%2F",
    ] {
        expect_error(
            host.put(&alice, path, b"x").await,
            400,
            ErrorCode::InvalidPath,
        )
        .await;
        if !path.ends_with("%2F") {
            expect_error(host.get(&alice, path).await, 400, ErrorCode::InvalidPath).await;
        }
    }
    // The path is checked before credentials, escaped or not.
    expect_error(
        host.request(Method::PUT, "/pub/a%2Eb")
            .body("x")
            .send()
            .await
            .unwrap(),
        400,
        ErrorCode::InvalidPath,
    )
    .await;
    assert!(events(&host).await.events.is_empty());
}

#[tokio::test]
async fn the_signature_covers_the_target_as_sent() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let body = b"signed";
    let sign = |target: &str, timestamp: u64| {
        AuthHeader::sign(&alice, "PUT", target, timestamp, &BodyHash::of(body)).to_header_value()
    };

    // Signed over the canonical target, sent escaped (and the other way): refused.
    for (signed, sent) in [("/pub/a/b", "/pub/a%2Fb"), ("/pub/a%2Fb", "/pub/a/b")] {
        let r = host
            .request(Method::PUT, sent)
            .header("Authorization", sign(signed, now()))
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        expect_error(r, 401, ErrorCode::InvalidSignature).await;
    }
    // Signed over what is sent: accepted, with its body declared up front too (the
    // rate limiter proves that signature before the body arrives).
    let r = host
        .request(Method::PUT, "/pub/a%2Fb")
        .header("Authorization", sign("/pub/a%2Fb", now()))
        .header("Content-Digest", BodyHash::of(body).to_content_digest())
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    assert_eq!(
        host.get(&alice, "/pub/a/b").await.bytes().await.unwrap(),
        "signed"
    );
}

async fn session_token(host: &TestHost, key: &Keypair, capabilities: &[&str]) -> String {
    let body = serde_json::to_vec(&json!({ "capabilities": capabilities })).unwrap();
    let r = host
        .signed(key, Method::POST, "/auth/session", &body)
        .send()
        .await
        .unwrap();
    let created: Value = expect_ok_json(r).await;
    created["token"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn capabilities_see_the_canonical_path() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let under_a = session_token(&host, &alice, &["*:/pub/a/"]).await;
    let under_b = session_token(&host, &alice, &["*:/pub/b/"]).await;
    let bearer = |token: &str, method: Method, path: &str| {
        host.request(method, path).bearer_auth(token).body("v")
    };

    let r = bearer(&under_a, Method::PUT, "/pub/a%2Fb")
        .send()
        .await
        .unwrap();
    expect_ok_json::<PutResult>(r).await;
    let r = bearer(&under_a, Method::GET, "/pub/a%2fb")
        .send()
        .await
        .unwrap();
    assert_eq!(r.bytes().await.unwrap(), "v");

    for method in [Method::PUT, Method::GET, Method::DELETE] {
        let r = bearer(&under_b, method.clone(), "/pub/a%2Fb")
            .send()
            .await
            .unwrap();
        expect_error(r, 403, ErrorCode::InsufficientPermissions).await;
    }
    // `/pub/b%2F..%2Fa/x` is a `..` segment, not a way out of `/pub/b/`.
    let r = bearer(&under_b, Method::PUT, "/pub/b%2F..%2Fa%2Fx")
        .send()
        .await
        .unwrap();
    expect_error(r, 400, ErrorCode::InvalidPath).await;
}
