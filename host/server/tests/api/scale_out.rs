//! Scale-out: the S3 blob store (object_store's own conformance helpers, multipart
//! values, an aborted upload), backing stores that go down and come back (503, then
//! recovery by itself, no partial write), and two real server processes sharing one
//! PostgreSQL database and one bucket (read-after-write, live events woken by NOTIFY,
//! replay marks, signup tokens, sessions and their revocation, quotas, account
//! deletion, event order).
//!
//! Tests that need PostgreSQL or the S3 server skip with a printed reason when those
//! are missing, and fail when `CI=true`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use homeserver::persistence::blobs::open_s3;
use homeserver::persistence::{BlobsUrl, DatabaseUrl};
use homeserver_protocol::event::EventPage;
use homeserver_protocol::wire::ListResult;
use homeserver_protocol::{BodyHash, ErrorCode, Keypair};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use sqlx::Connection;

use crate::backend::{PgDatabase, S3Server};
use crate::fixture::*;
use crate::process::ServerProcess;
use crate::tcp_proxy::TcpProxy;

// ---------------------------------------------------------------------------------------
// S3

#[tokio::test]
async fn object_store_conformance_on_the_s3_server() {
    let Some(s3) = S3Server::or_skip("object_store_conformance_on_the_s3_server") else {
        return;
    };
    use object_store::integration::*;
    let store = || open_s3(&s3.new_bucket(), &s3.settings(), &Default::default()).unwrap();
    put_get_delete_list(&store()).await;
    // Not `put_get_attributes`: its user metadata keys contain `_`, and moto's
    // server (Werkzeug) drops every header with an underscore, as a spoofing guard.
    // AWS keeps them; the homeserver stores no object metadata either way.
    get_opts(&store()).await;
    stream_get(&store()).await;
    list_uses_directories_correctly(&store()).await;
    list_with_delimiter(&store()).await;
    list_with_offset_exclusivity(&store()).await;
    rename_and_copy(&store()).await;
    let s = store();
    multipart(&s, &s).await;
    multipart_out_of_order(&store()).await;
    let s = store();
    multipart_put_part_out_of_order(&s, &s).await;
}

/// Multipart uploads the S3 server still holds in `bucket` (begun, neither completed
/// nor aborted).
async fn pending_multipart_uploads(s3: &S3Server, bucket: &str) -> usize {
    let xml = reqwest::get(format!("{}/{bucket}?uploads", s3.endpoint))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    xml.matches("<UploadId>").count()
}

fn s3_host_config(s3: &S3Server, bucket: &str, c: &mut homeserver::Config) {
    c.storage.blobs = format!("s3://{bucket}").parse().unwrap();
    c.s3 = s3.settings();
}

#[tokio::test]
async fn large_values_stream_through_s3_and_an_aborted_upload_changes_nothing() {
    let Some(s3) = S3Server::or_skip("large_values_stream_through_s3") else {
        return;
    };
    let bucket = s3.new_bucket();
    let host = TestHost::start_with(|c| {
        s3_host_config(s3, &bucket, c);
        c.storage.max_value_bytes = 32 << 20;
        c.storage.quota_bytes = 0;
    })
    .await;
    let alice = host.user().await;
    let user = alice.public_key().to_z32();

    // 12 MiB: three 5 MiB parts at most, streamed (declared digest: no buffering).
    let value: Vec<u8> = (0..12u32 << 20).map(|i| (i % 251) as u8).collect();
    let r = host
        .signed_with_digest(&alice, Method::PUT, "/pub/big", &value)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = host.get(&alice, "/pub/big").await;
    assert_eq!(r.status(), 200);
    assert!(
        r.bytes().await.unwrap() == value,
        "the value reads back whole"
    );

    // An upload that breaks off after 7 MiB (a part is already on S3).
    let replacement = vec![7u8; 12 << 20];
    let header = homeserver_protocol::AuthHeader::sign(
        &alice,
        "PUT",
        "/pub/big",
        now(),
        &BodyHash::of(&replacement),
    );
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = replacement[..7 << 20]
        .chunks(256 << 10)
        .map(|c| Ok(c.to_vec()))
        .chain(std::iter::once(Err(std::io::Error::other("client gone"))))
        .collect();
    let aborted = host
        .request(Method::PUT, "/pub/big")
        .header("Authorization", header.to_header_value())
        .header(
            "Content-Digest",
            BodyHash::of(&replacement).to_content_digest(),
        )
        .header("Content-Length", replacement.len())
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await;
    assert!(aborted.is_err() || !aborted.unwrap().status().is_success());

    // The old value is intact, and nothing of the broken upload stays behind.
    let r = host.get(&alice, "/pub/big").await;
    assert!(r.bytes().await.unwrap() == value, "the old value is intact");
    let ctx = host.server().context();
    eventually(
        "the aborted multipart upload is gone",
        Duration::from_secs(20),
        || async { pending_multipart_uploads(s3, &bucket).await == 0 },
    )
    .await;
    ctx.stores()
        .blobs
        .sweep(ctx.stores().metadata.as_ref(), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        crate::backend::blob_keys(&ctx.stores().blobs, &user)
            .await
            .len(),
        1,
        "one blob: the live value's"
    );
    let used = ctx
        .stores()
        .metadata
        .user(&user)
        .await
        .unwrap()
        .unwrap()
        .used_bytes;
    assert_eq!(used, value.len() as u64);
}

