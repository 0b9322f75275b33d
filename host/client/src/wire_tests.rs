//! Wire-level tests of [`PkClient`](crate::PkClient) against a scripted HTTP server that
//! records every request: what is signed is exactly what is sent, bodies arrive intact,
//! public reads carry `Pubky-Host`, errors are typed, and a replay refusal is retried.
//! Events: feed and stream requests carry the asked-for query and no credentials, SSE
//! bodies become events as they arrive, and refusals are typed before any event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use std::time::Duration;

use futures_util::StreamExt;
use homeserver_protocol::event::{Event, EventKind, EventParseError};
use homeserver_protocol::{AuthHeader, BodyHash, ErrorCode, Keypair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::clock::unix_now;
use crate::{ClientError, ListOptions, PkClient, RetryPolicy, StreamRequest};

#[derive(Debug, Clone)]
struct Recorded {
    method: String,
    target: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Recorded {
    /// Verifies the `Pk` signature against what actually arrived.
    fn verify(&self) -> AuthHeader {
        let value = self
            .headers
            .get("authorization")
            .expect("request is signed");
        let auth = AuthHeader::parse(value).expect("header parses");
        auth.verify(
            &self.method,
            &self.target,
            &BodyHash::of(&self.body),
            unix_now(),
        )
        .expect("signature verifies against the request as received");
        if matches!(self.method.as_str(), "PUT" | "POST") {
            // Writes declare the body's hash so the server can check the signature first.
            assert_eq!(
                self.headers.get("content-digest"),
                Some(&BodyHash::of(&self.body).to_content_digest()),
                "a write carries the Content-Digest of its body"
            );
        }
        auth
    }
}

struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

fn json(status: u16, body: &str) -> Reply {
    Reply {
        status,
        headers: vec![("content-type", "application/json".into())],
        body: body.as_bytes().to_vec(),
    }
}

type Handler = dyn Fn(&Recorded, usize) -> Reply + Send + Sync;

/// Serves one request per connection with `handler(request, index)`.
async fn serve(handler: Arc<Handler>) -> (String, Arc<Mutex<Vec<Recorded>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen: Arc<Mutex<Vec<Recorded>>> = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut buf = Vec::new();
            let head_end = loop {
                let mut chunk = [0u8; 4096];
                let n = socket.read(&mut chunk).await.unwrap();
                if n == 0 {
                    break None;
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break Some(i);
                }
            };
            let Some(head_end) = head_end else { continue };
            let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
            let mut lines = head.split("\r\n");
            let mut request_line = lines.next().unwrap().split(' ');
            let method = request_line.next().unwrap().to_owned();
            let target = request_line.next().unwrap().to_owned();
            let headers: HashMap<String, String> = lines
                .filter_map(|l| l.split_once(": "))
                .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
                .collect();
            let len: usize = headers
                .get("content-length")
                .map(|v| v.parse().unwrap())
                .unwrap_or(0);
            let mut body = buf[head_end + 4..].to_vec();
            while body.len() < len {
                let mut chunk = vec![0u8; 65536];
                let n = socket.read(&mut chunk).await.unwrap();
                assert!(n > 0, "body shorter than Content-Length");
                body.extend_from_slice(&chunk[..n]);
            }
            let request = Recorded {
                method,
                target,
                headers,
                body,
            };
            let index = {
                let mut seen = log.lock().unwrap();
                seen.push(request.clone());
                seen.len() - 1
            };
            let reply = handler(&request, index);
            let mut out = format!("HTTP/1.1 {} X\r\nconnection: close\r\n", reply.status);
            for (k, v) in &reply.headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            if request.method != "HEAD" {
                out.push_str(&format!("content-length: {}\r\n", reply.body.len()));
            }
            out.push_str("\r\n");
            let mut bytes = out.into_bytes();
            if request.method != "HEAD" {
                bytes.extend_from_slice(&reply.body);
            }
            socket.write_all(&bytes).await.unwrap();
            let _ = socket.shutdown().await;
        }
    });
    (base, seen)
}

