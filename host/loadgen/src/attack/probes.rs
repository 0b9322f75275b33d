//! Hostile-client probes against a running homeserver: each one replays a fault found
//! when the server was attacked on loopback, and says whether the server now holds.
//!
//! The server must run with open signup (the lockout probe signs up a victim); the
//! probes are told its `header_read_timeout_secs` so they know how long silent
//! connections may live.

use std::time::{Duration, Instant};

use homeserver_protocol::{AuthHeader, BodyHash, ErrorBody, Keypair};
use reqwest::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::scenario::unix_secs;
use crate::target::Target;

/// What the probes need to know of the server and how hard to push.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    pub target: Target,
    /// The server's `http.header_read_timeout_secs`.
    pub header_timeout: Duration,
    /// Silent TCP connections to open at once.
    pub silent: usize,
    /// HTTP/2 connections that send their preface and settings, then nothing.
    pub h2_idle: usize,
    /// Forged writes in the victim's name.
    pub forged: usize,
    /// Forged 5 MiB uploads without a digest, sent at once.
    pub forged_uploads: usize,
    /// The server's data folder, to check that forged uploads wrote nothing.
    pub data_dir: Option<std::path::PathBuf>,
    /// Connections one address holds busy (uploads that never finish) while another
    /// address must still be served.
    pub busy: usize,
    /// Rounds of event streams opened and dropped, watching the server's memory.
    pub stream_rounds: usize,
    /// Event streams opened per round (spread over several loopback addresses).
    pub streams_per_round: usize,
    /// The server's process id, to read its memory (the stream-churn probe needs it).
    pub server_pid: Option<u32>,
}

/// The verdict of one probe.
#[derive(Debug)]
pub struct Finding {
    pub probe: &'static str,
    pub passed: bool,
    pub detail: String,
}

impl Finding {
    fn new(probe: &'static str, passed: bool, detail: String) -> Self {
        Self {
            probe,
            passed,
            detail,
        }
    }
}

/// Runs every probe, in an order where each leaves the server as it found it.
pub async fn run_all(config: &ProbeConfig) -> Vec<Finding> {
    let mut findings = Vec::new();
    findings.push(malformed_heads(config).await);
    findings.push(silent_connections(config).await);
    findings.push(h2_idle_connections(config).await);
    // Before the lockout probe spends the IP's anonymous bucket: these uploads must meet
    // the memory bound, not the rate limit.
    findings.push(forged_uploads(config).await);
    findings.push(forged_lockout(config).await);
    findings.push(busy_connections(config).await);
    findings.push(stream_churn(config).await);
    findings
}

fn url(config: &ProbeConfig, target: &str) -> String {
    format!("http://{}{target}", config.target.authority)
}

async fn connect(config: &ProbeConfig) -> std::io::Result<TcpStream> {
    TcpStream::connect(config.target.addr).await
}

/// Connects from the loopback address `source` (any of 127/8: a server on 127.0.0.1
/// sees a client of its own for each).
async fn connect_from(config: &ProbeConfig, source: [u8; 4]) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::from((source, 0)))?;
    socket.connect(config.target.addr).await
}

