//! The scale-out example of docs/deploy.md (docs/examples/scale-out.toml) is a working
//! configuration: it loads, and a server started from it (its database, S3 endpoint,
//! addresses and file paths pointed at this test's) serves.

use homeserver::Config;

use crate::backend::{PgDatabase, S3Server};
use crate::fixture::*;

#[tokio::test]
async fn the_scale_out_example_starts_and_serves() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples/scale-out.toml");
    let mut config = Config::load_file_only(&example).expect("the example is a valid config");
    assert_eq!(config.storage.database_url.backend(), "postgres");
    assert_eq!(config.storage.blobs.backend(), "s3");

    let Some(db) = PgDatabase::or_skip("the_scale_out_example_starts_and_serves") else {
        return;
    };
    let Some(s3) = S3Server::or_skip("the_scale_out_example_starts_and_serves") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let local = test_config(dir.path());
    // What differs on this machine: addresses, paths, the servers' locations.
    config.http.listen = local.http.listen;
    config.admin = local.admin.clone();
    config.metrics = local.metrics.clone();
    config.keys = local.keys.clone();
    config.policies = local.policies.clone();
    config.storage.database_url = db.url.clone();
    config.storage.blobs = format!("s3://{}", s3.new_bucket()).parse().unwrap();
    config.s3 = s3.settings();
    config.rate_limit.trusted_proxies = vec![];
    let host = TestHost::start_in(dir, config).await;
    let alice = host.user().await;
    assert_eq!(host.put(&alice, "/pub/hello", b"world").await.status(), 200);
    let r = host.public_get(&alice, "/pub/hello").await;
    assert_eq!(r.text().await.unwrap(), "world");
}

/// The Debian package's files (host/server/debian, docs/deploy.md "The Debian package"):
/// its config names only absolute paths where the unit lets the server write, so a
/// server that systemd starts in `/` neither refuses it nor writes elsewhere.
#[test]
fn the_packaged_config_and_unit_agree() {
    let debian = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("debian");
    let config = Config::load_file_only(&debian.join("config.toml"))
        .expect("the packaged config is a valid config");
    let paths = homeserver::local_paths::resolve(&config, std::path::Path::new("/"))
        .expect("the packaged config starts in / (where systemd starts services)");
    assert_eq!(paths.len(), 5, "{paths:?}");
    for path in &paths {
        let readable = path.setting == "policies.dir";
        let root = if readable {
            "/etc/homeserver/"
        } else {
            "/var/lib/homeserver/"
        };
        assert!(path.path.starts_with(root), "{path:?} is not under {root}");
    }

    let unit = std::fs::read_to_string(debian.join("homeserver.service")).unwrap();
    let value = |key: &str| {
        let prefix = format!("{key}=");
        unit.lines()
            .filter_map(|line| line.strip_prefix(prefix.as_str()))
            .next_back()
            .unwrap_or_else(|| panic!("the unit names no {key}"))
            .to_owned()
    };
    assert_eq!(
        value("ExecStart"),
        "/usr/bin/homeserver --config /etc/homeserver/config.toml"
    );
    assert_eq!(value("WorkingDirectory"), "/var/lib/homeserver");
    assert_eq!(value("ReadWritePaths"), "/var/lib/homeserver");
    assert_eq!(value("StateDirectory"), "homeserver");
    assert_eq!(value("ProtectSystem"), "strict");
    assert_eq!(value("EnvironmentFile"), "-/etc/homeserver/env");
    // Exit code 2: a configuration the server refused; restarting would not help.
    assert_eq!(value("RestartPreventExitStatus"), "2");
}

/// Every instance reads the same scale-out file, so it names no instance's own
/// addresses; the settings it tells each instance to set in its environment are real
/// keys under the names the server reads (`HOMESERVER__<SECTION>__<KEY>`).
#[test]
fn the_scale_out_example_leaves_each_instances_addresses_to_its_environment() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples/scale-out.toml");
    let config = Config::load_file_only(&example).unwrap();
    let defaults = Config::defaults();
    assert_eq!(config.http.listen, defaults.http.listen);
    assert_eq!(config.admin.listen, defaults.admin.listen);
    assert_eq!(config.metrics.listen, defaults.metrics.listen);

    let text = std::fs::read_to_string(&example).unwrap();
    let named: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix('#')?.split_whitespace().next())
        .filter(|word| word.starts_with("HOMESERVER__"))
        .collect();
    for listener in ["HTTP", "ADMIN", "METRICS"] {
        let name = format!("HOMESERVER__{listener}__LISTEN");
        assert!(named.contains(&name.as_str()), "the file names {name}");
    }
    let keys = serde_json::to_value(&defaults).unwrap();
    for name in named {
        let mut value = &keys;
        for part in name["HOMESERVER__".len()..].split("__") {
            value = value
                .get(part.to_lowercase())
                .unwrap_or_else(|| panic!("{name} names no setting"));
        }
    }
}