fn put_ok(req: &Recorded, _: usize) -> Reply {
    json(
        200,
        &format!(
            r#"{{"path":"{}","size":{},"created_at":1700000000}}"#,
            req.target,
            req.body.len()
        ),
    )
}

fn keypair() -> Keypair {
    Keypair::from_seed(&[5; 32])
}

#[tokio::test]
async fn put_bytes_is_signed_as_sent() {
    let (base, seen) = serve(Arc::new(put_ok)).await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let result = client.put_bytes("/pub/a.txt", "hello").await.unwrap();
    assert_eq!((result.path.as_str(), result.size), ("/pub/a.txt", 5));
    let req = seen.lock().unwrap()[0].clone();
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("PUT", "/pub/a.txt")
    );
    assert_eq!(req.body, b"hello");
    assert_eq!(req.headers["content-type"], "application/octet-stream");
    assert_eq!(req.headers["content-length"], "5");
    assert_eq!(req.verify().public_key, keypair().public_key());
}

/// The server also reads `%2F` as `/` (for generated clients); this client never needs
/// the escape: nested paths go out, and are signed, with plain slashes.
#[tokio::test]
async fn nested_paths_are_sent_with_plain_slashes() {
    let (base, seen) = serve(Arc::new(put_ok)).await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    client
        .put_bytes("/pub/example.com/hello.txt", "hi")
        .await
        .unwrap();
    let req = seen.lock().unwrap()[0].clone();
    assert_eq!(req.target, "/pub/example.com/hello.txt");
    req.verify();
    // An escaped path is not a path the client takes from its caller.
    assert!(matches!(
        client.put_bytes("/pub/example.com%2Fhello.txt", "hi").await,
        Err(ClientError::InvalidPath { .. })
    ));
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn identical_puts_get_distinct_signatures() {
    let (base, seen) = serve(Arc::new(put_ok)).await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    client.put_bytes("/pub/a", "same").await.unwrap();
    client.put_bytes("/pub/a", "same").await.unwrap();
    let seen = seen.lock().unwrap();
    let (a, b) = (seen[0].verify(), seen[1].verify());
    assert!(b.timestamp > a.timestamp);
    assert_ne!(a.signature, b.signature);
}

#[tokio::test]
async fn put_file_streams_the_file() {
    let (base, seen) = serve(Arc::new(put_ok)).await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data.bin");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(&file, &data).unwrap();
    let result = client.put_file("/pub/data.bin", &file).await.unwrap();
    assert_eq!(result.size, data.len() as u64);
    let req = seen.lock().unwrap()[0].clone();
    assert_eq!(req.body, data);
    assert_eq!(req.headers["content-length"], data.len().to_string());
    req.verify();

    let missing = client
        .put_file("/pub/x", &dir.path().join("missing"))
        .await
        .unwrap_err();
    assert!(matches!(missing, ClientError::Io { .. }), "{missing:?}");
}

#[tokio::test]
async fn put_reader_spools_and_signs() {
    let (base, seen) = serve(Arc::new(put_ok)).await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let data = vec![42u8; 150_000];
    client.put_reader("/pub/in", &data[..]).await.unwrap();
    client.put_reader("/pub/empty", &b""[..]).await.unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].body, data);
    seen[0].verify();
    assert!(seen[1].body.is_empty());
    assert_eq!(seen[1].headers["content-length"], "0");
    seen[1].verify();
}

#[tokio::test]
async fn list_query_is_signed_exactly_as_sent() {
    let (base, seen) = serve(Arc::new(|_: &Recorded, _| {
        json(
            200,
            r#"{"entries":[{"path":"/pub/d/a","size":1,"created_at":1,"updated_at":2},{"path":"/pub/d/sub/"}],"cursor":"c2","has_more":true}"#,
        )
    }))
    .await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let options = ListOptions {
        limit: Some(2),
        cursor: Some("L3B1Yi9k/YQ==+ x".into()),
        reverse: true,
        shallow: true,
    };
    let page = client.list("/pub/d/", options, None).await.unwrap();
    assert_eq!(page.entries.len(), 2);
    assert_eq!(page.entries[1].size, None);
    assert_eq!(page.cursor.as_deref(), Some("c2"));
    assert!(page.has_more);
    let req = seen.lock().unwrap()[0].clone();
    assert_eq!(
        req.target,
        "/pub/d/?limit=2&cursor=L3B1Yi9k%2FYQ%3D%3D%2B+x&reverse=true&shallow=true"
    );
    assert_eq!(req.method, "GET");
    req.verify();
}

