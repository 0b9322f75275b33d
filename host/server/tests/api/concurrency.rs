//! Concurrent writers: one path, and one user's quota.

use homeserver_protocol::wire::ListResult;
use homeserver_protocol::{ErrorBody, ErrorCode};
use reqwest::Method;

use crate::fixture::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_writers_on_one_path() {
    // Every value in a blob: the test counts the blobs the overwrites retire.
    let host = std::sync::Arc::new(TestHost::start_with(|c| c.storage.inline_max_bytes = 0).await);
    let alice = host.user().await;
    let writers = 40;
    let mut tasks = Vec::new();
    for i in 0..writers {
        let host = host.clone();
        let alice = alice.clone();
        tasks.push(tokio::spawn(async move {
            let body = format!("writer {i} ").repeat(100 + i);
            let r = host.put(&alice, "/pub/contended", body.as_bytes()).await;
            (r.status().as_u16(), body)
        }));
    }
    let mut bodies = Vec::new();
    for t in tasks {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, 200);
        bodies.push(body);
    }
    let r = host.get(&alice, "/pub/contended").await;
    let final_body = r.text().await.unwrap();
    assert!(
        bodies.contains(&final_body),
        "the value is one writer's, whole"
    );

    let ctx = host.server().context();
    let used = ctx
        .stores()
        .metadata
        .user(&alice.public_key().to_z32())
        .await
        .unwrap()
        .unwrap()
        .used_bytes;
    assert_eq!(
        used,
        final_body.len() as u64,
        "usage counts the one surviving value"
    );
    assert_eq!(
        ctx.stores().metadata.latest_cursor().await.unwrap(),
        writers as u64,
        "one event per write"
    );

    // Replaced blobs are retired, not deleted: all stay for the grace period, and the
    // sweep of retired blobs then leaves only the live one.
    let user = alice.public_key().to_z32();
    let stores = ctx.stores();
    assert_eq!(
        crate::backend::blob_keys(&stores.blobs, &user).await.len(),
        writers
    );
    let grace = std::time::Duration::from_secs(ctx.config.storage.blob_grace_secs);
    assert_eq!(
        stores
            .blobs
            .sweep_retired(stores.metadata.as_ref(), grace)
            .await
            .unwrap(),
        0,
        "nothing is past its grace yet"
    );
    stores
        .blobs
        .sweep_retired(stores.metadata.as_ref(), std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        crate::backend::blob_keys(&stores.blobs, &user).await.len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_writers_near_quota() {
    let host = std::sync::Arc::new(TestHost::start_with(|c| c.storage.quota_bytes = 10_000).await);
    let alice = host.user().await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let host = host.clone();
        let alice = alice.clone();
        tasks.push(tokio::spawn(async move {
            let r = host.put(&alice, &format!("/pub/q/{i}"), &[9u8; 1000]).await;
            let status = r.status().as_u16();
            if status != 200 {
                let e: ErrorBody = r.json().await.unwrap();
                assert_eq!(e.error, ErrorCode::StorageQuotaExceeded);
            }
            status
        }));
    }
    let mut ok = 0;
    let mut full = 0;
    for t in tasks {
        match t.await.unwrap() {
            200 => ok += 1,
            507 => full += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!((ok, full), (10, 30));
    let page: ListResult = expect_ok_json(
        host.signed(&alice, Method::GET, "/pub/q/", b"")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(page.entries.len(), 10);
    let ctx = host.server().context();
    let used = ctx
        .stores()
        .metadata
        .user(&alice.public_key().to_z32())
        .await
        .unwrap()
        .unwrap()
        .used_bytes;
    assert_eq!(used, 10_000);
}
