//! Small values in their rows (`storage.inline_max_bytes`): up to the limit a value is
//! kept in its entry's row, past it in a blob, however the body comes (a declared
//! length, a chunked body that stays under the limit or grows past it, a signature
//! checked before or after the body); each reads back byte for byte and overwrites in
//! either direction leave no blob behind but the live ones. On every backend pair.

use homeserver::persistence::metadata::Stored;
use homeserver_protocol::wire::PutResult;
use reqwest::Method;

use crate::fixture::*;

const LIMIT: u64 = 1000;

fn value(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A PUT with a chunked body (no Content-Length), signed over the whole body.
async fn put_chunked(host: &TestHost, key: &homeserver_protocol::Keypair, path: &str, body: &[u8]) {
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(300).map(|c| Ok(c.to_vec())).collect();
    let header = homeserver_protocol::AuthHeader::sign(
        key,
        "PUT",
        path,
        now(),
        &homeserver_protocol::BodyHash::of(body),
    );
    let r = host
        .request(Method::PUT, path)
        .header("Authorization", header.to_header_value())
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    let put: PutResult = expect_ok_json(r).await;
    assert_eq!(put.size, body.len() as u64);
}

async fn stored(host: &TestHost, user: &str, path: &str) -> Stored {
    let ctx = host.server().context();
    ctx.stores()
        .metadata
        .entry(user, path)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no entry at {path}"))
        .stored
}

#[tokio::test]
async fn small_values_live_in_their_rows_and_large_ones_in_blobs() {
    let host = TestHost::start_with(|c| c.storage.inline_max_bytes = LIMIT).await;
    let alice = host.user().await;
    let user = alice.public_key().to_z32();
    let limit = LIMIT as usize;

    // (path, value, how it is sent, kept inline?)
    let cases: Vec<(&str, Vec<u8>, &str, bool)> = vec![
        ("/pub/empty", Vec::new(), "signed", true),
        ("/pub/at-limit", value(limit, 1), "signed", true),
        ("/pub/over-limit", value(limit + 1, 2), "signed", false),
        ("/pub/digest", value(limit, 3), "digest", true),
        ("/pub/digest-over", value(limit + 1, 4), "digest", false),
        ("/pub/chunked", value(limit - 100, 5), "chunked", true),
        ("/pub/chunked-over", value(limit + 500, 6), "chunked", false),
    ];
    for (path, body, how, _) in &cases {
        match *how {
            "chunked" => put_chunked(&host, &alice, path, body).await,
            "digest" => {
                let r = host
                    .signed_with_digest(&alice, Method::PUT, path, body)
                    .send()
                    .await
                    .unwrap();
                let _: PutResult = expect_ok_json(r).await;
            }
            _ => {
                let _: PutResult = expect_ok_json(host.put(&alice, path, body).await).await;
            }
        }
    }
    for (path, body, how, inline) in &cases {
        let r = host.get(&alice, path).await;
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(
            r.headers()["content-length"].to_str().unwrap(),
            body.len().to_string(),
            "{path}"
        );
        assert!(
            r.bytes().await.unwrap() == body[..],
            "{path}: read back whole"
        );
        let kind = stored(&host, &user, path).await;
        assert_eq!(
            matches!(kind, Stored::Inline(_)),
            *inline,
            "{path} ({how}, {} bytes): {kind:?}",
            body.len()
        );
    }
    let blobs = crate::backend::blob_keys(&host.server().context().stores().blobs, &user).await;
    assert_eq!(
        blobs.len(),
        3,
        "one blob for each value past the limit: {blobs:?}"
    );

    // Overwrites both ways: a blob replaced by a small value is retired (and swept);
    // a small value replaced by a blob retires nothing.
    let small = value(10, 7);
    let _: PutResult = expect_ok_json(host.put(&alice, "/pub/over-limit", &small).await).await;
    let big = value(limit + 9, 8);
    let _: PutResult = expect_ok_json(host.put(&alice, "/pub/at-limit", &big).await).await;
    for (path, body) in [("/pub/over-limit", &small), ("/pub/at-limit", &big)] {
        let r = host.get(&alice, path).await;
        assert!(
            r.bytes().await.unwrap() == body[..],
            "{path} after an overwrite"
        );
    }
    let ctx = host.server().context();
    let stores = ctx.stores();
    stores
        .blobs
        .sweep_retired(stores.metadata.as_ref(), std::time::Duration::ZERO)
        .await
        .unwrap();
    let blobs = crate::backend::blob_keys(&stores.blobs, &user).await;
    assert_eq!(blobs.len(), 3, "the live blobs only: {blobs:?}");
    // Usage counts inline values like any other.
    let account: serde_json::Value = expect_ok_json(
        host.signed(&alice, Method::GET, "/account", b"")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let expected: usize = cases
        .iter()
        .map(|(path, body, _, _)| match *path {
            "/pub/over-limit" => small.len(),
            "/pub/at-limit" => big.len(),
            _ => body.len(),
        })
        .sum();
    assert_eq!(account["used_bytes"], expected as u64);
}

/// With `inline_max_bytes = 0` every value goes to the blob store, the empty one too.
#[tokio::test]
async fn zero_keeps_every_value_in_the_blob_store() {
    let host = TestHost::start_with(|c| c.storage.inline_max_bytes = 0).await;
    let alice = host.user().await;
    let user = alice.public_key().to_z32();
    for (path, body) in [("/pub/empty", &b""[..]), ("/pub/one", &b"1"[..])] {
        let _: PutResult = expect_ok_json(host.put(&alice, path, body).await).await;
        assert!(
            stored(&host, &user, path).await.blob_key().is_some(),
            "{path}"
        );
        let r = host.get(&alice, path).await;
        assert!(r.bytes().await.unwrap() == body, "{path}");
    }
}

/// A value kept in its row that is not what its entry records (a damaged database):
/// fsck reports it, and a GET fails (500) instead of sending a body of another size.
#[tokio::test]
async fn a_damaged_inline_value_is_reported_and_never_served() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let user = alice.public_key().to_z32();
    let _: PutResult = expect_ok_json(host.put(&alice, "/pub/fine", b"fine").await).await;
    let damaged = value(77, 9);
    let _: PutResult = expect_ok_json(host.put(&alice, "/pub/damaged", &damaged).await).await;
    let ctx = host.server().context();
    // One byte cut off the value, behind the server's back (substr works on BLOB and
    // BYTEA alike; 77 bytes picks the row).
    crate::backend::execute_with_i64(
        &ctx.config.storage.database_url,
        "UPDATE entries SET inline_value = substr(inline_value, 2) WHERE size = ?",
        77,
    )
    .await;
    let report = homeserver::service::maintenance::fsck(
        ctx.stores(),
        false,
        ctx.config.orphan_min_age(),
        &homeserver::service::maintenance::Quiet,
    )
    .await
    .unwrap();
    assert_eq!(report.inline_values, 2, "{report:?}");
    let damaged_paths: Vec<_> = report
        .damaged_values
        .iter()
        .map(|d| (d.user.as_str(), d.path.as_str()))
        .collect();
    assert_eq!(damaged_paths, [(user.as_str(), "/pub/damaged")]);
    assert!(!report.is_clean());
    assert_eq!(host.get(&alice, "/pub/damaged").await.status(), 500);
    let r = host.get(&alice, "/pub/fine").await;
    assert_eq!(r.bytes().await.unwrap(), "fine");
}
