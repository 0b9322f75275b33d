//! What a hostile client tries: connections that never speak (HTTP/1 and HTTP/2),
//! malformed heads that only hyper sees, forged signatures in another user's name (rate
//! limits and disk), sessions spending their owner's limit, and early refusals on a kept-
//! alive connection. Each test fails if the fault it names comes back.

use std::time::Duration;

use homeserver_protocol::wire::PutResult;
use homeserver_protocol::{AuthHeader, BodyHash, ErrorBody, ErrorCode, Keypair};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::fixture::*;

/// Generous bound for waits (not a timing assertion).
const WAIT: Duration = Duration::from_secs(30);

async fn connect(host: &TestHost) -> TcpStream {
    TcpStream::connect(host.server().http_addr()).await.unwrap()
}

/// Whether the server closed `stream` (EOF or reset) before `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue, // e.g. an HTTP/2 GOAWAY before the close
        }
    }
}

/// Reads one response head (up to the blank line) from `stream`.
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(WAIT, stream.read(&mut byte))
            .await
            .expect("a response head in time")
            .unwrap();
        assert!(n > 0, "connection closed before a full head: {head:?}");
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap().to_ascii_lowercase()
}

fn auth_header(key: &Keypair, method: &str, target: &str, body: &[u8]) -> String {
    AuthHeader::sign(key, method, target, now(), &BodyHash::of(body)).to_header_value()
}

#[tokio::test]
async fn silent_connections_cannot_keep_others_out() {
    let host = TestHost::start_with(|c| {
        c.http.max_connections = 20;
        c.http.header_read_timeout_secs = 600;
    })
    .await;
    let alice = host.user().await;
    host.put(&alice, "/pub/x", b"hello").await;
    let mut silent = Vec::new();
    for _ in 0..100 {
        silent.push(connect(&host).await);
    }
    // Each new connection took the place of the longest-idle one; a normal client still
    // gets its answer although 100 connections were opened and never spoke.
    let fresh = reqwest::Client::builder().timeout(WAIT).build().unwrap();
    let r = fresh
        .get(format!("{}/pub/x", host.url))
        .header("Pubky-Host", alice.public_key().to_z32())
        .send()
        .await
        .expect("answered while silent connections are open");
    assert_eq!(r.status(), StatusCode::OK);
    let mut closed = 0;
    for stream in &mut silent {
        if closed_within(stream, Duration::from_millis(200)).await {
            closed += 1;
        }
    }
    assert!(
        closed >= 80,
        "only {closed} of 100 silent connections were let go"
    );
    let open = host.metric("hs_open_connections{listener=\"http\"}").await;
    assert!(open.is_some_and(|n| n <= 20.0), "{open:?}");
}

#[tokio::test]
async fn connections_without_a_request_are_closed_at_the_header_deadline() {
    let host = TestHost::start_with(|c| c.http.header_read_timeout_secs = 1).await;
    let mut silent = connect(&host).await;
    let mut h2_settings_only = connect(&host).await;
    // The HTTP/2 client preface and an empty SETTINGS frame, then nothing.
    h2_settings_only
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let mut h2_open_headers = connect(&host).await;
    // A HEADERS frame without END_HEADERS: the head never completes.
    h2_open_headers
        .write_all(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0\0\0\x01\x01\0\0\0\0\x01\x82",
        )
        .await
        .unwrap();
    let mut h1_partial = connect(&host).await;
    h1_partial
        .write_all(b"GET /pub/ HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    for (name, stream) in [
        ("silent", &mut silent),
        ("h2 settings only", &mut h2_settings_only),
        ("h2 open headers", &mut h2_open_headers),
        ("h1 partial head", &mut h1_partial),
    ] {
        assert!(closed_within(stream, WAIT).await, "{name} stayed open");
    }
}

#[tokio::test]
async fn idle_http2_connections_are_closed() {
    let host = TestHost::start_with(|c| c.http.idle_timeout_secs = 1).await;
    let io = hyper_util::rt::TokioIo::new(connect(&host).await);
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .unwrap();
    let driver = tokio::spawn(connection);
    let request = hyper::Request::get(format!("{}/events/", host.url))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    drop(response);
    // No request in flight: the server ends the connection (GOAWAY, then close).
    tokio::time::timeout(WAIT, driver)
        .await
        .expect("the idle connection was closed")
        .unwrap()
        .ok();
}

