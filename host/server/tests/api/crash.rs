//! `kill -9` of the real binary in the middle of uploads: after a restart every
//! acknowledged write is there (or the write to its path that was in flight at the
//! kill), every entry is whole (its bytes match its size and ETag), usage matches the
//! entries, and the server serves. On the suite's backends: with HS_TEST_BLOBS=s3 the
//! large upload is a multipart one, cut off by the kill.

use std::time::Duration;

use base64::Engine;
use homeserver_protocol::wire::ListResult;
use homeserver_protocol::{AuthHeader, BodyHash, Keypair};
use reqwest::Method;

use crate::fixture::{now, signed_request};
use crate::process::{ServerProcess, free_port};

/// The metadata database of the server whose working dir is `dir`.
fn database_url(dir: &std::path::Path) -> homeserver::persistence::DatabaseUrl {
    crate::backend::database_url_for(&dir.join("data"))
}

/// The real binary on `dir`'s data (the suite's backends), quota off.
async fn start(dir: &std::path::Path, port: u16) -> ServerProcess {
    let mut env = crate::backend::server_env(&dir.join("data"));
    env.push(("HOMESERVER__STORAGE__QUOTA_BYTES".into(), "0".into()));
    ServerProcess::start(dir, port, &env).await
}

/// A slow streamed upload: the body trickles in so the kill lands mid-stream. 6 MiB:
/// above the S3 part size, so on S3 it is a multipart upload.
fn slow_upload(
    http: &reqwest::Client,
    url: &str,
    key: &Keypair,
    target: &str,
) -> reqwest::RequestBuilder {
    let body: Vec<u8> = vec![5u8; 6 * 1024 * 1024];
    let header = AuthHeader::sign(key, "PUT", target, now(), &BodyHash::of(&body));
    let chunks: Vec<Vec<u8>> = body.chunks(64 * 1024).map(<[u8]>::to_vec).collect();
    let stream = futures_util::stream::unfold(chunks.into_iter(), |mut it| async move {
        tokio::time::sleep(Duration::from_millis(15)).await;
        it.next().map(|c| (Ok::<_, std::io::Error>(c), it))
    });
    http.request(Method::PUT, format!("{url}{target}"))
        .header("Authorization", header.to_header_value())
        .header("Content-Length", body.len())
        .body(reqwest::Body::wrap_stream(stream))
}

/// The writer's record: what each path was last acknowledged to hold, and the write
/// sent but not answered yet.
#[derive(Default)]
struct Ledger {
    acknowledged: std::collections::HashMap<String, Vec<u8>>,
    in_flight: Option<(String, Vec<u8>)>,
}

async fn check_consistent(url: &str, key: &Keypair, dir: &std::path::Path) -> usize {
    let http = reqwest::Client::new();
    let page: ListResult = signed_request(
        &http,
        url,
        key,
        Method::GET,
        "/pub/?limit=1000",
        vec![],
        now(),
    )
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let mut total = 0;
    for entry in &page.entries {
        let r = signed_request(&http, url, key, Method::GET, &entry.path, vec![], now())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{} is readable", entry.path);
        let etag = r.headers()["etag"].to_str().unwrap().to_owned();
        let bytes = r.bytes().await.unwrap();
        assert_eq!(
            Some(bytes.len() as u64),
            entry.size,
            "{} is whole",
            entry.path
        );
        let hash =
            base64::engine::general_purpose::STANDARD.encode(blake3::hash(&bytes).as_bytes());
        assert_eq!(
            etag,
            format!("\"{hash}\""),
            "{} matches its hash",
            entry.path
        );
        total += bytes.len() as u64;
    }
    // Usage agrees with the entries.
    let store = homeserver::persistence::open_metadata(&database_url(dir), &Default::default())
        .await
        .unwrap();
    let used = store
        .user(&key.public_key().to_z32())
        .await
        .unwrap()
        .unwrap()
        .used_bytes;
    store.close().await;
    assert_eq!(used, total, "usage matches the stored entries");
    page.entries.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_during_uploads_leaves_store_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let key = Keypair::random();
    let http = reqwest::Client::new();
    let mut server = start(dir.path(), port).await;
    let r = signed_request(
        &http,
        &server.url,
        &key,
        Method::POST,
        "/signup",
        vec![],
        now(),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 201);

    for round in 0..3u64 {
        // Writers: a slow large upload plus a stream of small overwrites and new entries.
        let url = server.url.clone();
        let slow = tokio::spawn(slow_upload(&http, &url, &key, &format!("/pub/big{round}")).send());
        let acked = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        // What each path was last acknowledged to hold, and the write in flight.
        let ledger = std::sync::Arc::new(std::sync::Mutex::new(Ledger::default()));
        let writer = {
            let (http, url, key) = (http.clone(), url.clone(), key.clone());
            let (acked, ledger) = (acked.clone(), ledger.clone());
            tokio::spawn(async move {
                for i in 0u64.. {
                    let body = format!("round {round} value {i} ")
                        .repeat(1 + (i as usize % 50))
                        .into_bytes();
                    let target = format!("/pub/small/{}", i % 7);
                    ledger.lock().unwrap().in_flight = Some((target.clone(), body.clone()));
                    let sent = signed_request(
                        &http,
                        &url,
                        &key,
                        Method::PUT,
                        &target,
                        body.clone(),
                        now() + i % 100,
                    )
                    .send()
                    .await;
                    match sent {
                        Ok(r) if r.status() == 200 => {
                            let mut ledger = ledger.lock().unwrap();
                            ledger.in_flight = None;
                            ledger.acknowledged.insert(target, body);
                            acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            })
        };
        // Some writes answered first (a loaded machine may take a while), then a little
        // more so the kill lands in the middle of the stream.
        crate::fixture::eventually("a write answered", Duration::from_secs(60), || {
            let acked = acked.clone();
            async move { acked.load(std::sync::atomic::Ordering::SeqCst) > 0 }
        })
        .await;
        tokio::time::sleep(Duration::from_millis(100 + round * 150)).await;
        // kill -9
        server.kill();
        let _ = slow.await;
        writer.await.unwrap();

        server = start(dir.path(), port).await;
        let entries = check_consistent(&server.url, &key, dir.path()).await;
        // Nothing acknowledged was lost: each path holds what it was last acknowledged
        // to hold, or what the write in flight at the kill sent.
        let ledger = std::mem::take(&mut *ledger.lock().unwrap());
        for (path, body) in &ledger.acknowledged {
            let r = signed_request(&http, &server.url, &key, Method::GET, path, vec![], now())
                .send()
                .await
                .unwrap();
            assert_eq!(
                r.status(),
                200,
                "round {round}: acknowledged {path} is there"
            );
            let stored = r.bytes().await.unwrap();
            let in_flight = ledger
                .in_flight
                .as_ref()
                .is_some_and(|(p, b)| p == path && stored == b[..]);
            assert!(
                stored == body[..] || in_flight,
                "round {round}: {path} holds neither its acknowledged value nor the one in flight"
            );
        }
        assert!(
            entries >= 1,
            "round {round}: some writes committed before the kill"
        );
        // The interrupted big upload is either absent or whole (checked above); new
        // writes work after the restart.
        let r = signed_request(
            &http,
            &server.url,
            &key,
            Method::PUT,
            "/pub/after",
            // Differs per round: an identical request in the same second is a replay.
            format!("ok {round}").into_bytes(),
            now(),
        )
        .send()
        .await
        .unwrap();
        assert_eq!(r.status(), 200);
    }
    drop(server);
    crate::backend::forget_database_of(&dir.path().join("data"));
}
