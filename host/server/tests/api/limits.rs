//! Value size limit (413) and per-user quota (507), and their precedence.

use homeserver_protocol::ErrorCode;
use homeserver_protocol::wire::PutResult;
use reqwest::Method;

use crate::fixture::*;

#[tokio::test]
async fn size_limit_with_content_length() {
    let host = TestHost::start_with(|c| c.storage.max_value_bytes = 1000).await;
    let alice = host.user().await;
    expect_ok_json::<PutResult>(host.put(&alice, "/pub/ok", &[1; 1000]).await).await;
    let e = expect_error(
        host.put(&alice, "/pub/big", &[1; 1001]).await,
        413,
        ErrorCode::PayloadTooLarge,
    )
    .await;
    assert_eq!(e.details["max_value_bytes"], 1000);
    expect_error(host.get(&alice, "/pub/big").await, 404, ErrorCode::NotFound).await;
}

#[tokio::test]
async fn size_limit_without_content_length_counts_the_stream() {
    let host = TestHost::start_with(|c| c.storage.max_value_bytes = 100_000).await;
    let alice = host.user().await;
    let body = vec![7u8; 150_000];
    // A chunked body: no Content-Length, so the server must count while streaming.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(10_000).map(|c| Ok(c.to_vec())).collect();
    let stream = futures_util::stream::iter(chunks);
    let header = homeserver_protocol::AuthHeader::sign(
        &alice,
        "PUT",
        "/pub/chunked",
        now(),
        &homeserver_protocol::BodyHash::of(&body),
    );
    let r = host
        .request(Method::PUT, "/pub/chunked")
        .header("Authorization", header.to_header_value())
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    expect_error(r, 413, ErrorCode::PayloadTooLarge).await;
    expect_error(
        host.get(&alice, "/pub/chunked").await,
        404,
        ErrorCode::NotFound,
    )
    .await;

    // Within the limit, chunked works.
    let small = vec![3u8; 50_000];
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        small.chunks(7_000).map(|c| Ok(c.to_vec())).collect();
    let header = homeserver_protocol::AuthHeader::sign(
        &alice,
        "PUT",
        "/pub/chunked",
        now(),
        &homeserver_protocol::BodyHash::of(&small),
    );
    let r = host
        .request(Method::PUT, "/pub/chunked")
        .header("Authorization", header.to_header_value())
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    let put: PutResult = expect_ok_json(r).await;
    assert_eq!(put.size, 50_000);
}

#[tokio::test]
async fn quota_counts_overwrites_and_deletes() {
    let host = TestHost::start_with(|c| c.storage.quota_bytes = 1000).await;
    let alice = host.user().await;
    expect_ok_json::<PutResult>(host.put(&alice, "/pub/a", &[0; 600]).await).await;
    // 600 + 500 > 1000.
    let e = expect_error(
        host.put(&alice, "/pub/b", &[0; 500]).await,
        507,
        ErrorCode::StorageQuotaExceeded,
    )
    .await;
    assert_eq!(e.details["quota_bytes"], 1000);
    // Overwriting a counts the difference: 900 in all.
    expect_ok_json::<PutResult>(host.put(&alice, "/pub/a", &[1; 900]).await).await;
    expect_ok_json::<PutResult>(host.put(&alice, "/pub/b", &[1; 100]).await).await;
    expect_error(
        host.put(&alice, "/pub/c", &[1; 1]).await,
        507,
        ErrorCode::StorageQuotaExceeded,
    )
    .await;
    // Shrinking and deleting free space.
    expect_ok_json::<PutResult>(host.put(&alice, "/pub/a", &[2; 100]).await).await;
    expect_ok_json::<PutResult>(host.put(&alice, "/pub/c", &[2; 800]).await).await;
    assert_eq!(host.delete(&alice, "/pub/c").await.status(), 200);
    expect_ok_json::<PutResult>(host.put(&alice, "/pub/d", &[2; 800]).await).await;
    // The refused writes stored nothing.
    let used = host
        .server()
        .context()
        .stores()
        .metadata
        .user(&alice.public_key().to_z32())
        .await
        .unwrap()
        .unwrap()
        .used_bytes;
    assert_eq!(used, 100 + 100 + 800);
}

#[tokio::test]
async fn zero_quota_is_unlimited() {
    let host = TestHost::start_with(|c| {
        c.storage.quota_bytes = 0;
        c.storage.max_value_bytes = 2_000_000;
    })
    .await;
    let alice = host.user().await;
    for i in 0..3 {
        expect_ok_json::<PutResult>(
            host.put(&alice, &format!("/pub/{i}"), &vec![0; 1_500_000])
                .await,
        )
        .await;
    }
}

