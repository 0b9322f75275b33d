//! Signup tokens: minted by the admin, redeemed once (two signups racing for one token:
//! one wins), and the public check with its own limit.

use std::sync::Arc;

use homeserver_protocol::wire::SignupTokenStatus;
use homeserver_protocol::{ErrorCode, Keypair};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::fixture::*;

async fn new_token(host: &TestHost) -> String {
    let body: Value = expect_ok_json(
        host.admin(Method::POST, "/admin/signup_tokens")
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
