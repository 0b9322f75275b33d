//! Signup in open and token mode.

use homeserver_protocol::wire::SignupResult;
use homeserver_protocol::{ErrorCode, Keypair};
use reqwest::{Method, StatusCode};

use crate::fixture::*;

#[tokio::test]
async fn open_signup_is_idempotent() {
    let host = TestHost::start().await;
    let key = Keypair::random();
    let r = host
        .signed(&key, Method::POST, "/signup", b"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let first: SignupResult = r.json().await.unwrap();
    assert_eq!(first.public_key, key.public_key().to_z32());
    // A later signup (new timestamp, so not a replay) answers 200 with the same record.
    let r = host
        .signed_at(&key, Method::POST, "/signup", b"", now() + 1)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let second: SignupResult = r.json().await.unwrap();
    assert_eq!(second, first);
}

#[tokio::test]
async fn signup_errors() {
    let host = TestHost::start().await;
    let r = host.request(Method::POST, "/signup").send().await.unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
    let key = Keypair::random();
    let ts = now();
    let r = host
        .signed_at(&key, Method::POST, "/signup", b"", ts)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = host
        .signed_at(&key, Method::POST, "/signup", b"", ts)
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
}

#[tokio::test]
async fn token_mode_requires_a_valid_token() {
    let host =
        TestHost::start_with(|c| c.signup.mode = homeserver::config::SignupMode::Token).await;
    let key = Keypair::random();
    let r = host
        .signed(&key, Method::POST, "/signup", b"")
        .send()
        .await
        .unwrap();
    let e = expect_error(r, 403, ErrorCode::InsufficientPermissions).await;
    assert!(e.message.contains("token"));
    let r = host
        .signed(&key, Method::POST, "/signup?signup_token=bad", b"")
        .send()
        .await
        .unwrap();
    expect_error(r, 400, ErrorCode::BadRequest).await;
    let r = host
        .signed(
            &key,
            Method::POST,
            "/signup?signup_token=ABCD-EFGH-2345",
            b"",
        )
        .send()
        .await
        .unwrap();
    let e = expect_error(r, 403, ErrorCode::InsufficientPermissions).await;
    assert!(e.message.contains("unknown"));
}