/// A value declared small enough for its entry's row is refused by the commit (no
/// database read before its body); a larger one before its body is read. Both answer
/// alike, store nothing and spend the signature.
#[tokio::test]
async fn small_and_large_writes_are_refused_alike() {
    let host = TestHost::start_with(|c| c.storage.quota_bytes = 20_000).await;
    let alice = host.user().await;
    expect_ok_json::<PutResult>(host.put(&alice, "/pub/a", &[1; 10_000]).await).await;
    let small = vec![2u8; 12_000]; // under the 16 KiB inline limit
    let large = vec![3u8; 17_000];
    let (host_ref, alice_ref) = (&host, &alice);
    for (path, body) in [("/pub/small", &small), ("/pub/large", &large)] {
        // The same signed request each time it is sent.
        let ts = now();
        let send = move || async move {
            host_ref
                .signed_at(alice_ref, Method::PUT, path, body, ts)
                .send()
                .await
                .unwrap()
        };
        expect_error(send().await, 507, ErrorCode::StorageQuotaExceeded).await;
        expect_error(host.get(&alice, path).await, 404, ErrorCode::NotFound).await;
        // Refused, the signature is spent all the same.
        expect_error(send().await, 401, ErrorCode::InvalidSignature).await;
    }
    // A key that never signed up: 403 either way, nothing stored.
    let stranger = homeserver_protocol::Keypair::random();
    for (path, body) in [("/pub/small", &small), ("/pub/large", &large)] {
        expect_error(
            host.put(&stranger, path, body).await,
            403,
            ErrorCode::InsufficientPermissions,
        )
        .await;
    }
    let account: serde_json::Value = expect_ok_json(host.get(&alice, "/account").await).await;
    assert_eq!(account["used_bytes"], 10_000, "{account}");
}

#[tokio::test]
async fn precedence_credentials_before_size_and_quota() {
    let host = TestHost::start_with(|c| c.storage.quota_bytes = 10).await;
    let alice = host.user().await;
    // Over quota but the signature is forged: 401, not 507.
    let header = homeserver_protocol::AuthHeader::sign(
        &alice,
        "PUT",
        "/pub/x",
        now(),
        &homeserver_protocol::BodyHash::of(b"something else"),
    );
    let r = host
        .request(Method::PUT, "/pub/x")
        .header("Authorization", header.to_header_value())
        .body(vec![0u8; 50])
        .send()
        .await
        .unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
    // Genuine and over quota: 507.
    expect_error(
        host.put(&alice, "/pub/x", &[0; 50]).await,
        507,
        ErrorCode::StorageQuotaExceeded,
    )
    .await;
    // Invalid path beats missing credentials.
    let r = host
        .request(Method::PUT, "/pub/a b")
        .body("x")
        .send()
        .await
        .unwrap();
    expect_error(r, 400, ErrorCode::InvalidPath).await;
}

#[tokio::test]
async fn orphaned_blobs_are_swept() {
    // Every value in a blob, however small: the test is about blobs.
    let host = TestHost::start_with(|c| c.storage.inline_max_bytes = 0).await;
    let alice = host.user().await;
    let user = alice.public_key().to_z32();
    host.put(&alice, "/pub/a", b"one").await;
    host.put(&alice, "/pub/a", b"two").await; // the first blob becomes garbage
    let ctx = host.server().context();
    // Plant an orphan as a crash would leave it (between blob write and commit)...
    ctx.stores()
        .blobs
        .put_bytes(
            &format!("{user}/0190a0a0-0000-7000-8000-000000000000"),
            "orphan".into(),
        )
        .await
        .unwrap();
    // ...and, on the local disk, a staging file of an interrupted upload.
    let staging = host
        .dir
        .path()
        .join("blobs")
        .join(&user)
        .join("0190a0a0-0000-7000-8000-000000000001#3");
    let local = crate::backend::Blobs::current() == crate::backend::Blobs::File;
    if local {
        std::fs::write(&staging, b"partial").unwrap();
    }
    ctx.stores()
        .blobs
        .sweep(ctx.stores().metadata.as_ref(), std::time::Duration::ZERO)
        .await
        .unwrap();
    let left = crate::backend::blob_keys(&ctx.stores().blobs, &user).await;
    assert_eq!(
        left.len(),
        2,
        "the orphan went; the live blob and the replaced one (retired, for its grace \
         period) stay: {left:?}"
    );
    ctx.stores()
        .blobs
        .sweep_retired(ctx.stores().metadata.as_ref(), std::time::Duration::ZERO)
        .await
        .unwrap();
    let left = crate::backend::blob_keys(&ctx.stores().blobs, &user).await;
    assert_eq!(left.len(), 1, "only the live blob stays: {left:?}");
    if local {
        assert!(!staging.exists(), "the staging file was swept");
    }
    let r = host.get(&alice, "/pub/a").await;
    assert_eq!(r.bytes().await.unwrap(), "two");
}
