//! The operator's tools, run as the real binary: `homeserver fsck` finds and repairs
//! what a lost blob, a crash or a bug leaves; `export`/`import` move a user as an
//! archive that an independent `tar` reads, with damaged values refused; `migrate`
//! copies a deployment to other backends (PostgreSQL + S3 when at hand), resumes after
//! being killed half-way, and the copy serves the same data and event feed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use homeserver::Config;
use homeserver_protocol::event::EventPage;
use homeserver_protocol::wire::ListResult;
use homeserver_protocol::{ErrorCode, Keypair};
use reqwest::Method;

use crate::backend::{PgDatabase, S3Server};
use crate::fixture::*;

/// A config file for the stores, key and policies of `config` (what the tools read with
/// --config).
fn write_config(config: &Config, file: &Path) {
    let mut text = format!(
        "[storage]\ndatabase_url = \"{}\"\nblobs = \"{}\"\n[keys]\nsecret_key_file = \"{}\"\n\
         [policies]\ndir = \"{}\"\n",
        config.storage.database_url.expose_secret(),
        config.storage.blobs,
        config.keys.secret_key_file.display(),
        config.policies.dir.display()
    );
    let s3 = &config.s3;
    if !s3.endpoint.is_empty() {
        text.push_str(&format!(
            "[s3]\nendpoint = \"{}\"\nregion = \"{}\"\npath_style = {}\nallow_http = {}\n\
             access_key_id = \"{}\"\nsecret_access_key = \"{}\"\n",
            s3.endpoint,
            s3.region,
            s3.path_style,
            s3.allow_http,
            s3.access_key_id,
            s3.secret_access_key.expose()
        ));
    }
    std::fs::write(file, text).unwrap();
}

