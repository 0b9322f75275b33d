//! docs/examples/nginx.conf, run unchanged by Debian's nginx in front of two instances
//! made from docs/examples/scale-out.toml on PostgreSQL + S3: TLS with a throwaway
//! certificate, the request id passed through, rate limits keyed on the real client
//! address (clients on 127.0.0.1 and 127.0.0.2), a path with `%2F` passed on as sent
//! (its signature verifies; it reads back under the path with `/`), the probes answered
//! to the allowed monitor (127.0.0.1) only, live event streams (each event within 1 s),
//! nginx's own errors in the JSON shape, a 100 MiB chunked upload that streams
//! through (the instance has passed most of it on to S3 while the client still holds
//! the rest back, and its peak memory grows by a fraction of the value), and failover
//! when one instance is killed (no acknowledged write lost or doubled, and no write
//! sent twice).
//!
//! The file fixes its ports, so this is one test: nginx on 127.0.0.1:8443 as
//! hs.example.org, the instances on 127.0.0.1:6291 and 127.0.0.1:6292. nginx runs as
//! the packaged one does (as root: the file logs under /var/log/nginx), with `-p` (a
//! scratch folder with the certificate under `tls/` and a link to the file), `-e stderr`
//! and `-g` (its pid file, in the foreground). Skipped with a printed reason without
//! nginx (apt nginx-light), root, PostgreSQL or moto, or when the ports are taken; each
//! of those is a failure when CI=true.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use homeserver::persistence::BlobsUrl;
use homeserver_protocol::event::EventPage;
use homeserver_protocol::{AuthHeader, BodyHash, ErrorBody, ErrorCode, Keypair};
use reqwest::{Method, StatusCode};

use crate::backend::{PgDatabase, S3Server};
use crate::fixture::*;
use crate::process::ServerProcess;

/// What the file says: the name, the port nginx listens on, the instances.
const NAME: &str = "hs.example.org";
const PROXY_PORT: u16 = 8443;
const INSTANCE_PORTS: [u16; 2] = [6291, 6292];
const URL: &str = "https://hs.example.org:8443";

/// The instances' anonymous limit in this test (per instance, per client address).
const ANONYMOUS_PER_MINUTE: usize = 20;
/// The upload that must stream: the example's storage.max_value_bytes.
const BIG: usize = 100 << 20;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Why the test cannot run, printed; a failure with `CI=true`.
fn skip(why: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true and the nginx test cannot run: {why}"
    );
    eprintln!("SKIPPED nginx_example_fronts_two_instances: {why}");
}

fn nginx_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|p| p.is_file())
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// nginx from the example file, stopped (with its workers) when dropped or when this
/// test process exits.
struct Nginx {
    watcher: Child,
    _dir: tempfile::TempDir,
}

impl Nginx {
    /// Starts nginx on the example file with a certificate for [`NAME`] in a scratch
    /// prefix; returns it and the certificate to trust.
    fn start(program: &Path) -> Result<(Self, reqwest::Certificate), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let certified =
            rcgen::generate_simple_self_signed(vec![NAME.to_owned()]).map_err(|e| e.to_string())?;
        std::fs::create_dir(dir.path().join("tls")).map_err(|e| e.to_string())?;
        std::fs::write(dir.path().join("tls/fullchain.pem"), certified.cert.pem())
            .map_err(|e| e.to_string())?;
        std::fs::write(
            dir.path().join("tls/privkey.pem"),
            certified.signing_key.serialize_pem(),
        )
        .map_err(|e| e.to_string())?;
        // A link, not a copy: nginx reads the file in the repository, and resolves its
        // relative paths (the certificate) against the link's folder.
        std::os::unix::fs::symlink(
            repo().join("docs/examples/nginx.conf"),
            dir.path().join("nginx.conf"),
        )
        .map_err(|e| e.to_string())?;
        let script = format!(
            "\"$0\" -p \"$1/\" -c \"$1/nginx.conf\" -e stderr -g \"daemon off; pid $1/nginx.pid;\" & \
             nginx=$!; trap 'kill $nginx 2>/dev/null; wait $nginx' EXIT TERM; \
             while kill -0 {parent} 2>/dev/null && kill -0 $nginx 2>/dev/null; do sleep 0.5; done",
            parent = std::process::id()
        );
        let mut watcher = Command::new("bash")
            .arg("-c")
            .arg(script)
            .arg(program)
            .arg(dir.path())
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting nginx: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", PROXY_PORT)).is_ok() {
                let trust = reqwest::Certificate::from_der(certified.cert.der())
                    .map_err(|e| e.to_string())?;
                return Ok((Self { watcher, _dir: dir }, trust));
            }
            if let Ok(Some(status)) = watcher.try_wait() {
                return Err(format!(
                    "nginx exited at start ({status}); its errors are above"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("nginx did not listen on {PROXY_PORT}"))
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM to the watcher: its trap stops nginx (master and workers).
        let _ = Command::new("kill")
            .arg(self.watcher.id().to_string())
            .status();
        let _ = self.watcher.wait();
    }
}

