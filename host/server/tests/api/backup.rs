//! Backups under load, restored: `homeserver backup` / `restore` on the embedded store
//! (SQLite + a blob folder) run as the real binary beside a running server while 8
//! writers keep overwriting and deleting; a kill -9 in the middle of a backup; damaged
//! and partial backups and non-empty targets refused. (PostgreSQL + S3: the procedure of
//! docs/deploy.md in `backup_procedure.rs`.)
//!
//! What a restore must give back (checked by [`verify_restored`], for both store kinds):
//! every value acknowledged before the backup started and not changed during it, with
//! its hash; a value for every entry; usage equal to the sum of sizes; a clean fsck; the
//! same server key.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use homeserver::Config;
use homeserver::service::maintenance::{self, Quiet};
use homeserver_protocol::Keypair;

use crate::fixture::*;

/// Paths each user has; writers change only the first [`CHURNED`] of them.
const PATHS: usize = 16;
const CHURNED: usize = 8;
const WRITERS: usize = 8;

/// A value for `user`'s path `i`, version `round`: distinct bytes, 1-24 KiB.
fn body(user: usize, i: usize, round: u64) -> Vec<u8> {
    let len = 1024 + (user * 7919 + i * 104_729 + round as usize * 31) % (23 * 1024);
    let seed = format!("{user}:{i}:{round}:");
    seed.bytes().cycle().take(len).collect()
}

/// Users with values, and writers that change some of them while a backup runs.
pub struct Workload {
    pub users: Vec<Keypair>,
    /// (user, path) → the value acknowledged before the writers started.
    pub before: BTreeMap<(usize, String), Vec<u8>>,
    /// Paths a writer touched (from before its request was sent).
    touched: Arc<Mutex<BTreeSet<(usize, String)>>>,
    stop: Arc<AtomicBool>,
    /// Writes acknowledged so far.
    pub acknowledged: Arc<AtomicU64>,
    writers: Vec<tokio::task::JoinHandle<()>>,
}

impl Workload {
    /// `WRITERS` users with `PATHS` values each.
    pub async fn populate(host: &TestHost) -> Self {
        let mut users = Vec::new();
        let mut before = BTreeMap::new();
        for u in 0..WRITERS {
            let key = host.user().await;
            for i in 0..PATHS {
                let path = format!("/pub/v/{i}");
                let value = body(u, i, 0);
                assert_eq!(host.put(&key, &path, &value).await.status(), 200);
                before.insert((u, path), value);
            }
            users.push(key);
        }
        Self {
            users,
            before,
            touched: Default::default(),
            stop: Default::default(),
            acknowledged: Default::default(),
            writers: Vec::new(),
        }
    }

