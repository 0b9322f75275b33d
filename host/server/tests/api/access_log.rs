//! The access log (target `access`): one line per request on the client and admin
//! listeners with every field, as JSON fields in the JSON format; the caller as the
//! services proved it (anonymous, key, session); the client behind a trusted proxy;
//! streamed bodies logged when they end, with their real size; and never a signup token
//! nor an `Authorization` header. The log is captured in the test's own thread (the
//! server runs on the test's single-threaded runtime).

use std::time::Duration;

use futures_util::StreamExt;
use hs_testkit::CapturedLog;
use reqwest::Method;
use serde_json::{Value, json};

use crate::fixture::*;

/// Captures the `access` target (only) as text or JSON lines until the guard goes.
fn capture(json: bool) -> (CapturedLog, tracing::subscriber::DefaultGuard) {
    let log = CapturedLog::default();
    let writer = log.clone();
    let builder = tracing_subscriber::fmt()
        .with_env_filter("access=info")
        .with_ansi(false)
        .with_writer(move || writer.clone());
    let guard = match json {
        true => tracing::subscriber::set_default(builder.json().finish()),
        false => tracing::subscriber::set_default(builder.finish()),
    };
    (log, guard)
}

/// The JSON access lines, parsed.
fn json_lines(log: &CapturedLog) -> Vec<Value> {
    log.text()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// The one line (its fields) of the request with this id.
fn line_of(lines: &[Value], id: &str) -> Value {
    let found: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["request_id"] == id)
        .collect();
    assert_eq!(found.len(), 1, "one line for {id}: {lines:#?}");
    assert_eq!(found[0]["target"], "access");
    assert_eq!(found[0]["level"], "INFO");
    assert!(found[0]["timestamp"].is_string(), "{}", found[0]);
    found[0]["fields"].clone()
}

/// Waits until the line of `id` is written (a body is logged when hyper drops it, just
/// after the client has read it).
async fn wait_for_line(log: &CapturedLog, id: &str) {
    eventually(
        &format!("the access line of {id}"),
        Duration::from_secs(30),
        || async { log.text().contains(id) },
    )
    .await;
}