// ---------------------------------------------------------------------------------------
// Outages

/// GET /admin/stats of a TestHost.
async fn admin_stats(host: &TestHost) -> Value {
    let admin = host.server().admin_addr().unwrap();
    expect_ok_json(
        host.http
            .get(format!("http://{admin}/admin/stats"))
            .bearer_auth(ADMIN_PASSWORD)
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// Every acknowledged value reads back whole and usage is the sum of the sizes.
async fn assert_consistent(host: &TestHost, key: &Keypair, expected: &[(&str, Vec<u8>)]) {
    let page: ListResult = expect_ok_json(host.get(key, "/pub/?limit=1000").await).await;
    let paths: Vec<&str> = page.entries.iter().map(|e| e.path.as_str()).collect();
    let wanted: Vec<&str> = expected.iter().map(|(p, _)| *p).collect();
    assert_eq!(paths, wanted, "exactly the acknowledged writes");
    for (path, body) in expected {
        let r = host.get(key, path).await;
        assert_eq!(r.status(), 200, "{path}");
        assert!(r.bytes().await.unwrap() == body[..], "{path} is whole");
    }
    let used = host
        .server()
        .context()
        .stores()
        .metadata
        .user(&key.public_key().to_z32())
        .await
        .unwrap()
        .unwrap()
        .used_bytes;
    let sum: u64 = expected.iter().map(|(_, b)| b.len() as u64).sum();
    assert_eq!(used, sum, "usage is the sum of the stored sizes");
}

#[tokio::test]
async fn s3_down_answers_503_and_the_server_recovers_by_itself() {
    let Some(s3) = S3Server::private_or_skip("s3_down_answers_503") else {
        return;
    };
    let bucket = s3.new_bucket();
    let host = TestHost::start_with(|c| {
        s3_host_config(&s3, &bucket, c);
        c.storage.timeout_secs = 2;
    })
    .await;
    let alice = host.user().await;
    // Larger than the in-memory blob cache holds, so reads go to S3.
    let big = vec![3u8; 100 << 10];
    assert_eq!(host.put(&alice, "/pub/big", &big).await.status(), 200);

    s3.stop();
    let started = Instant::now();
    let e = expect_error(
        host.put(&alice, "/pub/lost", &vec![4u8; 100 << 10]).await,
        503,
        ErrorCode::ServiceUnavailable,
    )
    .await;
    eprintln!(
        "PUT with S3 down answered 503 after {:?}: {}",
        started.elapsed(),
        e.message
    );
    expect_error(
        host.get(&alice, "/pub/big").await,
        503,
        ErrorCode::ServiceUnavailable,
    )
    .await;
    let stats = admin_stats(&host).await;
    assert_eq!(stats["backends"]["blobs"]["status"], "down", "{stats}");
    assert_eq!(stats["backends"]["blobs"]["backend"], "s3", "{stats}");
    assert_eq!(stats["backends"]["metadata"]["status"], "ok", "{stats}");

    // Back (moto keeps nothing across a restart: the bucket is made again, empty).
    s3.restart();
    reqwest::Client::new()
        .put(format!("{}/{bucket}", s3.endpoint))
        .send()
        .await
        .unwrap();
    eventually("writes work again", Duration::from_secs(30), || async {
        host.put(&alice, "/pub/after", b"back").await.status() == 200
    })
    .await;
    let stats = admin_stats(&host).await;
    assert_eq!(stats["backends"]["blobs"]["status"], "ok", "{stats}");
    // The write refused during the outage was not half done.
    assert_eq!(host.get(&alice, "/pub/lost").await.status(), 404);
}

#[tokio::test]
async fn postgres_down_answers_503_and_the_server_recovers_by_itself() {
    let Some(db) = PgDatabase::or_skip("postgres_down_answers_503") else {
        return;
    };
    // The server reaches PostgreSQL through a proxy the test can cut.
    let real: url::Url = db.url.expose_secret().parse().unwrap();
    let upstream = format!(
        "{}:{}",
        real.host_str().unwrap(),
        real.port().unwrap_or(5432)
    )
    .parse()
    .unwrap();
    let proxy = TcpProxy::start(upstream).await;
    let mut through = real.clone();
    through.set_port(Some(proxy.addr.port())).unwrap();
    let host = TestHost::start_with(|c| {
        c.storage.database_url = DatabaseUrl::parse(through.as_str()).unwrap();
        c.storage.timeout_secs = 2;
    })
    .await;
    let alice = host.user().await;
    assert_eq!(host.put(&alice, "/pub/a", b"one").await.status(), 200);

    proxy.cut();
    let started = Instant::now();
    let e = expect_error(
        host.put(&alice, "/pub/lost", b"never stored").await,
        503,
        ErrorCode::ServiceUnavailable,
    )
    .await;
    eprintln!(
        "PUT with PostgreSQL down answered 503 after {:?}: {}",
        started.elapsed(),
        e.message
    );
    expect_error(
        host.get(&alice, "/pub/a").await,
        503,
        ErrorCode::ServiceUnavailable,
    )
    .await;
    let stats = admin_stats(&host).await;
    assert_eq!(stats["backends"]["metadata"]["status"], "down", "{stats}");
    assert_eq!(stats["backends"]["metadata"]["backend"], "postgres");
    assert!(stats["users"].is_null(), "{stats}");

    proxy.restore().await;
    eventually("writes work again", Duration::from_secs(30), || async {
        host.put(&alice, "/pub/b", b"two").await.status() == 200
    })
    .await;
    assert_consistent(
        &host,
        &alice,
        &[("/pub/a", b"one".to_vec()), ("/pub/b", b"two".to_vec())],
    )
    .await;
}

/// A database that stops answering (a partition: connections stay open, nothing comes
/// back) must not hang requests until TCP gives up: they end with 503 within the
/// configured deadline, and the server recovers by itself when the database answers.
#[tokio::test]
async fn a_database_that_hangs_answers_503_not_never() {
    let Some(db) = PgDatabase::or_skip("a_database_that_hangs_answers_503_not_never") else {
        return;
    };
    let real: url::Url = db.url.expose_secret().parse().unwrap();
    let upstream = format!(
        "{}:{}",
        real.host_str().unwrap(),
        real.port().unwrap_or(5432)
    )
    .parse()
    .unwrap();
    let proxy = TcpProxy::start(upstream).await;
    let mut through = real.clone();
    through.set_port(Some(proxy.addr.port())).unwrap();
    let host = TestHost::start_with(|c| {
        c.storage.database_url = DatabaseUrl::parse(through.as_str()).unwrap();
        c.storage.timeout_secs = 2;
    })
    .await;
    let alice = host.user().await;
    assert_eq!(host.put(&alice, "/pub/a", b"one").await.status(), 200);

    proxy.stall();
    // Far beyond the 2 s deadline, far below TCP's own give-up: a hang fails here.
    let patient = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    for (method, path, body) in [
        (Method::PUT, "/pub/hung", &b"never stored"[..]),
        (Method::GET, "/pub/a", &b""[..]),
    ] {
        let started = Instant::now();
        let response = signed_request(
            &patient,
            &host.url,
            &alice,
            method.clone(),
            path,
            body.to_vec(),
            now(),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} {path} hung with the database: {e}"));
        let e = expect_error(response, 503, ErrorCode::ServiceUnavailable).await;
        eprintln!(
            "{method} {path} with the database hung: 503 after {:?} ({})",
            started.elapsed(),
            e.message
        );
    }

    proxy.unstall();
    eventually("writes work again", Duration::from_secs(30), || async {
        host.put(&alice, "/pub/b", b"two").await.status() == 200
    })
    .await;
    assert_eq!(
        host.get(&alice, "/pub/hung").await.status(),
        404,
        "nothing half written"
    );
    assert_consistent(
        &host,
        &alice,
        &[("/pub/a", b"one".to_vec()), ("/pub/b", b"two".to_vec())],
    )
    .await;
}

/// A commit that outlives the deadline: the client hears 503, but PostgreSQL finishes
/// the commit after all. The value must then be whole: its blob may not be deleted as if
/// the write had failed, nor the write run again (which would look like a replay).
#[tokio::test]
async fn a_commit_that_outlives_the_deadline_keeps_its_value() {
    let Some(db) = PgDatabase::or_skip("a_commit_that_outlives_the_deadline_keeps_its_value")
    else {
        return;
    };
    let host = TestHost::start_with(|c| {
        c.storage.database_url = db.url.clone();
        c.storage.timeout_secs = 1;
    })
    .await;
    let alice = host.user().await;
    // Commits of entries under /pub/slow/ take 3 s: a deferred trigger runs at COMMIT.
    let mut conn = sqlx::PgConnection::connect(db.url.expose_secret())
        .await
        .unwrap();
    for sql in [
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF NEW.path LIKE '/pub/slow/%' THEN PERFORM pg_sleep(3); END IF; \
         RETURN NULL; END $$",
        "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT OR UPDATE ON entries \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()",
    ] {
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    }

    expect_error(
        host.put(&alice, "/pub/slow/late", b"landed late").await,
        503,
        ErrorCode::ServiceUnavailable,
    )
    .await;
    eventually(
        "the late commit is readable, whole",
        Duration::from_secs(30),
        || async {
            let response = host.get(&alice, "/pub/slow/late").await;
            assert_ne!(response.status(), 500, "the committed entry lost its blob");
            response.status() == 200 && response.bytes().await.unwrap().as_ref() == b"landed late"
        },
    )
    .await;
    // Concurrent writes share a transaction (group commit): a batch whose commit
    // outlives the deadline is not run again (its writes would look replayed). A 503
    // means "outcome unknown": the value is then either stored whole or not at all.
    let paths: Vec<String> = (0..6).map(|i| format!("/pub/slow/batch-{i}")).collect();
    let answers =
        futures_util::future::join_all(paths.iter().map(|p| host.put(&alice, p, p.as_bytes())))
            .await;
    let acknowledged: Vec<bool> = answers
        .iter()
        .map(|answer| match answer.status().as_u16() {
            200 => true,
            503 => false,
            other => panic!("PUT answered {other}"),
        })
        .collect();
    // Wait until PostgreSQL has no transaction of the server's in flight.
    eventually(
        "the late commits are done",
        Duration::from_secs(30),
        || async {
            let mut conn = sqlx::PgConnection::connect(db.url.expose_secret())
                .await
                .unwrap();
            let busy: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND state <> 'idle'",
            )
            .fetch_one(&mut conn)
            .await
            .unwrap();
            busy == 0
        },
    )
    .await;
    let mut expected = vec![("/pub/slow/late", b"landed late".to_vec())];
    for (path, acked) in paths.iter().zip(acknowledged) {
        let response = host.get(&alice, path).await;
        match response.status().as_u16() {
            200 => {
                assert!(
                    response.bytes().await.unwrap() == path.as_bytes(),
                    "{path} is whole"
                );
                expected.push((path, path.as_bytes().to_vec()));
            }
            404 if !acked => {}
            other => panic!("{path} (acknowledged: {acked}) reads {other}"),
        }
    }
    expected.sort();
    assert_consistent(&host, &alice, &expected).await;
}

// ---------------------------------------------------------------------------------------
// Two real instances on one PostgreSQL database and one bucket

struct Pair {
    a: ServerProcess,
    b: ServerProcess,
    http: reqwest::Client,
    _dirs: tempfile::TempDir,
    _db: PgDatabase,
}

/// Two `homeserver` processes sharing a fresh database and bucket, or None (skipped).
async fn pair(test: &str, extra: &[(&str, &str)]) -> Option<Pair> {
    let db = PgDatabase::or_skip(test)?;
    let s3 = S3Server::or_skip(test)?;
    let bucket = s3.new_bucket();
    let settings = s3.settings();
    let mut env: Vec<(String, String)> = vec![
        (
            "HOMESERVER__STORAGE__DATABASE_URL".into(),
            db.url.expose_secret().into(),
        ),
        (
            "HOMESERVER__STORAGE__BLOBS".into(),
            BlobsUrl::parse(&format!("s3://{bucket}"))
                .unwrap()
                .to_string(),
        ),
        ("HOMESERVER__S3__ENDPOINT".into(), settings.endpoint.clone()),
        ("HOMESERVER__S3__REGION".into(), settings.region.clone()),
        ("HOMESERVER__S3__PATH_STYLE".into(), "true".into()),
        ("HOMESERVER__S3__ALLOW_HTTP".into(), "true".into()),
        ("HOMESERVER__S3__ACCESS_KEY_ID".into(), "test".into()),
        ("HOMESERVER__S3__SECRET_ACCESS_KEY".into(), "test".into()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let dirs = tempfile::tempdir().unwrap();
    let a = ServerProcess::start(&dirs.path().join("a"), 0, &env).await;
    let b = ServerProcess::start(&dirs.path().join("b"), 0, &env).await;
    Some(Pair {
        a,
        b,
        http: reqwest::Client::new(),
        _dirs: dirs,
        _db: db,
    })
}

impl Pair {
    fn signed(
        &self,
        on: &ServerProcess,
        key: &Keypair,
        method: Method,
        target: &str,
        body: &[u8],
    ) -> reqwest::RequestBuilder {
        signed_request(
            &self.http,
            &on.url,
            key,
            method,
            target,
            body.to_vec(),
            now(),
        )
    }

    async fn sign_up(&self, on: &ServerProcess, key: &Keypair, token: Option<&str>) -> StatusCode {
        let target = match token {
            Some(t) => format!("/signup?signup_token={t}"),
            None => "/signup".into(),
        };
        self.signed(on, key, Method::POST, &target, b"")
            .send()
            .await
            .unwrap()
            .status()
    }

    fn admin(&self, on: &ServerProcess, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", on.admin))
            .bearer_auth(ADMIN_PASSWORD)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_read_each_others_writes_at_once() {
    let Some(p) = pair("two_instances_read_each_others_writes", &[]).await else {
        return;
    };
    let alice = Keypair::random();
    assert_eq!(p.sign_up(&p.a, &alice, None).await, StatusCode::CREATED);
    let read = |on: &ServerProcess| {
        p.http
            .get(format!("{}/pub/shared.txt", on.url))
            .header("Pubky-Host", alice.public_key().to_z32())
            .send()
    };
    // Each write answered by one instance is what the very next read on the other
    // returns, overwrites included: the reader read the old value just before (so a
    // cache of its own would hold it).
    for round in 0..20u32 {
        let (writer, reader) = if round % 2 == 0 {
            (&p.a, &p.b)
        } else {
            (&p.b, &p.a)
        };
        let before = read(reader).await.unwrap();
        if round > 0 {
            assert_eq!(before.text().await.unwrap(), format!("round {}", round - 1));
        }
        let body = format!("round {round}");
        let r = p
            .signed(
                writer,
                &alice,
                Method::PUT,
                "/pub/shared.txt",
                body.as_bytes(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let r = p
            .http
            .get(format!("{}/pub/shared.txt", reader.url))
            .header("Pubky-Host", alice.public_key().to_z32())
            .send()
            .await
            .unwrap();
        assert_eq!(r.text().await.unwrap(), body, "round {round}");
    }
    // A delete on one instance is a 404 on the other at once.
    assert_eq!(read(&p.a).await.unwrap().status(), 200);
    let r = p
        .signed(&p.b, &alice, Method::DELETE, "/pub/shared.txt", b"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = p
        .signed(&p.a, &alice, Method::GET, "/pub/shared.txt", b"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_streams_on_one_instance_see_writes_on_the_other() {
    // The tailers' own polling is made too slow to matter: what B hears of A's
    // writes, it hears from PostgreSQL's notifications.
    let Some(p) = pair(
        "live_streams_on_one_instance",
        &[("HOMESERVER__STORAGE__EVENTS_POLL_MS", "600000")],
    )
    .await
    else {
        return;
    };
    let alice = Keypair::random();
    assert_eq!(p.sign_up(&p.a, &alice, None).await, StatusCode::CREATED);
    let user = alice.public_key().to_z32();
    let stream = p
        .http
        .get(format!("{}/events-stream?user={user}&live=true", p.b.url))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let mut body = stream.bytes_stream();
    let mut received = String::new();
    let mut latencies = Vec::new();
    for i in 0..10 {
        let path = format!("/pub/live/{i}");
        let sent = Instant::now();
        let r = p
            .signed(&p.a, &alice, Method::PUT, &path, b"x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let wanted = format!("{user}{path}\n");
        tokio::time::timeout(Duration::from_secs(10), async {
            while !received.contains(&wanted) {
                let chunk = body.next().await.unwrap().unwrap();
                received.push_str(&String::from_utf8_lossy(&chunk));
            }
        })
        .await
        .expect("the event arrives on the other instance");
        latencies.push(sent.elapsed());
    }
    latencies.sort();
    eprintln!(
        "write on A to event on B: median {:?}, max {:?}",
        latencies[latencies.len() / 2],
        latencies.last().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_marks_tokens_quotas_and_deletion_hold_across_instances() {
    let Some(p) = pair(
        "replay_marks_tokens_quotas_and_deletion",
        &[("HOMESERVER__SIGNUP__MODE", "token")],
    )
    .await
    else {
        return;
    };
    // A signup token made on A is good once, on either instance.
    let token: Value = p
        .admin(&p.a, Method::POST, "/admin/signup_tokens")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = token["token"].as_str().unwrap().to_owned();
    let alice = Keypair::random();
    assert_eq!(
        p.sign_up(&p.b, &alice, Some(&token)).await,
        StatusCode::CREATED
    );
    let mallory = Keypair::random();
    assert_eq!(
        p.sign_up(&p.a, &mallory, Some(&token)).await,
        StatusCode::FORBIDDEN
    );

    // A signed write accepted by A is a replay on B.
    let request = || p.signed(&p.a, &alice, Method::PUT, "/pub/once", b"v");
    let first = request().build().unwrap();
    let auth = first.headers()["authorization"].clone();
    assert_eq!(p.http.execute(first).await.unwrap().status(), 200);
    let replay = p
        .http
        .put(format!("{}/pub/once", p.b.url))
        .header("authorization", auth)
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 401, "replayed on the other instance");

    // A session minted on A works on B; revoked on B, it is refused on A at once
    // (and a disabled owner's session too).
    let minted: Value = p
        .signed(
            &p.a,
            &alice,
            Method::POST,
            "/auth/session",
            br#"{"capabilities":["*:/pub/"],"ttl":600}"#,
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = minted["token"].as_str().unwrap().to_owned();
    let with_session = |on: &ServerProcess, method: Method| {
        p.http
            .request(method, format!("{}/pub/s.txt", on.url))
            .bearer_auth(&token)
    };
    let r = with_session(&p.b, Method::PUT)
        .body("s")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "a session minted on A, used on B");
    assert_eq!(
        with_session(&p.a, Method::GET)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let r = p
        .http
        .delete(format!("{}/auth/session", p.b.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(
        with_session(&p.a, Method::GET)
            .send()
            .await
            .unwrap()
            .status(),
        401,
        "revoked on B, refused on A at once"
    );
    let r = p
        .signed(&p.a, &alice, Method::DELETE, "/pub/s.txt", b"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // A quota set on A binds writes on both, racing.
    let key = alice.public_key().to_z32();
    let r = p
        .admin(&p.a, Method::PUT, &format!("/admin/users/{key}/quota"))
        .json(&serde_json::json!({ "quota_bytes": 10_000 }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let p = Arc::new(p);
    let mut tasks = Vec::new();
    for i in 0..30 {
        let p = p.clone();
        let alice = alice.clone();
        tasks.push(tokio::spawn(async move {
            let on = if i % 2 == 0 { &p.a } else { &p.b };
            p.signed(
                on,
                &alice,
                Method::PUT,
                &format!("/pub/q/{i}"),
                &[1u8; 1000],
            )
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
        }));
    }
    let mut stored = 0;
    for t in tasks {
        match t.await.unwrap() {
            200 => stored += 1,
            507 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    let user: Value = p
        .admin(&p.b, Method::GET, &format!("/admin/users/{key}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let used = user["storage_used"].as_u64().unwrap();
    assert!(used <= 10_000, "{user}");
    assert_eq!(
        used,
        1 + 1000 * stored,
        "usage: /pub/once plus every stored write"
    );

    // An account deleted on A is gone on B: its data and its signup.
    let r = p
        .admin(&p.a, Method::DELETE, &format!("/admin/users/{key}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = p
        .http
        .get(format!("{}/pub/once", p.b.url))
        .header("Pubky-Host", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = p
        .signed(&p.b, &alice, Method::PUT, "/pub/again", b"x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "no longer signed up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn event_order_holds_with_writers_on_both_instances() {
    let Some(p) = pair("event_order_holds_with_writers_on_both_instances", &[]).await else {
        return;
    };
    let p = Arc::new(p);
    let users: Vec<Keypair> = (0..4).map(|_| Keypair::random()).collect();
    for (i, u) in users.iter().enumerate() {
        let on = if i % 2 == 0 { &p.a } else { &p.b };
        assert_eq!(p.sign_up(on, u, None).await, StatusCode::CREATED);
    }
    const WRITES: usize = 25;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Readers on both instances walk the feed while the writers write.
    let readers: Vec<_> = [false, true]
        .into_iter()
        .flat_map(|on_b| [on_b, on_b])
        .map(|on_b| {
            let p = p.clone();
            let done = done.clone();
            tokio::spawn(async move {
                let url = if on_b { &p.b.url } else { &p.a.url };
                let mut seen: Vec<u64> = Vec::new();
                let mut cursor = 0u64;
                loop {
                    let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                    let page: EventPage = p
                        .http
                        .get(format!("{url}/events/?cursor={cursor}&limit=7"))
                        .send()
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap();
                    for e in &page.events {
                        assert!(e.cursor > cursor, "cursor {} after {cursor}", e.cursor);
                        cursor = e.cursor;
                        seen.push(e.cursor);
                    }
                    if page.events.is_empty() && finished {
                        return seen;
                    }
                }
            })
        })
        .collect();
    let writers: Vec<_> = users
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, user)| {
            let p = p.clone();
            tokio::spawn(async move {
                for w in 0..WRITES {
                    let on = if (i + w) % 2 == 0 { &p.a } else { &p.b };
                    let r = p
                        .signed(
                            on,
                            &user,
                            Method::PUT,
                            &format!("/pub/{}", w % 5),
                            &[w as u8],
                        )
                        .send()
                        .await
                        .unwrap();
                    let status = r.status();
                    // The body says why, should a write ever be refused.
                    let body = r.text().await.unwrap_or_default();
                    assert_eq!(status, 200, "write {w} of user {i}: {body}");
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut all = Vec::new();
    let mut cursor = 0;
    loop {
        let page: EventPage = p
            .http
            .get(format!("{}/events/?cursor={cursor}&limit=1000", p.a.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if page.events.is_empty() {
            break;
        }
        cursor = page.events.last().unwrap().cursor;
        all.extend(page.events.iter().map(|e| e.cursor));
    }
    assert_eq!(all.len(), users.len() * WRITES, "one event per write");
    for r in readers {
        assert_eq!(
            r.await.unwrap(),
            all,
            "every reader saw every event once, in order"
        );
    }
}

/// `HS_TEST_INSTANCES=2` really spreads a test's requests over both instances (else the
/// two-instance run of the suite would prove nothing).
#[tokio::test]
async fn the_suite_in_two_instance_mode_uses_both() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    for i in 0..10 {
        assert_eq!(
            host.put(&alice, &format!("/pub/{i}"), b"v").await.status(),
            200
        );
    }
    let mut served = Vec::new();
    for server in host.instances() {
        let addr = server.metrics_addr().unwrap();
        let text = host
            .http
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let puts: f64 = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("hs_requests_total{method=\"PUT\",status=\"200\"} ")?
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0);
        served.push(puts);
    }
    assert_eq!(served.len(), crate::fixture::instances(), "{served:?}");
    assert_eq!(served.iter().sum::<f64>(), 10.0, "{served:?}");
    assert!(
        served.iter().all(|&n| n > 0.0),
        "every instance served PUTs: {served:?}"
    );
}
