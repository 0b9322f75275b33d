//! Rate limits (headers, 429 and recovery; bad and random credentials count against
//! the address; a refused write cannot be replayed later) and slow clients cut off.

use std::time::Duration;

use homeserver_protocol::{ErrorCode, Keypair};
use reqwest::Method;

use crate::fixture::*;

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

/// A refused HEAD carries no body, also over HTTP/2, where a DATA frame on a HEAD
/// stream is a protocol error the client resets the stream for (hyper's HTTP/1 drops a
/// HEAD answer's body itself, HTTP/2 sends what it is given).
#[tokio::test]
async fn a_refused_head_has_no_body_on_http2() {
    let host = TestHost::start_single_with(|c| {
        c.rate_limit.enabled = true;
        c.rate_limit.anonymous_per_minute = 2;
    })
    .await;
    let owner = Keypair::random();
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let r = h2
            .head(format!("{}/pub/x", host.url))
            .header("Pubky-Host", owner.public_key().to_z32())
            .send()
            .await
            .expect("an answer over HTTP/2");
        assert_eq!(r.version(), reqwest::Version::HTTP_2);
        let status = r.status().as_u16();
        let body = r.bytes().await.expect("a HEAD answer's body, empty");
        assert!(body.is_empty(), "{status}: {body:?}");
        statuses.push(status);
    }
    assert!(statuses.contains(&429), "{statuses:?}");
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