#[tokio::test]
async fn malformed_heads_answer_the_json_error_shape() {
    let host = TestHost::start().await;
    let long_header = format!(
        "GET /pub/ HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let cases = [
        (
            "GET /pub/a\0b HTTP/1.1\r\nHost: x\r\n\r\n".to_owned(),
            400,
            ErrorCode::BadRequest,
        ),
        (
            "GET /pub/a b HTTP/1.1\r\nHost: x\r\n\r\n".to_owned(),
            400,
            ErrorCode::BadRequest,
        ),
        (
            "PUT /pub/a HTTP/1.1\r\nHost: x\r\nContent-Length: 18446744073709551615\r\n\r\n"
                .to_owned(),
            431, // hyper's verdict on a length it cannot represent
            ErrorCode::HeadersTooLarge,
        ),
        (long_header, 431, ErrorCode::HeadersTooLarge),
        (
            format!(
                "GET /pub/{} HTTP/1.1\r\nHost: x\r\n\r\n",
                "a".repeat(70_000)
            ),
            414,
            ErrorCode::UriTooLong,
        ),
    ];
    for (request, status, code) in cases {
        let answer = raw_request(&host, &request).await;
        let (head, body) = answer.split_once("\r\n\r\n").expect("a response");
        let head = head.to_ascii_lowercase();
        assert!(head.starts_with(&format!("http/1.1 {status} ")), "{head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(head.contains("connection: close"), "{head}");
        let body: ErrorBody = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(body.error, code);
    }
    // The server is unharmed.
    assert_eq!(
        host.request(Method::GET, "/events/")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn early_refusals_say_the_connection_closes() {
    let host = TestHost::start_with(|c| c.storage.max_value_bytes = 1000).await;
    let alice = host.user().await;
    let mut stream = connect(&host).await;
    // A body that is read in full: the connection stays usable.
    let small = b"0123456789";
    let request = format!(
        "PUT /pub/small HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Length: {}\r\n\r\n",
        auth_header(&alice, "PUT", "/pub/small", small),
        small.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.write_all(small).await.unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(!head.contains("connection: close"), "{head}");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.unwrap();

    // Refused on its declared length before the body is read: the answer says the
    // connection ends, so the client does not send its next request on it.
    let big = vec![b'x'; 2000];
    let request = format!(
        "PUT /pub/big HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Length: {}\r\n\r\n",
        auth_header(&alice, "PUT", "/pub/big", &big),
        big.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.write_all(&big[..100]).await.unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("http/1.1 413"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
}

#[tokio::test]
async fn forged_signatures_cannot_lock_a_user_out() {
    let host = TestHost::start_with(|c| {
        c.rate_limit.enabled = true;
        c.rate_limit.anonymous_per_minute = 5;
        c.rate_limit.authenticated_per_minute = 20;
    })
    .await;
    let alice = Keypair::random();
    let r = host
        .signed(&alice, Method::POST, "/signup", b"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    // The attacker names alice's key with signatures over other bodies, with and without
    // a declared digest, far past every limit.
    let mut statuses = Vec::new();
    for i in 0..30 {
        let header = auth_header(&alice, "PUT", "/pub/y", b"what alice signed");
        let mut request = host
            .request(Method::PUT, "/pub/y")
            .header("Authorization", header)
            .body("forged");
        if i % 2 == 0 {
            request = request.header(
                "Content-Digest",
                BodyHash::of(b"forged").to_content_digest(),
            );
        }
        statuses.push(request.send().await.unwrap().status().as_u16());
    }
    // Charged to the attacker's IP: a few 401s, then 429s.
    assert!(
        statuses.iter().all(|s| *s == 401 || *s == 429),
        "{statuses:?}"
    );
    assert!(statuses.contains(&429), "{statuses:?}");
    // Alice's bucket is untouched: her own requests go through, and her first one sees
    // a full bucket.
    let r = host.get(&alice, "/pub/").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["x-ratelimit-remaining"], "19");
    let r = host
        .signed_with_digest(&alice, Method::PUT, "/pub/z", b"mine")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
}

#[tokio::test]
async fn a_session_has_its_own_bucket() {
    let host = TestHost::start_single_with(|c| {
        c.rate_limit.enabled = true;
        c.rate_limit.anonymous_per_minute = 100;
        c.rate_limit.authenticated_per_minute = 5;
    })
    .await;
    let alice = host.user().await;
    let body = serde_json::to_vec(&json!({ "capabilities": ["read:/pub/"] })).unwrap();
    let r = host
        .signed_with_digest(&alice, Method::POST, "/auth/session", &body)
        .send()
        .await
        .unwrap();
    let token = expect_ok_json::<Value>(r).await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let session_get = || host.request(Method::GET, "/pub/").bearer_auth(&token);
    for _ in 0..5 {
        assert_eq!(session_get().send().await.unwrap().status(), StatusCode::OK);
    }
    expect_error(
        session_get().send().await.unwrap(),
        429,
        ErrorCode::RateLimitExceeded,
    )
    .await;
    // The owner's own bucket was used once (minting the session).
    let r = host.get(&alice, "/pub/").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["x-ratelimit-remaining"], "3");
}

/// A PUT whose body the test sends in two parts, pausing in between.
struct PausedUpload {
    rest: tokio::sync::oneshot::Sender<()>,
    response: tokio::task::JoinHandle<reqwest::Response>,
}

fn paused_upload(request: reqwest::RequestBuilder, body: Vec<u8>, pause_at: usize) -> PausedUpload {
    let (rest, resume) = tokio::sync::oneshot::channel::<()>();
    let first = body[..pause_at].to_vec();
    let second = body[pause_at..].to_vec();
    let stream = futures_util::stream::unfold(
        (Some(first), Some((resume, second))),
        |(first, later)| async move {
            if let Some(first) = first {
                return Some((Ok::<_, std::io::Error>(first), (None, later)));
            }
            let (resume, second) = later?;
            resume.await.ok()?;
            Some((Ok(second), (None, None)))
        },
    );
    let response = tokio::spawn(async move {
        request
            .body(reqwest::Body::wrap_stream(stream))
            .send()
            .await
            .unwrap()
    });
    PausedUpload { rest, response }
}

fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[tokio::test]
async fn forged_uploads_are_never_written_to_disk() {
    let host = TestHost::start_single_with(|_| {}).await;
    let alice = host.user().await;
    let blobs = host.dir.path().join("blobs");
    let body = vec![b'f'; 2 << 20];
    // No digest: the body must be read before the signature can be checked.
    let forged = host
        .request(Method::PUT, "/pub/forged")
        .header(
            "Authorization",
            auth_header(&alice, "PUT", "/pub/forged", b"other"),
        )
        .header("Content-Length", body.len());
    let upload = paused_upload(forged, body, 1 << 20);
    eventually("the first MiB to be held in memory", WAIT, || async {
        host.metric("hs_unproven_upload_bytes")
            .await
            .is_some_and(|n| n >= f64::from(1 << 20))
    })
    .await;
    assert_eq!(files_under(&blobs), Vec::<std::path::PathBuf>::new());
    upload.rest.send(()).unwrap();
    let r = upload.response.await.unwrap();
    expect_error(r, 401, ErrorCode::InvalidSignature).await;
    assert_eq!(host.metric("hs_unproven_upload_bytes").await, Some(0.0));

    // With a digest, a forged signature is refused before a byte of the body is read.
    let mut stream = connect(&host).await;
    let request = format!(
        "PUT /pub/forged HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\n\
         Content-Digest: {}\r\nContent-Length: 5000000\r\n\r\n",
        auth_header(&alice, "PUT", "/pub/forged", b"other"),
        BodyHash::of(b"declared").to_content_digest(),
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("http/1.1 401"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(files_under(&blobs), Vec::<std::path::PathBuf>::new());
}

#[tokio::test]
async fn memory_for_unproven_uploads_is_bounded() {
    let host = TestHost::start_single_with(|c| c.http.unproven_upload_memory_bytes = 100_000).await;
    let alice = host.user().await;
    let holding = vec![b'h'; 90_000];
    let first = host
        .signed(&alice, Method::PUT, "/pub/first", &holding)
        .header("Content-Length", holding.len());
    let upload = paused_upload(first, holding.clone(), 80_000);
    eventually("80 kB to be held", WAIT, || async {
        host.metric("hs_unproven_upload_bytes")
            .await
            .is_some_and(|n| n >= 80_000.0)
    })
    .await;
    let second = vec![b's'; 50_000];
    let e = expect_error(
        host.put(&alice, "/pub/second", &second).await,
        503,
        ErrorCode::ServiceUnavailable,
    )
    .await;
    assert!(e.message.contains("Content-Digest"), "{}", e.message);
    // A declared digest streams without waiting for that memory.
    let r = host
        .signed_with_digest(&alice, Method::PUT, "/pub/second", &second)
        .send()
        .await
        .unwrap();
    expect_ok_json::<PutResult>(r).await;
    upload.rest.send(()).unwrap();
    expect_ok_json::<PutResult>(upload.response.await.unwrap()).await;
    assert_eq!(
        host.get(&alice, "/pub/first").await.bytes().await.unwrap(),
        holding
    );
}

#[tokio::test]
async fn a_body_must_match_its_declared_digest() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    // Signed over the declared digest, but another body is sent.
    let r = host
        .request(Method::PUT, "/pub/d")
        .header(
            "Authorization",
            auth_header(&alice, "PUT", "/pub/d", b"declared"),
        )
        .header(
            "Content-Digest",
            BodyHash::of(b"declared").to_content_digest(),
        )
        .body("different")
        .send()
        .await
        .unwrap();
    let e = expect_error(r, 400, ErrorCode::BadRequest).await;
    assert!(e.message.contains("Content-Digest"), "{}", e.message);
    expect_error(host.get(&alice, "/pub/d").await, 404, ErrorCode::NotFound).await;
    // A malformed digest is a clear 400.
    let r = host
        .signed(&alice, Method::PUT, "/pub/d", b"x")
        .header("Content-Digest", "md5=abc")
        .send()
        .await
        .unwrap();
    expect_error(r, 400, ErrorCode::BadRequest).await;
    // And the right one stores the value.
    let r = host
        .signed_with_digest(&alice, Method::PUT, "/pub/d", b"declared")
        .send()
        .await
        .unwrap();
    expect_ok_json::<PutResult>(r).await;
    assert_eq!(
        host.get(&alice, "/pub/d").await.bytes().await.unwrap(),
        "declared"
    );
}

#[tokio::test]
async fn a_session_put_over_both_size_and_quota_is_413() {
    let host = TestHost::start_with(|c| {
        c.storage.max_value_bytes = 2000;
        c.storage.quota_bytes = 1000;
    })
    .await;
    let alice = host.user().await;
    let body = serde_json::to_vec(&json!({ "capabilities": ["write:/pub/"] })).unwrap();
    let r = host
        .signed(&alice, Method::POST, "/auth/session", &body)
        .send()
        .await
        .unwrap();
    let token = expect_ok_json::<Value>(r).await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = host
        .request(Method::PUT, "/pub/big")
        .bearer_auth(&token)
        .body(vec![0u8; 5000])
        .send()
        .await
        .unwrap();
    expect_error(r, 413, ErrorCode::PayloadTooLarge).await;
    // Within the size limit but over the quota: 507.
    let r = host
        .request(Method::PUT, "/pub/big")
        .bearer_auth(&token)
        .body(vec![0u8; 1500])
        .send()
        .await
        .unwrap();
    expect_error(r, 507, ErrorCode::StorageQuotaExceeded).await;
}

/// Connects to the server from `source` (any 127/8 address reaches a loopback listener).
async fn connect_from(host: &TestHost, source: [u8; 4]) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(std::net::SocketAddr::from((source, 0)))
        .unwrap();
    socket.connect(host.server().http_addr()).await.unwrap()
}

/// Opens an event stream on `stream` and reads its response head (the stream stays
/// open: the connection is busy from then on).
async fn open_event_stream(stream: &mut TcpStream, user: &Keypair) -> String {
    let request = format!(
        "GET /events-stream?user={}&live=true HTTP/1.1\r\nHost: x\r\n\r\n",
        user.public_key().to_z32()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    read_head(stream).await
}

#[tokio::test]
async fn busy_connections_of_one_address_cannot_fill_the_server() {
    let host = TestHost::start_with(|c| {
        c.http.max_connections = 50;
        c.http.max_connections_per_ip = 4;
        c.http.max_streams_per_ip = 0;
    })
    .await;
    let alice = host.user().await;
    host.put(&alice, "/pub/x", b"hello").await;
    // One address holds four connections busy with streams that never end.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut stream = connect_from(&host, [127, 0, 0, 2]).await;
        assert!(
            open_event_stream(&mut stream, &alice)
                .await
                .starts_with("http/1.1 200")
        );
        held.push(stream);
    }
    // A fifth from it is turned away at once...
    let mut fifth = connect_from(&host, [127, 0, 0, 2]).await;
    fifth
        .write_all(b"GET /events/ HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(
        closed_within(&mut fifth, WAIT).await,
        "a fifth connection was served"
    );
    // ...while everyone else is served.
    let mut other = connect_from(&host, [127, 0, 0, 3]).await;
    let request = format!(
        "GET /pub/x HTTP/1.1\r\nHost: x\r\nPubky-Host: {}\r\n\r\n",
        alice.public_key().to_z32()
    );
    other.write_all(request.as_bytes()).await.unwrap();
    assert!(read_head(&mut other).await.starts_with("http/1.1 200"));
    // When one of the held connections goes, the address may connect again.
    drop(held.pop());
    eventually("the address gets a slot back", WAIT, || async {
        let mut again = connect_from(&host, [127, 0, 0, 2]).await;
        again
            .write_all(b"GET /events/ HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        !closed_within(&mut again, Duration::from_millis(500)).await
    })
    .await;
}

#[tokio::test]
async fn event_streams_per_address_are_capped() {
    let host = TestHost::start_single_with(|c| c.http.max_streams_per_ip = 3).await;
    let alice = host.user().await;
    let client = reqwest::Client::builder().timeout(WAIT).build().unwrap();
    let url = format!(
        "{}/events-stream?user={}&live=true",
        host.url,
        alice.public_key().to_z32()
    );
    let mut open = Vec::new();
    for _ in 0..3 {
        let r = client.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 200);
        open.push(r);
    }
    let e = expect_error(
        client.get(&url).send().await.unwrap(),
        429,
        ErrorCode::RateLimitExceeded,
    )
    .await;
    assert!(e.message.contains("event streams"), "{}", e.message);
    // Closing a stream gives its slot back.
    drop(open.pop());
    eventually("a stream slot comes back", WAIT, || async {
        client.get(&url).send().await.unwrap().status() == 200
    })
    .await;
}

#[tokio::test]
async fn bodies_that_trickle_or_never_come_are_cut_off() {
    let host = TestHost::start_with(|c| {
        c.http.body_idle_timeout_secs = 2;
        c.http.upload_timeout_secs = 3;
    })
    .await;
    let alice = host.user().await;
    let body = vec![b'x'; 64];
    let digest = BodyHash::of(&body);
    // A signed PUT that sends a byte every half second: never idle, never done.
    let mut trickle = connect(&host).await;
    let head = format!(
        "PUT /pub/trickle HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\n\
         Content-Digest: {}\r\nContent-Length: {}\r\n\r\n",
        auth_header(&alice, "PUT", "/pub/trickle", &body),
        digest.to_content_digest(),
        body.len()
    );
    trickle.write_all(head.as_bytes()).await.unwrap();
    let started = tokio::time::Instant::now();
    let mut answer = String::new();
    for byte in &body {
        if trickle.write_all(&[*byte]).await.is_err() {
            break;
        }
        let mut buf = [0u8; 1024];
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(500), trickle.read(&mut buf)).await
        {
            answer.push_str(&String::from_utf8_lossy(&buf[..n]));
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "the trickling upload was never cut off"
        );
    }
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("not complete within 3 s"), "{answer}");
    assert_eq!(host.get(&alice, "/pub/trickle").await.status(), 404);

    // A signup whose body never arrives.
    let bob = Keypair::random();
    let mut stalled = connect(&host).await;
    let head = format!(
        "POST /signup HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Length: 10\r\n\r\n",
        auth_header(&bob, "POST", "/signup", b"0123456789")
    );
    stalled.write_all(head.as_bytes()).await.unwrap();
    let head = read_head(&mut stalled).await;
    assert!(head.starts_with("http/1.1 400"), "{head}");
}
