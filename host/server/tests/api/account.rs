//! `GET /account`: the caller's own account (what `pk whoami` shows), for a signed
//! request or a session, with usage that follows writes and the quota in force.

use homeserver_protocol::wire::AccountInfo;
use homeserver_protocol::{ErrorCode, Keypair};
use reqwest::Method;
use serde_json::{Value, json};

use crate::fixture::*;

async fn account(host: &TestHost, key: &Keypair) -> AccountInfo {
    expect_ok_json(
        host.signed(key, Method::GET, "/account", b"")
            .send()
            .await
            .unwrap(),
    )
    .await
}

#[tokio::test]
async fn shows_usage_quota_and_limits() {
    let host = TestHost::start_with(|c| {
        c.storage.quota_bytes = 1000;
        c.storage.max_value_bytes = 600;
    })
    .await;
    let alice = host.user().await;
    let fresh = account(&host, &alice).await;
    assert_eq!(fresh.public_key, alice.public_key().to_z32());
    assert!((fresh.created_at - now() as i64).abs() <= 5, "{fresh:?}");
    assert_eq!(
        (fresh.used_bytes, fresh.quota_bytes, fresh.max_value_bytes),
        (0, 1000, 600)
    );
    assert!(!fresh.disabled);

    // Usage follows writes, overwrites and deletes.
    assert_eq!(host.put(&alice, "/pub/a", &[1; 300]).await.status(), 200);
    assert_eq!(host.put(&alice, "/pub/b", &[2; 100]).await.status(), 200);
    assert_eq!(account(&host, &alice).await.used_bytes, 400);
    assert_eq!(host.put(&alice, "/pub/a", &[3; 50]).await.status(), 200);
    assert_eq!(host.delete(&alice, "/pub/b").await.status(), 200);
    assert_eq!(account(&host, &alice).await.used_bytes, 50);

    // The operator's per-user quota and the disabled flag show.
    let key = alice.public_key().to_z32();
    let r = host
        .admin(Method::PUT, &format!("/admin/users/{key}/quota"))
        .json(&json!({"quota_bytes": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = host
        .admin(Method::POST, &format!("/admin/users/{key}/disable"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let shown = account(&host, &alice).await;
    assert_eq!(shown.quota_bytes, 0, "0 = unlimited");
    assert!(shown.disabled);

    // Only the caller's own account, whatever the request names.
    let bob = host.user().await;
    let r = host
        .signed(&bob, Method::GET, "/account", b"")
        .header("Pubky-Host", key.as_str())
        .send()
        .await
        .unwrap();
    let seen: AccountInfo = expect_ok_json(r).await;
    assert_eq!(seen.public_key, bob.public_key().to_z32());
}

#[tokio::test]
async fn a_session_sees_its_owners_account() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let body = serde_json::to_vec(&json!({"capabilities": ["read:/pub/app/"]})).unwrap();
    let created: Value = expect_ok_json(
        host.signed(&alice, Method::POST, "/auth/session", &body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    let token = created["token"].as_str().unwrap();
    let r = host
        .request(Method::GET, "/account")
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let shown: AccountInfo = expect_ok_json(r).await;
    assert_eq!(shown.public_key, alice.public_key().to_z32());

    let r = host
        .request(Method::GET, "/account")
        .bearer_auth("not-a-token")
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
}

#[tokio::test]
async fn refusals() {
    let host = TestHost::start().await;
    // No credentials.
    let r = host.request(Method::GET, "/account").send().await.unwrap();
    let e = expect_error(r, 401, ErrorCode::InvalidSignature).await;
    assert!(e.message.contains("missing credentials"), "{}", e.message);
    // A key that never signed up: 404 saying so.
    let stranger = Keypair::random();
    let r = host
        .signed(&stranger, Method::GET, "/account", b"")
        .send()
        .await
        .unwrap();
    let e = expect_error(r, 404, ErrorCode::NotFound).await;
    assert!(e.message.contains("sign up"), "{}", e.message);
    // A signature over another request.
    let alice = host.user().await;
    let r = host
        .signed(&alice, Method::GET, "/account?x=1", b"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "a query is part of the signed target");
    let header = homeserver_protocol::AuthHeader::sign(
        &alice,
        "GET",
        "/pub/",
        now(),
        &homeserver_protocol::BodyHash::empty(),
    );
    let r = host
        .request(Method::GET, "/account")
        .header("Authorization", header.to_header_value())
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
    // Only GET.
    let r = host
        .signed(&alice, Method::POST, "/account", b"")
        .send()
        .await
        .unwrap();
    expect_error(r, 405, ErrorCode::MethodNotAllowed).await;
}

#[tokio::test]
async fn listings_carry_the_content_hash_of_each_entry() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    assert_eq!(host.put(&alice, "/pub/h/one", b"first").await.status(), 200);
    assert_eq!(host.put(&alice, "/pub/h/d/two", b"").await.status(), 200);
    let etag = host
        .get(&alice, "/pub/h/one")
        .await
        .headers()
        .get("etag")
        .unwrap()
        .to_str()
        .unwrap()
        .trim_matches('"')
        .to_owned();
    let listing: Value = expect_ok_json(host.get(&alice, "/pub/h/").await).await;
    let entries = listing["entries"].as_array().unwrap();
    assert_eq!(entries[0]["path"], "/pub/h/d/two");
    assert_eq!(
        entries[0]["content_hash"],
        homeserver_protocol::event::encode_content_hash(blake3::hash(b"").as_bytes())
    );
    assert_eq!(entries[1]["content_hash"], etag.as_str());
    // Folders of a shallow listing have none.
    let shallow: Value = expect_ok_json(host.get(&alice, "/pub/h/?shallow=true").await).await;
    assert_eq!(shallow["entries"][0]["path"], "/pub/h/d/");
    assert!(shallow["entries"][0].get("content_hash").is_none());
}