/// A client of the proxy from `local` (127.0.0.x), trusting `trust`.
fn client(local: [u8; 4], trust: &reqwest::Certificate, http1_only: bool) -> reqwest::Client {
    let builder = reqwest::Client::builder()
        .add_root_certificate(trust.clone())
        .resolve(NAME, SocketAddr::from(([127, 0, 0, 1], PROXY_PORT)))
        .local_address(IpAddr::from(local));
    let builder = if http1_only {
        builder.http1_only()
    } else {
        builder
    };
    builder.build().unwrap()
}

/// A request signed by `key` now; writes declare their body's digest, as `pk` does (so
/// they count against the key's rate limit, not the address's).
fn signed(
    http: &reqwest::Client,
    key: &Keypair,
    method: Method,
    target: &str,
    body: &[u8],
) -> reqwest::RequestBuilder {
    let write = method == Method::PUT || method == Method::POST;
    let request = signed_request(http, URL, key, method, target, body.to_vec(), now());
    if write {
        request.header("Content-Digest", BodyHash::of(body).to_content_digest())
    } else {
        request
    }
}

/// A `/proc/PID/status` field in bytes (the kB figures).
fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        * 1024
}

/// Bytes in the parts of multipart uploads begun but not finished in `bucket`: what an
/// instance has passed on of a large value it is still receiving.
async fn bytes_in_unfinished_uploads(http: &reqwest::Client, endpoint: &str, bucket: &str) -> u64 {
    let get =
        |url: String| async move { http.get(url).send().await.unwrap().text().await.unwrap() };
    let between = |xml: &str, tag: &str| -> Vec<String> {
        xml.split(&format!("<{tag}>"))
            .skip(1)
            .filter_map(|s| {
                s.split_once(&format!("</{tag}>"))
                    .map(|(v, _)| v.to_owned())
            })
            .collect()
    };
    let uploads = get(format!("{endpoint}/{bucket}?uploads")).await;
    let mut total = 0;
    for upload in uploads.split("<Upload>").skip(1) {
        let (Some(key), Some(id)) = (
            between(upload, "Key").pop(),
            between(upload, "UploadId").pop(),
        ) else {
            continue;
        };
        let parts = get(format!("{endpoint}/{bucket}/{key}?uploadId={id}")).await;
        total += between(&parts, "Size")
            .iter()
            .filter_map(|s| s.parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

async fn error_body(response: reqwest::Response) -> (StatusCode, ErrorBody) {
    let status = response.status();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{status} {e}: {text}"));
    (status, body)
}

#[tokio::test]
async fn nginx_example_fronts_two_instances() {
    if crate::fixture::instances() == 2 {
        // The two-instance pass of the suite: this test starts its own two instances
        // whatever the suite's backend, and ran in the first pass already.
        eprintln!("nginx_example_fronts_two_instances: runs in the suite's first pass only");
        return;
    }
    let Some(nginx) = nginx_binary() else {
        return skip("no nginx (Debian: apt-get install nginx-light)");
    };
    if !running_as_root() {
        return skip("nginx.conf uses the packaged nginx's folders (/var/log/nginx): run as root");
    }
    for port in std::iter::once(PROXY_PORT).chain(INSTANCE_PORTS) {
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            return skip(&format!(
                "127.0.0.1:{port}, which nginx.conf names, is in use"
            ));
        }
    }
    let Some(db) = PgDatabase::or_skip("nginx_example_fronts_two_instances") else {
        return;
    };
    let Some(s3) = S3Server::or_skip("nginx_example_fronts_two_instances") else {
        return;
    };

    // Two instances of the scale-out example, each with what the file says differs
    // per instance in its environment (the listeners; ServerProcess sets them), the
    // stores pointed at this test's, and this machine's proxy as the trusted one.
    let dirs = tempfile::tempdir().unwrap();
    let settings = s3.settings();
    let bucket = s3.new_bucket();
    let env: Vec<(String, String)> = [
        ("STORAGE__DATABASE_URL", db.url.expose_secret().to_owned()),
        (
            "STORAGE__BLOBS",
            BlobsUrl::parse(&format!("s3://{bucket}"))
                .unwrap()
                .to_string(),
        ),
        ("S3__ENDPOINT", settings.endpoint.clone()),
        ("S3__REGION", settings.region.clone()),
        ("S3__PATH_STYLE", "true".into()),
        ("S3__ALLOW_HTTP", "true".into()),
        ("S3__ACCESS_KEY_ID", "test".into()),
        ("S3__SECRET_ACCESS_KEY", "test".into()),
        (
            "KEYS__SECRET_KEY_FILE",
            dirs.path().join("server.key").display().to_string(),
        ),
        (
            "POLICIES__DIR",
            dirs.path().join("policies").display().to_string(),
        ),
        ("RATE_LIMIT__ENABLED", "true".into()),
        (
            "RATE_LIMIT__ANONYMOUS_PER_MINUTE",
            ANONYMOUS_PER_MINUTE.to_string(),
        ),
        ("RATE_LIMIT__AUTHENTICATED_PER_MINUTE", "1000000".into()),
        ("RATE_LIMIT__TRUSTED_PROXIES", "[\"127.0.0.1\"]".into()),
    ]
    .into_iter()
    .map(|(k, v)| (format!("HOMESERVER__{k}"), v))
    .collect();
    let config = repo().join("docs/examples/scale-out.toml");
    let mut first = ServerProcess::start_with_config(
        &dirs.path().join("a"),
        INSTANCE_PORTS[0],
        Some(&config),
        &env,
    )
    .await;
    let second = ServerProcess::start_with_config(
        &dirs.path().join("b"),
        INSTANCE_PORTS[1],
        Some(&config),
        &env,
    )
    .await;
    let (_nginx, trust) = match Nginx::start(&nginx) {
        Ok(started) => started,
        Err(why) => panic!("{why}"),
    };
    let c1 = client([127, 0, 0, 1], &trust, false);
    let c2 = client([127, 0, 0, 2], &trust, false);

    // TLS, HTTP/2 from the client, and the request id: nginx's own, or the client's.
    let alice = Keypair::random();
    let r = signed(&c1, &alice, Method::POST, "/signup", b"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    let id = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "nginx's request id reaches the instance and comes back: {id}"
    );
    let r = signed(&c1, &alice, Method::GET, "/pub/", b"")
        .header("X-Request-Id", "nginx-test.1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "nginx-test.1");

    rate_limits_key_on_the_client(&c1, &c2, &alice).await;
    escaped_paths_pass_as_sent(&c1, &alice).await;
    probes_answer_monitors_only(&c1, &c2).await;
    events_arrive_live(&c1, &alice).await;
    nginx_errors_are_json(&c1, &alice).await;
    let h1 = client([127, 0, 0, 1], &trust, true);
    big_upload_streams(&h1, &alice, [first.pid(), second.pid()], (s3, &bucket)).await;
    failover_loses_nothing(&c1, &alice, &mut first).await;
}

/// 127.0.0.2 uses up its anonymous requests on both instances; a forged
/// X-Forwarded-For does not give it new ones; 127.0.0.1 still has its own.
async fn rate_limits_key_on_the_client(
    c1: &reqwest::Client,
    c2: &reqwest::Client,
    alice: &Keypair,
) {
    let public_read = |c: &reqwest::Client| {
        c.get(format!("{URL}/pub/"))
            .header("Pubky-Host", alice.public_key().to_z32())
    };
    let (mut allowed, mut refused_in_a_row) = (0, 0);
    for _ in 0..4 * ANONYMOUS_PER_MINUTE + 8 {
        let r = public_read(c2).send().await.unwrap();
        match r.status() {
            StatusCode::OK => (allowed, refused_in_a_row) = (allowed + 1, 0),
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(r.headers().contains_key("retry-after"));
                let (_, body) = error_body(r).await;
                assert_eq!(body.error, ErrorCode::RateLimitExceeded);
                refused_in_a_row += 1;
                // Both instances (nginx alternates them) have refused twice.
                if refused_in_a_row == 4 {
                    break;
                }
            }
            other => panic!("anonymous read through the proxy: {other}"),
        }
    }
    assert_eq!(refused_in_a_row, 4, "127.0.0.2 is limited");
    assert!(
        allowed >= ANONYMOUS_PER_MINUTE,
        "each instance gave 127.0.0.2 its {ANONYMOUS_PER_MINUTE} (got {allowed} in all)"
    );
    // What a client writes into X-Forwarded-For itself is not believed.
    for _ in 0..2 {
        let r = public_read(c2)
            .header("X-Forwarded-For", "127.0.0.9")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    // Another client address has buckets of its own (keyed on the proxy, it would not).
    let r = public_read(c1).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let remaining: usize = r.headers()["x-ratelimit-remaining"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(remaining > 0, "127.0.0.1 has its own bucket");
}

/// A target with `%2F` (what clients generated from the OpenAPI document send) reaches
/// the instance as sent: its signature, over that target, verifies (a proxy that decoded
/// it, e.g. `proxy_pass http://homeserver/` or a `rewrite`, would make it 401), and the
/// value reads back under the canonical path, with `/`.
async fn escaped_paths_pass_as_sent(c1: &reqwest::Client, alice: &Keypair) {
    let r = signed(
        c1,
        alice,
        Method::PUT,
        "/pub/example.com/nginx%2Fescaped.txt",
        b"escaped",
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    for spelling in [
        "/pub/example.com/nginx/escaped.txt",
        "/pub/example.com/nginx%2fescaped.txt",
    ] {
        let r = signed(c1, alice, Method::GET, spelling, b"")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{spelling}");
        assert_eq!(r.text().await.unwrap(), "escaped", "{spelling}");
    }
}

/// /health and /ready through the proxy answer the monitor the file allows (127.0.0.1)
/// and refuse anyone else with nginx's 403 in the JSON shape.
async fn probes_answer_monitors_only(c1: &reqwest::Client, c2: &reqwest::Client) {
    for (probe, status) in [("/health", "ok"), ("/ready", "ready")] {
        let r = c1.get(format!("{URL}{probe}")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{probe} from the monitor");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["status"], status, "{probe} from the monitor");
        // nginx matches locations on the decoded, merged path: these are /health and
        // /ready to it too.
        let escaped = format!("/%{:02X}{}", probe.as_bytes()[1], &probe[2..]);
        for spelling in [
            probe.to_owned(),
            format!("{probe}?x=1"),
            format!("/{probe}"),
            escaped,
        ] {
            let r = c2.get(format!("{URL}{spelling}")).send().await.unwrap();
            let (code, body) = error_body(r).await;
            assert_eq!(
                (code, body.error),
                (StatusCode::FORBIDDEN, ErrorCode::InsufficientPermissions),
                "{spelling} from a client"
            );
        }
    }
}

/// Each event reaches a stream opened through the proxy within 1 s of the write's
/// answer (a buffering proxy would hold it until a buffer fills).
async fn events_arrive_live(c1: &reqwest::Client, alice: &Keypair) {
    let r = c1
        .get(format!(
            "{URL}/events-stream?user={}&live=true",
            alice.public_key()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let mut stream = r.bytes_stream();
    let mut seen = String::new();
    for i in 0..3 {
        let path = format!("/pub/live/{i}");
        let r = signed(c1, alice, Method::PUT, &path, b"now")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let answered = Instant::now();
        tokio::time::timeout(Duration::from_secs(30), async {
            // The event's data line: `data: pk://<user>/pub/live/<i>`.
            while !seen.contains(&format!("{path}\n")) {
                let chunk = stream.next().await.expect("the stream stays open").unwrap();
                seen.push_str(&String::from_utf8_lossy(&chunk));
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no event for {path} through the proxy: {seen}"));
        let waited = answered.elapsed();
        assert!(
            waited < Duration::from_secs(1),
            "the event for {path} took {waited:?} through the proxy"
        );
    }
}

/// What nginx answers itself has the homeserver's JSON error shape.
async fn nginx_errors_are_json(c1: &reqwest::Client, alice: &Keypair) {
    // Over client_max_body_size (= storage.max_value_bytes): refused at the headers.
    let header = AuthHeader::sign(alice, "PUT", "/pub/too-big", now(), &BodyHash::empty());
    let r = c1
        .put(format!("{URL}/pub/too-big"))
        .header("Authorization", header.to_header_value())
        .header("Content-Length", (BIG + 1).to_string())
        .body(reqwest::Body::wrap_stream(futures_util::stream::pending::<
            Result<Bytes, std::io::Error>,
        >()))
        .send()
        .await
        .unwrap();
    let (status, body) = error_body(r).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body.error, ErrorCode::PayloadTooLarge);
}

/// 100 MiB, chunked over HTTP/1.1 (what nginx buffers without `proxy_http_version
/// 1.1`) with a session's token (no body hash to compute first): the instances have
/// passed most of it on to S3 while the client still holds the rest back, and their
/// peak memory grows by much less than the value.
async fn big_upload_streams(
    h1: &reqwest::Client,
    alice: &Keypair,
    pids: [u32; 2],
    (s3, bucket): (&S3Server, &str),
) {
    let session: serde_json::Value = expect_ok_json(
        signed(
            h1,
            alice,
            Method::POST,
            "/auth/session",
            br#"{"capabilities": ["*:/pub/"]}"#,
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    let token = session["token"].as_str().unwrap().to_owned();
    // Bytes that differ from one MiB to the next (a period of 251).
    let mut value = (0..=250u8).collect::<Vec<u8>>().repeat(BIG / 251 + 1);
    value.truncate(BIG);
    let value = Bytes::from(value);
    // Peak RSS counted from here (writing 5 to clear_refs resets VmHWM).
    let before: Vec<u64> = pids
        .iter()
        .map(|&pid| {
            std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
            proc_status_bytes(pid, "VmRSS")
        })
        .collect();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(2);
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    let put = tokio::spawn(
        h1.put(format!("{URL}/pub/big"))
            .bearer_auth(&token)
            .body(reqwest::Body::wrap_stream(body))
            .send(),
    );
    let held_back = 40 << 20;
    let chunk = 1 << 20;
    for start in (0..BIG - held_back).step_by(chunk) {
        tx.send(Ok(value.slice(start..start + chunk)))
            .await
            .unwrap();
    }
    let plain = reqwest::Client::new();
    eventually(
        "the instances to pass 50 MiB of the upload on to S3 while the client holds the rest",
        Duration::from_secs(60),
        || async { bytes_in_unfinished_uploads(&plain, &s3.endpoint, bucket).await >= 50 << 20 },
    )
    .await;
    for start in (BIG - held_back..BIG).step_by(chunk) {
        tx.send(Ok(value.slice(start..start + chunk)))
            .await
            .unwrap();
    }
    drop(tx);
    let r = put.await.unwrap().unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    for (&pid, rss) in pids.iter().zip(&before) {
        let peak = proc_status_bytes(pid, "VmHWM");
        let grew = peak.saturating_sub(*rss);
        eprintln!("instance {pid}: RSS {rss} B before the upload, peak {peak} B (+{grew})");
        assert!(
            grew < 40 << 20,
            "instance {pid}'s peak memory grew by {grew} B during a {BIG} B upload"
        );
    }
    // It reads back whole.
    let r = h1
        .get(format!("{URL}/pub/big"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let mut stream = r.bytes_stream();
    let mut at = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        assert!(
            at + chunk.len() <= BIG && chunk == value.slice(at..at + chunk.len()),
            "the value reads back as written (bytes from {at})"
        );
        at += chunk.len();
    }
    assert_eq!(at, BIG, "the value reads back whole");
}

/// Writers keep writing through the proxy while one instance is killed (kill -9):
/// every write is answered 200 or nginx's 503 (never a 401 replay: no write was sent
/// twice), the last ones all succeed (on the other instance), and every acknowledged
/// write reads back and has exactly one event.
async fn failover_loses_nothing(c1: &reqwest::Client, alice: &Keypair, victim: &mut ServerProcess) {
    const WRITERS: usize = 3;
    const WRITES: usize = 40;
    let done = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (c1, alice, done) = (c1.clone(), alice.clone(), done.clone());
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                for i in 0..WRITES {
                    let path = format!("/pub/failover/{w}/{i}");
                    let r = signed(&c1, &alice, Method::PUT, &path, path.as_bytes())
                        .send()
                        .await
                        .unwrap();
                    let status = r.status();
                    if status != StatusCode::OK {
                        let (_, body) = error_body(r).await;
                        assert_eq!(
                            (status, body.error),
                            (
                                StatusCode::SERVICE_UNAVAILABLE,
                                ErrorCode::ServiceUnavailable
                            ),
                            "{path}: a write that fails over is refused, not repeated: {}",
                            body.message
                        );
                    }
                    outcomes.push((path, status == StatusCode::OK));
                    done.fetch_add(1, Ordering::SeqCst);
                }
                outcomes
            })
        })
        .collect();
    eventually("the first writes", Duration::from_secs(60), || async {
        done.load(Ordering::SeqCst) >= WRITERS * 10
    })
    .await;
    victim.kill();
    let mut outcomes = Vec::new();
    for writer in writers {
        let written = writer.await.unwrap();
        // The last writes all went to the instance that is left.
        assert!(
            written[WRITES - 15..].iter().all(|(_, ok)| *ok),
            "writes after the kill fail: {written:?}"
        );
        outcomes.extend(written);
    }
    let acknowledged: Vec<&String> = outcomes
        .iter()
        .filter(|(_, ok)| *ok)
        .map(|(path, _)| path)
        .collect();
    eprintln!(
        "failover: {} of {} writes acknowledged",
        acknowledged.len(),
        outcomes.len()
    );
    futures_util::stream::iter(acknowledged)
        .for_each_concurrent(8, |path| async move {
            let r = signed(c1, alice, Method::GET, path, b"")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{path} was acknowledged");
            assert_eq!(r.text().await.unwrap(), *path);
        })
        .await;
    // One PUT event per acknowledged write, at most one per refused one.
    let mut events: std::collections::HashMap<String, usize> = Default::default();
    let mut cursor = 0;
    loop {
        let target = format!("/events/?cursor={cursor}&limit=1000");
        let page: EventPage = expect_ok_json(
            signed(c1, alice, Method::GET, &target, b"")
                .send()
                .await
                .unwrap(),
        )
        .await;
        for event in &page.events {
            if let Some(path) = event.url.split_once("/pub/failover/").map(|(_, p)| p) {
                *events.entry(format!("/pub/failover/{path}")).or_default() += 1;
            }
        }
        if page.events.is_empty() {
            break;
        }
        cursor = page.cursor;
    }
    for (path, ok) in &outcomes {
        let n = events.get(path).copied().unwrap_or(0);
        if *ok {
            assert_eq!(n, 1, "events of the acknowledged {path}");
        } else {
            assert!(n <= 1, "events of the refused {path}: {n}");
        }
    }
}