/// Reads a response head from `stream` (up to the blank line), within 10 s.
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte)).await {
            Ok(Ok(1)) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// Whether the server closed `stream` before `deadline`.
async fn closed_by(stream: &mut TcpStream, deadline: tokio::time::Instant) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// Sends `request` raw and reads the whole answer (the server closes after it).
async fn raw(config: &ProbeConfig, request: &[u8]) -> std::io::Result<String> {
    let mut stream = connect(config).await?;
    stream.write_all(request).await?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .map_err(|_| std::io::Error::other("no complete answer in 30 s"))??;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// The status of a raw answer, when its body is the JSON error shape.
fn json_error_status(answer: &str) -> Option<u16> {
    let (head, body) = answer.split_once("\r\n\r\n")?;
    serde_json::from_str::<ErrorBody>(body).ok()?;
    head.split(' ').nth(1)?.parse().ok()
}

async fn malformed_heads(config: &ProbeConfig) -> Finding {
    let huge_header = format!(
        "GET /pub/ HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let cases: [(&str, Vec<u8>, &[u16]); 5] = [
        (
            "NUL in target",
            b"GET /pub/a\0b HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            &[400],
        ),
        ("1 MiB header", huge_header.into_bytes(), &[431]),
        (
            "Content-Length 2^64-1",
            b"PUT /pub/a HTTP/1.1\r\nHost: x\r\nContent-Length: 18446744073709551615\r\n\r\n"
                .to_vec(),
            &[400, 431],
        ),
        (
            "Content-Length 2^63",
            b"PUT /pub/a HTTP/1.1\r\nHost: x\r\nContent-Length: 9223372036854775808\r\n\r\n"
                .to_vec(),
            // Unsigned and unsized: refused before any body, for size or credentials.
            &[401, 413],
        ),
        (
            "70 kB target",
            format!(
                "GET /pub/{} HTTP/1.1\r\nHost: x\r\n\r\n",
                "a".repeat(70_000)
            )
            .into_bytes(),
            &[414],
        ),
    ];
    let mut problems = Vec::new();
    for (name, request, expected) in cases {
        match raw(config, &request).await {
            Ok(answer) => match json_error_status(&answer) {
                Some(status) if expected.contains(&status) => {}
                other => problems.push(format!(
                    "{name}: {other:?} ({})",
                    answer.lines().next().unwrap_or("no answer")
                )),
            },
            Err(e) => problems.push(format!("{name}: {e}")),
        }
    }
    Finding::new(
        "malformed heads answer JSON errors",
        problems.is_empty(),
        if problems.is_empty() {
            "5 of 5 with the JSON error shape".into()
        } else {
            problems.join("; ")
        },
    )
}

async fn silent_connections(config: &ProbeConfig) -> Finding {
    let mut silent = Vec::with_capacity(config.silent);
    for _ in 0..config.silent {
        match connect(config).await {
            Ok(s) => silent.push(s),
            Err(e) => {
                return Finding::new(
                    "silent connections",
                    false,
                    format!("could only open {} connections: {e}", silent.len()),
                );
            }
        }
    }
    let started = Instant::now();
    let answered = reqwest::Client::new()
        .get(url(config, "/events/?limit=1"))
        .timeout(config.header_timeout + Duration::from_secs(5))
        .send()
        .await
        .map(|r| r.status());
    let answer_ms = started.elapsed().as_millis();
    let deadline = tokio::time::Instant::now() + config.header_timeout + Duration::from_secs(10);
    let mut still_open = 0;
    for stream in &mut silent {
        if !closed_by(stream, deadline).await {
            still_open += 1;
        }
    }
    let passed = matches!(answered, Ok(StatusCode::OK)) && still_open == 0;
    Finding::new(
        "silent connections",
        passed,
        format!(
            "{} silent connections; a normal request answered {answered:?} in {answer_ms} ms; \
             {still_open} still open 10 s past the header deadline",
            config.silent,
        ),
    )
}

async fn h2_idle_connections(config: &ProbeConfig) -> Finding {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
    let mut streams = Vec::with_capacity(config.h2_idle);
    for i in 0..config.h2_idle {
        let Ok(mut stream) = connect(config).await else {
            continue;
        };
        let mut hello = PREFACE.to_vec();
        if i % 2 == 1 {
            // A HEADERS frame without END_HEADERS: a request head that never completes.
            hello.extend_from_slice(b"\0\0\x01\x01\0\0\0\0\x01\x82");
        }
        if stream.write_all(&hello).await.is_ok() {
            streams.push(stream);
        }
    }
    let deadline = tokio::time::Instant::now() + config.header_timeout + Duration::from_secs(10);
    let mut still_open = 0;
    for stream in &mut streams {
        if !closed_by(stream, deadline).await {
            still_open += 1;
        }
    }
    Finding::new(
        "idle HTTP/2 connections",
        still_open == 0 && streams.len() == config.h2_idle,
        format!(
            "{} opened (half with an unfinished HEADERS frame); {still_open} still open after \
             the header deadline",
            streams.len()
        ),
    )
}

fn signed(
    http: &reqwest::Client,
    config: &ProbeConfig,
    key: &Keypair,
    method: Method,
    target: &str,
    signed_body: &[u8],
) -> reqwest::RequestBuilder {
    let header = AuthHeader::sign(
        key,
        method.as_str(),
        target,
        unix_secs(),
        &BodyHash::of(signed_body),
    );
    http.request(method, url(config, target))
        .header("Authorization", header.to_header_value())
}

async fn forged_lockout(config: &ProbeConfig) -> Finding {
    let http = reqwest::Client::new();
    let victim = Keypair::random();
    let signup = signed(&http, config, &victim, Method::POST, "/signup", b"")
        .send()
        .await
        .map(|r| r.status());
    if !matches!(signup, Ok(StatusCode::CREATED)) {
        return Finding::new(
            "forged-signature lockout",
            false,
            format!("could not sign the victim up: {signup:?}"),
        );
    }
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for i in 0..config.forged {
        let mut request =
            signed(&http, config, &victim, Method::PUT, "/pub/y", b"signed").body("forged");
        if i % 2 == 0 {
            request = request.header(
                "Content-Digest",
                BodyHash::of(b"forged").to_content_digest(),
            );
        }
        let status = request.send().await.map_or(0, |r| r.status().as_u16());
        *statuses.entry(status).or_default() += 1;
    }
    let body = b"the victim's own write";
    let own_put = signed(&http, config, &victim, Method::PUT, "/pub/mine", body)
        .header("Content-Digest", BodyHash::of(body).to_content_digest())
        .body(body.to_vec())
        .send()
        .await
        .map(|r| r.status());
    let own_get = signed(&http, config, &victim, Method::GET, "/pub/mine", b"")
        .send()
        .await
        .map(|r| r.status());
    let forged_refused = statuses.keys().all(|s| matches!(s, 401 | 429));
    let passed = forged_refused
        && matches!(own_put, Ok(StatusCode::OK))
        && matches!(own_get, Ok(StatusCode::OK));
    Finding::new(
        "forged-signature lockout",
        passed,
        format!(
            "{} forged writes answered {statuses:?}; then the victim's own PUT {own_put:?}, \
             GET {own_get:?}",
            config.forged
        ),
    )
}

fn folder_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => folder_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

async fn forged_uploads(config: &ProbeConfig) -> Finding {
    const SIZE: usize = 5 << 20;
    let http = reqwest::Client::new();
    let victim = Keypair::random();
    let _ = signed(&http, config, &victim, Method::POST, "/signup", b"")
        .send()
        .await;
    let blobs = config.data_dir.as_ref().map(|d| d.join("blobs"));
    let before = blobs.as_deref().map(folder_bytes);
    let body = bytes::Bytes::from(vec![b'f'; SIZE]);
    let uploads = (0..config.forged_uploads).map(|i| {
        let target = format!("/pub/forged-{i}");
        signed(&http, config, &victim, Method::PUT, &target, b"not this")
            .body(body.clone())
            .send()
    });
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let mut peak = 0;
    let mut pending: futures_util::stream::FuturesUnordered<_> = uploads.collect();
    use futures_util::StreamExt;
    while let Some(result) = pending.next().await {
        let status = result.map_or(0, |r| r.status().as_u16());
        *statuses.entry(status).or_default() += 1;
        if let Some(dir) = &blobs {
            peak = peak.max(folder_bytes(dir));
        }
    }
    let after = blobs.as_deref().map(folder_bytes);
    let grew = match (before, after) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b).max(peak.saturating_sub(b))),
        _ => None,
    };
    // 0: the server answered before reading the body and closed the connection while
    // the upload was still being sent (the client then sees a broken pipe, not a status).
    let refused = statuses.keys().all(|s| matches!(s, 0 | 401 | 429 | 503));
    let passed = refused && grew.is_none_or(|g| g < (1 << 20));
    Finding::new(
        "forged uploads write nothing",
        passed,
        format!(
            "{} forged 5 MiB uploads answered {statuses:?} (0: closed mid-upload); blob folder \
             grew by {}",
            config.forged_uploads,
            grew.map_or("(not checked: no --data-dir)".into(), |g| format!(
                "{g} bytes"
            ))
        ),
    )
}

