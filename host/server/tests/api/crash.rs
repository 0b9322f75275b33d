//! `kill -9` of the real binary in the middle of uploads: after a restart every entry
//! is whole (its bytes match its size and ETag), usage matches the entries, and the
//! server serves.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use homeserver_protocol::wire::ListResult;
use homeserver_protocol::{AuthHeader, BodyHash, Keypair};
use reqwest::Method;

use crate::fixture::now;

struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// The returned guard kills and reaps the child in Drop, which the lint cannot see.
#[allow(clippy::zombie_processes)]
async fn start(dir: &std::path::Path, port: u16) -> Server {
    let child = Command::new(env!("CARGO_BIN_EXE_homeserver"))
        .current_dir(dir)
        .env("HOMESERVER__HTTP__LISTEN", format!("127.0.0.1:{port}"))
        .env("HOMESERVER__STORAGE__QUOTA_BYTES", "0")
        .env("HOMESERVER__METRICS__LISTEN", "")
        .env(
            "HOMESERVER__POLICIES__CACHE_DIR",
            crate::fixture::shared_guest_cache(),
        )
        .env("HOMESERVER__RATE_LIMIT__ENABLED", "false")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Server { child, url };
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("homeserver did not start");
}

fn signed(
    http: &reqwest::Client,
    url: &str,
    key: &Keypair,
    method: Method,
    target: &str,
    body: Vec<u8>,
    ts: u64,
) -> reqwest::RequestBuilder {
    let header = AuthHeader::sign(key, method.as_str(), target, ts, &BodyHash::of(&body));
    http.request(method, format!("{url}{target}"))
        .header("Authorization", header.to_header_value())
        .body(body)
}

/// A slow streamed upload: the body trickles in so the kill lands mid-stream.
fn slow_upload(
    http: &reqwest::Client,
    url: &str,
    key: &Keypair,
    target: &str,
) -> reqwest::RequestBuilder {
    let body: Vec<u8> = vec![5u8; 4 * 1024 * 1024];
    let header = AuthHeader::sign(key, "PUT", target, now(), &BodyHash::of(&body));
    let chunks: Vec<Vec<u8>> = body.chunks(64 * 1024).map(<[u8]>::to_vec).collect();
    let stream = futures_util::stream::unfold(chunks.into_iter(), |mut it| async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        it.next().map(|c| (Ok::<_, std::io::Error>(c), it))
    });
    http.request(Method::PUT, format!("{url}{target}"))
        .header("Authorization", header.to_header_value())
        .header("Content-Length", body.len())
        .body(reqwest::Body::wrap_stream(stream))
}

async fn check_consistent(url: &str, key: &Keypair, dir: &std::path::Path) -> usize {
    let http = reqwest::Client::new();
    let page: ListResult = signed(
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
        let r = signed(&http, url, key, Method::GET, &entry.path, vec![], now())
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
    let db = sqlx::SqlitePool::connect(&format!("sqlite://{}/data/hs.db", dir.display()))
        .await
        .unwrap();
    let used: i64 = sqlx::query_scalar("SELECT used_bytes FROM users WHERE public_key = ?")
        .bind(key.public_key().to_z32())
        .fetch_one(&db)
        .await
        .unwrap();
    db.close().await;
    assert_eq!(used as u64, total, "usage matches the stored entries");
    page.entries.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_during_uploads_leaves_store_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let key = Keypair::random();
    let http = reqwest::Client::new();
    let mut server = start(dir.path(), port).await;
    let r = signed(
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
        let writer = {
            let (http, url, key) = (http.clone(), url.clone(), key.clone());
            tokio::spawn(async move {
                for i in 0u64.. {
                    let body = format!("round {round} value {i} ")
                        .repeat(1 + (i as usize % 50))
                        .into_bytes();
                    let target = format!("/pub/small/{}", i % 7);
                    let sent = signed(
                        &http,
                        &url,
                        &key,
                        Method::PUT,
                        &target,
                        body,
                        now() + i % 100,
                    )
                    .send()
                    .await;
                    if sent.is_err() {
                        break;
                    }
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(300 + round * 250)).await;
        // kill -9
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        let _ = slow.await;
        writer.await.unwrap();

        server = start(dir.path(), port).await;
        let entries = check_consistent(&server.url, &key, dir.path()).await;
        assert!(
            entries >= 1,
            "round {round}: some writes committed before the kill"
        );
        // The interrupted big upload is either absent or whole (checked above); new
        // writes work after the restart.
        let r = signed(
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
}