#[tokio::test]
async fn list_all_follows_cursors() {
    let (base, seen) = serve(Arc::new(|_: &Recorded, i| match i {
        0 => json(
            200,
            r#"{"entries":[{"path":"/pub/a"}],"cursor":"one","has_more":true}"#,
        ),
        _ => json(
            200,
            r#"{"entries":[{"path":"/pub/b"}],"cursor":"two","has_more":false}"#,
        ),
    }))
    .await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let all = client
        .list_all(
            "/pub/",
            ListOptions {
                limit: Some(1),
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap();
    let paths: Vec<_> = all.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["/pub/a", "/pub/b"]);
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].target, "/pub/?limit=1");
    assert_eq!(seen[1].target, "/pub/?limit=1&cursor=one");
}

#[tokio::test]
async fn public_reads_name_the_host_and_carry_no_signature() {
    let (base, seen) = serve(Arc::new(|req: &Recorded, _| match req.target.as_str() {
        "/pub/post" => Reply {
            status: 200,
            headers: vec![
                ("etag", "\"abc=\"".into()),
                ("last-modified", "Tue, 14 Nov 2023 22:13:20 GMT".into()),
            ],
            body: b"public value".to_vec(),
        },
        _ => json(200, r#"{"entries":[],"cursor":null,"has_more":false}"#),
    }))
    .await;
    let owner = Keypair::from_seed(&[8; 32]).public_key();
    // Works without any key, and with a key of someone else.
    for key in [None, Some(keypair())] {
        let client = PkClient::new(&base, key).unwrap();
        let got = client.get("/pub/post", Some(owner)).await.unwrap();
        assert_eq!(got.meta().etag.as_deref(), Some("\"abc=\""));
        assert_eq!(got.meta().content_length, Some(12));
        let mut out = Vec::new();
        assert_eq!(got.write_to(&mut out).await.unwrap(), 12);
        assert_eq!(out, b"public value");
        let page = client
            .list("/pub/", ListOptions::default(), Some(owner))
            .await
            .unwrap();
        assert!(page.entries.is_empty() && page.cursor.is_none());
    }
    for req in seen.lock().unwrap().iter() {
        assert_eq!(req.headers["pubky-host"], owner.to_z32());
        assert!(!req.headers.contains_key("authorization"));
    }
}

#[tokio::test]
async fn own_reads_are_signed() {
    let (base, seen) = serve(Arc::new(|_: &Recorded, _| Reply {
        status: 200,
        headers: vec![("etag", "\"e\"".into())],
        body: b"mine".to_vec(),
    }))
    .await;
    let me = keypair();
    let client = PkClient::new(&base, Some(me.clone())).unwrap();
    assert_eq!(
        &client.get_bytes("/pub/m", None).await.unwrap()[..],
        b"mine"
    );
    assert_eq!(
        &client
            .get_bytes("/pub/m", Some(me.public_key()))
            .await
            .unwrap()[..],
        b"mine"
    );
    let meta = client.head("/pub/m", None).await.unwrap();
    assert_eq!(meta.etag.as_deref(), Some("\"e\""));
    let seen = seen.lock().unwrap();
    for req in seen.iter() {
        req.verify();
        assert!(!req.headers.contains_key("pubky-host"));
    }
    assert_eq!(seen[2].method, "HEAD");
}

#[tokio::test]
async fn not_modified_is_none() {
    let (base, seen) = serve(Arc::new(|req: &Recorded, _| {
        if req.headers.get("if-none-match").map(String::as_str) == Some("\"e\"") {
            Reply {
                status: 304,
                headers: vec![],
                body: vec![],
            }
        } else {
            Reply {
                status: 200,
                headers: vec![],
                body: b"v".to_vec(),
            }
        }
    }))
    .await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    assert!(
        client
            .get_if_none_match("/pub/m", "\"e\"", None)
            .await
            .unwrap()
            .is_none()
    );
    let fresh = client
        .get_if_none_match("/pub/m", "\"old\"", None)
        .await
        .unwrap();
    assert_eq!(&fresh.unwrap().bytes().await.unwrap()[..], b"v");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn errors_are_typed() {
    let (base, _) = serve(Arc::new(|req: &Recorded, _| match req.method.as_str() {
        "GET" => json(
            404,
            r#"{"error":"not_found","message":"no entry at /pub/x"}"#,
        ),
        "HEAD" => Reply {
            status: 404,
            headers: vec![],
            body: vec![],
        },
        "DELETE" => Reply {
            status: 502,
            headers: vec![],
            body: b"upstream down".to_vec(),
        },
        _ => json(200, "not json"),
    }))
    .await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let err = client.get("/pub/x", None).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NotFound));
    assert_eq!(err.to_string(), "not_found (404): no entry at /pub/x");
    let err = client.head("/pub/x", None).await.unwrap_err();
    assert!(err.is_not_found() && err.code().is_none());
    let err = client.delete("/pub/x").await.unwrap_err();
    assert!(
        matches!(err, ClientError::UnexpectedStatus { ref text, .. } if text == "upstream down")
    );
    let err = client.put_bytes("/pub/x", "v").await.unwrap_err();
    assert!(matches!(err, ClientError::InvalidResponse(_)), "{err:?}");
}

