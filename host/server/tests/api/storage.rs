//! PUT, GET, HEAD, DELETE of entries; ETag and conditional GET; public reads.

use homeserver_protocol::ErrorCode;
use homeserver_protocol::wire::{DeleteResult, PutResult};
use reqwest::{Method, StatusCode};

use crate::fixture::*;

#[tokio::test]
async fn put_get_overwrite_delete() {
    let host = TestHost::start().await;
    let alice = host.user().await;

    let put: PutResult =
        expect_ok_json(host.put(&alice, "/pub/app/note.txt", b"hello").await).await;
    assert_eq!(put.path, "/pub/app/note.txt");
    assert_eq!(put.size, 5);
    assert!(put.created_at.abs_diff(now() as i64) < 5);

    let r = host.get(&alice, "/pub/app/note.txt").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "application/octet-stream");
    assert_eq!(r.headers()["content-length"], "5");
    assert!(r.headers().contains_key("etag"));
    assert!(r.headers().contains_key("last-modified"));
    assert_eq!(r.bytes().await.unwrap(), "hello");

    // Overwrite keeps created_at, changes the bytes.
    let again: PutResult =
        expect_ok_json(host.put(&alice, "/pub/app/note.txt", b"hello, world").await).await;
    assert_eq!(again.created_at, put.created_at);
    assert_eq!(again.size, 12);
    let r = host.get(&alice, "/pub/app/note.txt").await;
    assert_eq!(r.bytes().await.unwrap(), "hello, world");

    let del: DeleteResult = expect_ok_json(host.delete(&alice, "/pub/app/note.txt").await).await;
    assert_eq!(del.path, "/pub/app/note.txt");
    expect_error(
        host.get(&alice, "/pub/app/note.txt").await,
        404,
        ErrorCode::NotFound,
    )
    .await;
    // Same request in the same second would be a replay: sign the retry a second later.
    let again = host
        .signed_at(&alice, Method::DELETE, "/pub/app/note.txt", b"", now() + 1)
        .send()
        .await
        .unwrap();
    expect_error(again, 404, ErrorCode::NotFound).await;
}

#[tokio::test]
async fn empty_and_binary_values() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    expect_ok_json::<PutResult>(host.put(&alice, "/pub/empty", b"").await).await;
    let r = host.get(&alice, "/pub/empty").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().len(), 0);

    let binary: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    expect_ok_json::<PutResult>(host.put(&alice, "/pub/bin", &binary).await).await;
    let r = host.get(&alice, "/pub/bin").await;
    assert_eq!(r.bytes().await.unwrap(), binary);
}

#[tokio::test]
async fn etag_head_and_if_none_match() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    host.put(&alice, "/pub/a", b"abc").await;
    let r = host.get(&alice, "/pub/a").await;
    let etag = r.headers()["etag"].to_str().unwrap().to_owned();
    // ETag is the base64 BLAKE3 of the content, quoted.
    use base64::Engine;
    let expected =
        base64::engine::general_purpose::STANDARD.encode(blake3::hash(b"abc").as_bytes());
    assert_eq!(etag, format!("\"{expected}\""));

    let r = host
        .signed(&alice, Method::GET, "/pub/a", b"")
        .header("If-None-Match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(r.headers()["etag"], etag.as_str());
    assert!(r.bytes().await.unwrap().is_empty());

    let r = host
        .signed(&alice, Method::GET, "/pub/a", b"")
        .header("If-None-Match", "\"other\", W/".to_owned() + &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);

    let r = host
        .signed(&alice, Method::GET, "/pub/a", b"")
        .header("If-None-Match", "\"stale\"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    let r = host
        .signed(&alice, Method::HEAD, "/pub/a", b"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-length"], "3");
    assert_eq!(r.headers()["etag"], etag.as_str());

    let r = host
        .request(Method::HEAD, "/pub/missing")
        .header("Pubky-Host", alice.public_key().to_z32())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn public_reads_by_header_or_query() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let bob = host.user().await;
    host.put(&alice, "/pub/post", b"public words").await;

    let r = host.public_get(&alice, "/pub/post").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap(), "public words");

    let target = format!("/pub/post?pubky-host={}", alice.public_key());
    let r = host.request(Method::GET, &target).send().await.unwrap();
    assert_eq!(r.bytes().await.unwrap(), "public words");

    // Bob's signed request naming Alice as host is a public read of Alice's data.
    let r = host
        .signed(&bob, Method::GET, "/pub/post", b"")
        .header("Pubky-Host", alice.public_key().to_z32())
        .send()
        .await
        .unwrap();
    assert_eq!(r.bytes().await.unwrap(), "public words");

    // A public listing.
    let r = host.public_get(&alice, "/pub/").await;
    let page: homeserver_protocol::wire::ListResult = expect_ok_json(r).await;
    assert_eq!(page.entries.len(), 1);

    // Bob's own space does not have it.
    expect_error(host.get(&bob, "/pub/post").await, 404, ErrorCode::NotFound).await;
}