/// One address holds connections busy with uploads that never finish (each sends its
/// head and one byte of a 10-byte body); a client at another address must still be
/// served. Without a per-address cap they would fill `max_connections`.
async fn busy_connections(config: &ProbeConfig) -> Finding {
    let victim = Keypair::random();
    let mut held = Vec::with_capacity(config.busy);
    for _ in 0..config.busy {
        let Ok(mut stream) = connect_from(config, [127, 0, 0, 2]).await else {
            continue;
        };
        let head = format!(
            "POST /signup HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Length: 10\r\n\r\nx",
            AuthHeader::sign(
                &victim,
                "POST",
                "/signup",
                unix_secs(),
                &BodyHash::of(b"0123456789")
            )
            .to_header_value()
        );
        if stream.write_all(head.as_bytes()).await.is_ok() {
            held.push(stream);
        }
    }
    // Give the server a moment to take (or refuse) them all.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut refused = 0;
    for stream in &mut held {
        if closed_by(
            stream,
            tokio::time::Instant::now() + Duration::from_millis(20),
        )
        .await
        {
            refused += 1;
        }
    }
    let started = Instant::now();
    let answer = match connect_from(config, [127, 0, 0, 3]).await {
        Ok(mut other) => {
            let sent = other
                .write_all(b"GET /events/?limit=1 HTTP/1.1\r\nHost: x\r\n\r\n")
                .await;
            match sent {
                Ok(()) => read_head(&mut other).await,
                Err(_) => None,
            }
        }
        Err(_) => None,
    };
    let served = answer
        .as_deref()
        .is_some_and(|h| h.starts_with("HTTP/1.1 200"));
    Finding::new(
        "busy connections of one address",
        served && refused > 0,
        format!(
            "{} unfinished uploads from 127.0.0.2, {refused} of them refused; a request from \
             127.0.0.3 {} in {} ms",
            held.len(),
            if served {
                "was answered"
            } else {
                "got no answer"
            },
            started.elapsed().as_millis()
        ),
    )
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Rounds of event streams opened (and their heads read) then dropped, with the
/// server's resident memory after each: it may grow while allocators and buffers warm
/// up, but must level off. Passes when the second half of the rounds adds less than
/// 4 MiB.
async fn stream_churn(config: &ProbeConfig) -> Finding {
    const NAME: &str = "event streams opened and dropped";
    let Some(pid) = config.server_pid else {
        return Finding::new(NAME, true, "skipped: no --server-pid".into());
    };
    if config.stream_rounds == 0 {
        return Finding::new(NAME, true, "skipped: 0 rounds".into());
    }
    let user = Keypair::random().public_key().to_z32();
    let request = format!("GET /events-stream?user={user}&live=true HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut samples = Vec::with_capacity(config.stream_rounds);
    let mut failures = 0;
    for round in 0..config.stream_rounds {
        let mut open = Vec::with_capacity(config.streams_per_round);
        for i in 0..config.streams_per_round {
            // 25 streams per address, fresh addresses each round: within the
            // per-address caps and the anonymous rate limit.
            let [hi, lo] = u16::try_from(round % 60_000).unwrap_or(0).to_be_bytes();
            let source = [
                127,
                hi.saturating_add(1),
                lo,
                10 + u8::try_from(i / 25).unwrap_or(200),
            ];
            let Ok(mut stream) = connect_from(config, source).await else {
                failures += 1;
                continue;
            };
            if stream.write_all(request.as_bytes()).await.is_err() {
                failures += 1;
                continue;
            }
            open.push(stream);
        }
        for stream in &mut open {
            if !read_head(stream)
                .await
                .is_some_and(|h| h.starts_with("HTTP/1.1 200"))
            {
                failures += 1;
            }
        }
        drop(open);
        // Let the server notice the closed streams before measuring.
        tokio::time::sleep(Duration::from_millis(300)).await;
        samples.push(rss_kib(pid).unwrap_or(0));
    }
    let half = samples.len() / 2;
    let growth = samples
        .last()
        .copied()
        .unwrap_or(0)
        .saturating_sub(samples[half]);
    let mib = |kib: u64| format!("{:.1}", kib as f64 / 1024.0);
    Finding::new(
        NAME,
        failures == 0 && growth < 4 * 1024,
        format!(
            "{} rounds of {} streams ({failures} failed); server RSS {} -> {} -> {} MiB \
             (first, middle, last round): the second half added {} MiB",
            samples.len(),
            config.streams_per_round,
            mib(samples[0]),
            mib(samples[half]),
            mib(samples[samples.len() - 1]),
            mib(growth)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_with_the_json_error_shape_count() {
        let json = "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 2\r\n\r\n\
                    {\"error\":\"headers_too_large\",\"message\":\"m\"}";
        assert_eq!(json_error_status(json), Some(431));
        assert_eq!(
            json_error_status("HTTP/1.1 431 Request Header Fields Too Large\r\n\r\n"),
            None
        );
        assert_eq!(json_error_status(""), None);
    }
}