#[tokio::test]
async fn replay_refusal_is_retried_once_with_a_later_timestamp() {
    let (base, seen) = serve(Arc::new(|req: &Recorded, i| match i {
        0 => json(
            401,
            r#"{"error":"invalid_signature","message":"signature replayed"}"#,
        ),
        _ => put_ok(req, i),
    }))
    .await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, b"file body").unwrap();
    client.put_file("/pub/f", &file).await.unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    // The file was rewound: the retry carries the whole body again.
    assert_eq!(seen[1].body, b"file body");
    assert!(seen[1].verify().timestamp > seen[0].verify().timestamp);
}

#[tokio::test]
async fn persistent_replay_refusal_is_reported() {
    let (base, seen) = serve(Arc::new(|_: &Recorded, _| {
        json(
            401,
            r#"{"error":"invalid_signature","message":"signature replayed"}"#,
        )
    }))
    .await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let err = client.delete("/pub/f").await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidSignature));
    // The first try and three with ever later timestamps.
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4);
    let stamps: Vec<u64> = seen.iter().map(|r| r.verify().timestamp).collect();
    assert!(stamps.windows(2).all(|w| w[0] < w[1]), "{stamps:?}");
}

#[tokio::test]
async fn signup_sends_the_token_in_the_signed_query() {
    let (base, seen) = serve(Arc::new(|_: &Recorded, _| {
        json(
            201,
            &format!(
                r#"{{"public_key":"{}","created_at":1700000000}}"#,
                keypair().public_key()
            ),
        )
    }))
    .await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let result = client.signup(Some("ABCD-EFGH-JKMN")).await.unwrap();
    assert_eq!(result.public_key, keypair().public_key().to_z32());
    let req = seen.lock().unwrap()[0].clone();
    assert_eq!(req.method, "POST");
    assert_eq!(req.target, "/signup?signup_token=ABCD-EFGH-JKMN");
    assert!(req.body.is_empty());
    req.verify();
}

fn sse(body: &str) -> Reply {
    Reply {
        status: 200,
        headers: vec![("content-type", "text/event-stream".into())],
        body: body.as_bytes().to_vec(),
    }
}

fn user_url(seed: u8, path: &str) -> String {
    format!(
        "pk://{}/{path}",
        Keypair::from_seed(&[seed; 32]).public_key().to_z32()
    )
}