#[tokio::test]
async fn every_request_logs_one_json_line_with_every_field_and_no_secret() {
    let (log, _guard) = capture(true);
    let host = TestHost::start_single_with(|c| {
        c.rate_limit.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
        c.signup.mode = homeserver::config::SignupMode::Token;
    })
    .await;
    let token: Value = host.admin_json(Method::POST, "/admin/signup_tokens").await;
    let token = token["token"].as_str().unwrap().to_owned();

    // A signed signup with the token in the query, through a "proxy".
    let alice = homeserver_protocol::Keypair::random();
    let target = format!("/signup?signup_token={token}");
    let signup = host.signed(&alice, Method::POST, &target, b"");
    let authorization = signup.try_clone().unwrap().build().unwrap().headers()["authorization"]
        .to_str()
        .unwrap()
        .to_owned();
    let r = signup
        .header("x-request-id", "signup-1")
        .header("x-forwarded-for", "198.51.100.7")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);

    // A signed PUT of 1 KiB; a public GET of it; a session's GET; a 404; the token check.
    let value = vec![7u8; 1024];
    let r = host
        .signed(&alice, Method::PUT, "/pub/a.bin", &value)
        .header("x-request-id", "put-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = host
        .request(Method::GET, "/pub/a.bin?x=1")
        .header("Pubky-Host", alice.public_key().to_z32())
        .header("x-request-id", "public-get-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.bytes().await.unwrap().len(), 1024);
    let body = serde_json::to_vec(&json!({ "capabilities": ["read:/pub/"] })).unwrap();
    let session: Value = expect_ok_json(
        host.signed(&alice, Method::POST, "/auth/session", &body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    let session = session["token"].as_str().unwrap().to_owned();
    let r = host
        .request(Method::GET, "/pub/a.bin")
        .bearer_auth(&session)
        .header("x-request-id", "session-get-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.bytes().await.unwrap().len(), 1024);
    let r = host
        .request(Method::GET, "/pub/missing")
        .header("Pubky-Host", alice.public_key().to_z32())
        .header("x-request-id", "missing-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = host
        .request(Method::GET, &format!("/signup_tokens/{token}"))
        .header("x-request-id", "token-check-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The probes are not logged.
    for path in ["/health", "/ready"] {
        let r = host
            .request(Method::GET, path)
            .header("x-request-id", "probe-1")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = host
        .admin(Method::GET, "/admin/stats")
        .header("x-request-id", "admin-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    for id in [
        "signup-1",
        "put-1",
        "public-get-1",
        "session-get-1",
        "missing-1",
        "token-check-1",
        "admin-1",
    ] {
        wait_for_line(&log, id).await;
    }

    let lines = json_lines(&log);
    let alice_key = alice.public_key().to_z32();
    let signup = line_of(&lines, "signup-1");
    assert_eq!(signup["listener"], "http");
    assert_eq!(signup["method"], "POST");
    assert_eq!(signup["path"], "/signup?signup_token=****");
    assert_eq!(signup["status"], 201);
    assert_eq!(signup["caller"], "key");
    assert_eq!(signup["key"], alice_key.as_str());
    assert_eq!(
        signup["client"], "198.51.100.7",
        "the client behind the trusted proxy"
    );
    for field in ["bytes_in", "bytes_out", "duration_us"] {
        assert!(signup[field].is_u64(), "{field}: {signup}");
    }

    let put = line_of(&lines, "put-1");
    assert_eq!(put["method"], "PUT");
    assert_eq!(put["path"], "/pub/a.bin");
    assert_eq!(put["bytes_in"], 1024);
    assert_eq!(put["caller"], "key");
    assert_eq!(put["client"], "127.0.0.1");

    let public = line_of(&lines, "public-get-1");
    assert_eq!(public["path"], "/pub/a.bin?x=1");
    assert_eq!(public["status"], 200);
    assert_eq!(public["bytes_in"], 0);
    assert_eq!(public["bytes_out"], 1024);
    assert_eq!(public["caller"], "anonymous");
    assert!(public.get("key").is_none(), "{public}");
    assert!(public.get("aborted").is_none(), "{public}");

    let by_session = line_of(&lines, "session-get-1");
    assert_eq!(by_session["caller"], "session");
    assert_eq!(by_session["key"], alice_key.as_str());
    assert_eq!(by_session["bytes_out"], 1024);

    assert_eq!(line_of(&lines, "missing-1")["status"], 404);
    assert_eq!(
        line_of(&lines, "token-check-1")["path"],
        "/signup_tokens/****"
    );
    let admin = line_of(&lines, "admin-1");
    assert_eq!(admin["listener"], "admin");
    assert_eq!(admin["path"], "/admin/stats");

    // Every request got exactly one line (those made by the fixture have made-up ids).
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["fields"]["request_id"].as_str().unwrap())
        .collect();
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(ids.len(), unique.len(), "one line per request: {ids:?}");
    assert_eq!(ids.len(), 9, "{ids:?}");

    // No secret anywhere, no probe.
    let text = log.text();
    assert!(!text.contains("probe-1"), "{text}");
    for secret in [
        token.as_str(),
        session.as_str(),
        authorization.as_str(),
        ADMIN_PASSWORD,
    ] {
        assert!(!text.contains(secret), "{secret} logged: {text}");
    }
    let signature = authorization.split(':').nth(1).unwrap();
    assert!(!text.contains(signature), "a signature logged: {text}");
}

#[tokio::test]
async fn streamed_bodies_are_logged_when_they_end_with_their_real_size() {
    let (log, _guard) = capture(true);
    let host = TestHost::start_single_with(|c| c.storage.max_value_bytes = 8 << 20).await;
    let alice = host.user().await;
    let big = vec![5u8; 5 << 20];
    let r = host
        .signed_with_digest(&alice, Method::PUT, "/pub/big", &big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // A large GET: streamed from the blob store.
    let r = host.public_get(&alice, "/pub/big").await;
    let id = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(r.bytes().await.unwrap().len(), big.len());
    wait_for_line(&log, &id).await;
    let get = line_of(&json_lines(&log), &id);
    assert_eq!(get["bytes_out"], big.len() as u64);
    assert!(get.get("aborted").is_none(), "{get}");

    // A live event stream the client leaves after the first event: logged then, with
    // what it was sent, as aborted.
    let r = host
        .request(
            Method::GET,
            &format!("/events-stream?user={}&live=true", alice.public_key()),
        )
        .header("x-request-id", "stream-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let mut received = 0usize;
    while let Some(chunk) = stream.next().await {
        received += chunk.unwrap().len();
        if received > 0 {
            break;
        }
    }
    assert!(
        !log.text().contains("stream-1"),
        "an open stream is not logged yet"
    );
    drop(stream);
    wait_for_line(&log, "stream-1").await;
    let line = line_of(&json_lines(&log), "stream-1");
    assert_eq!(line["aborted"], true, "{line}");
    let sent = line["bytes_out"].as_u64().unwrap();
    assert!(sent >= received as u64, "{line}, received {received}");
}

#[tokio::test]
async fn the_text_format_and_turning_it_off() {
    let (log, guard) = capture(false);
    let host = TestHost::start_single_with(|_| {}).await;
    let r = host
        .request(Method::GET, "/info")
        .header("x-request-id", "text-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    wait_for_line(&log, "text-1").await;
    let text = log.text();
    let line = text.lines().find(|l| l.contains("text-1")).unwrap();
    for part in [
        " INFO access: ",
        "listener=http",
        "request_id=text-1",
        "method=GET",
        "path=\"/info\"",
        "status=200",
        "bytes_in=0",
        "bytes_out=",
        "duration_us=",
        "caller=anonymous",
        "client=127.0.0.1",
    ] {
        assert!(line.contains(part), "{part} missing: {line}");
    }

    // logging.access = false: no line. (Checked against a server that logs: both run
    // on this thread, so the second one's line comes after the first one's would have.)
    let quiet = TestHost::start_single_with(|c| c.logging.access = false).await;
    quiet.user().await;
    let r = quiet
        .request(Method::GET, "/info")
        .header("x-request-id", "quiet-1")
        .send()
        .await
        .unwrap();
    assert!(!r.bytes().await.unwrap().is_empty());
    let r = host
        .request(Method::GET, "/info")
        .header("x-request-id", "text-2")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    wait_for_line(&log, "text-2").await;
    let text = log.text();
    assert!(!text.contains("quiet-1"), "{text}");
    assert_eq!(text.lines().count(), 2, "{text}");
    drop(guard);
}
