//! The PostgreSQL + S3 backup and restore procedures of docs/deploy.md, run exactly as
//! written there: each block marked `<!-- tested: NAME -->` is read from the document
//! and run by bash with the variables it names, against a real PostgreSQL (`pg_dump`,
//! `pg_restore` from postgresql-client), a real S3 server (moto) and the AWS CLI's
//! `aws s3 sync`, while 8 writers keep overwriting and deleting. Then a server on the
//! restored database and bucket must give back what [`crate::backup::verify_restored`]
//! asks.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{PgDatabase, S3Server};
use crate::backup::{Workload, text, verify_restored};
use crate::fixture::*;

/// The shell block of `doc` (relative to the repository) that follows the marker
/// `<!-- tested: NAME ... -->`, as it is written there.
pub fn tested_block(doc: &str, name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(doc);
    let text = std::fs::read_to_string(&path).unwrap();
    let marker = format!("<!-- tested: {name} ");
    let after = &text[text
        .find(&marker)
        .unwrap_or_else(|| panic!("{doc} has no block marked {marker}"))..];
    let fence = after
        .find("```sh\n")
        .expect("a ```sh block after the marker")
        + 6;
    let body = &after[fence..];
    body[..body.find("```").expect("the block's end")].to_owned()
}

/// A program the procedures need, or why it is missing (`CI=true`: a failure).
pub fn tool_or_skip(test: &str, name: &str, candidates: &[PathBuf], hint: &str) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    if let Some(found) = candidates.iter().find(|p| p.is_file()).cloned().or(on_path) {
        return Some(found);
    }
    let why = format!("no {name} ({hint})");
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("CI=true and {why} for {test}");
    }
    eprintln!("SKIPPED {test}: {why}");
    None
}

/// The AWS CLI: `HS_TEST_AWS`, else the one .ci/run installs beside moto, else PATH.
pub fn aws_or_skip(test: &str) -> Option<PathBuf> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("HS_TEST_AWS") {
        candidates.push(repo.join(p));
    }
    candidates.push(repo.join("target/tools/moto/bin/aws"));
    tool_or_skip(
        test,
        "aws",
        &candidates,
        "the AWS CLI: target/tools/moto/bin/pip install awscli, as .ci/run does",
    )
}

/// The PATH for a procedure: the homeserver binary and `aws` first.
pub fn procedure_path(aws: &Path) -> String {
    let homeserver = Path::new(env!("CARGO_BIN_EXE_homeserver"));
    let mut dirs = vec![
        homeserver.parent().unwrap().to_owned(),
        aws.parent().unwrap().to_owned(),
    ];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap().into_string().unwrap()
}

/// The `[s3]` and AWS CLI environment that reach `s3`.
pub fn aws_env(s3: &S3Server) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", s3.endpoint.clone()),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_DEFAULT_REGION", "us-east-1".into()),
    ]
}

/// A config file naming a PostgreSQL database, a bucket on `s3`, a key and a policies
/// folder (what `homeserver --config` reads).
pub fn write_scale_out_config(
    file: &Path,
    database: &PgDatabase,
    bucket: &str,
    s3: &S3Server,
    dir: &Path,
) {
    std::fs::write(
        file,
        format!(
            "[storage]\ndatabase_url = \"{}\"\nblobs = \"s3://{bucket}\"\n\
             [s3]\nendpoint = \"{}\"\nregion = \"us-east-1\"\npath_style = true\n\
             allow_http = true\naccess_key_id = \"test\"\nsecret_access_key = \"test\"\n\
             [keys]\nsecret_key_file = \"{}\"\n[policies]\ndir = \"{}\"\n",
            database.url.expose_secret(),
            s3.endpoint,
            dir.join("server.key").display(),
            dir.join("policies").display()
        ),
    )
    .unwrap();
}

/// A server config for a deployment on `database` and `bucket`, its files under `dir`.
fn scale_out_config(
    dir: &Path,
    database: &PgDatabase,
    bucket: &str,
    s3: &S3Server,
) -> homeserver::Config {
    let mut config = test_config(dir);
    config.storage.database_url = database.url.clone();
    config.storage.blobs = format!("s3://{bucket}").parse().unwrap();
    config.s3 = s3.settings();
    config
}

