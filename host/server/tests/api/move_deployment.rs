//! Moving a deployment from SQLite + disk to PostgreSQL + S3 (moto) with the step of
//! docs/deploy.md run as written (`homeserver migrate --to`), on a local mainline DHT:
//! afterwards the server has the same public key, its users' pkarr records are
//! republished naming it from the moved store (on a DHT that never saw them), its own
//! record names the new listener, its policies came along, and every user's value reads
//! back unchanged. A target config whose key file holds another key is refused before
//! anything is copied, naming both files.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mainline::Testnet;
use pk_client::PkClient;
use pk_client::pkarr::{Resolver, ResolverSettings};

use crate::backend::{PgDatabase, S3Server};
use crate::backup::text;
use crate::backup_procedure::{aws_env, tested_block, write_scale_out_config};
use crate::fixture::*;

const WAIT: Duration = Duration::from_secs(60);

fn testnet() -> Testnet {
    Testnet::builder(5)
        .bind_address(Ipv4Addr::LOCALHOST)
        .build()
        .unwrap()
}

fn resolver(testnet: &Testnet) -> Resolver {
    Resolver::new(&ResolverSettings {
        bootstrap: testnet.bootstrap.clone(),
        relays: vec![],
        timeout: Some(Duration::from_millis(500)),
    })
    .unwrap()
}

/// Publishing on `testnet`, with a raw-public-key TLS listener.
fn on_dht(config: &mut homeserver::Config, testnet: &Testnet) {
    config.tls.listen = Some("127.0.0.1:0".parse().unwrap());
    config.pkarr.enabled = true;
    config.pkarr.bootstrap = testnet.bootstrap.clone();
    config.pkarr.request_timeout_ms = 500;
}

/// The config file of the single machine (what `--config` reads).
fn write_embedded_config(config: &homeserver::Config, file: &Path) {
    std::fs::write(
        file,
        format!(
            "[storage]\ndatabase_url = \"{}\"\nblobs = \"{}\"\n[keys]\nsecret_key_file = \
             \"{}\"\n[policies]\ndir = \"{}\"\n",
            config.storage.database_url.expose_secret(),
            config.storage.blobs,
            config.keys.secret_key_file.display(),
            config.policies.dir.display()
        ),
    )
    .unwrap();
}