#[tokio::test]
async fn public_read_errors() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    expect_error(
        host.request(Method::GET, "/pub/x").send().await.unwrap(),
        401,
        ErrorCode::InvalidSignature,
    )
    .await;
    expect_error(
        host.request(Method::GET, "/pub/x")
            .header("Pubky-Host", "nonsense")
            .send()
            .await
            .unwrap(),
        400,
        ErrorCode::BadRequest,
    )
    .await;
    expect_error(
        host.public_get(&alice, "/private/x").await,
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;
    expect_error(
        host.public_get(&alice, "/pub/x").await,
        404,
        ErrorCode::NotFound,
    )
    .await;
}

#[tokio::test]
async fn private_paths_are_reserved() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let e = expect_error(
        host.put(&alice, "/private/x", b"1").await,
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;
    assert!(e.message.contains("reserved"));
    expect_error(
        host.get(&alice, "/private/x").await,
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;
    expect_error(
        host.get(&alice, "/private/").await,
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;
    expect_error(
        host.delete(&alice, "/private/x").await,
        403,
        ErrorCode::InsufficientPermissions,
    )
    .await;
}

#[tokio::test]
async fn invalid_paths_get_400() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let long = format!("/pub/{}", "a".repeat(1100));
    for path in ["/pub//a", "/pub/a%20b", "/pubx", "/pub", long.as_str()] {
        expect_error(
            host.put(&alice, path, b"x").await,
            400,
            ErrorCode::InvalidPath,
        )
        .await;
        expect_error(host.get(&alice, path).await, 400, ErrorCode::InvalidPath).await;
    }
    // Dot segments, sent raw (HTTP clients normalize them away).
    for path in ["/pub/./a", "/pub/../x", "/pub/a/.."] {
        let response = raw_request(
            &host,
            &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(response.starts_with("HTTP/1.1 400"), "{path}: {response}");
        assert!(response.contains("invalid_path"), "{response}");
    }
    // Path errors come before credential errors.
    expect_error(
        host.request(Method::PUT, "/pub//a")
            .body("x")
            .send()
            .await
            .unwrap(),
        400,
        ErrorCode::InvalidPath,
    )
    .await;
    // A listing path cannot be written or deleted.
    expect_error(
        host.put(&alice, "/pub/dir/", b"x").await,
        400,
        ErrorCode::InvalidPath,
    )
    .await;
    expect_error(
        host.delete(&alice, "/pub/dir/").await,
        400,
        ErrorCode::InvalidPath,
    )
    .await;
}

#[tokio::test]
async fn unknown_routes_and_methods_get_json_errors() {
    let host = TestHost::start().await;
    expect_error(
        host.request(Method::GET, "/nothing").send().await.unwrap(),
        404,
        ErrorCode::NotFound,
    )
    .await;
    expect_error(
        host.request(Method::POST, "/pub/x").send().await.unwrap(),
        405,
        ErrorCode::MethodNotAllowed,
    )
    .await;
    expect_error(
        host.request(Method::GET, "/signup").send().await.unwrap(),
        405,
        ErrorCode::MethodNotAllowed,
    )
    .await;
}

#[tokio::test]
async fn large_value_streams_through() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let value: Vec<u8> = (0..9 * 1024 * 1024).map(|i: u32| (i % 251) as u8).collect();
    let put: PutResult = expect_ok_json(host.put(&alice, "/pub/big", &value).await).await;
    assert_eq!(put.size, value.len() as u64);
    let r = host.get(&alice, "/pub/big").await;
    assert_eq!(
        r.headers()["content-length"],
        value.len().to_string().as_str()
    );
    let got = r.bytes().await.unwrap();
    assert!(got == value, "large value round-trips");
}

#[tokio::test]
async fn data_survives_restart() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    host.put(&alice, "/pub/keep", b"still here").await;
    let dir = host.stop().await;
    let config = test_config(dir.path());
    let host = TestHost::start_in(dir, config).await;
    let r = host.get(&alice, "/pub/keep").await;
    assert_eq!(r.bytes().await.unwrap(), "still here");
}
