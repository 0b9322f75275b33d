//! The files and folders a configuration names on this machine (database, blob folder,
//! server key, policies, guest cache, TLS files), resolved against the working
//! directory: logged at start as absolute paths, and refused when relative while the
//! working directory is `/`.
//!
//! The embedded defaults are relative (`data/`, `policies`) so that `cargo run` in a
//! checkout keeps everything in the checkout. A service manager starts a process in `/`
//! (systemd does unless told `WorkingDirectory=`), where those defaults would quietly
//! make `/data` and read `/policies`: the server refuses that and says which settings
//! to make absolute, before it creates anything.

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::persistence::{BlobsUrl, sqlite};

/// One local path of a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPath {
    /// The setting that names it, as in the config file (`storage.database_url`).
    pub setting: &'static str,
    /// What it is, for people (`database`).
    pub what: &'static str,
    /// As configured: relative paths are relative to the working directory.
    pub path: PathBuf,
}

/// Relative paths while the working directory is `/`.
#[derive(Debug, thiserror::Error)]
#[error(
    "the working directory is / (as for a service that systemd starts) and {} relative, \
     so the server would keep its data in /: {}. Give absolute paths in the config file \
     (the Debian package's /etc/homeserver/config.toml uses /var/lib/homeserver and \
     /etc/homeserver/policies; see docs/deploy.md) or start the server in its own folder \
     (systemd: WorkingDirectory=)",
    if .0.len() == 1 { "this setting is" } else { "these settings are" },
    list(.0)
)]
pub struct RelativeInRoot(pub Vec<LocalPath>);

fn list(paths: &[LocalPath]) -> String {
    paths
        .iter()
        .map(|p| format!("{} = {}", p.setting, p.path.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every path on this machine that `config` names (shared stores name none).
pub fn local_paths(config: &Config) -> Vec<LocalPath> {
    let mut paths = Vec::new();
    let mut push = |setting, what, path: &Path| {
        if !path.as_os_str().is_empty() {
            paths.push(LocalPath {
                setting,
                what,
                path: path.to_owned(),
            });
        }
    };
    if let Some(file) = sqlite::database_file(&config.storage.database_url) {
        push("storage.database_url", "database", &file);
    }
    if let BlobsUrl::File(dir) = &config.storage.blobs {
        push("storage.blobs", "blobs", dir);
    }
    push(
        "keys.secret_key_file",
        "server key",
        &config.keys.secret_key_file,
    );
    push("policies.dir", "policies", &config.policies.dir);
    push(
        "policies.cache_dir",
        "guest cache",
        &config.policies.cache_dir,
    );
    if let Some(file) = &config.http.tls_cert_file {
        push("http.tls_cert_file", "TLS certificate", file);
    }
    if let Some(file) = &config.http.tls_key_file {
        push("http.tls_key_file", "TLS key", file);
    }
    paths
}

/// Refuses relative paths when `working_dir` is the root directory; otherwise returns
/// every local path made absolute (for the start's log line).
pub fn resolve(config: &Config, working_dir: &Path) -> Result<Vec<LocalPath>, RelativeInRoot> {
    let paths = local_paths(config);
    if working_dir == Path::new("/") {
        let relative: Vec<LocalPath> = paths
            .iter()
            .filter(|p| p.path.is_relative())
            .cloned()
            .collect();
        if !relative.is_empty() {
            return Err(RelativeInRoot(relative));
        }
    }
    Ok(paths
        .into_iter()
        .map(|p| LocalPath {
            path: working_dir.join(&p.path),
            ..p
        })
        .collect())
}

/// [`resolve`] against this process's working directory (paths stay as configured if
/// it cannot be read: there is nothing to compare with then).
pub fn resolve_here(config: &Config) -> Result<Vec<LocalPath>, RelativeInRoot> {
    match std::env::current_dir() {
        Ok(dir) => resolve(config, &dir),
        Err(_) => Ok(local_paths(config)),
    }
}

/// One line for the log: `database /srv/hs/data/hs.db, blobs /srv/hs/data/blobs, ...`.
pub fn describe(paths: &[LocalPath]) -> String {
    paths
        .iter()
        .map(|p| format!("{} {}", p.what, p.path.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_refused_in_the_root_directory_and_each_is_named() {
        let error = resolve(&Config::defaults(), Path::new("/")).unwrap_err();
        let settings: Vec<_> = error.0.iter().map(|p| p.setting).collect();
        assert_eq!(
            settings,
            [
                "storage.database_url",
                "storage.blobs",
                "keys.secret_key_file",
                "policies.dir",
                "policies.cache_dir"
            ]
        );
        let message = error.to_string();
        assert!(
            message.contains("storage.database_url = data/hs.db"),
            "{message}"
        );
        assert!(message.contains("policies.dir = policies"), "{message}");
        assert!(message.contains("WorkingDirectory="), "{message}");
    }

    #[test]
    fn the_defaults_resolve_against_any_other_working_directory() {
        let paths = resolve(&Config::defaults(), Path::new("/srv/hs")).unwrap();
        assert_eq!(
            describe(&paths),
            "database /srv/hs/data/hs.db, blobs /srv/hs/data/blobs, server key \
             /srv/hs/data/server.key, policies /srv/hs/policies, guest cache \
             /srv/hs/data/guest-cache"
        );
    }

    #[test]
    fn absolute_paths_and_shared_stores_start_anywhere() {
        let mut config = Config::defaults();
        config.storage.database_url = "postgres://hs@db/hs".parse().unwrap();
        config.storage.blobs = "s3://hs-blobs".parse().unwrap();
        config.keys.secret_key_file = "/var/lib/homeserver/server.key".into();
        config.policies.dir = "/etc/homeserver/policies".into();
        config.policies.cache_dir = PathBuf::new();
        let paths = resolve(&config, Path::new("/")).unwrap();
        assert_eq!(
            describe(&paths),
            "server key /var/lib/homeserver/server.key, policies /etc/homeserver/policies"
        );

        // One relative path is enough to refuse, and only it is named.
        config.http.tls_cert_file = Some("cert.pem".into());
        config.http.tls_key_file = Some("/etc/ssl/key.pem".into());
        let error = resolve(&config, Path::new("/")).unwrap_err();
        assert_eq!(error.0.len(), 1);
        assert!(
            error.to_string().contains("this setting is relative"),
            "{error}"
        );
    }
}
