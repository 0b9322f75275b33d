//! Upgrades (docs/upgrade.md): every release's database in `testdata/upgrade/<version>/`
//! (a SQLite file and a PostgreSQL dump, made by `scripts/make-upgrade-fixture` with
//! that release) is migrated by this binary and every value read back; a database newer
//! than the binary is refused with both versions named; `/info` and `hs_build_info` say
//! which version and commit run.

use std::path::{Path, PathBuf};
use std::process::Command;

use homeserver::Config;
use homeserver::persistence::DatabaseUrl;
use homeserver::service::maintenance::{self, Quiet};
use homeserver_protocol::Keypair;
use reqwest::Method;
use serde::{Deserialize, Serialize};

use crate::backend::PgDatabase;
use crate::backup_procedure::tool_or_skip;
use crate::fixture::*;

/// What a release's fixture holds (`values.json`).
#[derive(Debug, Serialize, Deserialize)]
struct Expected {
    homeserver: String,
    server_key: String,
    latest_cursor: u64,
    users: Vec<ExpectedUser>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ExpectedUser {
    /// The user's secret (a throwaway test key), to read back as them.
    secret: String,
    used_bytes: u64,
    values: Vec<ExpectedValue>,
    /// Paths deleted before the fixture was taken.
    deleted: Vec<String>,
    /// Whether the user handed the server a pkarr record.
    pkarr_record: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct ExpectedValue {
    path: String,
    size: u64,
    blake3: String,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every release fixture under testdata/upgrade/.
fn fixtures() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(repo().join("testdata/upgrade"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("values.json").exists())
        .collect();
    found.sort();
    assert!(!found.is_empty(), "no fixture in testdata/upgrade");
    found
}

fn copy_tree(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-R")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

/// A config for a deployment under `dir` on `database`, values in `dir/blobs`.
fn config_on(dir: &Path, database: DatabaseUrl) -> Config {
    let mut config = test_config(dir);
    config.storage.database_url = database;
    config.storage.blobs = format!("file://{}/blobs", dir.display()).parse().unwrap();
    config.s3 = Default::default();
    config
}

/// Starts this binary's server on a release's data and checks all of it.
async fn check_release_data(config: Config, dir: tempfile::TempDir, expected: &Expected) {
    let host = TestHost::start_single_in(dir, config).await;
    assert_eq!(host.server().server_key().to_z32(), expected.server_key);
    let ctx = host.server().context();
    let stores = ctx.stores();
    for user in &expected.users {
        let key = Keypair::from_secret_hex(&user.secret).unwrap();
        for value in &user.values {
            let r = host.get(&key, &value.path).await;
            assert_eq!(r.status(), 200, "{}", value.path);
            let body = r.bytes().await.unwrap();
            assert_eq!(body.len() as u64, value.size, "{}", value.path);
            assert_eq!(blake3::hash(&body).to_hex().as_str(), value.blake3);
        }
        for path in &user.deleted {
            assert_eq!(host.get(&key, path).await.status(), 404, "{path}");
        }
        let record = stores
            .metadata
            .user(&key.public_key().to_z32())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.used_bytes, user.used_bytes);
        // Writes go on, on top of the old data.
        assert_eq!(
            host.put(&key, "/pub/after-upgrade", b"new").await.status(),
            200
        );
    }
    let records = stores.metadata.pkarr_packets_after("", 100).await.unwrap();
    assert_eq!(
        records.len(),
        expected.users.iter().filter(|u| u.pkarr_record).count()
    );
    assert_eq!(
        stores.metadata.latest_cursor().await.unwrap(),
        expected.latest_cursor + expected.users.len() as u64,
        "the event log continues above the release's"
    );
    let report = maintenance::fsck(stores, false, ctx.config.orphan_min_age(), &Quiet)
        .await
        .unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[tokio::test]
async fn each_release_database_migrates_and_reads_back() {
    const TEST: &str = "each_release_database_migrates_and_reads_back";
    if crate::backup::scale_out_pass() {
        eprintln!("SKIPPED {TEST} here: it runs in the suite's first pass");
        return;
    }
    for fixture in fixtures() {
        let expected: Expected =
            serde_json::from_slice(&std::fs::read(fixture.join("values.json")).unwrap()).unwrap();

        // SQLite: the release's file, migrated in place at start.
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(fixture.join("hs.db"), dir.path().join("hs.db")).unwrap();
        copy_tree(&fixture.join("blobs"), &dir.path().join("blobs"));
        std::fs::copy(fixture.join("server.key"), dir.path().join("server.key")).unwrap();
        let url = DatabaseUrl::parse(&format!("sqlite://{}/hs.db", dir.path().display())).unwrap();
        let config = config_on(dir.path(), url);
        check_release_data(config, dir, &expected).await;

        // PostgreSQL: the release's dump loaded with psql, migrated at start.
        let Some(database) = PgDatabase::or_skip(TEST) else {
            continue;
        };
        let Some(psql) = tool_or_skip(TEST, "psql", &[], "Debian: postgresql-client") else {
            continue;
        };
        let loaded = Command::new(psql)
            .args(["-q", "-v", "ON_ERROR_STOP=1", "-f"])
            .arg(fixture.join("postgres.sql"))
            .arg(database.url.expose_secret())
            .output()
            .unwrap();
        assert!(
            loaded.status.success(),
            "{}",
            String::from_utf8_lossy(&loaded.stderr)
        );
        let dir = tempfile::tempdir().unwrap();
        copy_tree(&fixture.join("blobs"), &dir.path().join("blobs"));
        std::fs::copy(fixture.join("server.key"), dir.path().join("server.key")).unwrap();
        let config = config_on(dir.path(), database.url.clone());
        check_release_data(config, dir, &expected).await;
    }
}

/// A release's database read as it is, never migrated (what `restore` does with a
/// backup that release made): every value's entry reads, in the release's schema.
#[tokio::test]
async fn each_release_database_reads_as_a_backup_would() {
    for fixture in fixtures() {
        let expected: Expected =
            serde_json::from_slice(&std::fs::read(fixture.join("values.json")).unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(fixture.join("hs.db"), dir.path().join("hs.db")).unwrap();
        let file = homeserver::persistence::sql::SqliteFile::open(&dir.path().join("hs.db"))
            .await
            .unwrap();
        let entries = file.entries_after(("", ""), 10_000).await.unwrap();
        let values: usize = expected.users.iter().map(|u| u.values.len()).sum();
        assert_eq!(entries.len(), values, "{}", fixture.display());
        for (user, entry) in &entries {
            assert!(
                entry.stored.blob_key().is_some(),
                "{user}{}: a release before inline values keeps every value in a blob",
                entry.path
            );
        }
        file.close().await;
    }
}

/// A migration this binary does not know in `_sqlx_migrations`: the database was
/// migrated by a newer homeserver, and this one refuses to start on it.
#[tokio::test]
async fn a_database_newer_than_the_binary_is_refused() {
    let host = TestHost::start_single_with(|_| {}).await;
    let url = host.server().context().config.storage.database_url.clone();
    let dir = host.stop().await;
    let future = match url {
        DatabaseUrl::Sqlite(_) => {
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
             execution_time) VALUES (?, 'from the future', 1, X'00', 0)"
        }
        DatabaseUrl::Postgres(_) => {
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
             execution_time) VALUES (?, 'from the future', TRUE, '\\x00'::bytea, 0)"
        }
    };
    crate::backend::execute_with_i64(&url, future, 9999).await;
    let config = test_config(dir.path());
    let error = match homeserver::Homeserver::start(config).await {
        Ok(_) => panic!("a server started on a newer database"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("schema version 9999"), "{error}");
    assert!(
        error.contains(&format!(
            "homeserver {} knows schema versions up to",
            env!("CARGO_PKG_VERSION")
        )),
        "{error}"
    );
    drop(dir);
}

/// `/info` and the `hs_build_info` gauge name the version and the build's commit.
#[tokio::test]
async fn info_and_metrics_say_what_runs() {
    let host = TestHost::start_single_with(|_| {}).await;
    let info: serde_json::Value = host
        .request(Method::GET, "/info")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    let commit = info["commit"].as_str().unwrap().to_owned();
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(repo())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    match head {
        // Built from this checkout (the test binary and the server share the build).
        Some(head) => assert_eq!(commit.len(), head.len(), "{commit} vs {head}"),
        None => assert_eq!(commit, "unknown"),
    }
    let addr = host.server().metrics_addr().unwrap();
    let text = host
        .http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("hs_build_info{"))
        .unwrap_or_else(|| panic!("no hs_build_info in {text}"));
    assert!(line.ends_with(" 1"), "{line}");
    assert!(line.contains(&format!("commit=\"{commit}\"")), "{line}");
    assert!(
        line.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
        "{line}"
    );
}

/// Makes `testdata/upgrade/<this version>/` (run by scripts/make-upgrade-fixture when a
/// release is cut): a deployment with users, values, an overwrite, a delete, a signup
/// token and a pkarr record, as a SQLite file and (migrated to PostgreSQL) a plain
/// `pg_dump`, with the values and what to expect.
#[tokio::test]
#[ignore = "makes the release fixture: scripts/make-upgrade-fixture"]
async fn make_upgrade_fixture() {
    let out = repo()
        .join("testdata/upgrade")
        .join(env!("CARGO_PKG_VERSION"));
    assert!(
        !out.exists(),
        "{} exists: remove it to make it again",
        out.display()
    );
    let database = PgDatabase::or_skip("make_upgrade_fixture").expect("PostgreSQL is needed");
    let dir = tempfile::tempdir().unwrap();
    let url = DatabaseUrl::parse(&format!("sqlite://{}/hs.db", dir.path().display())).unwrap();
    let config = config_on(dir.path(), url.clone());
    let host = TestHost::start_single_in(dir, config).await;
    let server = host.server().server_key();
    let mut users = Vec::new();
    for n in 1..=3u8 {
        let key = Keypair::from_seed(&[n; 32]);
        let r = host
            .signed(&key, Method::POST, "/signup", b"")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let mut values = Vec::new();
        for j in 0..5usize {
            let path = format!("/pub/release/{j}.txt");
            let value = format!("user {n}, value {j}, first version. ").repeat(20 * (j + 1));
            assert_eq!(host.put(&key, &path, value.as_bytes()).await.status(), 200);
            values.push((path, value.into_bytes()));
        }
        // An overwrite (its old value retired) and a delete.
        let newer = format!("user {n}: the value of 0.txt, overwritten").into_bytes();
        assert_eq!(
            host.put(&key, "/pub/release/0.txt", &newer).await.status(),
            200
        );
        values[0].1 = newer;
        assert_eq!(host.delete(&key, "/pub/release/4.txt").await.status(), 200);
        let deleted = vec![values.pop().unwrap().0];
        let pkarr_record = n == 1;
        if pkarr_record {
            let client = pk_client::PkClient::new(&host.url, Some(key.clone())).unwrap();
            let record = pk_client::pkarr::Resolver::user_record(&key, &server).unwrap();
            assert!(client.store_record(&record).await.unwrap());
        }
        users.push(ExpectedUser {
            secret: key.secret_hex(),
            used_bytes: values.iter().map(|(_, v)| v.len() as u64).sum(),
            values: values
                .iter()
                .map(|(path, v)| ExpectedValue {
                    path: path.clone(),
                    size: v.len() as u64,
                    blake3: blake3::hash(v).to_hex().to_string(),
                })
                .collect(),
            deleted,
            pkarr_record,
        });
    }
    let token = host.admin_json(Method::POST, "/admin/signup_tokens").await;
    assert!(token["token"].is_string());
    let ctx = host.server().context().clone();
    let expected = Expected {
        homeserver: env!("CARGO_PKG_VERSION").into(),
        server_key: server.to_z32(),
        latest_cursor: ctx.stores().metadata.latest_cursor().await.unwrap(),
        users,
    };

    std::fs::create_dir_all(&out).unwrap();
    homeserver::persistence::sqlite::snapshot_into(&url, &out.join("hs.db"))
        .await
        .unwrap();
    copy_tree(&host.dir.path().join("blobs"), &out.join("blobs"));
    std::fs::copy(host.dir.path().join("server.key"), out.join("server.key")).unwrap();
    // The same deployment on PostgreSQL (its values stay in the one blob folder).
    let options = Default::default();
    let scratch = tempfile::tempdir().unwrap();
    let from = ctx.stores().clone();
    let to = maintenance::Stores {
        metadata: homeserver::persistence::open_metadata(&database.url, &options)
            .await
            .unwrap(),
        blobs: homeserver::persistence::BlobStore::open(
            &format!("file://{}", scratch.path().display())
                .parse()
                .unwrap(),
            &Default::default(),
            &options,
        )
        .unwrap(),
    };
    maintenance::migrate(&from, &to, &Quiet).await.unwrap();
    let dump = Command::new("pg_dump")
        .args(["--format=plain", "--no-owner", "--no-privileges"])
        .arg(database.url.expose_secret())
        .output()
        .unwrap();
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    std::fs::write(out.join("postgres.sql"), dump.stdout).unwrap();
    std::fs::write(
        out.join("values.json"),
        serde_json::to_string_pretty(&expected).unwrap() + "\n",
    )
    .unwrap();
}