#[tokio::test]
async fn feed_pages_are_signed_when_the_client_has_a_key() {
    let body = format!(
        r#"{{"events":[{{"type":"PUT","url":"{}","cursor":6,"content_hash":"AQ=="}},{{"type":"DEL","url":"{}","cursor":9}}],"cursor":9}}"#,
        user_url(1, "pub/a"),
        user_url(1, "pub/a")
    );
    let (base, seen) = serve(Arc::new(move |_: &Recorded, _| json(200, &body))).await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let page = client.events(5, Some(2)).await.unwrap();
    assert_eq!(page.cursor, 9);
    assert_eq!(
        page.events
            .iter()
            .map(|e| (e.kind, e.cursor, e.content_hash.as_deref()))
            .collect::<Vec<_>>(),
        [(EventKind::Put, 6, Some("AQ==")), (EventKind::Del, 9, None)]
    );
    client.events(0, None).await.unwrap();
    // Without a key, the same request carries no credentials.
    PkClient::new(&base, None)
        .unwrap()
        .events(0, None)
        .await
        .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].method, "GET");
    assert_eq!(seen[0].target, "/events/?cursor=5&limit=2");
    assert_eq!(seen[1].target, "/events/?cursor=0");
    // Signed over exactly what was sent, so the server counts it against the key.
    for req in &seen[..2] {
        assert_eq!(req.verify().public_key, keypair().public_key());
        assert!(!req.headers.contains_key("pubky-host"));
    }
    assert!(!seen[2].headers.contains_key("authorization"));
    assert!(!seen[2].headers.contains_key("pubky-host"));
}

#[tokio::test]
async fn stream_sends_the_query_and_maps_each_event() {
    let body = format!(
        ": hello\n\n\
         event: PUT\nid: 3\ndata: {}\ndata: cursor: 3\ndata: content_hash: AQ==\n\n\
         :\n\n\
         event: DEL\nid: 4\ndata: {}\ndata: cursor: 4\n\n",
        user_url(1, "pub/app/x"),
        user_url(2, "pub/app/y")
    );
    let (base, seen) = serve(Arc::new(move |_: &Recorded, _| sse(&body))).await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let (a, b) = (
        Keypair::from_seed(&[1; 32]).public_key(),
        Keypair::from_seed(&[2; 32]).public_key(),
    );
    let request = StreamRequest::new()
        .user(a)
        .user_after(b, 2)
        .limit(10)
        .path("/pub/app/");
    let events: Vec<Event> = client
        .stream(request)
        .await
        .unwrap()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(
        events,
        [
            Event {
                kind: EventKind::Put,
                url: user_url(1, "pub/app/x"),
                cursor: 3,
                content_hash: Some("AQ==".into()),
            },
            Event {
                kind: EventKind::Del,
                url: user_url(2, "pub/app/y"),
                cursor: 4,
                content_hash: None,
            },
        ]
    );
    let req = seen.lock().unwrap()[0].clone();
    assert_eq!(req.method, "GET");
    assert_eq!(
        req.target,
        format!(
            "/events-stream?user={}&user={}%3A2&limit=10&path=%2Fpub%2Fapp%2F",
            a.to_z32(),
            b.to_z32()
        )
    );
    assert_eq!(req.headers["accept"], "text/event-stream");
    // The client has a key: the stream request is signed as sent.
    assert_eq!(req.verify().public_key, keypair().public_key());
}