fn homeserver(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_homeserver"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test]
async fn fsck_finds_and_repairs_missing_values_orphans_and_usage() {
    // "bbbb" goes to a blob (the value this test loses), "aaa" and "cc" stay in their rows.
    let host = TestHost::start_with(|c| c.storage.inline_max_bytes = 3).await;
    let alice = host.user().await;
    let user = alice.public_key().to_z32();
    for (path, body) in [("/pub/a", "aaa"), ("/pub/b", "bbbb"), ("/pub/c", "cc")] {
        assert_eq!(host.put(&alice, path, body.as_bytes()).await.status(), 200);
    }
    let ctx = host.server().context().clone();
    let config = ctx.config.clone();
    // While the server runs on local stores, the tool refuses to touch them.
    let file = host.dir.path().join("tools.toml");
    write_config(&config, &file);
    let config_arg = file.to_str().unwrap().to_owned();
    if !crate::backend::Backend::current().shared() {
        let out = homeserver(&["--config", &config_arg, "fsck"]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains("in use"), "{}", text(&out));
    }

    // Damage: /pub/b's value is lost, an orphan appears, alice's usage is wrong.
    let lost = ctx
        .stores()
        .metadata
        .entry(&user, "/pub/b")
        .await
        .unwrap()
        .unwrap();
    let lost = lost.stored.blob_key().expect("a value in the blob store");
    ctx.stores().blobs.delete(lost).await.unwrap();
    let orphan = format!("{user}/0190a0a0-0000-7000-8000-00000000beef");
    ctx.stores()
        .blobs
        .put_bytes(&orphan, "stray".into())
        .await
        .unwrap();
    crate::backend::execute_with_i64(
        &config.storage.database_url,
        "UPDATE users SET used_bytes = ?",
        12345,
    )
    .await;
    let dir = host.stop().await;

    let out = homeserver(&["--config", &config_arg, "fsck", "--min-orphan-age", "0"]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains("MISSING VALUE") && report.contains("/pub/b"),
        "{report}"
    );
    assert!(
        report.contains(&format!("ORPHAN VALUE   {orphan}")),
        "{report}"
    );
    assert!(
        report.contains("recorded 12345 bytes, entries sum to 9"),
        "{report}"
    );

    let out = homeserver(&[
        "--config",
        &config_arg,
        "fsck",
        "--repair",
        "--min-orphan-age",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("1 entries removed, 1 orphan values deleted, 1 usages corrected"),
        "{}",
        text(&out)
    );
    let out = homeserver(&[
        "--config",
        &config_arg,
        "fsck",
        "--json",
        "--min-orphan-age",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["entries"], 2, "{json}");
    assert_eq!(
        json["inline_values"], 2,
        "the two left are in their rows: {json}"
    );

    // The server serves the repaired store: /pub/b is gone with a DEL event, usage is 5.
    let host = TestHost::start_in(dir, config).await;
    expect_error(host.get(&alice, "/pub/b").await, 404, ErrorCode::NotFound).await;
    let used = host
        .server()
        .context()
        .stores()
        .metadata
        .user(&user)
        .await
        .unwrap()
        .unwrap()
        .used_bytes;
    assert_eq!(used, 5);
    let feed: EventPage = expect_ok_json(
        host.request(Method::GET, "/events/?limit=1000")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let last = feed.events.last().unwrap();
    assert!(
        last.url.ends_with("/pub/b") && last.content_hash.is_none(),
        "{last:?}"
    );
}

/// Alice's values on `host`: path → bytes, in path order.
async fn values(host: &TestHost, key: &Keypair) -> Vec<(String, Vec<u8>, Option<i64>)> {
    let page: ListResult = expect_ok_json(host.get(key, "/pub/?limit=1000").await).await;
    let mut out = Vec::new();
    for entry in page.entries {
        let body = host
            .get(key, &entry.path)
            .await
            .bytes()
            .await
            .unwrap()
            .to_vec();
        out.push((entry.path, body, entry.created_at));
    }
    out
}

#[tokio::test]
async fn export_and_import_move_a_user_with_hashes_checked() {
    let source = TestHost::start().await;
    let alice = source.user().await;
    let long = format!("/pub/{}/end.bin", "x".repeat(300));
    let binary: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    for (path, body) in [
        ("/pub/notes/a.txt", b"hello".to_vec()),
        (long.as_str(), binary.clone()),
        ("/pub/empty", Vec::new()),
    ] {
        assert_eq!(source.put(&alice, path, &body).await.status(), 200);
    }
    let before = values(&source, &alice).await;
    let config = source.server().context().config.clone();
    let dir = source.stop().await;
    let config_file = dir.path().join("source.toml");
    write_config(&config, &config_file);
    let archive = dir.path().join("alice.tar");
    let user = alice.public_key().to_z32();
    let out = homeserver(&[
        "--config",
        config_file.to_str().unwrap(),
        "export",
        "--user",
        &user,
        "--out",
        archive.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("3 values"), "{}", text(&out));

    // An independent reader: GNU tar lists the manifest and every value.
    let listing = Command::new("tar")
        .arg("tvf")
        .arg(&archive)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    assert!(listing.contains("manifest.json"), "{listing}");
    assert!(listing.contains("pub/notes/a.txt"), "{listing}");
    assert!(listing.contains("end.bin"), "{listing}");

    // Into another server's stores.
    let target = TestHost::start().await;
    let target_config = target.server().context().config.clone();
    let target_dir = target.stop().await;
    let target_file = target_dir.path().join("target.toml");
    write_config(&target_config, &target_file);
    let out = homeserver(&[
        "--config",
        target_file.to_str().unwrap(),
        "import",
        archive.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let target = TestHost::start_in(target_dir, target_config.clone()).await;
    let after = values(&target, &alice).await;
    let strip = |v: &[(String, Vec<u8>, Option<i64>)]| {
        v.iter()
            .map(|(p, b, _)| (p.clone(), b.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        strip(&after),
        strip(&before),
        "the same values, byte for byte"
    );
    // Imported values are writes on the new server: one PUT event each.
    let feed: EventPage = expect_ok_json(
        target
            .request(Method::GET, "/events/?limit=1000")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(feed.events.len(), 3);

    // A damaged archive: one value's bytes changed. The import stops there and stores
    // nothing for it.
    let target_dir = target.stop().await;
    let mut bytes = std::fs::read(&archive).unwrap();
    let at = bytes
        .windows(5)
        .position(|w| w == b"hello")
        .expect("the small value is in the archive");
    bytes[at] = b'j';
    let damaged = dir.path().join("damaged.tar");
    std::fs::write(&damaged, &bytes).unwrap();
    let out = homeserver(&[
        "--config",
        target_file.to_str().unwrap(),
        "import",
        damaged.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("does not match its hash"),
        "{}",
        text(&out)
    );
    let target = TestHost::start_in(target_dir, target_config).await;
    let r = target.get(&alice, "/pub/notes/a.txt").await;
    assert_eq!(r.text().await.unwrap(), "hello", "the good value stayed");
}

/// The target of a migration: PostgreSQL + S3 when both are at hand, else another
/// SQLite database and blob folder. Returns its config and the guards that keep it.
fn migration_target(dir: &Path) -> (Config, Option<PgDatabase>) {
    let mut config = test_config(dir);
    let pg = PgDatabase::or_skip("migrate to PostgreSQL + S3 (moving to SQLite instead)");
    let s3 = S3Server::or_skip("migrate to PostgreSQL + S3 (moving to local blobs instead)");
    match (pg, s3) {
        (Some(pg), Some(s3)) => {
            config.storage.database_url = pg.url.clone();
            config.storage.blobs = format!("s3://{}", s3.new_bucket()).parse().unwrap();
            config.s3 = s3.settings();
            (config, Some(pg))
        }
        _ => {
            config.storage.database_url = format!("sqlite://{}/moved.db", dir.display())
                .parse()
                .unwrap();
            config.storage.blobs = format!("file://{}/moved-blobs", dir.display())
                .parse()
                .unwrap();
            (config, None)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_copies_a_deployment_and_resumes_after_a_kill() {
    // The source: the embedded default (SQLite + local blobs), whatever the suite's
    // backend.
    let source_dir = tempfile::tempdir().unwrap();
    let mut source_config = test_config(source_dir.path());
    source_config.storage.database_url = format!("sqlite://{}/hs.db", source_dir.path().display())
        .parse()
        .unwrap();
    source_config.storage.blobs = format!("file://{}/blobs", source_dir.path().display())
        .parse()
        .unwrap();
    source_config.s3 = Default::default();
    let source = TestHost::start_in(source_dir, source_config.clone()).await;
    let users: Vec<Keypair> = vec![source.user().await, source.user().await];
    for (u, key) in users.iter().enumerate() {
        for i in 0..60 {
            let body = vec![(u * 60 + i) as u8; 20_000 + i];
            assert_eq!(
                source
                    .put(key, &format!("/pub/v/{i}"), &body)
                    .await
                    .status(),
                200
            );
        }
        assert_eq!(source.delete(key, "/pub/v/0").await.status(), 200);
        // Small values, kept in their rows: they travel with their entries (the blob
        // counts below are the 20 KB values').
        for i in 0..3 {
            let body = format!("small value {i} of user {u}");
            assert_eq!(
                source
                    .put(key, &format!("/pub/small/{i}"), body.as_bytes())
                    .await
                    .status(),
                200
            );
        }
    }
    // A user's pkarr record, which the server republishes: it moves with the user.
    let server_key = source.server().context().server_key.public_key();
    let record = pk_client::pkarr::Resolver::user_record(&users[0], &server_key).unwrap();
    let record_payload = record.to_relay_payload().to_vec();
    assert!(
        pk_client::PkClient::new(&source.url, Some(users[0].clone()))
            .unwrap()
            .store_record(&record)
            .await
            .unwrap()
    );
    source
        .admin(Method::POST, "/admin/signup_tokens")
        .send()
        .await
        .unwrap();
    let before: Vec<_> =
        futures_util::future::join_all(users.iter().map(|k| values(&source, k))).await;
    let feed_before: EventPage = expect_ok_json(
        source
            .request(Method::GET, "/events/?limit=1000")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let source_dir = source.stop().await;

    let target_dir = tempfile::tempdir().unwrap();
    let (target_config, _pg) = migration_target(target_dir.path());
    let source_file = source_dir.path().join("source.toml");
    let target_file = target_dir.path().join("target.toml");
    write_config(&source_config, &source_file);
    write_config(&target_config, &target_file);
    let migrate = |file: &PathBuf| {
        Command::new(env!("CARGO_BIN_EXE_homeserver"))
            .args([
                "--config",
                source_file.to_str().unwrap(),
                "migrate",
                "--to",
                file.to_str().unwrap(),
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };

    // Killed half-way: once the first user's entries (hence values) are on the target,
    // before the second user's are.
    let first = users.iter().map(|k| k.public_key().to_z32()).min().unwrap();
    let mut child = migrate(&target_file);
    let target_store = homeserver::persistence::open_metadata(
        &target_config.storage.database_url,
        &Default::default(),
    )
    .await
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let killed = loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("migrate ended ({status}) before it could be killed half-way");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "migrate copied nothing"
        );
        let copied = target_store
            .entries(homeserver::persistence::metadata::EntryRange {
                user: &first,
                after: "/",
                before: "~",
                descending: false,
                limit: 1,
            })
            .await
            .map(|e| !e.is_empty())
            .unwrap_or(false);
        if copied {
            child.kill().unwrap();
            break true;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let _ = child.wait();
    target_store.close().await;
    assert!(killed);

    // Run again: it resumes (the values already there are not sent again), completes
    // and verifies entry by entry.
    let out = migrate(&target_file).wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(said.contains("verified"), "{said}");
    assert!(said.contains("1 pkarr records match"), "{said}");
    let already: u64 = said
        .split("; ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of values already there: {said}"));
    assert!(
        (59..118).contains(&already),
        "the first user's 59 values were there already, not the second's: {said}"
    );

    // The copy serves the same values, dates and event feed (cursors included).
    let target = TestHost::start_in(target_dir, target_config).await;
    for (key, want) in users.iter().zip(&before) {
        assert_eq!(&values(&target, key).await, want, "values and dates");
    }
    let feed_after: EventPage = expect_ok_json(
        target
            .request(Method::GET, "/events/?limit=1000")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(feed_after.events, feed_before.events, "the same event log");
    let records = target
        .server()
        .context()
        .stores()
        .metadata
        .pkarr_packets_after("", 10)
        .await
        .unwrap();
    assert_eq!(
        records,
        vec![(users[0].public_key().to_z32(), record_payload)],
        "the pkarr record moved"
    );
    // New writes continue above the copied cursors.
    assert_eq!(target.put(&users[0], "/pub/new", b"n").await.status(), 200);
    let next: EventPage = expect_ok_json(
        target
            .request(
                Method::GET,
                &format!("/events/?cursor={}", feed_before.cursor),
            )
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(next.events.len(), 1);
    assert!(next.events[0].cursor > feed_before.cursor);
}