    /// Starts one writer per user, overwriting and deleting its first `CHURNED` paths
    /// until [`Workload::stop`].
    pub fn start_writers(&mut self, host: &Arc<TestHost>) {
        for (u, key) in self.users.iter().enumerate() {
            let (host, key) = (host.clone(), key.clone());
            let (touched, stop, acknowledged) = (
                self.touched.clone(),
                self.stop.clone(),
                self.acknowledged.clone(),
            );
            self.writers.push(tokio::spawn(async move {
                let mut round = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    let i = (round as usize * 7 + u) % CHURNED;
                    let path = format!("/pub/v/{i}");
                    touched.lock().unwrap().insert((u, path.clone()));
                    let status = if round.is_multiple_of(5) {
                        host.delete(&key, &path).await.status().as_u16()
                    } else {
                        host.put(&key, &path, &body(u, i, round))
                            .await
                            .status()
                            .as_u16()
                    };
                    // 404: a DELETE of a path an earlier DELETE emptied; 503: a store
                    // too slow under the backup's load (not acknowledged: no harm).
                    assert!(
                        matches!(status, 200 | 404 | 503),
                        "a write answered {status}"
                    );
                    if status != 503 {
                        acknowledged.fetch_add(1, Ordering::Relaxed);
                    }
                    round += 1;
                    // Steady churn, not a flood: the store's size stays modest.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }));
        }
    }

    /// Stops the writers and waits for them.
    pub async fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for writer in self.writers.drain(..) {
            writer.await.unwrap();
        }
    }

    /// The values no writer touched: acknowledged before the backup, unchanged since.
    pub fn untouched(&self) -> Vec<(usize, String, Vec<u8>)> {
        let touched = self.touched.lock().unwrap();
        self.before
            .iter()
            .filter(|(k, _)| !touched.contains(*k))
            .map(|((u, p), v)| (*u, p.clone(), v.clone()))
            .collect()
    }
}

/// Checks a restored deployment served by `host` against the workload (see the module
/// header) and the original server key.
/// `min_orphan_age`: 0 where the restore brings only referenced values (the embedded
/// backup), the default where a bucket copy may bring values written after the snapshot.
pub async fn verify_restored(
    host: &TestHost,
    workload: &Workload,
    server_key: &str,
    min_orphan_age: Duration,
) {
    assert_eq!(
        host.server().server_key().to_z32(),
        server_key,
        "the same identity"
    );
    let untouched = workload.untouched();
    assert!(
        untouched.len() >= WRITERS * (PATHS - CHURNED),
        "{} untouched values",
        untouched.len()
    );
    for (u, path, value) in &untouched {
        let r = host.get(&workload.users[*u], path).await;
        assert_eq!(r.status(), 200, "user {u} {path}");
        let got = r.bytes().await.unwrap();
        assert!(
            blake3::hash(&got) == blake3::hash(value),
            "user {u} {path}: the value acknowledged before the backup"
        );
    }
    let ctx = host.server().context();
    let stores = ctx.stores();
    for key in &workload.users {
        let user = key.public_key().to_z32();
        let entries = stores
            .metadata
            .entries(homeserver::persistence::metadata::EntryRange {
                user: &user,
                after: "",
                before: "{",
                descending: false,
                limit: 1000,
            })
            .await
            .unwrap();
        assert!(entries.len() >= PATHS - CHURNED);
        let mut sum = 0;
        for entry in &entries {
            let r = host.get(key, &entry.path).await;
            assert_eq!(
                r.status(),
                200,
                "{user}{} (blob {:?})",
                entry.path,
                entry.stored.blob_key()
            );
            let got = r.bytes().await.unwrap();
            assert_eq!(
                blake3::hash(&got).as_bytes(),
                &entry.content_hash,
                "{user}{}: its value, whole",
                entry.path
            );
            sum += entry.size;
        }
        let record = stores.metadata.user(&user).await.unwrap().unwrap();
        assert_eq!(record.used_bytes, sum, "usage is the sum of sizes");
    }
    let report = maintenance::fsck(stores, false, min_orphan_age, &Quiet)
        .await
        .unwrap();
    assert!(report.is_clean(), "fsck after the restore: {report:?}");
}

/// Whether this run is the scale-out pass (PostgreSQL + S3): the embedded store's tests
/// ran in the first pass already, the documented PostgreSQL + S3 procedure runs here.
pub fn scale_out_pass() -> bool {
    crate::backend::Blobs::current() == crate::backend::Blobs::S3
}

/// Skips a test of the embedded store in the scale-out pass (it ran in the first).
fn embedded_only(test: &str) -> bool {
    if scale_out_pass() {
        eprintln!("SKIPPED {test} here: it runs in the suite's first pass (SQLite + disk)");
        return false;
    }
    true
}

/// A config for the embedded store under `dir`, whatever the suite's backend.
fn embedded_config(dir: &Path) -> Config {
    let mut config = test_config(dir);
    config.storage.database_url =
        homeserver::persistence::DatabaseUrl::parse(&format!("sqlite://{}/hs.db", dir.display()))
            .unwrap();
    config.storage.blobs = format!("file://{}/blobs", dir.display()).parse().unwrap();
    config.s3 = Default::default();
    config
}

/// The config file the tools read for `config`'s data paths.
fn write_tool_config(config: &Config, file: &Path) {
    let text = format!(
        "[storage]\ndatabase_url = \"{}\"\nblobs = \"{}\"\n[keys]\nsecret_key_file = \"{}\"\n\
         [policies]\ndir = \"{}\"\n",
        config.storage.database_url.expose_secret(),
        config.storage.blobs,
        config.keys.secret_key_file.display(),
        config.policies.dir.display()
    );
    std::fs::write(file, text).unwrap();
}

fn homeserver(config: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_homeserver"));
    command
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    command
}

pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs a tool to completion off the async threads.
async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

/// An embedded deployment running in this process, with a policies folder holding a
/// file of the operator's, and its tools' config file.
async fn embedded_host() -> (Arc<TestHost>, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let config = embedded_config(dir.path());
    std::fs::create_dir_all(&config.policies.dir).unwrap();
    std::fs::write(
        config.policies.dir.join("notes.txt"),
        "the operator's notes\n",
    )
    .unwrap();
    let file = dir.path().join("tools.toml");
    write_tool_config(&config, &file);
    (Arc::new(TestHost::start_single_in(dir, config).await), file)
}

/// An empty deployment to restore into, and its tools' config file.
fn empty_target() -> (tempfile::TempDir, Config, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let config = embedded_config(dir.path());
    let file = dir.path().join("tools.toml");
    write_tool_config(&config, &file);
    (dir, config, file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_online_backup_under_writes_restores_every_acknowledged_value() {
    if !embedded_only("an_online_backup_under_writes_restores_every_acknowledged_value") {
        return;
    }
    let (host, tools) = embedded_host().await;
    let server_key = host.server().server_key().to_z32();
    let mut workload = Workload::populate(&host).await;
    let backup = tempfile::tempdir().unwrap();
    let backup_dir = backup.path().join("b1");

    workload.start_writers(&host);
    // The writers are going before the backup starts.
    eventually("writers under way", Duration::from_secs(30), || async {
        workload.acknowledged.load(Ordering::Relaxed) >= 50
    })
    .await;
    let during = workload.acknowledged.load(Ordering::Relaxed);
    let out = run(homeserver(
        &tools,
        &["backup", backup_dir.to_str().unwrap()],
    ))
    .await;
    let during = workload.acknowledged.load(Ordering::Relaxed) - during;
    workload.stop().await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("backed up"), "{}", text(&out));
    assert!(during > 0, "writes went on during the backup");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(backup_dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["format"], "homeserver-backup");
    let files: Vec<&str> = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["hs.db", "server.key", "policies/notes.txt"]);

    let (target, config, target_tools) = empty_target();
    let out = run(homeserver(
        &target_tools,
        &["restore", backup_dir.to_str().unwrap()],
    ))
    .await;
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(config.policies.dir.join("notes.txt")).unwrap(),
        "the operator's notes\n"
    );
    let restored = TestHost::start_single_in(target, config).await;
    verify_restored(&restored, &workload, &server_key, Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_killed_midway_leaves_the_store_as_it_was_and_is_refused() {
    if !embedded_only("a_backup_killed_midway_leaves_the_store_as_it_was_and_is_refused") {
        return;
    }
    let (host, tools) = embedded_host().await;
    let alice = host.user().await;
    // Enough bytes that the backup takes a while to hash them (12 MiB).
    const BIG_VALUES: usize = 24;
    let big: Vec<u8> = (0..512 * 1024).map(|i| (i % 251) as u8).collect();
    for i in 0..BIG_VALUES {
        assert_eq!(
            host.put(&alice, &format!("/pub/big/{i}"), &big)
                .await
                .status(),
            200
        );
    }
    let ctx = host.server().context().clone();
    let stores = ctx.stores();
    let blobs_before = crate::backend::blob_keys(&stores.blobs, "").await;
    let cursor_before = stores.metadata.latest_cursor().await.unwrap();

    let backup = tempfile::tempdir().unwrap();
    let backup_dir = backup.path().join("b");
    let mut child = homeserver(&tools, &["backup", backup_dir.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once it is copying values.
    let values = backup_dir.join("blobs");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !values.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the backup never started"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the backup ended too soon"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !backup_dir.join("manifest.json").exists(),
        "killed before it finished"
    );

    // The source: the same blobs, the same log, every value whole, fsck clean, writes go.
    assert_eq!(
        crate::backend::blob_keys(&stores.blobs, "").await,
        blobs_before
    );
    assert_eq!(
        stores.metadata.latest_cursor().await.unwrap(),
        cursor_before
    );
    for i in 0..BIG_VALUES {
        let r = host.get(&alice, &format!("/pub/big/{i}")).await;
        assert!(r.bytes().await.unwrap() == big);
    }
    let report = maintenance::fsck(stores, false, Duration::ZERO, &Quiet)
        .await
        .unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(host.put(&alice, "/pub/after", b"x").await.status(), 200);

    // The partial backup is refused, and nothing is written to the target.
    let (target, config, target_tools) = empty_target();
    let out = run(homeserver(
        &target_tools,
        &["restore", backup_dir.to_str().unwrap()],
    ))
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no manifest.json"), "{}", text(&out));
    assert!(!config.storage_database_file().exists());
    drop(target);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn damaged_backups_and_occupied_targets_are_refused() {
    if !embedded_only("damaged_backups_and_occupied_targets_are_refused") {
        return;
    }
    let (host, tools) = embedded_host().await;
    let alice = host.user().await;
    // Values in blobs (over `storage.inline_max_bytes`: the files this test damages),
    // and a small one kept in its row (it travels in hs.db).
    let big = |i: usize| format!("value {i} ").repeat(3000);
    assert_eq!(
        host.put(&alice, "/pub/d/small", b"small").await.status(),
        200
    );
    for i in 0..5 {
        let value = big(i);
        assert_eq!(
            host.put(&alice, &format!("/pub/d/{i}"), value.as_bytes())
                .await
                .status(),
            200
        );
    }
    let backup = tempfile::tempdir().unwrap();
    let good = backup.path().join("good");
    let out = run(homeserver(&tools, &["backup", good.to_str().unwrap()])).await;
    assert!(out.status.success(), "{}", text(&out));
    // Into a folder that is not empty: refused.
    let out = run(homeserver(&tools, &["backup", good.to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("is not empty"), "{}", text(&out));

    let copy = |name: &str| {
        let to = backup.path().join(name);
        let status = Command::new("cp")
            .arg("-a")
            .arg(&good)
            .arg(&to)
            .status()
            .unwrap();
        assert!(status.success());
        to
    };
    let one_value = |dir: &Path| {
        let mut files = Vec::new();
        for user in std::fs::read_dir(dir.join("blobs")).unwrap() {
            for blob in std::fs::read_dir(user.unwrap().path()).unwrap() {
                files.push(blob.unwrap().path());
            }
        }
        files.sort();
        files.remove(0)
    };
    let refused = async |dir: &Path, expect: &str| {
        let (target, config, target_tools) = empty_target();
        let out = run(homeserver(
            &target_tools,
            &["restore", dir.to_str().unwrap()],
        ))
        .await;
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains(expect), "{expect}: {}", text(&out));
        assert!(!config.storage_database_file().exists(), "nothing restored");
        assert!(!config.keys.secret_key_file.exists(), "nothing restored");
        drop(target);
    };

    // A value whose bytes changed (a new file: the backup's are hard links).
    let damaged = copy("damaged");
    let value = one_value(&damaged);
    let mut bytes = std::fs::read(&value).unwrap();
    bytes[0] ^= 1;
    std::fs::remove_file(&value).unwrap();
    std::fs::write(&value, bytes).unwrap();
    refused(&damaged, "does not match its recorded size and hash").await;
    // A value missing.
    let partial = copy("partial");
    std::fs::remove_file(one_value(&partial)).unwrap();
    refused(&partial, "is missing").await;
    // The key changed.
    let rekeyed = copy("rekeyed");
    std::fs::remove_file(rekeyed.join("server.key")).unwrap();
    std::fs::write(rekeyed.join("server.key"), "00".repeat(32)).unwrap();
    refused(&rekeyed, "server.key does not match").await;
    // No manifest.
    let unfinished = copy("unfinished");
    std::fs::remove_file(unfinished.join("manifest.json")).unwrap();
    refused(&unfinished, "no manifest.json").await;

    // A target that holds data: refused, and left as it was.
    let (target, config, target_tools) = empty_target();
    std::fs::create_dir_all(config.storage_blob_folder().join("someone")).unwrap();
    std::fs::write(config.storage_blob_folder().join("someone/old"), "old").unwrap();
    let out = run(homeserver(
        &target_tools,
        &["restore", good.to_str().unwrap()],
    ))
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("is not empty"), "{}", text(&out));
    assert!(!config.storage_database_file().exists());
    drop(target);
    // The good one restores.
    let (target, config, target_tools) = empty_target();
    let out = run(homeserver(
        &target_tools,
        &["restore", good.to_str().unwrap()],
    ))
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let restored = TestHost::start_single_in(target, config).await;
    let r = restored.get(&alice, "/pub/d/3").await;
    assert_eq!(r.bytes().await.unwrap(), big(3));
    let r = restored.get(&alice, "/pub/d/small").await;
    assert_eq!(r.bytes().await.unwrap(), "small");
}

/// Where an embedded config keeps its files.
trait EmbeddedPaths {
    fn storage_database_file(&self) -> PathBuf;
    fn storage_blob_folder(&self) -> PathBuf;
}

impl EmbeddedPaths for Config {
    fn storage_database_file(&self) -> PathBuf {
        homeserver::persistence::sqlite::database_file(&self.storage.database_url).unwrap()
    }

    fn storage_blob_folder(&self) -> PathBuf {
        match &self.storage.blobs {
            homeserver::persistence::BlobsUrl::File(dir) => dir.clone(),
            other => panic!("not a folder: {other}"),
        }
    }
}