/// Runs a procedure block with bash (`set -euo pipefail`) and the given variables.
async fn run_block(block: String, env: Vec<(String, String)>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .arg("-euo")
            .arg("pipefail")
            .arg("-c")
            .arg(&block)
            .envs(env)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// Fails naming every entry of the restored database whose value the backup's bucket
/// copy lacks, with where it is in the source (a bucket copy that missed a value, or a
/// value the source lost itself).
async fn missing_from_backup(
    restored: &PgDatabase,
    backup: &Path,
    source: &PgDatabase,
    source_bucket: &str,
    s3: &S3Server,
) {
    use homeserver::persistence::{BlobStore, open_metadata};
    let options = Default::default();
    let restored = open_metadata(&restored.url, &options).await.unwrap();
    let source_meta = open_metadata(&source.url, &options).await.unwrap();
    let source_blobs = BlobStore::open(
        &format!("s3://{source_bucket}").parse().unwrap(),
        &s3.settings(),
        &options,
    )
    .unwrap();
    let mut missing = Vec::new();
    for user in restored.users_after("", 1000).await.unwrap() {
        let entries = restored
            .entries(homeserver::persistence::metadata::EntryRange {
                user: &user.public_key,
                after: "",
                before: "{",
                descending: false,
                limit: 1000,
            })
            .await
            .unwrap();
        for entry in entries {
            // A value kept in its row is in the backup's database.
            let Some(blob_key) = entry.stored.blob_key() else {
                continue;
            };
            let file =
                homeserver::persistence::blobs::local_blob_file(&backup.join("blobs"), blob_key);
            if !file.exists() {
                missing.push(format!(
                    "{}{} (blob {}): in the source bucket {:?}, in the source database {:?}",
                    user.public_key,
                    entry.path,
                    blob_key,
                    source_blobs.size_of(blob_key).await,
                    source_meta.blob_state(blob_key).await
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "values missing from the backup: {missing:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_documented_postgres_s3_backup_restores_under_writes() {
    const TEST: &str = "the_documented_postgres_s3_backup_restores_under_writes";
    if !crate::backup::scale_out_pass() {
        eprintln!(
            "SKIPPED {TEST} here: it runs in the suite's PostgreSQL + S3 pass \
             (HS_TEST_BLOBS=s3, as scripts/test runs it)"
        );
        return;
    }
    let Some(source_db) = PgDatabase::or_skip(TEST) else {
        return;
    };
    let Some(s3) = S3Server::or_skip(TEST) else {
        return;
    };
    let Some(aws) = aws_or_skip(TEST) else {
        return;
    };
    for program in ["pg_dump", "pg_restore"] {
        if tool_or_skip(
            TEST,
            program,
            &[],
            "Debian: apt-get install postgresql-client",
        )
        .is_none()
        {
            return;
        }
    }
    let backup_block = tested_block("docs/deploy.md", "backup-postgres-s3");
    let restore_block = tested_block("docs/deploy.md", "restore-postgres-s3");

    // The deployment: PostgreSQL + a bucket (two instances in the scale-out run).
    let source_bucket = s3.new_bucket();
    let dir = tempfile::tempdir().unwrap();
    let config = scale_out_config(dir.path(), &source_db, &source_bucket, s3);
    std::fs::create_dir_all(&config.policies.dir).unwrap();
    std::fs::write(config.policies.dir.join("notes.txt"), "kept\n").unwrap();
    let (server_key_file, policies) = (
        config.keys.secret_key_file.clone(),
        config.policies.dir.clone(),
    );
    let grace = config.storage.blob_grace_secs;
    let host = Arc::new(TestHost::start_in(dir, config).await);
    let server_key = host.server().server_key().to_z32();
    let mut workload = Workload::populate(&host).await;

    // The backup, as documented, while 8 writers overwrite and delete.
    let backups = tempfile::tempdir().unwrap();

    let backup = backups.path().join("backup");
    let path = procedure_path(&aws);
    let mut env: Vec<(String, String)> = aws_env(s3)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    env.push(("PATH".into(), path));
    env.push(("BACKUP".into(), backup.display().to_string()));
    env.push(("GRACE_SECS".into(), grace.to_string()));
    let mut backup_env = env.clone();
    backup_env.extend([
        (
            "DATABASE_URL".into(),
            source_db.url.expose_secret().to_owned(),
        ),
        ("BUCKET".into(), source_bucket.clone()),
        ("SERVER_KEY".into(), server_key_file.display().to_string()),
        ("POLICIES".into(), policies.display().to_string()),
    ]);
    workload.start_writers(&host);
    eventually("writers under way", Duration::from_secs(30), || async {
        workload
            .acknowledged
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 50
    })
    .await;
    let out = run_block(backup_block, backup_env).await;
    workload.stop().await;
    assert!(out.status.success(), "the backup procedure: {}", text(&out));
    drop(host);

    // The restore, as documented, into an empty database and bucket.
    let Some(target_db) = PgDatabase::or_skip(TEST) else {
        return;
    };
    let target_bucket = s3.new_bucket();
    let target = tempfile::tempdir().unwrap();
    let config_file = target.path().join("homeserver.toml");
    write_scale_out_config(&config_file, &target_db, &target_bucket, s3, target.path());
    let target_config = scale_out_config(target.path(), &target_db, &target_bucket, s3);
    let mut restore_env = env;
    restore_env.extend([
        (
            "DATABASE_URL".into(),
            target_db.url.expose_secret().to_owned(),
        ),
        ("BUCKET".into(), target_bucket),
        (
            "SERVER_KEY".into(),
            target_config.keys.secret_key_file.display().to_string(),
        ),
        (
            "POLICIES".into(),
            target_config.policies.dir.display().to_string(),
        ),
        ("CONFIG".into(), config_file.display().to_string()),
    ]);
    let out = run_block(restore_block, restore_env).await;
    missing_from_backup(&target_db, &backup, &source_db, &source_bucket, s3).await;
    assert!(
        out.status.success(),
        "the restore procedure: {}",
        text(&out)
    );
    assert!(text(&out).contains("clean"), "fsck: {}", text(&out));
    assert_eq!(
        std::fs::read_to_string(target_config.policies.dir.join("notes.txt")).unwrap(),
        "kept\n"
    );
    let min_orphan_age = target_config.orphan_min_age();
    let restored = TestHost::start_single_in(target, target_config).await;
    verify_restored(&restored, &workload, &server_key, min_orphan_age).await;
    drop(source_db);
}