#[tokio::test]
async fn stream_refusals_are_typed_before_any_event() {
    let (base, _) = serve(Arc::new(|req: &Recorded, _| {
        if req.target.contains("limit=0") {
            json(
                400,
                r#"{"error":"bad_request","message":"limit must be from 1 to 65535, got `0`"}"#,
            )
        } else if req.target.contains("live") {
            json(200, r#"{"events":[]}"#)
        } else {
            sse("event: PUT\ndata: pk://a/pub/x\n\nevent: PUT\ndata: pk://a/pub/y\ndata: cursor: 2\n\n")
        }
    }))
    .await;
    let client = PkClient::new(&base, None).unwrap();
    let a = Keypair::from_seed(&[1; 32]).public_key();
    let Err(err) = client.stream(StreamRequest::new().user(a).limit(0)).await else {
        panic!("a refused stream must fail before streaming");
    };
    assert_eq!(err.code(), Some(ErrorCode::BadRequest));
    assert_eq!(
        err.to_string(),
        "bad_request (400): limit must be from 1 to 65535, got `0`"
    );
    let Err(err) = client.stream(StreamRequest::new().user(a).live(true)).await else {
        panic!("a JSON answer is not an event stream");
    };
    assert!(matches!(err, ClientError::InvalidResponse(_)), "{err:?}");
    // A malformed event ends the stream with a typed error; nothing after it is read.
    let got: Vec<_> = client
        .stream(StreamRequest::new().user(a))
        .await
        .unwrap()
        .collect()
        .await;
    assert!(
        matches!(
            &got[..],
            [Err(ClientError::InvalidEvent {
                source: EventParseError::Missing("cursor")
            })]
        ),
        "{got:?}"
    );
}

/// An SSE server that sends the first event, waits for the test to say go, then sends a
/// keep-alive, the second event and closes: events must arrive while the body is open.
#[tokio::test]
async fn live_events_arrive_before_the_body_ends() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let first = user_url(1, "pub/live/1");
    let second = user_url(1, "pub/live/2");
    let (first_sent, second_sent) = (first.clone(), second.clone());
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            assert_eq!(socket.read(&mut byte).await.unwrap(), 1);
            head.push(byte[0]);
        }
        let start = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
             event: PUT\nid: 1\ndata: {first_sent}\ndata: cursor: 1\ndata: content_hash: AQ==\n\n"
        );
        socket.write_all(start.as_bytes()).await.unwrap();
        go_rx.await.unwrap();
        let rest = format!(":\n\nevent: DEL\nid: 2\ndata: {second_sent}\ndata: cursor: 2\n\n");
        socket.write_all(rest.as_bytes()).await.unwrap();
        let _ = socket.shutdown().await;
    });
    let client = PkClient::new(&base, None).unwrap();
    let a = Keypair::from_seed(&[1; 32]).public_key();
    let mut events = client
        .stream(StreamRequest::new().user(a).live(true))
        .await
        .unwrap();
    let one = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("the first event arrives while the stream is open")
        .unwrap()
        .unwrap();
    assert_eq!((one.url.as_str(), one.cursor), (first.as_str(), 1));
    go_tx.send(()).unwrap();
    let two = events.next().await.unwrap().unwrap();
    assert_eq!(
        (two.kind, two.url.as_str(), two.cursor),
        (EventKind::Del, second.as_str(), 2)
    );
    assert!(events.next().await.is_none());
}

