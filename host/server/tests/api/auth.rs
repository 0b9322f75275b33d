//! Signed-request checks over HTTP: malformed headers, skew, tampering, replay.

use homeserver_protocol::{AuthHeader, BodyHash, ErrorCode, Keypair};
use reqwest::Method;

use crate::fixture::*;

#[tokio::test]
async fn malformed_authorization_gets_401() {
    let host = TestHost::start().await;
    for value in ["Basic xyz", "Pk", "Pk a:b:c", "Pk a:b", "Bearer nope"] {
        let r = host
            .request(Method::PUT, "/pub/x")
            .header("Authorization", value)
            .body("x")
            .send()
            .await
            .unwrap();
        expect_error(r, 401, ErrorCode::InvalidSignature).await;
    }
}

#[tokio::test]
async fn writes_need_credentials() {
    let host = TestHost::start().await;
    let r = host
        .request(Method::PUT, "/pub/x")
        .body("x")
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
    let r = host.request(Method::DELETE, "/pub/x").send().await.unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
    // A list without credentials or host.
    let r = host.request(Method::GET, "/pub/").send().await.unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
}

#[tokio::test]
async fn clock_skew_is_refused() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    // 300 s is the bound. The future one has room: a loaded machine may take seconds
    // between signing and the server's check, which brings it closer to the bound.
    for ts in [now() - 301, now() + 330] {
        let r = host
            .signed_at(&alice, Method::PUT, "/pub/x", b"1", ts)
            .send()
            .await
            .unwrap();
        let e = expect_error(r, 401, ErrorCode::InvalidSignature).await;
        assert!(e.message.contains("clock"), "{}", e.message);
        let r = host
            .signed_at(&alice, Method::GET, "/pub/", b"", ts)
            .send()
            .await
            .unwrap();
        expect_error(r, 401, ErrorCode::InvalidSignature).await;
    }
    let r = host
        .signed_at(&alice, Method::PUT, "/pub/x", b"1", now() - 250)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn tampered_requests_are_refused() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let sign = |method: &str, target: &str, body: &[u8]| {
        AuthHeader::sign(&alice, method, target, now(), &BodyHash::of(body)).to_header_value()
    };
    // Body differs from the signed one.
    let r = host
        .request(Method::PUT, "/pub/x")
        .header("Authorization", sign("PUT", "/pub/x", b"good"))
        .body("evil")
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
    // Path differs.
    let r = host
        .request(Method::PUT, "/pub/y")
        .header("Authorization", sign("PUT", "/pub/x", b"good"))
        .body("good")
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
    // Query differs (the signature covers the query).
    let r = host
        .request(Method::GET, "/pub/?limit=5")
        .header("Authorization", sign("GET", "/pub/?limit=6", b""))
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
    // Method differs.
    let r = host
        .request(Method::DELETE, "/pub/x")
        .header("Authorization", sign("GET", "/pub/x", b""))
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
    // Nothing was written.
    expect_error(host.get(&alice, "/pub/x").await, 404, ErrorCode::NotFound).await;
    expect_error(host.get(&alice, "/pub/y").await, 404, ErrorCode::NotFound).await;
}

#[tokio::test]
async fn replayed_writes_are_refused_reads_are_not() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let ts = now();
    let first = host
        .signed_at(&alice, Method::PUT, "/pub/r", b"v1", ts)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let again = host
        .signed_at(&alice, Method::PUT, "/pub/r", b"v1", ts)
        .send()
        .await
        .unwrap();
    let e = expect_error(again, 401, ErrorCode::InvalidSignature).await;
    assert!(e.message.contains("replayed"), "{}", e.message);
    // Next second is a new signature.
    let next = host
        .signed_at(&alice, Method::PUT, "/pub/r", b"v1", ts + 1)
        .send()
        .await
        .unwrap();
    assert_eq!(next.status(), 200);

    // DELETE replay.
    let del = host
        .signed_at(&alice, Method::DELETE, "/pub/r", b"", ts)
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 200);
    host.put(&alice, "/pub/r", b"v2").await;
    let del_again = host
        .signed_at(&alice, Method::DELETE, "/pub/r", b"", ts)
        .send()
        .await
        .unwrap();
    expect_error(del_again, 401, ErrorCode::InvalidSignature).await;
    assert_eq!(
        host.get(&alice, "/pub/r").await.status(),
        200,
        "the replayed delete did nothing"
    );

    // Identical GETs are fine.
    for _ in 0..3 {
        let r = host
            .signed_at(&alice, Method::GET, "/pub/r", b"", ts)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

#[tokio::test]
async fn replay_marks_survive_restart() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let ts = now();
    let r = host
        .signed_at(&alice, Method::PUT, "/pub/r", b"v", ts)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let dir = host.stop().await;
    let config = test_config(dir.path());
    let host = TestHost::start_in(dir, config).await;
    let r = host
        .signed_at(&alice, Method::PUT, "/pub/r", b"v", ts)
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
}

#[tokio::test]
async fn writes_to_another_users_space_are_forbidden() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let bob = host.user().await;
    let r = host
        .signed(&bob, Method::PUT, "/pub/x", b"x")
        .header("Pubky-Host", alice.public_key().to_z32())
        .send()
        .await
        .unwrap();
    expect_error(r, 403, ErrorCode::InsufficientPermissions).await;
}

#[tokio::test]
async fn unregistered_keys_cannot_write() {
    let host = TestHost::start().await;
    let stranger = Keypair::random();
    let e = expect_error(
        host.put(&stranger, "/pub/x", b"x").await,
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;
    assert!(e.message.contains("signed up"));
    expect_error(
        host.delete(&stranger, "/pub/x").await,
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;
    // A forged request for an unregistered key is still a credentials error first.
    let header = AuthHeader::sign(&stranger, "PUT", "/pub/x", now(), &BodyHash::of(b"a"));
    let r = host
        .request(Method::PUT, "/pub/x")
        .header("Authorization", header.to_header_value())
        .body("b")
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
}