async fn run_move(block: &str, old: &Path, new: &Path, s3: &S3Server) -> std::process::Output {
    let homeserver = Path::new(env!("CARGO_BIN_EXE_homeserver"));
    let path = std::env::join_paths(
        std::iter::once(homeserver.parent().unwrap().to_owned()).chain(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        )),
    )
    .unwrap();
    let mut command = Command::new("bash");
    command
        .args(["-euo", "pipefail", "-c", block])
        .env("OLD_CONFIG", old)
        .env("NEW_CONFIG", new)
        .env("PATH", path)
        .env("RUST_LOG", "warn")
        // What the source's own instances would have: the doc says they do not apply
        // to the target.
        .env("HOMESERVER__SIGNUP__MODE", "open");
    for (key, value) in aws_env(s3) {
        command.env(key, value);
    }
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_move_to_postgres_and_s3_keeps_the_identity_and_every_value() {
    const TEST: &str = "a_move_to_postgres_and_s3_keeps_the_identity_and_every_value";
    if crate::backup::scale_out_pass() {
        eprintln!("SKIPPED {TEST} here: it runs in the suite's first pass");
        return;
    }
    let Some(database) = PgDatabase::or_skip(TEST) else {
        return;
    };
    let Some(s3) = S3Server::or_skip(TEST) else {
        return;
    };
    let block = tested_block("docs/deploy.md", "move-to-postgres-s3");

    // The single machine, on the DHT, with users, values, a record and policies.
    let dht = testnet();
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.storage.database_url = homeserver::persistence::DatabaseUrl::parse(&format!(
        "sqlite://{}/hs.db",
        dir.path().display()
    ))
    .unwrap();
    config.storage.blobs = format!("file://{}/blobs", dir.path().display())
        .parse()
        .unwrap();
    config.s3 = Default::default();
    on_dht(&mut config, &dht);
    std::fs::create_dir_all(&config.policies.dir).unwrap();
    std::fs::write(
        config.policies.dir.join("notes.txt"),
        "the operator's notes\n",
    )
    .unwrap();
    let old_file = dir.path().join("old.toml");
    write_embedded_config(&config, &old_file);
    let host = TestHost::start_single_in(dir, config).await;
    let server = host.server().server_key();
    let mut values = Vec::new();
    let mut users = Vec::new();
    for u in 0..3 {
        let key = host.user().await;
        for i in 0..5 {
            let path = format!("/pub/moving/{i}");
            let value = format!("user {u} value {i} ")
                .repeat(50 * (i + 1))
                .into_bytes();
            assert_eq!(host.put(&key, &path, &value).await.status(), 200);
            values.push((u, path, value));
        }
        users.push(key);
    }
    let alice = &users[0];
    let client = PkClient::new(&host.url, Some(alice.clone())).unwrap();
    let record = Resolver::user_record(alice, &server).unwrap();
    assert!(client.store_record(&record).await.unwrap());
    // The doc's step 2: stop the server.
    let dir = host.stop().await;
    drop(dht);

    // The new deployment's config: its key path has no key yet, its own policies folder.
    let bucket = s3.new_bucket();
    let target = tempfile::tempdir().unwrap();
    let new_file = target.path().join("scale-out.toml");
    write_scale_out_config(&new_file, &database, &bucket, s3, target.path());

    // A target whose key file holds another key: refused before anything is copied.
    std::fs::write(target.path().join("server.key"), "11".repeat(32)).unwrap();
    let out = run_move(&block, &old_file, &new_file, s3).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("holds another key"), "{said}");
    assert!(
        said.contains(&target.path().join("server.key").display().to_string())
            && said.contains(&dir.path().join("server.key").display().to_string()),
        "both files named: {said}"
    );
    let copied = homeserver::persistence::open_metadata(&database.url, &Default::default())
        .await
        .unwrap()
        .stats()
        .await
        .unwrap();
    assert_eq!(copied.users, 0, "nothing was copied");
    std::fs::remove_file(target.path().join("server.key")).unwrap();

    // The doc's step 3, as written.
    let out = run_move(&block, &old_file, &new_file, s3).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("copied the server key"),
        "{}",
        text(&out)
    );
    assert_eq!(
        std::fs::read_to_string(target.path().join("server.key")).unwrap(),
        std::fs::read_to_string(dir.path().join("server.key")).unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(target.path().join("policies/notes.txt")).unwrap(),
        "the operator's notes\n"
    );
    // Again: the key is there already, the policies are the same; nothing refused.
    let out = run_move(&block, &old_file, &new_file, s3).await;
    assert!(out.status.success(), "{}", text(&out));

    // Step 4: the instances on the new config, on a DHT that never saw the old server.
    let fresh = testnet();
    let resolver = resolver(&fresh);
    let mut new_config = test_config(target.path());
    new_config.storage.database_url = database.url.clone();
    new_config.storage.blobs = format!("s3://{bucket}").parse().unwrap();
    new_config.s3 = s3.settings();
    on_dht(&mut new_config, &fresh);
    let moved = TestHost::start_single_in(target, new_config).await;
    assert_eq!(moved.server().server_key(), server, "the same identity");
    let info: serde_json::Value = moved
        .request(reqwest::Method::GET, "/info")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["public_key"], server.to_z32());
    // Alice's record, republished from the moved store, names the same server; the
    // server's own record, under the same key, names the new listener.
    let alice_pk = alice.public_key();
    eventually("alice's record republished", WAIT, || async {
        resolver.homeserver_of(&alice_pk).await.ok() == Some(server)
    })
    .await;
    let tls = moved.server().tls_addr().unwrap();
    eventually("the server's record published", WAIT, || async {
        resolver
            .endpoint_of(&server)
            .await
            .ok()
            .is_some_and(|url| url.as_str() == format!("https://{tls}/"))
    })
    .await;
    // Every user's value, unchanged, also through the key alone.
    for (u, path, value) in &values {
        let r = moved.get(&users[*u], path).await;
        assert_eq!(r.status(), 200, "user {u} {path}");
        assert!(r.bytes().await.unwrap() == *value, "user {u} {path}");
    }
    let reader = PkClient::for_server_key(server, None, &resolver)
        .await
        .unwrap();
    let got = reader
        .get_bytes("/pub/moving/0", Some(alice_pk))
        .await
        .unwrap();
    assert!(got == values[0].2);
    drop(dir);
}