#[tokio::test]
async fn server_error_event_ends_the_stream() {
    let body = format!(
        "event: PUT\nid: 1\ndata: {}\ndata: cursor: 1\ndata: content_hash: AQ==\n\n\
         event: error\ndata: the event stream failed on the server; resume from the last id\n\n",
        user_url(1, "pub/a")
    );
    let (base, _) = serve(Arc::new(move |_: &Recorded, _| sse(&body))).await;
    let client = PkClient::new(&base, None).unwrap();
    let a = Keypair::from_seed(&[1; 32]).public_key();
    let got: Vec<_> = client
        .stream(StreamRequest::new().user(a))
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].as_ref().unwrap().cursor, 1);
    let err = got[1].as_ref().unwrap_err();
    assert!(matches!(err, ClientError::StreamFailed { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "the homeserver ended the event stream with an error: the event stream failed on the \
         server; resume from the last id"
    );
}

fn limited(retry_after: &str) -> Reply {
    Reply {
        status: 429,
        headers: vec![
            ("content-type", "application/json".into()),
            ("retry-after", retry_after.into()),
        ],
        body: br#"{"error":"rate_limit_exceeded","message":"rate limit exceeded: retry in 1 s"}"#
            .to_vec(),
    }
}

#[tokio::test]
async fn rate_limited_writes_wait_and_are_signed_again() {
    let (base, seen) = serve(Arc::new(|req: &Recorded, i| match i {
        0 => limited("1"),
        1 => Reply {
            status: 503,
            headers: vec![("retry-after", "0".into())],
            body: br#"{"error":"service_unavailable","message":"busy"}"#.to_vec(),
        },
        _ => put_ok(req, i),
    }))
    .await;
    let notices = Arc::new(Mutex::new(Vec::new()));
    let heard = notices.clone();
    let client = PkClient::new(&base, Some(keypair()))
        .unwrap()
        .on_retry(move |n| heard.lock().unwrap().push(n.clone()));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, b"file body").unwrap();
    client.put_file("/pub/f", &file).await.unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    // Every attempt carries the whole body and a fresh signature over it: a write's
    // signature is accepted once, so a retry must never resend the refused one.
    let signed: Vec<AuthHeader> = seen.iter().map(Recorded::verify).collect();
    for req in seen.iter() {
        assert_eq!(req.body, b"file body");
    }
    assert!(signed[1].timestamp > signed[0].timestamp);
    assert!(signed[2].timestamp > signed[1].timestamp);
    let notices = notices.lock().unwrap();
    assert_eq!(
        notices
            .iter()
            .map(|n| (n.status.as_u16(), n.wait, n.retry, n.max_retries))
            .collect::<Vec<_>>(),
        [
            (429, Duration::from_secs(1), 1, 5),
            (503, Duration::ZERO, 2, 5)
        ]
    );
    assert_eq!(notices[0].method, reqwest::Method::PUT);
    assert_eq!(notices[0].target, "/pub/f");
}

#[tokio::test]
async fn reads_and_feeds_are_retried_too() {
    let (base, seen) = serve(Arc::new(|req: &Recorded, i| {
        match (i, req.target.as_str()) {
            (0, _) | (2, _) => limited("0"),
            (_, t) if t.starts_with("/events/") => json(200, r#"{"events":[],"cursor":0}"#),
            _ => Reply {
                status: 200,
                headers: vec![("etag", "\"AQ==\"".into())],
                body: b"v".to_vec(),
            },
        }
    }))
    .await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    assert_eq!(&client.get_bytes("/pub/r", None).await.unwrap()[..], b"v");
    client.events(0, None).await.unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4);
    for req in seen.iter() {
        req.verify();
    }
}

#[tokio::test]
async fn retries_are_bounded() {
    let (base, seen) = serve(Arc::new(|_: &Recorded, _| limited("0"))).await;
    let policy = RetryPolicy {
        max_retries: 2,
        ..RetryPolicy::default()
    };
    let client = PkClient::new(&base, Some(keypair()))
        .unwrap()
        .with_retry_policy(policy);
    let err = client.delete("/pub/x").await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::RateLimitExceeded));
    assert_eq!(
        seen.lock().unwrap().len(),
        3,
        "the first try and two retries"
    );

    // A server asking for longer than the policy allows is not waited for.
    let (base, seen) = serve(Arc::new(|_: &Recorded, _| limited("3600"))).await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let err = client.events(0, None).await.unwrap_err();
    assert_eq!(err.status(), Some(reqwest::StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(seen.lock().unwrap().len(), 1);

    // RetryPolicy::never() hands back the first 429.
    let (base, seen) = serve(Arc::new(|_: &Recorded, _| limited("0"))).await;
    let client = PkClient::new(&base, None)
        .unwrap()
        .with_retry_policy(RetryPolicy::never());
    assert!(client.events(0, None).await.is_err());
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn signup_says_whether_the_account_is_new() {
    let (base, seen) = serve(Arc::new(|_: &Recorded, i| {
        json(
            if i == 0 { 201 } else { 200 },
            &format!(
                r#"{{"public_key":"{}","created_at":1700000000}}"#,
                keypair().public_key()
            ),
        )
    }))
    .await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    assert!(client.signup_status(None).await.unwrap().created);
    let again = client.signup_status(Some("abcd-efgh-jkmn")).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.result.created_at, 1_700_000_000);
    // A lower-case token goes out as the server makes them: upper case.
    let seen = seen.lock().unwrap();
    assert_eq!(seen[1].target, "/signup?signup_token=ABCD-EFGH-JKMN");
    seen[1].verify();
}

#[tokio::test]
async fn account_is_a_signed_get() {
    let body = format!(
        r#"{{"public_key":"{}","created_at":1700000000,"used_bytes":12,"quota_bytes":0,"max_value_bytes":10485760,"disabled":false}}"#,
        keypair().public_key()
    );
    let (base, seen) = serve(Arc::new(move |_: &Recorded, _| json(200, &body))).await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let account = client.account().await.unwrap();
    assert_eq!((account.used_bytes, account.quota_bytes), (12, 0));
    let req = seen.lock().unwrap()[0].clone();
    assert_eq!(
        (req.method.as_str(), req.target.as_str()),
        ("GET", "/account")
    );
    req.verify();
    assert!(matches!(
        PkClient::new(&base, None).unwrap().account().await,
        Err(ClientError::MissingKey)
    ));
}

#[tokio::test]
async fn uploads_report_progress() {
    let (base, _) = serve(Arc::new(put_ok)).await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big");
    let data = vec![7u8; 1_000_000];
    std::fs::write(&file, &data).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let progress: crate::Progress = Arc::new(move |n| log.lock().unwrap().push(n));
    client
        .put_file_with_progress("/pub/big", &file, Some(progress))
        .await
        .unwrap();
    let seen = seen.lock().unwrap();
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "never backwards");
    assert_eq!(seen.last(), Some(&(data.len() as u64)));
    assert!(
        seen.len() > 2,
        "several steps for a 1 MB body: {}",
        seen.len()
    );
}

fn value_reply(body: &'static [u8], etag: String) -> Reply {
    Reply {
        status: 200,
        headers: vec![
            ("content-type", "application/octet-stream".into()),
            ("etag", etag),
        ],
        body: body.to_vec(),
    }
}

#[tokio::test]
async fn downloads_are_checked_against_the_content_hash() {
    let good = format!("\"{}\"", crate::transfer::content_hash_of(b"the value"));
    let (base, _) = serve(Arc::new(move |req: &Recorded, _| {
        if req.target == "/pub/damaged" {
            value_reply(b"the valuE", good.clone())
        } else {
            value_reply(b"the value", good.clone())
        }
    }))
    .await;
    let client = PkClient::new(&base, Some(keypair())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("out");
    let got = client
        .download("/pub/ok", None, &dest, crate::DownloadOptions::default())
        .await
        .unwrap();
    assert!(got.verified);
    assert_eq!(got.size, 9);
    assert_eq!(std::fs::read(&dest).unwrap(), b"the value");

    // An existing file is kept unless overwriting was asked for.
    std::fs::write(&dest, b"mine").unwrap();
    let err = client
        .download("/pub/ok", None, &dest, crate::DownloadOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::DestinationExists { .. }),
        "{err:?}"
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"mine");

    // A value that does not match its hash never replaces the file, and leaves no
    // temporary file behind.
    let options = crate::DownloadOptions {
        overwrite: true,
        progress: None,
    };
    let err = client
        .download("/pub/damaged", None, &dest, options.clone())
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::HashMismatch { .. }), "{err:?}");
    assert_eq!(std::fs::read(&dest).unwrap(), b"mine");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    client
        .download("/pub/ok", None, &dest, options)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"the value");
}

#[tokio::test]
async fn an_unreachable_server_is_named() {
    // Bind and drop: nothing listens on this port any more.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let client = PkClient::new(&format!("127.0.0.1:{port}"), None).unwrap();
    let err = client.events(0, None).await.unwrap_err();
    match &err {
        ClientError::Unreachable { url, refused, .. } => {
            assert_eq!(url, &format!("http://127.0.0.1:{port}"));
            assert!(refused);
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
    assert!(err.is_unreachable());
    let text = err.to_string();
    assert!(
        text.contains("cannot connect to the homeserver at http://127.0.0.1:"),
        "{text}"
    );
    assert!(text.to_ascii_lowercase().contains("refused"), "{text}");
}
